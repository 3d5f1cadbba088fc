//go:build linux

package evloop

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// raceChildEnv names the case TestKernelAccessRaceChild runs in a child
// process started by TestRaceDetectorSeesKernelAccess.
const raceChildEnv = "EVLOOP_RACE_CHILD"

// TestRaceDetectorSeesKernelAccess checks that the race detector sees the
// kernel's accesses to Go buffers made by the raw system calls and the
// io_uring, which the syscall package's annotations do not cover: in each
// case a goroutine touches a buffer that a Read or Write (or a ring
// operation) uses, unsynchronised, and the child process running it must
// report a data race naming the annotated call; in the ordered cases, where
// the goroutine waits for the Read, it must report none. The children run
// this test binary again, so the test needs a -race build.
func TestRaceDetectorSeesKernelAccess(t *testing.T) {
	if !raceEnabled {
		t.Skip("needs the race detector: go test -race")
	}
	for _, tc := range []struct {
		name string
		// want is a frame of the annotated access in the race report (the
		// annotated calls themselves may be inlined); "" for no race.
		want string
	}{
		{"raw_read", "evloop.(*Conn).Read"},
		{"raw_write", "evloop.(*Conn).writeNow"},
		{"ring_receive", "evloop.(*Loop).dispatch"},
		{"ring_send", "evloop.ringSendCase"},
		{"raw_read_ordered", ""},
		{"ring_receive_ordered", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKernelAccessRaceChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), raceChildEnv+"="+tc.name, "GORACE=halt_on_error=0 atexit_sleep_ms=0")
			out, err := cmd.CombinedOutput()
			raced := strings.Contains(string(out), "WARNING: DATA RACE")
			switch {
			case tc.want == "" && (raced || err != nil):
				t.Fatalf("the child failed (%v) or reported a race:\n%s", err, out)
			case tc.want != "" && !raced:
				t.Fatalf("no data race reported (%v):\n%s", err, out)
			case tc.want != "" && !annotatedRace(string(out), tc.want):
				t.Fatalf("no race report names an annotated access (racereadrange or racewriterange) under %s:\n%s", tc.want, out)
			case tc.want != "" && !strings.Contains(string(out), "child: done"):
				t.Fatalf("the child did not finish its case:\n%s", out)
			}
		})
	}
}

// annotatedRace reports whether a race report in out has an access made by
// raceReadRange or raceWriteRange (runtime.racereadrange,
// runtime.racewriterange) with frame further down its stack.
func annotatedRace(out, frame string) bool {
	for _, access := range strings.Split(out, "\n\n") {
		if (strings.Contains(access, "runtime.racereadrange") || strings.Contains(access, "runtime.racewriterange")) && strings.Contains(access, frame) {
			return true
		}
	}
	return false
}

// TestKernelAccessRaceChild runs one case of
// TestRaceDetectorSeesKernelAccess (in its child process only).
func TestKernelAccessRaceChild(t *testing.T) {
	name := os.Getenv(raceChildEnv)
	if name == "" {
		t.Skip("run by TestRaceDetectorSeesKernelAccess")
	}
	switch name {
	case "raw_read", "raw_read_ordered":
		rawReadCase(t, name == "raw_read_ordered")
	case "raw_write":
		rawWriteCase(t)
	case "ring_receive", "ring_receive_ordered":
		ringReceiveCase(t, name == "ring_receive_ordered")
	case "ring_send":
		ringSendCase(t)
	default:
		t.Fatalf("no case %q", name)
	}
	t.Log("child: done")
}

// rawReadCase: a coroutine's Read waits for bytes (a loop without a ring:
// it receives with recvfrom itself) while another goroutine reads the
// buffer it will fill; ordered, the goroutine reads it after Read returned.
func rawReadCase(t *testing.T, ordered bool) {
	l := newLoopIn(t, Options{NoRing: true})
	go l.Run()
	defer l.Stop()
	c, peer := pair(t)
	buf := make([]byte, 64)
	reading, got := make(chan struct{}), make(chan int, 1)
	run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			t.Error(err)
		}
		defer c.Close()
		close(reading)
		n, err := c.Read(buf)
		if err != nil {
			t.Error(err)
		}
		got <- n
	})
	<-reading
	peek := func() {
		if buf[0] != 0 && buf[0] != 'h' {
			t.Errorf("buffer holds %q", buf[0])
		}
	}
	var wg sync.WaitGroup
	if !ordered {
		// The goroutine finishes before the peer writes, but nothing
		// orders its read before the kernel's write for the race detector
		// (the bytes pass through the kernel, which the detector does not
		// see): that is the race a pending Read's buffer must show.
		wg.Add(1)
		go func() { defer wg.Done(); peek() }()
		wg.Wait()
	}
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != 5 {
		t.Fatalf("read %d bytes", n)
	}
	if ordered {
		wg.Add(1)
		go func() { defer wg.Done(); peek() }()
		wg.Wait()
	}
}

// rawWriteCase: a coroutine writes a buffer another goroutine changes.
func rawWriteCase(t *testing.T) {
	l := newLoopIn(t, Options{NoRing: true})
	go l.Run()
	defer l.Stop()
	c, peer := pair(t)
	buf := []byte("hello")
	writing, wrote := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	run(l, func(co *Co) {
		defer close(wrote)
		if err := c.Bind(co); err != nil {
			t.Error(err)
		}
		defer c.Close()
		close(writing)
		// Nothing orders the change below before or after the send.
		if _, err := c.Write(buf); err != nil {
			t.Error(err)
		}
	})
	<-writing
	wg.Add(1)
	go func() { defer wg.Done(); buf[0] = 'j' }()
	<-wrote
	wg.Wait()
	got := make([]byte, 5)
	if _, err := peer.Read(got); err != nil {
		t.Fatal(err)
	}
}

// ringReceiveCase: two coroutines' Reads wait on sockets that become
// readable in the same turn, so the loop receives for both through its
// ring, into their buffers; meanwhile another goroutine reads the first
// buffer. Ordered, it reads it after that Read returned.
func ringReceiveCase(t *testing.T, ordered bool) {
	l := newLoopIn(t, Options{})
	if !l.UsesRing() {
		t.Skip("io_uring is not available here")
	}
	go l.Run()
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	var conns [2]*Conn
	var peers [2]net.Conn
	var bufs [2][]byte
	got := make(chan int, 2)
	for i := range conns {
		conns[i], peers[i] = unixPair(t)
		bufs[i] = make([]byte, 64)
		// Posted in order: each coroutine waits in Read before the next
		// posted function runs.
		run(l, func(co *Co) {
			if err := conns[i].Bind(co); err != nil {
				t.Error(err)
			}
			defer conns[i].Close()
			n, err := conns[i].Read(bufs[i])
			if err != nil {
				t.Error(err)
			}
			got <- n
		})
	}
	// Hold the loop until both peers have written: one turn then finds
	// both sockets readable.
	held, release := make(chan struct{}), make(chan struct{})
	l.Post(func() { close(held); <-release })
	<-held
	for _, p := range peers {
		if _, err := p.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	peek := func() {
		if b := bufs[0][0]; b != 0 && b != 'h' {
			t.Errorf("buffer holds %q", b)
		}
	}
	var wg sync.WaitGroup
	if !ordered {
		wg.Add(1)
		go func() { defer wg.Done(); peek() }()
	}
	close(release)
	for range conns {
		if n := <-got; n != 5 {
			t.Errorf("read %d bytes", n)
		}
	}
	if ordered {
		wg.Add(1)
		go func() { defer wg.Done(); peek() }()
	}
	wg.Wait()
	l.Stop()
	stopped = true
	if l.ringReceives != 2 {
		t.Fatalf("%d receives through the ring, want 2", l.ringReceives)
	}
}

// ringSendCase: a ring sends a buffer another goroutine changes.
func ringSendCase(t *testing.T) {
	r := newRing()
	if r == nil {
		t.Skip("io_uring is not available here")
	}
	defer r.close()
	fd, peer := blockingPair(t)
	buf := []byte("hello")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); buf[0] = 'j' }()
	r.add(uringOpSend, fd, buf, 0)
	if !r.submit(func(uint64, int32) {}) {
		t.Fatal("submit failed")
	}
	wg.Wait()
	got := make([]byte, 5)
	if _, err := unix.Read(peer, got); err != nil {
		t.Fatal(err)
	}
}

// unixPair returns a connected Unix socket pair: one end wrapped for a
// loop.
func unixPair(t testing.TB) (*Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { conns[1].Close() })
	return Wrap(conns[0]), conns[1]
}
