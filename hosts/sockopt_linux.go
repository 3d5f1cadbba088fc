package hosts

import "golang.org/x/sys/unix"

func setUserTimeout(fd, ms int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
}
