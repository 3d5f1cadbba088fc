//go:build linux

package evloop

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// acceptBatch bounds the connections a loop accepts in one turn, so that a
// storm of connections does not starve the sessions the loop already runs
// (the listening socket is level-triggered: what is left is reported again
// next turn).
const acceptBatch = 32

// keepAlive is what every accepted socket gets, as Go's net.Listen gives its
// accepted connections by default: keepalive probes after 15 s idle, every
// 15 s (the count stays the kernel's, 9).
const keepAlive = 15

// Listener accepts the connections of a TCP listening socket on event loops,
// with no goroutine and no netpoller in between: each loop that listens has
// the socket in its epoll (EPOLLEXCLUSIVE: one loop is woken per
// connection), accepts on its own thread (one accept4 per connection: the
// socket options come from the listening socket) and hands each new connection, a
// Conn with its own non-blocking descriptor that no loop has adopted yet, to
// the callback on that loop's goroutine. The callback typically starts a
// coroutine (Loop.Go) that binds the Conn (Bind homes it on the loop).
type Listener struct {
	fd     int            // a duplicate of the listening socket's descriptor
	local  netip.AddrPort // the listener's address; invalid when unspecified (then getsockname per connection)
	loops  []*Loop
	accept func(l *Loop, c *Conn)
	// errf, when set, is told about accept errors that are not the end of
	// the listener (descriptor exhaustion and the like): the loop stops
	// accepting for a moment and tries again.
	errf func(err error, backoff time.Duration)

	mu      sync.Mutex
	closed  bool
	backoff map[*Loop]time.Duration // loops that paused after an error
}

// Listen starts accepting ln's connections on loops (running). ln must be a
// *net.TCPListener; ln keeps its own descriptor, which the caller closes as
// before. accept runs on the goroutine of the loop that accepted. Close
// stops accepting. errf (may be nil) hears of transient accept errors.
func Listen(ln net.Listener, loops []*Loop, accept func(l *Loop, c *Conn), errf func(err error, backoff time.Duration)) (*Listener, error) {
	tl, ok := ln.(*net.TCPListener)
	if !ok || len(loops) == 0 {
		return nil, errNotSocket
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, os.NewSyscallError("fcntl", derr)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		_ = unix.Close(nfd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	// Set on the listening socket, the options are the accepted sockets'
	// too: Linux copies a listener's TCP_NODELAY, keepalive flag and
	// keepalive times to each socket it accepts (and arms its keepalive
	// timer), so an accept costs no setsockopt.
	setSocketOptions(nfd)
	lis := &Listener{fd: nfd, loops: loops, accept: accept, errf: errf, backoff: map[*Loop]time.Duration{}}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsUnspecified() {
		lis.local = a.AddrPort()
	}
	errs := make(chan error, len(loops))
	for _, l := range loops {
		l.Post(func() { errs <- lis.register(l) })
	}
	for range loops {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		lis.Close()
		return nil, err
	}
	// Only now that the loops accept: had they failed to, the caller
	// accepts on ln, which needs the netpoller.
	_ = rc.Control(func(fd uintptr) { forgetInNetpoller(int(fd)) })
	return lis, nil
}

// forgetInNetpoller takes the listening socket fd out of the Go runtime's
// netpoller, where net.Listen put it: nobody calls Accept on the Go
// listener while the loops accept, but registered there (edge-triggered)
// every incoming connection would also wake the thread that waits in the
// netpoller, for nothing (one context switch and a scheduler round per
// login). The runtime's epoll instance is found as the one whose
// /proc/self/fdinfo lists fd; none found (no /proc, or a runtime that polls
// otherwise) leaves everything as it was. The loops' epolls hold the
// socket under its duplicate's number, so only the runtime's lists fd. The Go
// listener must not Accept afterwards: its waits would never be woken. Its
// Close still works (the runtime's EPOLL_CTL_DEL then fails, unchecked).
func forgetInNetpoller(fd int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	want := fmt.Sprintf("tfd: %8d ", fd)
	for _, e := range ents {
		epfd, err := strconv.Atoi(e.Name())
		if err != nil || epfd == fd {
			continue
		}
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || link != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil || !strings.Contains(string(info), want) {
			continue
		}
		_ = unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, fd, nil)
	}
}

// register puts the listening socket into l's epoll (on l's goroutine).
func (lis *Listener) register(l *Loop) error {
	lis.mu.Lock()
	closed := lis.closed
	lis.mu.Unlock()
	if closed {
		return net.ErrClosed
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(lis.fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, lis.fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	s := l.slot(lis.fd)
	s.lis, s.ready, s.waiter = lis, 0, nil
	return nil
}

// unregister takes the listening socket out of l's epoll (on l's
// goroutine).
func (lis *Listener) unregister(l *Loop) {
	if lis.fd < len(l.fds) && l.fds[lis.fd].lis == lis {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, lis.fd, nil)
		l.fds[lis.fd].lis = nil
		l.fds[lis.fd].ready = 0
	}
}

// Close stops accepting: when it returns, no loop accepts another
// connection through lis, and its duplicate descriptor is closed (the
// caller's listener is untouched). Connections already handed to the
// callback are the callback's. Do not call it on a loop goroutine.
func (lis *Listener) Close() {
	lis.mu.Lock()
	if lis.closed {
		lis.mu.Unlock()
		return
	}
	lis.closed = true
	lis.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range lis.loops {
		wg.Add(1)
		l.Post(func() {
			defer wg.Done()
			lis.unregister(l)
		})
	}
	wg.Wait()
	_ = unix.Close(lis.fd)
}

// acceptAll accepts up to acceptBatch connections on l's goroutine.
func (l *Loop) acceptAll(lis *Listener) {
	var rsa unix.RawSockaddrAny
	for i := 0; i < acceptBatch; i++ {
		// A raw accept4 (it cannot block: the socket is non-blocking): the
		// loop keeps its P, and no getsockopt follows (unix.Accept4 asks
		// every IPv4 socket's protocol, for L2TP).
		n := uint32(unix.SizeofSockaddrAny)
		r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lis.fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)),
			unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		nfd := int(r)
		var err error
		if e != 0 {
			err = e
		}
		raceWriteRange(unsafe.Pointer(&rsa), int(n))
		switch err {
		case nil:
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED, unix.EPROTO:
			continue
		case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM:
			lis.pause(l, err)
			return
		default:
			// EBADF, EINVAL: the socket no longer listens.
			lis.unregister(l)
			return
		}
		c := &Conn{fd: nfd, addrs: endpoints{local: lis.local, remote: rawAddrPort(&rsa)}}
		if !c.addrs.local.IsValid() {
			if la, err := unix.Getsockname(nfd); err == nil {
				c.addrs.local = addrPortOf(la)
			}
		}
		lis.accept(l, c)
	}
}

// pause stops l from accepting for a while after err (out of descriptors
// or memory), longer each time it happens in a row, up to a second: a
// level-triggered listening socket would otherwise wake the loop at once
// again.
func (lis *Listener) pause(l *Loop, err error) {
	lis.unregister(l)
	lis.mu.Lock()
	d := lis.backoff[l]
	if d == 0 {
		d = 5 * time.Millisecond
	} else if d < time.Second {
		d *= 2
	}
	lis.backoff[l] = d
	lis.mu.Unlock()
	if lis.errf != nil {
		lis.errf(os.NewSyscallError("accept4", err), d)
	}
	time.AfterFunc(d, func() {
		l.Post(func() {
			if lis.register(l) == nil {
				lis.mu.Lock()
				delete(lis.backoff, l)
				lis.mu.Unlock()
			}
		})
	})
}

// deferAccept is the listening socket's TCP_DEFER_ACCEPT, in seconds: the
// kernel hands over a connection only once its first bytes (for
// PostgreSQL, the client's startup packet or SSL request) have arrived, so
// an accept is followed by a read that finds them, not by a wait for them.
// A connection that sends nothing within about this time is dropped by the
// kernel without reaching the listener (PgBouncer's tcp_defer_accept does
// the same, for as long).
const deferAccept = 45

// setSocketOptions sets, on a listening socket, what Go's net package sets
// on each connection its TCP listeners accept: no Nagle delay, keepalive
// probes (keepAlive); and deferAccept. Errors are ignored, as Go does.
func setSocketOptions(fd int) {
	setIntOpt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	setIntOpt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	setIntOpt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAlive)
	setIntOpt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAlive)
	setIntOpt(fd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, deferAccept)
}

// setIntOpt is setsockopt of an int as a raw system call (it cannot block).
func setIntOpt(fd, level, opt int, v int32) {
	raceReadRange(unsafe.Pointer(&v), 4)
	_, _, _ = unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), 4, 0)
}

// rawAddrPort is the address of a socket address accept4 wrote (the zero
// AddrPort for a kind other than IPv4 and IPv6).
func rawAddrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		a := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&a.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		a := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&a.Port))
		ip := netip.AddrFrom16(a.Addr)
		if a.Scope_id != 0 {
			if ifi, err := net.InterfaceByIndex(int(a.Scope_id)); err == nil {
				ip = ip.WithZone(ifi.Name)
			}
		}
		return netip.AddrPortFrom(ip, uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// addrPortOf is the address of a TCP socket address (the zero AddrPort for
// another kind).
func addrPortOf(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		ip := netip.AddrFrom16(a.Addr)
		if a.ZoneId != 0 {
			if ifi, err := net.InterfaceByIndex(int(a.ZoneId)); err == nil {
				ip = ip.WithZone(ifi.Name)
			}
		}
		return netip.AddrPortFrom(ip, uint16(a.Port))
	}
	return netip.AddrPort{}
}
