//go:build !linux

package evloop

import (
	"errors"
	"net"
	"time"
)

// errUnsupported: the event loops need Linux (epoll).
var errUnsupported = errors.New("evloop: event loops need Linux (epoll)")

// ErrStopped is returned by a wait of a coroutine whose loop stopped.
var ErrStopped = errors.New("evloop: loop stopped")

// Loop is an event loop; on this system New always fails.
type Loop struct{}

// New reports that event loops need Linux.
func New(Options) (*Loop, error) { return nil, errUnsupported }

// Options: see the Linux implementation.
type Options struct{ NoRing bool }

// UsesRing: see the Linux implementation.
func (l *Loop) UsesRing() bool { return false }

// Post, Stop, Run, Go, GoOnReadable and StopOnReadable exist so that
// lockpool builds here; no Loop is ever made.
func (l *Loop) Post(fn func())                          {}
func (l *Loop) Stop()                                   {}
func (l *Loop) Run()                                    {}
func (l *Loop) Go(fn func(co *Co))                      {}
func (l *Loop) GoOnReadable(c *Conn, fn func(*Co)) bool { return false }
func (l *Loop) StopOnReadable(c *Conn) bool             { return false }

// Co is a coroutine of a loop; none exists on this system.
type Co struct{}

// Loop, Park, Unpark, Offload, Interrupt, Quiet and WaitReadable: see the Linux
// implementation.
func (co *Co) Loop() *Loop                   { return nil }
func (co *Co) Park(deadline time.Time) error { return errUnsupported }
func (co *Co) Unpark()                       {}
func (co *Co) Offload(fn func())             { fn() }
func (co *Co) Interrupt(err error)           {}
func (co *Co) Quiet(net.Conn) (bool, bool)   { return false, false }
func (co *Co) WaitReadable(a, b *Conn, deadline time.Time) (*Conn, error) {
	return a, nil
}

// Listener accepts on loops; none exists on this system.
type Listener struct{}

// Listen reports that event loops need Linux: the caller accepts as before.
func Listen(ln net.Listener, loops []*Loop, accept func(l *Loop, c *Conn), errf func(err error, backoff time.Duration)) (*Listener, error) {
	return nil, errUnsupported
}

// Close: see the Linux implementation.
func (lis *Listener) Close() {}

// Conn is the Go connection it wraps.
type Conn struct{ net.Conn }

// Wrap returns nc as a Conn.
func Wrap(nc net.Conn) *Conn {
	if c, ok := nc.(*Conn); ok {
		return c
	}
	return &Conn{nc}
}

// RemoteString is RemoteAddr().String().
func (c *Conn) RemoteString() string { return c.RemoteAddr().String() }

// Bind, Unbind, Flush, DropDeferred, Adopted, WriteDeferred, WriteDeferredDraining and WriteDraining: see the Linux implementation.
func (c *Conn) Bind(co *Co) error                   { return errUnsupported }
func (c *Conn) Unbind()                             {}
func (c *Conn) UnbindShared()                       {}
func (c *Conn) DropDeferred()                       {}
func (c *Conn) Flush() error                        { return nil }
func (c *Conn) Adopted() bool                       { return false }
func (c *Conn) WriteDeferred(p []byte) (int, error) { return c.Write(p) }

// WriteDeferredDraining is Write: without a loop nothing drains.
func (c *Conn) WriteDeferredDraining(p []byte, drain func() (bool, error)) (int, error) {
	return c.Write(p)
}

// WriteDraining is Write: without a loop nothing drains.
func (c *Conn) WriteDraining(p []byte, drain func() (bool, error)) (int, error) {
	return c.Write(p)
}
