//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pool

import "net"

func peekAlive(net.Conn) (ok, handled bool) { return false, false }
