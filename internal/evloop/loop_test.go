//go:build linux

package evloop

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

func startLoop(t *testing.T) *Loop {
	t.Helper()
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	go l.Run()
	t.Cleanup(l.Stop)
	return l
}

// pair returns a connected TCP pair: the server side wrapped for a loop.
func pair(t testing.TB) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return Wrap(sc), cc
}

// run starts fn as a coroutine of l and returns a channel closed when fn returns.
func run(l *Loop, fn func(co *Co)) chan struct{} {
	done := make(chan struct{})
	l.Post(func() {
		l.Go(func(co *Co) {
			defer close(done)
			fn(co)
		})
	})
	return done
}

// echoOnReadable serves c on l with no coroutine held between bytes: each
// byte the peer sends starts a coroutine (GoOnReadable) that echoes it.
func echoOnReadable(t *testing.T, l *Loop, c *Conn) {
	var serve func(co *Co, echo bool)
	serve = func(co *Co, echo bool) {
		if err := c.Bind(co); err != nil {
			t.Error(err)
			return
		}
		if echo {
			b := make([]byte, 1)
			if _, err := c.Read(b); err != nil {
				if err != io.EOF {
					t.Error(err)
				}
				return
			}
			if _, err := c.Write(b); err != nil {
				t.Error(err)
				return
			}
		}
		c.Unbind()
		next := func(co *Co) { serve(co, true) }
		if !l.GoOnReadable(c, next) {
			next(co) // readable already: serve on this coroutine
		}
	}
	run(l, func(co *Co) { serve(co, false) })
}

// echoRound sends b to the echo server behind peer and expects it back.
func echoRound(t *testing.T, peer net.Conn, b byte) {
	t.Helper()
	if _, err := peer.Write([]byte{b}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, got); err != nil || got[0] != b {
		t.Fatalf("echo of %q: %q %v", b, got, err)
	}
}

func TestEchoManyCoroutines(t *testing.T) {
	loops := []*Loop{startLoop(t), startLoop(t)}
	const clients, rounds = 40, 200
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		c, peer := pair(t)
		l := loops[i%2]
		run(l, func(co *Co) {
			if err := c.Bind(co); err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			buf := make([]byte, 64)
			for {
				n, err := c.Read(buf)
				if err != nil {
					if err != io.EOF {
						t.Error(err)
					}
					return
				}
				if _, err := c.Write(buf[:n]); err != nil {
					t.Error(err)
					return
				}
			}
		})
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer peer.Close()
			buf := make([]byte, 64)
			for r := 0; r < rounds; r++ {
				msg := fmt.Sprintf("client %d round %d", i, r)
				if _, err := peer.Write([]byte(msg)); err != nil {
					t.Error(err)
					return
				}
				if _, err := io.ReadFull(peer, buf[:len(msg)]); err != nil {
					t.Error(err)
					return
				}
				if string(buf[:len(msg)]) != msg {
					t.Errorf("echo %q, want %q", buf[:len(msg)], msg)
					return
				}
			}
		}(i)
	}
	wg.Wait()
}

func TestLargeWriteWaitsForReader(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than the socket buffers
	errc := make(chan error, 1)
	run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			errc <- err
			return
		}
		_, err := c.Write(want)
		c.Close()
		errc <- err
	})
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d (equal prefix: %v)", len(got), len(want), bytes.HasPrefix(want, got))
	}
}

func TestReadDeadline(t *testing.T) {
	l := startLoop(t)
	c, _ := pair(t)
	errc := make(chan error, 1)
	start := time.Now()
	run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			errc <- err
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		errc <- err
	})
	err := <-errc
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read error %v is not a net.Error timeout", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 2*time.Second {
		t.Fatalf("deadline fired after %v", d)
	}
}

func TestInterruptEndsWait(t *testing.T) {
	l := startLoop(t)
	c, _ := pair(t)
	stop := errors.New("stop")
	coc := make(chan *Co, 1)
	errc := make(chan error, 1)
	run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			errc <- err
			return
		}
		coc <- co
		_, err := c.Read(make([]byte, 1))
		errc <- err
	})
	co := <-coc
	l.Post(func() { co.Interrupt(stop) })
	if err := <-errc; !errors.Is(err, stop) {
		t.Fatalf("read: %v, want the interrupt", err)
	}
}

func TestOffloadKeepsLoopServing(t *testing.T) {
	l := startLoop(t)
	release := make(chan struct{})
	offloaded := run(l, func(co *Co) {
		co.Offload(func() { <-release })
	})
	// Another coroutine on the same loop runs while the first one waits.
	c, peer := pair(t)
	echoed := run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			t.Error(err)
			return
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Error(err)
			return
		}
		_, _ = c.Write(b)
	})
	if _, err := peer.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(peer, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo %q, %v", b, err)
	}
	<-echoed
	close(release)
	<-offloaded
}

func TestConnMovesBetweenLoopsAndPoll(t *testing.T) {
	a, b := startLoop(t), startLoop(t)
	c, peer := pair(t)
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := peer.Read(buf); err != nil {
				return
			}
			if _, err := peer.Write(buf); err != nil {
				return
			}
		}
	}()
	roundTrip := func(co *Co, ch byte) error {
		if co != nil {
			if err := c.Bind(co); err != nil {
				return err
			}
			defer c.Unbind()
		}
		if _, err := c.Write([]byte{ch}); err != nil {
			return err
		}
		got := make([]byte, 1)
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if got[0] != ch {
			return fmt.Errorf("got %q, want %q", got[0], ch)
		}
		return nil
	}
	for i, l := range []*Loop{a, b, a, nil, b} {
		errc := make(chan error, 1)
		if l == nil {
			errc <- roundTrip(nil, byte('0'+i)) // unbound: poll(2)
		} else {
			run(l, func(co *Co) { errc <- roundTrip(co, byte('0'+i)) })
		}
		if err := <-errc; err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	c.Close()
}

func TestWaitReadableEither(t *testing.T) {
	l := startLoop(t)
	c1, p1 := pair(t)
	c2, p2 := pair(t)
	got := make(chan *Conn, 1)
	run(l, func(co *Co) {
		_ = c1.Bind(co)
		_ = c2.Bind(co)
		r, err := co.WaitReadable(c1, c2, time.Time{})
		if err != nil {
			t.Error(err)
		}
		got <- r
	})
	_ = p1
	if _, err := p2.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r != c2 {
		t.Fatalf("WaitReadable returned %p, want the second connection %p", r, c2)
	}
}

func TestGoOnReadableRestartsIdleConn(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	echoOnReadable(t, l, c)
	for i := 0; i < 3; i++ {
		echoRound(t, peer, byte('a'+i))
	}
}

// TestEndAfterDataIsRead: bytes and the peer's close arriving together are
// one edge; the end must still be read after the bytes.
func TestEndAfterDataIsRead(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	if _, err := peer.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	got := make(chan error, 1)
	run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			got <- err
			return
		}
		b := make([]byte, 64)
		n, err := c.Read(b) // a short read: the bytes
		if err != nil || string(b[:n]) != "last words" {
			got <- fmt.Errorf("first read %q, %v", b[:n], err)
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(b) // the end, with no further edge
		got <- err
	})
	if err := <-got; err != io.EOF {
		t.Fatalf("second read: %v, want EOF", err)
	}
}

// TestQuiet: a connection read to its end is quiet (known from epoll, no
// peek); bytes or the peer's close that arrive after make it not quiet; a
// connection the loop has not adopted is not known.
func TestQuiet(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	other, _ := pair(t)
	steps := make(chan string, 8)
	next := make(chan struct{})
	done := run(l, func(co *Co) {
		defer close(steps)
		if q, known := co.Quiet(other); known {
			steps <- fmt.Sprintf("not adopted: known (quiet %v)", q)
			return
		}
		if err := c.Bind(co); err != nil {
			steps <- err.Error()
			return
		}
		b := make([]byte, 64)
		expect := func(what string, wantQuiet bool) bool {
			if q, known := co.Quiet(c); !known || q != wantQuiet {
				steps <- fmt.Sprintf("%s: quiet %v known %v, want quiet %v", what, q, known, wantQuiet)
				return false
			}
			steps <- "ok"
			return true
		}
		if n, err := c.Read(b); err != nil || string(b[:n]) != "x" {
			steps <- fmt.Sprintf("read %q %v", b[:n], err)
			return
		}
		if !expect("after reading to the end", true) {
			return
		}
		<-next // the peer writes
		if _, err := co.WaitReadable(c, c, time.Now().Add(5*time.Second)); err != nil {
			steps <- err.Error()
			return
		}
		if !expect("bytes arrived", false) {
			return
		}
		if n, err := c.Read(b); err != nil || string(b[:n]) != "y" {
			steps <- fmt.Sprintf("read %q %v", b[:n], err)
			return
		}
		<-next // the peer closes
		if _, err := co.WaitReadable(c, c, time.Now().Add(5*time.Second)); err != nil {
			steps <- err.Error()
			return
		}
		expect("peer closed", false)
	})
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if s := <-steps; s != "ok" {
		t.Fatal(s)
	}
	if _, err := peer.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	next <- struct{}{}
	if s := <-steps; s != "ok" {
		t.Fatal(s)
	}
	peer.Close()
	next <- struct{}{}
	if s := <-steps; s != "ok" {
		t.Fatal(s)
	}
	<-done
}

// TestPostWakesOnlyParkedLoop: a post to a loop waiting in epoll_wait
// writes the eventfd once; a post from the loop itself (a coroutine
// unparking another) writes nothing, and both run.
func TestPostWakesOnlyParkedLoop(t *testing.T) {
	l := startLoop(t)
	state := func() (parked bool, wakes int) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.parked.Load(), l.wakes
	}
	waitParked := func() int {
		deadline := time.Now().Add(5 * time.Second)
		for {
			if parked, wakes := state(); parked {
				return wakes
			}
			if time.Now().After(deadline) {
				t.Fatal("the loop never waited in epoll_wait")
			}
			time.Sleep(time.Millisecond)
		}
	}
	before := waitParked()
	ran := make(chan int, 2)
	l.Post(func() {
		ran <- 1
		l.Post(func() { ran <- 2 }) // from the loop: no wake-up needed
	})
	for want := 1; want <= 2; want++ {
		select {
		case got := <-ran:
			if got != want {
				t.Fatalf("ran %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("posted function %d did not run", want)
		}
	}
	if _, wakes := state(); wakes != before+1 {
		t.Fatalf("%d eventfd wake-ups for a post to a parked loop and one from the loop itself, want 1", wakes-before)
	}
}

// TestIdleLoopWaitsInNetpoller: a loop idle for a while hands its wait to
// Go's netpoller (its thread and P go free, and the runtime stops
// preempting it), and from there a socket, a post and a timer each still
// wake it.
func TestIdleLoopWaitsInNetpoller(t *testing.T) {
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	const idle = 50 * time.Millisecond
	l.idleAfter = idle // idleAfter is a second
	go l.Run()
	t.Cleanup(l.Stop)
	idleWaits := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.idle
	}
	waitIdle := func(after int) int {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if n := idleWaits(); n > after {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatal("the idle loop never waited in the netpoller")
			}
			time.Sleep(time.Millisecond)
		}
	}

	c, peer := pair(t)
	echoOnReadable(t, l, c)

	n := waitIdle(0)
	// The netpoller wait blocks: an idle loop does not come back every
	// idle period (as it would if the descriptor were not pollable there).
	time.Sleep(8 * idle)
	if m := idleWaits(); m > n+1 {
		t.Fatalf("%d netpoller waits in %v of idleness, want at most 1 more", m-n, 8*idle)
	}
	n = idleWaits()
	for i := 0; i < 3; i++ {
		echoRound(t, peer, byte('a'+i))
		n = waitIdle(n)
	}

	ran := make(chan struct{})
	l.Post(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("a post did not wake the idle loop")
	}
	waitIdle(n)

	const timer = 50 * time.Millisecond
	start := time.Now()
	parked := make(chan error, 1)
	run(l, func(co *Co) { parked <- co.Park(time.Now().Add(timer)) })
	select {
	case err := <-parked:
		if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) < timer {
			t.Fatalf("Park on an idle loop ended after %v with %v, want the deadline (%v)", time.Since(start), err, timer)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a timer did not wake the idle loop")
	}
}

// pipeConn is a net.Conn over an os.Pipe: it has a descriptor
// (syscall.Conn) that is not a socket.
type pipeConn struct {
	r, w *os.File
}

func (p pipeConn) Read(b []byte) (int, error)         { return p.r.Read(b) }
func (p pipeConn) Write(b []byte) (int, error)        { return p.w.Write(b) }
func (p pipeConn) Close() error                       { p.w.Close(); return p.r.Close() }
func (p pipeConn) LocalAddr() net.Addr                { return &net.UnixAddr{Name: "pipe"} }
func (p pipeConn) RemoteAddr() net.Addr               { return &net.UnixAddr{Name: "pipe"} }
func (p pipeConn) SetDeadline(t time.Time) error      { return p.r.SetDeadline(t) }
func (p pipeConn) SetReadDeadline(t time.Time) error  { return p.r.SetReadDeadline(t) }
func (p pipeConn) SetWriteDeadline(t time.Time) error { return p.w.SetWriteDeadline(t) }
func (p pipeConn) SyscallConn() (syscall.RawConn, error) {
	return p.r.SyscallConn()
}

// TestBindLeavesNonSocketsToGo: a descriptor that is not a socket is not
// adopted (the loop reads and writes with socket calls); the connection
// stays a Go connection that still carries bytes.
func TestBindLeavesNonSocketsToGo(t *testing.T) {
	l := startLoop(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c := Wrap(pipeConn{r: r, w: w})
	defer c.Close()
	var bindErr error
	got := make([]byte, 5)
	var readErr error
	<-run(l, func(co *Co) {
		bindErr = c.Bind(co)
		if _, err := c.Write([]byte("hello")); err != nil {
			readErr = err
			return
		}
		_, readErr = io.ReadFull(c, got)
	})
	if !errors.Is(bindErr, errNotSocket) {
		t.Fatalf("Bind of a pipe: %v, want errNotSocket", bindErr)
	}
	if c.Adopted() {
		t.Fatal("a pipe was adopted")
	}
	if readErr != nil || string(got) != "hello" {
		t.Fatalf("through the pipe: %q %v", got, readErr)
	}
}

// TestConnAddresses checks that a wrapped connection reports the addresses
// of the Go connection it came from, before and after a loop adopts it (TCP
// addresses are kept as values, Unix ones as they came).
func TestConnAddresses(t *testing.T) {
	unixPath := fmt.Sprintf("%s/evloop-%d.sock", t.TempDir(), os.Getpid())
	for _, tc := range []struct{ network, addr string }{
		{"tcp4", "127.0.0.1:0"},
		{"tcp6", "[::1]:0"},
		{"unix", unixPath},
	} {
		t.Run(tc.network, func(t *testing.T) {
			ln, err := net.Listen(tc.network, tc.addr)
			if err != nil {
				t.Skipf("%s not available here: %v", tc.network, err)
			}
			defer ln.Close()
			cc, err := net.Dial(tc.network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			sc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			wantLocal, wantRemote := sc.LocalAddr(), sc.RemoteAddr()
			c := Wrap(sc)
			check := func(when string) {
				t.Helper()
				for _, a := range []struct {
					name      string
					got, want net.Addr
				}{{"local", c.LocalAddr(), wantLocal}, {"remote", c.RemoteAddr(), wantRemote}} {
					if a.got.Network() != a.want.Network() || a.got.String() != a.want.String() {
						t.Errorf("%s: %s address %s %q, want %s %q", when, a.name, a.got.Network(), a.got, a.want.Network(), a.want)
					}
				}
			}
			check("wrapped")
			l := startLoop(t)
			bound := make(chan error, 1)
			<-run(l, func(co *Co) { bound <- c.Bind(co) })
			if err := <-bound; err != nil {
				t.Fatal(err)
			}
			check("adopted")
			_ = c.Close()
		})
	}
}

// ringModes are the two ways a loop moves a turn's bytes: through io_uring
// and with a system call each.
var ringModes = []struct {
	name string
	o    Options
}{{"io_uring", Options{}}, {"one_call_each", Options{NoRing: true}}}

// newLoopIn returns a new loop with options o; asked for io_uring where
// the kernel refuses it, it fails under CI and otherwise logs that the
// loop makes one call per operation.
func newLoopIn(t *testing.T, o Options) *Loop {
	t.Helper()
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if !o.NoRing && !l.UsesRing() {
		if os.Getenv("CI") != "" {
			t.Fatal("io_uring is not available")
		}
		t.Log("io_uring is not available here: the loop makes one call per operation")
	}
	return l
}

// TestDeferredWritesArriveWhole runs many coroutines on one loop that each
// answer their peer's tokens with deferred writes of random sizes (a few
// larger than a socket takes at once), with and without io_uring, and
// checks every byte arrives in order: a turn's writes go out together,
// partial sends are finished later, and a Write after deferred bytes sends
// them first.
func TestDeferredWritesArriveWhole(t *testing.T) {
	for _, tc := range ringModes {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoopIn(t, tc.o)
			go l.Run()
			t.Cleanup(l.Stop)
			const clients, rounds = 24, 40
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			size := func(rng *rand.Rand) int {
				if rng.Intn(10) == 0 {
					return 20000 + rng.Intn(60000) // past maxDeferred or a socket's buffer
				}
				return 1 + rng.Intn(3000)
			}
			fill := func(b []byte, client, off int) {
				for k := range b {
					b[k] = byte((off+k)*7 + client)
				}
			}
			var wg sync.WaitGroup
			for i := 0; i < clients; i++ {
				c, peer := pair(t)
				// Small buffers: sends are partial and EAGAIN is common.
				_ = c.inner.(*net.TCPConn).SetWriteBuffer(8 << 10)
				_ = peer.(*net.TCPConn).SetReadBuffer(8 << 10)
				run(l, func(co *Co) {
					if err := c.Bind(co); err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					rng := rand.New(rand.NewSource(seed + int64(i)))
					token, off := make([]byte, 1), 0
					for r := 0; r < rounds; r++ {
						if _, err := io.ReadFull(c, token); err != nil {
							t.Error(err)
							return
						}
						b := make([]byte, size(rng))
						fill(b, i, off)
						off += len(b)
						write := c.WriteDeferred
						if rng.Intn(5) == 0 {
							write = c.Write
						}
						if n, err := write(b); err != nil || n != len(b) {
							t.Errorf("client %d round %d: wrote %d of %d: %v", i, r, n, len(b), err)
							return
						}
					}
				})
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					defer peer.Close()
					rng := rand.New(rand.NewSource(seed + int64(i)))
					off := 0
					for r := 0; r < rounds; r++ {
						if _, err := peer.Write([]byte{1}); err != nil {
							t.Error(err)
							return
						}
						n := size(rng)
						rng.Intn(5) // the writer's choice of Write or WriteDeferred
						got, want := make([]byte, n), make([]byte, n)
						_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second))
						if _, err := io.ReadFull(peer, got); err != nil {
							t.Errorf("client %d round %d: %v", i, r, err)
							return
						}
						fill(want, i, off)
						off += n
						if !bytes.Equal(got, want) {
							t.Errorf("client %d round %d: bytes out of order", i, r)
							return
						}
					}
				}(i)
			}
			wg.Wait()
		})
	}
}

// TestReadsArriveWhole: many coroutines on one loop read streams their
// peers write in random pieces, each into buffers of random size, so that
// several sockets are readable in one turn (then the loop receives for all
// of them with one io_uring submission); every byte arrives once and in
// order, and a peer's close reads as io.EOF after its last byte (with
// io_uring and without).
func TestReadsArriveWhole(t *testing.T) {
	for _, tc := range ringModes {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoopIn(t, tc.o)
			ring := l.UsesRing()
			go l.Run()
			const clients, total = 24, 200 << 10
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			stream := func(b []byte, client, off int) {
				for k := range b {
					b[k] = byte((off+k)*13 + client)
				}
			}
			var wg sync.WaitGroup
			var done []chan struct{}
			for i := 0; i < clients; i++ {
				c, peer := pair(t)
				done = append(done, run(l, func(co *Co) {
					if err := c.Bind(co); err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					rng := rand.New(rand.NewSource(seed - int64(i)))
					want, off := make([]byte, 16<<10), 0
					for {
						b := make([]byte, 1+rng.Intn(8000))
						n, err := c.Read(b)
						if err == io.EOF && n == 0 {
							break
						}
						if err != nil {
							t.Errorf("client %d at %d: %v", i, off, err)
							return
						}
						stream(want[:n], i, off)
						if !bytes.Equal(b[:n], want[:n]) {
							t.Errorf("client %d: bytes %d..%d are not the stream's", i, off, off+n)
							return
						}
						off += n
					}
					if off != total {
						t.Errorf("client %d: read %d bytes before EOF, the peer wrote %d", i, off, total)
					}
				}))
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(seed + int64(i)))
					for off := 0; off < total; {
						n := min(1+rng.Intn(6000), total-off)
						b := make([]byte, n)
						stream(b, i, off)
						if _, err := peer.Write(b); err != nil {
							t.Error(err)
							return
						}
						off += n
						if rng.Intn(4) == 0 {
							runtime.Gosched()
						}
					}
					_ = peer.Close()
				}(i)
			}
			wg.Wait()
			for _, d := range done {
				<-d
			}
			l.Stop()
			if ring && l.ringReceives == 0 {
				t.Error("the loop never received through io_uring")
			}
			t.Logf("%d receives through io_uring", l.ringReceives)
		})
	}
}

// TestDeferredWriteErrorReachesNextWrite: a deferred write to a peer that
// reset the connection fails at the end of the turn, and the owner's next
// write reports it (with io_uring and without).
func TestDeferredWriteErrorReachesNextWrite(t *testing.T) {
	for _, o := range []Options{{}, {NoRing: true}} {
		l, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		go l.Run()
		c, peer := pair(t)
		c2, peer2 := pair(t)
		_ = peer.(*net.TCPConn).SetLinger(0)
		_ = peer.Close() // a reset: the next send fails
		done := run(l, func(co *Co) {
			if err := c.Bind(co); err != nil {
				t.Error(err)
				return
			}
			if err := c2.Bind(co); err != nil {
				t.Error(err)
				return
			}
			// Two connections in one turn: the io_uring batch.
			for k := 0; k < 50; k++ {
				if _, err := c.WriteDeferred([]byte("hello")); err != nil {
					return // the reset was seen: the test passes
				}
				if _, err := c2.WriteDeferred([]byte("x")); err != nil {
					t.Errorf("healthy connection: %v", err)
					return
				}
				if err := co.Park(time.Now().Add(10 * time.Millisecond)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Error(err)
					return
				}
			}
			t.Errorf("no write failed after the peer reset (ring %v)", l.UsesRing())
		})
		<-done
		buf := make([]byte, 64)
		_ = peer2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := peer2.Read(buf); err != nil || n == 0 || !bytes.Equal(buf[:n], bytes.Repeat([]byte("x"), n)) {
			t.Errorf("healthy peer got %q, %v", buf[:n], err)
		}
		l.Stop()
	}
}

// bindAndDefer binds each of conns to co and holds p for it with
// WriteDeferred; it reports false (after t.Error) if either fails.
func bindAndDefer(t *testing.T, co *Co, p []byte, conns ...*Conn) bool {
	for _, x := range conns {
		if err := x.Bind(co); err != nil {
			t.Error(err)
			return false
		}
		if _, err := x.WriteDeferred(p); err != nil {
			t.Error(err)
			return false
		}
	}
	return true
}

// TestFlushWritesDeferredBytes: Flush writes the bytes WriteDeferred holds
// before it returns, and the loop does not touch the connection after it
// (and Unbind); a connection only unbound keeps its bytes queued for the
// loop's turn.
func TestFlushWritesDeferredBytes(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	c2, peer2 := pair(t)
	done := run(l, func(co *Co) {
		if !bindAndDefer(t, co, []byte("before unbind"), c, c2) {
			return
		}
		if err := c.Flush(); err != nil {
			t.Error(err)
		}
		c.Unbind()
		c2.Unbind()
	})
	<-done
	// Nothing of the loop writes c now: another goroutine may use it.
	if _, err := c.Write([]byte("; after")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		conn net.Conn
		want string
	}{{peer, "before unbind; after"}, {peer2, "before unbind"}} {
		got := make([]byte, len(p.want))
		_ = p.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(p.conn, got); err != nil || string(got) != p.want {
			t.Errorf("peer got %q, %v; want %q", got, err, p.want)
		}
	}
}

// TestDropDeferredSendsNothing: bytes held by WriteDeferred and dropped in
// the same turn (a server connection being destroyed) never reach the peer,
// not even in part, while another connection's deferred bytes of that
// turn still go out whole.
func TestDropDeferredSendsNothing(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	c2, peer2 := pair(t)
	done := run(l, func(co *Co) {
		if !bindAndDefer(t, co, []byte("Q: a query"), c, c2) {
			return
		}
		c.DropDeferred()
		c.Unbind()
		c2.Unbind()
	})
	<-done
	if err := c.Close(); err != nil { // as the pool closes it, after the turn
		t.Fatal(err)
	}
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(peer); err != nil || len(got) != 0 {
		t.Errorf("the dropped connection's peer got %q, %v; want nothing, then EOF", got, err)
	}
	got := make([]byte, len("Q: a query"))
	_ = peer2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer2, got); err != nil || string(got) != "Q: a query" {
		t.Errorf("the other peer got %q, %v", got, err)
	}
}

// TestUnbindSharedCloseWakesReader: a connection unbound with UnbindShared
// is read on a goroutine of its own, waiting in poll(2) with no deadline;
// a Close from another goroutine wakes that read, which fails, and a
// second Close says so. Under -race, the two goroutines share nothing
// unguarded.
func TestUnbindSharedCloseWakesReader(t *testing.T) {
	l := startLoop(t)
	c, peer := pair(t)
	<-run(l, func(co *Co) {
		if err := c.Bind(co); err != nil {
			t.Error(err)
			return
		}
		c.UnbindShared()
	})
	if t.Failed() {
		return
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	reading := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		if n, err := c.Read(b); n != 1 || err != nil {
			readErr <- fmt.Errorf("first read: %d, %v", n, err)
			return
		}
		close(reading)
		_, err := c.Read(b) // waits: the peer sends nothing more
		readErr <- err
	}()
	select {
	case <-reading:
	case err := <-readErr:
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the read after Close returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the reader")
	}
	if err := c.Close(); err == nil {
		t.Error("a second Close returned no error")
	}
	// The peer sees the end of the connection.
	_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := peer.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("peer read after Close: %d, %v", n, err)
	}
}
