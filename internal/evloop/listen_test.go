//go:build linux

package evloop

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Two loops listen on one socket: every connection is accepted once, on
// one of them, with its addresses, its coroutine echoes a line; after
// Close no loop accepts (the caller's listener still holds the socket, so
// a new connection waits in the backlog, unaccepted).
func TestListenAcceptsOnLoops(t *testing.T) {
	loops := []*Loop{startLoop(t), startLoop(t)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	byLoop := map[*Loop]int{}
	remotes := map[string]bool{}
	lis, err := Listen(ln, loops, func(l *Loop, c *Conn) {
		mu.Lock()
		byLoop[l]++
		remotes[c.RemoteAddr().String()] = true
		if c.RemoteString() != c.RemoteAddr().String() {
			t.Errorf("RemoteString %q, RemoteAddr %q", c.RemoteString(), c.RemoteAddr())
		}
		if c.LocalAddr().String() != ln.Addr().String() {
			t.Errorf("local address %s, want %s", c.LocalAddr(), ln.Addr())
		}
		mu.Unlock()
		for _, o := range [][3]int{{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1}, {unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAlive}} {
			if v, err := unix.GetsockoptInt(c.fd, o[0], o[1]); err != nil || v != o[2] {
				t.Errorf("accepted socket: option %d/%d = %d, %v; want %d (from the listening socket)", o[0], o[1], v, err, o[2])
			}
		}
		l.Go(func(co *Co) {
			if err := c.Bind(co); err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("echo " + line))
		})
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	var wg sync.WaitGroup
	locals := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			locals <- c.LocalAddr().String()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write([]byte("hi\n"))
			got, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || got != "echo hi\n" {
				t.Errorf("got %q, %v", got, err)
			}
		}()
	}
	wg.Wait()
	close(locals)
	mu.Lock()
	total := byLoop[loops[0]] + byLoop[loops[1]]
	for l := range locals {
		if !remotes[l] {
			t.Errorf("client %s: no accepted connection had it as its remote address", l)
		}
	}
	mu.Unlock()
	if total != n {
		t.Fatalf("%d accepted, want %d", total, n)
	}
	lis.Close()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err) // the kernel completes the handshake into the backlog
	}
	defer c.Close()
	_, _ = c.Write([]byte("x")) // the socket defers accepts until data comes
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	after := byLoop[loops[0]] + byLoop[loops[1]]
	mu.Unlock()
	if after != n {
		t.Errorf("a loop accepted after Close")
	}
	// The caller's listener still works.
	if tl, ok := ln.(*net.TCPListener); ok {
		_ = tl.SetDeadline(time.Now().Add(2 * time.Second))
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatalf("the listener after Close: %v", err)
	}
	a.Close()
}

// TestListenDefersAccept: a connection is handed over only once it sent
// something; one that sends nothing stays with the kernel.
func TestListenDefersAccept(t *testing.T) {
	loops := []*Loop{startLoop(t)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan string, 2)
	lis, err := Listen(ln, loops, func(l *Loop, c *Conn) {
		accepted <- c.RemoteAddr().String()
		_ = c.Close()
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if v, err := unix.GetsockoptInt(lis.fd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT); err != nil || v == 0 {
		t.Fatalf("TCP_DEFER_ACCEPT on the listening socket: %d, %v", v, err)
	}
	silent, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	speaking, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer speaking.Close()
	if _, err := speaking.Write([]byte{0, 0, 0, 8}); err != nil {
		t.Fatal(err)
	}
	// The speaking client connected after the silent one: once it is
	// accepted, the silent one would have been too, had it been ready.
	select {
	case got := <-accepted:
		if got != speaking.LocalAddr().String() {
			t.Fatalf("accepted %s, the silent client (%s) before the one that spoke (%s)", got, silent.LocalAddr(), speaking.LocalAddr())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client that spoke was not accepted")
	}
	select {
	case got := <-accepted:
		t.Fatalf("accepted %s as well, a client that sent nothing", got)
	default:
	}
}

func TestListenNeedsTCP(t *testing.T) {
	l := startLoop(t)
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Listen(ln, []*Loop{l}, func(*Loop, *Conn) {}, nil); err == nil {
		t.Error("Listen took a Unix socket")
	}
}

// TestListenLeavesNetpoller: once the loops accept on a socket, the Go
// runtime's epoll no longer holds it (no wake-up of the netpoller per
// connection): no epoll instance of the process lists the listener's own
// descriptor, while one lists the duplicate the loops registered.
func TestListenLeavesNetpoller(t *testing.T) {
	loops := []*Loop{startLoop(t)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd := -1
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	if !inSomeEpoll(t, fd) {
		t.Skip("the runtime's netpoller is not an epoll this process lists")
	}
	lis, err := Listen(ln, loops, func(l *Loop, c *Conn) { _ = c.Close() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if inSomeEpoll(t, fd) {
		t.Errorf("descriptor %d is still in an epoll after Listen", fd)
	}
	if !inSomeEpoll(t, lis.fd) {
		t.Errorf("the loops' duplicate %d is in no epoll", lis.fd)
	}
}

// inSomeEpoll reports whether an epoll instance of this process watches
// descriptor fd (its /proc/self/fdinfo lists it as a target).
func inSomeEpoll(t *testing.T, fd int) bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	want := fmt.Sprintf("tfd: %8d ", fd)
	for _, e := range ents {
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || link != "anon_inode:[eventpoll]" {
			continue
		}
		if info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name()); err == nil && strings.Contains(string(info), want) {
			return true
		}
	}
	return false
}
