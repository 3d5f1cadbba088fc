//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pool

import (
	"crypto/tls"
	"net"
	"syscall"
)

// peekAlive checks a socket without blocking: recv(MSG_PEEK|MSG_DONTWAIT)
// of one byte. EAGAIN means alive and quiet; 0 bytes means the peer closed;
// data or any other error means the connection is not reusable. handled is
// false when nc is not a socket (net.Pipe in tests, wrappers).
func peekAlive(nc net.Conn) (ok, handled bool) {
	if tc, isTLS := nc.(*tls.Conn); isTLS {
		// Bytes pending below TLS after login are an alert or close_notify.
		nc = tc.NetConn()
	}
	sc, isSys := nc.(syscall.Conn)
	if !isSys {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var (
		buf  [1]byte
		rerr error
	)
	cerr := rc.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readability
	})
	if cerr != nil {
		return false, true
	}
	if rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK {
		return true, true
	}
	if rerr == syscall.EINTR {
		return false, false // let the deadline check decide
	}
	// n == 0 && rerr == nil: orderly shutdown by the peer; n > 0: data from
	// an idle server (e.g. a FATAL before it went away); other errors: reset.
	return false, true
}
