package handover

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// checkPeer returns the pid of the process at the other end of c, and an
// error unless it runs as this process's user or as root (SO_PEERCRED).
func checkPeer(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("handover: SO_PEERCRED: %w", cerr)
	}
	if uid := uint32(os.Getuid()); cred.Uid != uid && cred.Uid != 0 {
		return int(cred.Pid), fmt.Errorf("handover: peer pid %d runs as uid %d, not %d", cred.Pid, cred.Uid, uid)
	}
	return int(cred.Pid), nil
}
