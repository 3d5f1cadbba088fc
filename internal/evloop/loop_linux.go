//go:build linux

package evloop

import (
	"container/heap"
	"errors"
	"iter"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Readiness bits of a descriptor, as last reported by epoll and not yet
// disproved by EAGAIN or a short count.
const (
	readable uint8 = 1 << iota
	writable
)

// pollEvents is what every adopted descriptor is registered for.
const pollEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET

// deadlineGrain rounds the loop's wake-up deadline up, so that the runtime
// timer behind it changes at most a few hundred times a second however many
// coroutines wait with deadlines.
const deadlineGrain = 4 * time.Millisecond

// ErrStopped is returned by a wait of a coroutine whose loop stopped.
var ErrStopped = errors.New("evloop: loop stopped")

// Loop is one event loop: an epoll instance and the goroutine that waits on
// it and runs the coroutines whose sockets it reports. Its fields below mu
// belong to the loop goroutine (and the coroutine it runs).
type Loop struct {
	epfd int
	efd  int // eventfd: Post wakes the loop through it
	file *os.File
	raw  syscall.RawConn
	done chan struct{}

	mu      sync.Mutex
	posted  []func()
	woken   bool // an eventfd wake-up is pending
	stopped bool

	events   []unix.EpollEvent
	run      []func()
	fds      []slot // by descriptor number
	timers   timerHeap
	deadline time.Time // the read deadline set on file
	live     int       // coroutines started and not finished
}

// slot is the loop's view of one descriptor homed on it.
type slot struct {
	waiter *Co
	ready  uint8
}

// New creates a loop; Run runs it.
func New() (*Loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(efd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	// A non-blocking epoll descriptor is registered with the runtime's
	// netpoller by os.NewFile: the loop parks there when it is idle.
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(efd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	file := os.NewFile(uintptr(epfd), "evloop")
	raw, err := file.SyscallConn()
	if err != nil {
		_ = file.Close()
		_ = unix.Close(efd)
		return nil, err
	}
	return &Loop{epfd: epfd, efd: efd, file: file, raw: raw, done: make(chan struct{}), events: make([]unix.EpollEvent, 256)}, nil
}

// Post runs fn on the loop goroutine, soon. Any goroutine may call it.
func (l *Loop) Post(fn func()) {
	l.mu.Lock()
	l.posted = append(l.posted, fn)
	wake := !l.woken
	l.woken = true
	l.mu.Unlock()
	if wake {
		var one = [8]byte{1}
		_, _ = unix.Write(l.efd, one[:])
	}
}

// Stop ends Run after the functions posted before it ran, and waits for
// that. Coroutines still suspended stay suspended: stop them first.
func (l *Loop) Stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.Post(func() {})
	<-l.done
	_ = l.file.Close()
	_ = unix.Close(l.efd)
}

// Run is the loop goroutine.
func (l *Loop) Run() {
	defer close(l.done)
	for {
		if l.runPosted() {
			return
		}
		n := l.poll()
		if len(l.timers) > 0 {
			l.fireTimers(time.Now())
		}
		if n == 0 {
			l.mu.Lock()
			pending := len(l.posted) > 0
			l.mu.Unlock()
			if pending {
				continue
			}
			n = l.park()
		}
		l.dispatch(n)
	}
}

// poll takes what epoll has ready without waiting.
func (l *Loop) poll() int {
	for {
		n, err := unix.EpollWait(l.epfd, l.events, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0
		}
		return n
	}
}

// park waits in the runtime's netpoller until epoll has something or the
// earliest timer is due.
func (l *Loop) park() int {
	var next time.Time
	if len(l.timers) > 0 {
		next = l.timers[0].when.Truncate(deadlineGrain).Add(deadlineGrain)
	}
	if !next.Equal(l.deadline) {
		_ = l.file.SetReadDeadline(next)
		l.deadline = next
	}
	n := 0
	err := l.raw.Read(func(uintptr) bool {
		n = l.poll()
		return n > 0
	})
	if err != nil {
		return 0 // the deadline: timers are fired next turn
	}
	return n
}

// runPosted runs the posted functions; it reports whether the loop stops.
func (l *Loop) runPosted() bool {
	l.mu.Lock()
	l.run, l.posted = l.posted, l.run[:0]
	l.woken = false
	stopped := l.stopped
	l.mu.Unlock()
	for i, fn := range l.run {
		fn()
		l.run[i] = nil
	}
	return stopped
}

// dispatch records the readiness of n events and resumes their waiters.
func (l *Loop) dispatch(n int) {
	for i := 0; i < n; i++ {
		ev := &l.events[i]
		fd := int(ev.Fd)
		if fd == l.efd {
			var b [8]byte
			_, _ = unix.Read(l.efd, b[:])
			continue
		}
		if fd >= len(l.fds) {
			continue
		}
		s := &l.fds[fd]
		if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			s.ready |= readable
		}
		if ev.Events&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			s.ready |= writable
		}
		if co := s.waiter; co != nil && co.wants(l) {
			l.resume(co)
		}
	}
}

// slot returns the loop's record of fd.
func (l *Loop) slot(fd int) *slot {
	if fd >= len(l.fds) {
		n := 2 * len(l.fds)
		if n < fd+1 {
			n = fd + 64
		}
		fds := make([]slot, n)
		copy(fds, l.fds)
		l.fds = fds
	}
	return &l.fds[fd]
}

// Go starts fn as a coroutine of the loop. Call it on the loop goroutine
// (from a function given to Post).
func (l *Loop) Go(fn func(co *Co)) {
	co := &Co{loop: l}
	co.waitFd = [2]int{-1, -1}
	co.next, co.stop = iter.Pull(func(yield func(struct{}) bool) {
		co.yield = yield
		fn(co)
	})
	l.live++
	l.resume(co)
}

// resume runs co until it waits again or ends.
func (l *Loop) resume(co *Co) {
	if co.dead {
		return
	}
	co.clearWait()
	if _, ok := co.next(); !ok {
		co.dead = true
		l.live--
		co.stop()
	}
}

func (l *Loop) fireTimers(now time.Time) {
	for len(l.timers) > 0 && !l.timers[0].when.After(now) {
		t := heap.Pop(&l.timers).(timer)
		if co := t.co; co.waiting && co.seq == t.seq {
			co.timedOut = true
			l.resume(co)
		}
	}
}

// Co is a coroutine of a loop: one session's code in blocking style. Its
// fields belong to the loop goroutine and the coroutine itself, which never
// run at the same time.
type Co struct {
	loop  *Loop
	next  func() (struct{}, bool)
	stop  func()
	yield func(struct{}) bool

	waitFd   [2]int   // descriptors waited on (-1: none)
	waitWant [2]uint8 // readiness wanted of each
	waiting  bool     // suspended in a socket wait (not an offload)
	seq      uint64   // wait number (timers of older waits are stale)
	timedOut bool
	intr     error // a pending Interrupt
	dead     bool
}

// Loop returns the loop that runs co.
func (co *Co) Loop() *Loop { return co.loop }

// wants reports whether one of the descriptors co waits on is ready.
func (co *Co) wants(l *Loop) bool {
	if !co.waiting {
		return false
	}
	for i, fd := range co.waitFd {
		if fd >= 0 && l.fds[fd].ready&co.waitWant[i] != 0 {
			return true
		}
	}
	return false
}

func (co *Co) clearWait() {
	l := co.loop
	for i, fd := range co.waitFd {
		if fd >= 0 && fd < len(l.fds) && l.fds[fd].waiter == co {
			l.fds[fd].waiter = nil
		}
		co.waitFd[i] = -1
	}
	co.waiting = false
}

// wait suspends co until a (or b, when not nil) is ready as wanted, the
// deadline passes, or an Interrupt arrives.
func (co *Co) wait(a *Conn, wa uint8, b *Conn, wb uint8, deadline time.Time) error {
	if err := co.intr; err != nil {
		co.intr = nil
		return err
	}
	l := co.loop
	co.seq++
	if !deadline.IsZero() {
		if !time.Now().Before(deadline) {
			return os.ErrDeadlineExceeded
		}
		heap.Push(&l.timers, timer{when: deadline, co: co, seq: co.seq})
	}
	l.slot(a.fd).waiter = co
	co.waitFd[0], co.waitWant[0] = a.fd, wa
	if b != nil {
		l.slot(b.fd).waiter = co
		co.waitFd[1], co.waitWant[1] = b.fd, wb
	}
	co.waiting, co.timedOut = true, false
	if !co.yield(struct{}{}) {
		co.clearWait()
		return ErrStopped
	}
	if err := co.intr; err != nil {
		co.intr = nil
		return err
	}
	if co.timedOut {
		co.timedOut = false
		return os.ErrDeadlineExceeded
	}
	return nil
}

// Offload runs fn on a goroutine of its own while co is suspended, and
// returns when fn has returned. The loop serves its other coroutines
// meanwhile. fn may block on anything; it must not use co's sockets.
func (co *Co) Offload(fn func()) {
	l := co.loop
	go func() {
		defer l.Post(func() { l.resume(co) })
		fn()
	}()
	co.yield(struct{}{})
}

// Interrupt makes co's current socket wait (or its next one) return err.
// Call it on the loop goroutine (from a function given to Post). A
// coroutine suspended in Offload sees err at its next socket wait.
func (co *Co) Interrupt(err error) {
	if co.dead {
		return
	}
	co.intr = err
	if co.waiting {
		co.loop.resume(co)
	}
}

// WaitReadable suspends co until a or b may have bytes to read (or
// report their end), and returns the one that may. Both must be bound to
// co. deadline (zero: none) applies to the wait.
func (co *Co) WaitReadable(a, b *Conn, deadline time.Time) (*Conn, error) {
	for {
		if a.fd < 0 || b.fd < 0 {
			return a, nil // not adopted: the caller's read of a waits
		}
		if a.peekReadable(co) {
			return a, nil
		}
		if b.peekReadable(co) {
			return b, nil
		}
		if err := co.wait(a, readable, b, readable, deadline); err != nil {
			return nil, err
		}
	}
}

type timer struct {
	when time.Time
	co   *Co
	seq  uint64
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].when.Before(h[j].when) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = timer{}
	*h = old[:len(old)-1]
	return t
}

// errNotSocket is returned by Bind for a connection without a descriptor
// (net.Pipe in tests): it stays an ordinary Go connection.
var errNotSocket = errors.New("evloop: not a socket")

var _ net.Conn = (*Conn)(nil)
