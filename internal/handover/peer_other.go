//go:build !linux

package handover

import (
	"errors"
	"net"
)

// checkPeer refuses every peer: the handover checks its peer's user with
// SO_PEERCRED, which only Linux has here.
func checkPeer(*net.UnixConn) (int, error) {
	return 0, errors.New("handover: only supported on Linux")
}
