package pool

import (
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// killSwitch holds a duplicate of a server connection's socket, so that
// the pool can shut the connection down while its holder (an event loop,
// or a goroutine in a read) owns the connection's own descriptor: a
// shutdown(2) on the duplicate ends the socket for both, and the holder's
// next read sees the end. The duplicate is closed with the connection.
type killSwitch struct {
	mu sync.Mutex
	fd int // -1 once closed
}

// newKillSwitch duplicates nc's descriptor; nil when nc has none.
func newKillSwitch(nc net.Conn) *killSwitch {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	fd := -1
	if err := rc.Control(func(f uintptr) {
		fd, _ = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil || fd < 0 {
		return nil
	}
	return &killSwitch{fd: fd}
}

// pull shuts the socket down (both directions).
func (k *killSwitch) pull() {
	if k == nil {
		return
	}
	k.mu.Lock()
	if k.fd >= 0 {
		_ = unix.Shutdown(k.fd, unix.SHUT_RDWR)
	}
	k.mu.Unlock()
}

// close closes the duplicate.
func (k *killSwitch) close() {
	if k == nil {
		return
	}
	k.mu.Lock()
	if k.fd >= 0 {
		_ = unix.Close(k.fd)
		k.fd = -1
	}
	k.mu.Unlock()
}
