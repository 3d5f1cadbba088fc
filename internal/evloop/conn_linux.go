//go:build linux

package evloop

import (
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is a connection that a loop can adopt. Until then it is the Go
// connection it wraps; after, it reads and writes its own non-blocking
// descriptor: through its coroutine's loop while bound (Bind), in poll(2)
// while not.
type Conn struct {
	inner net.Conn // the Go connection until adoption; nil after
	fd    int      // the adopted descriptor (-1 before)
	home  *Loop    // the loop whose epoll holds fd
	owner *Co      // the coroutine the connection is bound to

	addrs    endpoints
	rdl, wdl time.Time
	closed   atomic.Bool

	// Deferred writes (WriteDeferred): bytes the loop writes at the end of
	// its turn (queued: the loop has the Conn on its list); werr is the
	// error such a write met, for the next Write. queued sits beside closed,
	// so the Conn fits a 224-byte allocation.
	queued bool
	wbuf   []byte
	werr   error

	// shared is set by UnbindShared: the poll(2) reads and writes of one
	// goroutine meet a Close from another through it.
	shared *sharedIO
}

// sharedIO lets the reads and writes of an unbound connection (in poll(2))
// and a Close from another goroutine meet safely: Close shuts the socket
// down, which wakes a poll(2) waiting on it, and the descriptor is closed
// by whichever ends last, so that its number cannot be reused by another
// connection under a read, write or poll still running.
type sharedIO struct {
	mu      sync.Mutex
	users   int  // reads and writes under way
	closing bool // Close ran: the last user closes the descriptor
}

// enter counts a read or write; false when c is closed.
func (sh *sharedIO) enter() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closing {
		return false
	}
	sh.users++
	return true
}

// leave ends a read or write, closing fd when Close ran meanwhile and
// this was the last one.
func (sh *sharedIO) leave(fd int) {
	sh.mu.Lock()
	sh.users--
	last := sh.closing && sh.users == 0
	sh.mu.Unlock()
	if last {
		_ = rawClose(fd)
	}
}

// Wrap returns nc as a Conn a loop can adopt later.
func Wrap(nc net.Conn) *Conn {
	if c, ok := nc.(*Conn); ok {
		return c
	}
	return &Conn{inner: nc, fd: -1, addrs: endpointsOf(nc)}
}

// endpoints are a connection's two addresses. TCP addresses are kept as
// values, so an idle client's connection holds no address objects (with
// thousands of idle clients they were 0.16 kB of each one's memory);
// others (Unix sockets) as they came.
type endpoints struct {
	local, remote netip.AddrPort // TCP
	other         *[2]net.Addr   // not TCP: local, remote
}

func endpointsOf(nc net.Conn) endpoints {
	l, lok := nc.LocalAddr().(*net.TCPAddr)
	r, rok := nc.RemoteAddr().(*net.TCPAddr)
	if lok && rok {
		return endpoints{local: l.AddrPort(), remote: r.AddrPort()}
	}
	return endpoints{other: &[2]net.Addr{nc.LocalAddr(), nc.RemoteAddr()}}
}

func (e *endpoints) addr(i int) net.Addr {
	if e.other != nil {
		return e.other[i]
	}
	if i == 0 {
		return net.TCPAddrFromAddrPort(e.local)
	}
	return net.TCPAddrFromAddrPort(e.remote)
}

// Bind adopts c into co's loop (once) and makes co its only user: its
// reads and writes then yield to the loop when the socket is not ready.
// A connection that has no descriptor stays a Go connection and Bind
// returns an error; using it still works (a blocking wait stalls the loop).
func (c *Conn) Bind(co *Co) error {
	if c.fd < 0 {
		if err := c.adopt(); err != nil {
			return err
		}
	}
	if err := c.homeOn(co.loop); err != nil {
		return err
	}
	c.owner = co
	return nil
}

// Unbind ends the binding: c may go to another goroutine or coroutine.
// Bytes WriteDeferred holds stay queued for the loop's turn, which writes
// them even unbound (a resting session's last reply); a connection that
// may leave the loop (to the pool) is flushed first (Flush).
func (c *Conn) Unbind() { c.owner = nil }

// UnbindShared is Unbind for a connection that one goroutine goes on
// reading and writing while another may Close it (an admin console,
// ended by a shutdown): that Close wakes the reader, which gets an
// error, and the descriptor is closed once neither uses it. c must be
// adopted.
func (c *Conn) UnbindShared() {
	c.owner = nil
	if c.shared == nil {
		c.shared = &sharedIO{}
	}
}

// Flush writes the bytes WriteDeferred holds now, in the bound coroutine
// (waiting up to a second for a full socket, as Close does), and takes c
// off its loop's list of deferred writes: after it, nothing of the loop
// touches c, so c may go to another goroutine or loop.
func (c *Conn) Flush() error {
	co := c.owner
	if co == nil {
		return nil
	}
	if len(c.wbuf) > 0 && c.werr == nil && !c.closed.Load() {
		if c.wdl.IsZero() {
			c.wdl = time.Now().Add(time.Second)
			defer func() { c.wdl = time.Time{} }()
		}
		pending := c.wbuf
		c.wbuf = nil
		if _, err := c.writeNow(co, pending, nil); err != nil {
			c.werr = err
		}
	}
	c.unqueue()
	return c.werr
}

// Adopted reports whether c reads and writes its own descriptor.
func (c *Conn) Adopted() bool { return c.fd >= 0 }

// adopt takes the descriptor out of the Go connection: a duplicate is kept
// and the Go connection closed, which removes it from the runtime's
// netpoller. The duplicate shares the (non-blocking) open file description.
func (c *Conn) adopt() error {
	sc, ok := c.inner.(syscall.Conn)
	if !ok {
		return errNotSocket
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		if _, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
			derr = errNotSocket // a pipe or file: rawRead and rawWrite are socket calls
			return
		}
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if derr != nil {
			derr = os.NewSyscallError("fcntl", derr)
		}
	}); err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		_ = unix.Close(nfd)
		return os.NewSyscallError("fcntl", err)
	}
	_ = c.inner.Close()
	c.inner = nil
	c.fd = nfd
	return nil
}

// homeOn moves c's descriptor into l's epoll.
func (c *Conn) homeOn(l *Loop) error {
	if c.home == l {
		return nil
	}
	if c.home != nil {
		_ = rawEpollCtl(c.home.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
		c.home = nil
	}
	ev := unix.EpollEvent{Events: pollEvents, Fd: int32(c.fd)}
	if err := rawEpollCtl(l.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	c.home = l
	s := l.slot(c.fd)
	s.ready, s.waiter = readable|writable, nil
	return nil
}

func (c *Conn) opError(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: c.network(), Source: c.addrs.addr(0), Addr: c.addrs.addr(1), Err: err}
}

func (c *Conn) network() string {
	if r := c.addrs.addr(1); r != nil {
		return r.Network()
	}
	return "tcp"
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	if c.inner != nil {
		return c.inner.Read(p)
	}
	if c.closed.Load() {
		return 0, c.opError("read", net.ErrClosed)
	}
	if len(p) == 0 {
		return 0, nil
	}
	co := c.owner
	if co == nil {
		return c.pollRead(p)
	}
	s := co.loop.slot(c.fd)
	for {
		if s.ready&readable != 0 {
			n, err := rawRead(c.fd, p)
			e, _ := err.(unix.Errno) // rawRead's only error type
			if n, done, err := c.received(s, len(p), n, e); done {
				return n, err
			}
			continue
		}
		if err := c.werr; err != nil {
			// A deferred write failed: the peer will not answer what it
			// did not get, so waiting for a reply would wait forever.
			return 0, err
		}
		co.rconn, co.rbuf = c, p
		err := co.wait(c, readable, nil, 0, c.rdl)
		co.rconn, co.rbuf = nil, nil
		s = co.loop.slot(c.fd)
		if co.rdone {
			// The loop received for this Read (receiveAll). Bytes it took
			// are returned even when the wait also ended otherwise: the
			// error shows at the next Read.
			co.rdone = false
			n, e := int(co.rres), unix.Errno(0)
			if n < 0 {
				n, e = 0, unix.Errno(-n)
			}
			if n, done, rerr := c.received(s, len(p), n, e); done {
				return n, rerr
			}
		}
		if err != nil {
			return 0, c.opError("read", err)
		}
	}
}

// received is Read's one rule for the outcome of a receive of up to want
// bytes on c, made by Read itself or by the loop (receiveAll): n bytes, or
// the error e. It keeps s's readiness true to the socket and reports
// whether Read returns (with n and err) or goes on (EAGAIN: nothing was
// there after all; EINTR).
func (c *Conn) received(s *slot, want, n int, e unix.Errno) (int, bool, error) {
	switch {
	case e == 0 && n > 0:
		if n < want && s.ready&hup == 0 {
			s.ready &^= readable // drained; the next bytes or the end come with an edge
		}
		return n, true, nil
	case e == 0:
		return 0, true, io.EOF
	case e == unix.EAGAIN:
		s.ready &^= readable
		return 0, false, nil
	case e == unix.EINTR:
		return 0, false, nil
	default:
		return 0, true, c.opError("read", os.NewSyscallError("read", e))
	}
}

// maxDeferred bounds the bytes WriteDeferred keeps for the loop.
const maxDeferred = 64 << 10

// WriteDeferred queues p for the loop to write at the end of its turn,
// together with the other replies of that turn, just before it waits again
// (the peers it wakes then do not preempt a loop that still has work). It
// is for the bound coroutine; bytes are written in order with Write's. A
// connection outside a loop, or a large write, is written now.
func (c *Conn) WriteDeferred(p []byte) (int, error) {
	co := c.owner
	if co == nil || c.inner != nil || len(c.wbuf)+len(p) > maxDeferred {
		return c.Write(p)
	}
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if err := c.werr; err != nil {
		return 0, err
	}
	c.wbuf = append(c.wbuf, p...)
	if !c.queued {
		c.queued = true
		co.loop.flushq = append(co.loop.flushq, c)
	}
	return len(p), nil
}

// flushDeferred writes what WriteDeferred queued, on the loop goroutine,
// without waiting. What the socket does not take now is written when epoll
// says it is writable (or by the owner's next Write).
func (c *Conn) flushDeferred(l *Loop) {
	c.queued = false
	if len(c.wbuf) == 0 || c.closed.Load() || c.werr != nil || c.home != l {
		return
	}
	s := l.slot(c.fd)
	for len(c.wbuf) > 0 {
		n, err := rawWrite(c.fd, c.wbuf)
		switch {
		case n > 0:
			c.wbuf = c.wbuf[:copy(c.wbuf, c.wbuf[n:])]
			continue
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			s.ready &^= writable
			s.flush = c
			return
		default:
			c.failDeferred(l, err)
			return
		}
	}
	if cap(c.wbuf) > 4<<10 {
		c.wbuf = nil
	}
}

// failDeferred records that a deferred write of c failed with err and
// wakes a coroutine waiting to read c, whose Read then reports it.
func (c *Conn) failDeferred(l *Loop, err error) {
	c.werr = c.opError("write", os.NewSyscallError("write", err))
	c.wbuf = c.wbuf[:0]
	s := l.slot(c.fd)
	if co := s.waiter; co != nil {
		s.ready |= readable // the read finds EAGAIN, then werr
		l.Post(func() {
			if co.wants(l) {
				l.resume(co)
			}
		})
	}
}

// DropDeferred forgets the bytes WriteDeferred holds and takes c off its
// loop's list: for a connection about to be closed whose peer needs
// nothing more (a server connection being destroyed). Only the bound
// coroutine calls it.
func (c *Conn) DropDeferred() {
	c.wbuf = nil
	c.unqueue()
}

// unqueue takes c off its owner's loop's list of deferred writes.
func (c *Conn) unqueue() {
	if !c.queued || c.owner == nil {
		return
	}
	c.queued = false
	q := c.owner.loop.flushq
	for i := range q {
		if q[i] == c {
			q[i] = nil
		}
	}
}

// Write implements net.Conn.
func (c *Conn) Write(p []byte) (int, error) { return c.write(p, nil) }

// write is Write, and WriteDraining when drain is not nil.
func (c *Conn) write(p []byte, drain func() (bool, error)) (int, error) {
	if c.inner != nil {
		return c.inner.Write(p)
	}
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if err := c.werr; err != nil {
		return 0, err
	}
	co := c.owner
	if co == nil {
		return c.pollWrite(p)
	}
	if len(c.wbuf) > 0 {
		// Deferred bytes go first.
		pending := c.wbuf
		c.wbuf = nil
		if _, err := c.writeNow(co, pending, drain); err != nil {
			return 0, err
		}
	}
	return c.writeNow(co, p, drain)
}

// WriteDeferredDraining is WriteDeferred whose large writes go through
// WriteDraining: what it cannot queue is written now, reading c meanwhile
// with drain while c takes nothing.
func (c *Conn) WriteDeferredDraining(p []byte, drain func() (bool, error)) (int, error) {
	if c.owner == nil || c.inner != nil || len(c.wbuf)+len(p) > maxDeferred {
		return c.WriteDraining(p, drain)
	}
	return c.WriteDeferred(p)
}

// WriteDraining writes p now, like Write, for the bound coroutine; while
// the socket takes nothing and has something to read, it calls drain
// (which reads c) instead of only waiting. It is for a peer that stops
// reading until its own output is read: a PostgreSQL server sends notices
// and errors while it reads COPY data, and blocks on a full socket. drain
// returning false leaves the rest unread (the write then waits for the
// socket to take more); an error ends the write with it.
func (c *Conn) WriteDraining(p []byte, drain func() (bool, error)) (int, error) {
	return c.write(p, drain)
}

// writeNow writes p through co's loop; with drain (not nil) it calls
// drain instead of only waiting while c takes nothing and has something
// to read, until drain says false.
func (c *Conn) writeNow(co *Co, p []byte, drain func() (bool, error)) (int, error) {
	done := 0
	draining := drain != nil
	for done < len(p) {
		s := co.loop.slot(c.fd)
		if s.ready&writable != 0 {
			n, err := rawWrite(c.fd, p[done:])
			switch {
			case n > 0:
				done += n
				if done < len(p) {
					s.ready &^= writable
				}
				continue
			case err == unix.EAGAIN:
				s.ready &^= writable
			case err == unix.EINTR:
				continue
			case err != nil:
				return done, c.opError("write", os.NewSyscallError("write", err))
			}
		}
		if draining && c.peekReadable(co) {
			more, err := drain()
			if err != nil {
				return done, err
			}
			draining = more
			continue
		}
		want := writable
		if draining {
			want |= readable
		}
		if err := co.wait(c, want, nil, 0, c.wdl); err != nil {
			return done, c.opError("write", err)
		}
	}
	return done, nil
}

// peekReadable reports whether c has a byte to read or its end to report,
// without consuming anything: an assumed readiness is checked with a
// non-blocking peek and cleared when it was wrong.
func (c *Conn) peekReadable(co *Co) bool {
	s := co.loop.slot(c.fd)
	if s.ready&readable == 0 {
		return false
	}
	return c.peekNow(s)
}

// Quiet reports whether nothing has arrived on nc since it was last read
// to its end, for a connection adopted by co's loop (nc is a *Conn, or a
// *tls.Conn over one: what is checked is the socket below). An idle
// PostgreSQL server sends nothing, so anything there is a FATAL or the
// end. With no readiness recorded it costs no system call; otherwise a
// non-blocking peek decides (and clears a readiness that was wrong). known
// is false when nc is not such a connection: the caller checks another
// way. Call it on co's loop (from co).
func (co *Co) Quiet(nc net.Conn) (quiet, known bool) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	c, ok := nc.(*Conn)
	if !ok || c.fd < 0 || c.home != co.loop || c.closed.Load() {
		return false, false
	}
	s := co.loop.slot(c.fd)
	switch {
	case s.ready&hup != 0:
		return false, true
	case s.ready&readable == 0:
		return true, true
	}
	return !c.peekNow(s), true
}

// peekNow checks readability with a non-blocking peek and records the
// answer in s.
func (c *Conn) peekNow(s *slot) bool {
	var b [1]byte
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(c.fd), uintptr(unsafe.Pointer(&b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		var err error
		if e != 0 {
			err = e
		} else {
			raceWriteRange(unsafe.Pointer(&b[0]), int(r))
		}
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			s.ready &^= readable
			return false
		}
		return true // a byte, the end, or an error a read reports
	}
}

// rawRead and rawWrite are recvfrom(2) and sendto(2) on a non-blocking
// socket, without the runtime's syscall bookkeeping: they cannot block,
// so the thread keeps its P and sysmon is not woken (entersyscall wakes a
// sleeping sysmon, one thread wake-up per idle-to-busy turn otherwise).
// The socket calls skip read(2) and write(2)'s file layer (the position
// lock, the permission and notification hooks), and MSG_NOSIGNAL makes a
// write to a closed peer return EPIPE without raising SIGPIPE.
//
// Without the syscall package they also lack its race annotations: they
// tell the race detector themselves what the kernel wrote (raceWriteRange)
// and what it may read (raceReadRange), so that `go test -race` sees a
// goroutine touching a buffer while a read or write uses it.
func rawRead(fd int, p []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	raceWriteRange(unsafe.Pointer(unsafe.SliceData(p)), int(r))
	return int(r), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	raceReadRange(unsafe.Pointer(unsafe.SliceData(p)), len(p))
	r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// pollRead reads an unbound adopted connection, waiting in poll(2).
func (c *Conn) pollRead(p []byte) (int, error) {
	if sh := c.shared; sh != nil {
		if !sh.enter() {
			return 0, c.opError("read", net.ErrClosed)
		}
		defer sh.leave(c.fd)
	}
	for {
		n, err := unix.Read(c.fd, p)
		switch {
		case err == nil && n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return 0, c.opError("read", os.NewSyscallError("read", err))
		}
		if err := pollWait(c.fd, unix.POLLIN, c.rdl); err != nil {
			return 0, c.opError("read", err)
		}
	}
}

// pollWrite writes an unbound adopted connection, waiting in poll(2).
func (c *Conn) pollWrite(p []byte) (int, error) {
	if sh := c.shared; sh != nil {
		if !sh.enter() {
			return 0, c.opError("write", net.ErrClosed)
		}
		defer sh.leave(c.fd)
	}
	done := 0
	for done < len(p) {
		n, err := unix.Write(c.fd, p[done:])
		switch {
		case n > 0:
			done += n
			continue
		case err == unix.EINTR:
			continue
		case err != nil && err != unix.EAGAIN:
			return done, c.opError("write", os.NewSyscallError("write", err))
		}
		if err := pollWait(c.fd, unix.POLLOUT, c.wdl); err != nil {
			return done, c.opError("write", err)
		}
	}
	return done, nil
}

// pollWait waits in poll(2) until fd is ready for events or the deadline.
func pollWait(fd int, events int16, deadline time.Time) error {
	for {
		ms := -1
		if !deadline.IsZero() {
			d := time.Until(deadline)
			if d <= 0 {
				return os.ErrDeadlineExceeded
			}
			ms = int((d + time.Millisecond - 1) / time.Millisecond)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return os.NewSyscallError("poll", err)
		}
		if n > 0 {
			return nil
		}
	}
}

// Close implements net.Conn. The descriptor is closed at once (which takes
// it out of its loop's epoll); only the connection's user may close it.
func (c *Conn) Close() error {
	if c.inner != nil {
		return c.inner.Close()
	}
	if sh := c.shared; sh != nil && c.owner == nil {
		if c.closed.Swap(true) {
			return errClosedTwice
		}
		sh.mu.Lock()
		sh.closing = true
		busy := sh.users > 0
		sh.mu.Unlock()
		if busy {
			// Wakes the user's poll(2); it closes the descriptor.
			return unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
		return rawClose(c.fd)
	}
	if co := c.owner; co != nil && len(c.wbuf) > 0 && c.werr == nil && !c.closed.Load() {
		// Deferred replies are not dropped by a close right behind them.
		if c.wdl.IsZero() {
			c.wdl = time.Now().Add(time.Second)
		}
		pending := c.wbuf
		c.wbuf = nil
		_, _ = c.writeNow(co, pending, nil)
	}
	if c.closed.Swap(true) {
		return errClosedTwice
	}
	c.owner, c.home = nil, nil
	return rawClose(c.fd)
}

// rawEpollCtl is epoll_ctl as a raw system call: it cannot block, and the
// scheduler need not hear of it (through the scheduler, a call sysmon
// happens to find under way hands the loop's P to another thread).
func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	if ev != nil {
		raceReadRange(unsafe.Pointer(ev), int(unsafe.Sizeof(*ev)))
	}
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// rawClose is close(2) as a raw system call, for sockets: with no
// SO_LINGER (lockpool sets none) closing a socket does not wait, though
// sending its FIN and waking its peer takes long enough for sysmon to see a
// scheduled call under way and hand the P to another thread.
func rawClose(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// errClosedTwice is Close's error for a connection closed already: made
// once, since the end of a session closes its client's socket and the
// session's owner closes it again.
var errClosedTwice error = &net.OpError{Op: "close", Net: "tcp", Err: net.ErrClosed}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.addrs.addr(0) }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.addrs.addr(1) }

// RemoteString is RemoteAddr().String(), made with one allocation instead
// of three for a TCP connection.
func (c *Conn) RemoteString() string {
	if r := c.addrs.remote; c.addrs.other == nil && r.IsValid() {
		if a := r.Addr(); a.Is4In6() {
			r = netip.AddrPortFrom(a.Unmap(), r.Port()) // as net.IP prints it
		}
		return r.String()
	}
	return c.RemoteAddr().String()
}

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.inner != nil {
		return c.inner.SetDeadline(t)
	}
	c.rdl, c.wdl = t, t
	return nil
}

// SetReadDeadline implements net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.inner != nil {
		return c.inner.SetReadDeadline(t)
	}
	c.rdl = t
	return nil
}

// SetWriteDeadline implements net.Conn.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.inner != nil {
		return c.inner.SetWriteDeadline(t)
	}
	c.wdl = t
	return nil
}

// SyscallConn implements syscall.Conn (a non-blocking peek, socket options).
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	if c.inner != nil {
		if sc, ok := c.inner.(syscall.Conn); ok {
			return sc.SyscallConn()
		}
		return nil, errNotSocket
	}
	return rawConn{c}, nil
}

// rawConn gives an adopted descriptor to syscall-level code.
type rawConn struct{ c *Conn }

func (r rawConn) Control(f func(fd uintptr)) error {
	if r.c.closed.Load() {
		return net.ErrClosed
	}
	f(uintptr(r.c.fd))
	return nil
}

func (r rawConn) Read(f func(fd uintptr) bool) error {
	for {
		if r.c.closed.Load() {
			return net.ErrClosed
		}
		if f(uintptr(r.c.fd)) {
			return nil
		}
		if err := pollWait(r.c.fd, unix.POLLIN, r.c.rdl); err != nil {
			return err
		}
	}
}

func (r rawConn) Write(f func(fd uintptr) bool) error {
	for {
		if r.c.closed.Load() {
			return net.ErrClosed
		}
		if f(uintptr(r.c.fd)) {
			return nil
		}
		if err := pollWait(r.c.fd, unix.POLLOUT, r.c.wdl); err != nil {
			return err
		}
	}
}
