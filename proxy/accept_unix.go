package proxy

import (
	"errors"
	"syscall"
)

// isTemporaryAccept reports accept errors that go away by themselves
// (descriptor exhaustion, aborted handshakes).
func isTemporaryAccept(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}
