//go:build linux

package evloop

import (
	"errors"
	"iter"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Readiness bits of a descriptor, as last reported by epoll and not yet
// disproved by EAGAIN or a short count.
const (
	readable uint8 = 1 << iota
	writable
	// hup: the peer closed its side (or the socket failed). A short read
	// then does not mean "drained": the end is still to be read, and no
	// further edge will announce it, so readable stays set.
	hup
)

// pollEvents is what every adopted descriptor is registered for.
const pollEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET

// running counts the loops of the process that are running. Each holds a
// P while it waits (park), so the process needs one P more than that for
// everything else: Run raises GOMAXPROCS when it must. It is the one
// process-wide value here because GOMAXPROCS is one too.
var running atomic.Int32

// spareIdle is how long a loop with nothing to do keeps its spare
// coroutines before it lets them go.
const spareIdle = time.Second

// ErrStopped is returned by a wait of a coroutine whose loop stopped.
var ErrStopped = errors.New("evloop: loop stopped")

// Loop is one event loop: an epoll instance and the goroutine that waits on
// it and runs the coroutines whose sockets it reports. Its fields below mu
// belong to the loop goroutine (and the coroutine it runs).
type Loop struct {
	epfd int
	efd  int // eventfd: Post wakes the loop through it
	done chan struct{}

	// parked: the loop waits (or is about to wait), in epoll_wait or, idle,
	// in the netpoller; hasPosted: posted is not empty. The loop sets
	// parked and then looks at hasPosted; Post sets hasPosted and then
	// looks at parked (both sequentially consistent): one of the two sees
	// the other, so a post is never left waiting, and a busy loop takes
	// no lock per turn.
	parked    atomic.Bool
	hasPosted atomic.Bool

	mu      sync.Mutex
	posted  []func()
	woken   bool // an eventfd wake-up is pending
	wakes   int  // eventfd wake-ups written (for tests)
	idle    int  // waits handed to the netpoller (for tests)
	stopped bool

	events []unix.EpollEvent
	run    []func()
	fds    []slot // by descriptor number
	timers timerHeap
	flushq []*Conn // connections with deferred writes this turn
	recvq  []*Co   // coroutines in Read whose sockets are readable (receiveAll)
	// ringReceives and ringSends count receives and sends done through the
	// ring (for tests; read them after Stop).
	ringReceives int
	ringSends    int
	ring         *ring // batches the turn's sends (nil: no io_uring)
	spare        []*Co // finished coroutines, kept to run the next Go
	// Spares go after spareIdle with no Go: goRan says Go ran since an
	// idle turn last looked; idleSince is when an idle turn first found it
	// had not (the clock is read on idle turns only).
	goRan     bool
	idleSince time.Time
	quiet     int           // consecutive empty busyWait waits (park)
	idleAfter time.Duration // idleAfter, shorter in tests
	live      int           // coroutines started and not finished
}

// slot is the loop's view of one descriptor homed on it.
type slot struct {
	waiter *Co
	start  func(*Co) // GoOnReadable: a coroutine to start when readable
	flush  *Conn     // deferred bytes wait for the socket to be writable
	lis    *Listener // a listening socket (listen_linux.go): accept when readable
	ready  uint8
}

// Options are a loop's settings.
type Options struct {
	// NoRing: write each connection's deferred bytes with a system call
	// of its own, never through io_uring.
	NoRing bool
}

// New creates a loop; Run runs it. Unless o.NoRing, it sets up an io_uring
// to send the turn's deferred writes with one system call; a kernel that
// refuses io_uring (too old, or disabled by sysctl or seccomp) leaves the
// loop writing them one by one (UsesRing reports which).
func New(o Options) (*Loop, error) {
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
	// Non-blocking so that os.NewFile puts a duplicate of it in the
	// netpoller (parkIdle); epoll_wait itself ignores the flag.
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(efd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	l := &Loop{epfd: epfd, efd: efd, done: make(chan struct{}), events: make([]unix.EpollEvent, 256), idleAfter: idleAfter}
	if !o.NoRing {
		l.ring = newRing()
	}
	return l, nil
}

// Post runs fn on the loop goroutine, soon. Any goroutine may call it. It
// wakes the loop (an eventfd write) only when the loop waits in epoll: a
// loop that is running looks at what was posted before it waits, so a post
// from the loop itself (a coroutine unparking another) costs no system
// call.
func (l *Loop) Post(fn func()) {
	l.mu.Lock()
	l.posted = append(l.posted, fn)
	l.hasPosted.Store(true)
	wake := l.parked.Load() && !l.woken
	if wake {
		l.woken = true
		l.wakes++
	}
	l.mu.Unlock()
	if wake {
		one := [8]byte{1}
		// A non-blocking eventfd: cannot block, so no syscall bookkeeping.
		raceReadRange(unsafe.Pointer(&one[0]), len(one))
		_, _, _ = unix.RawSyscall(unix.SYS_WRITE, uintptr(l.efd), uintptr(unsafe.Pointer(&one[0])), 8)
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
	_ = unix.Close(l.epfd)
	_ = unix.Close(l.efd)
	if l.ring != nil {
		l.ring.close()
		l.ring = nil
	}
}

// UsesRing reports whether the loop sends a turn's deferred writes through
// io_uring (see New).
func (l *Loop) UsesRing() bool { return l.ring != nil }

// Run is the loop goroutine.
func (l *Loop) Run() {
	defer close(l.done)
	n := int(running.Add(1))
	defer running.Add(-1)
	if runtime.GOMAXPROCS(0) < n+1 {
		runtime.GOMAXPROCS(n + 1)
	}
	for {
		if l.runPosted() {
			l.dropSpares()
			return
		}
		l.flush() // what the posted functions wrote
		n := l.wait()
		if len(l.timers) > 0 {
			l.fireTimers(time.Now())
		}
		l.dispatch(n)
		if n == 0 && len(l.spare) > 0 {
			l.idleTurn()
		}
	}
}

// wait takes what epoll has ready: it waits in epoll_wait (park) unless
// something was posted since runPosted (then it only polls). One system
// call per turn, busy or idle, as PgBouncer's loop makes: a busy loop's
// epoll_wait returns at once.
func (l *Loop) wait() int {
	l.parked.Store(true)
	if l.hasPosted.Load() {
		l.parked.Store(false)
		return l.poll()
	}
	n := l.park()
	l.parked.Store(false)
	return n
}

// poll takes what epoll has ready without waiting (a raw syscall: it
// cannot block).
func (l *Loop) poll() int {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.epfd), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0
		}
		l.eventsWritten(int(r))
		return int(r)
	}
}

// eventsWritten tells the race detector that epoll_pwait wrote n events
// into l.events (see raceWriteRange).
func (l *Loop) eventsWritten(n int) {
	raceWriteRange(unsafe.Pointer(&l.events[0]), n*int(unsafe.Sizeof(l.events[0])))
}

// busyWait is the longest park waits in epoll_wait on the loop's own
// thread at a time, and idleAfter how long a loop must have found nothing
// (consecutive empty waits) before it hands the wait to Go's netpoller
// (parkIdle). A loop with traffic keeps its thread; a loop with none stops
// being preempted by the runtime 100 times a second. Handing over costs a
// few system calls and a scheduler wake-up at the next event, so it is
// kept for a loop that is really idle: traffic of one transaction a
// second never pays it.
const (
	busyWait  = 5 * time.Millisecond
	idleAfter = time.Second
)

// park waits until a socket is ready, something is posted or the earliest
// timer is due. First the loop's own thread blocks in epoll_wait, as
// PgBouncer's does: a wake-up goes straight to it, with no netpoller thread
// and no scheduler hand-off in between. That wait is a raw syscall, so the
// runtime keeps the loop's P with it (a retaken P would move the loop to
// another thread at its next wake-up: two thread switches); the runtime's
// preemption signal ends it (EINTR) when a stop-the-world needs the P, and
// the server runs one P more than it has loops for its other goroutines
// (logins, offloaded waits, timers, the admin server). A loop that has
// found nothing for idleAfter then waits in the netpoller (parkIdle),
// which lets its P and thread go: the runtime sees a running P only while
// the loop has traffic.
func (l *Loop) park() int {
	ms := -1
	if len(l.timers) > 0 {
		d := time.Until(l.timers[0].when)
		if d < 0 {
			d = 0
		}
		ms = int((d + time.Millisecond - 1) / time.Millisecond)
	}
	if spare := int(spareIdle / time.Millisecond); len(l.spare) > 0 && (ms < 0 || ms > spare) {
		ms = spare // wake to let idle spares go
	}
	wait := int(busyWait / time.Millisecond)
	if ms >= 0 && ms < wait {
		wait = ms
	}
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.epfd), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), uintptr(wait), 0, 0)
	switch {
	case e != 0:
		return 0 // EINTR: a signal; the caller loops
	case r > 0:
		l.quiet = 0
		l.eventsWritten(int(r))
		return int(r)
	case wait == ms:
		return 0 // the deadline came
	}
	if l.quiet++; time.Duration(l.quiet)*busyWait < l.idleAfter {
		return 0
	}
	l.quiet = 0
	var deadline time.Time
	if ms >= 0 {
		deadline = time.Now().Add(time.Duration(ms-wait) * time.Millisecond)
	}
	return l.parkIdle(deadline)
}

// parkIdle waits in Go's netpoller until the loop's epoll has something
// (a socket, the eventfd of a Post) or the deadline (zero: none) passes.
// The netpoller gets a duplicate of the epoll descriptor for this wait
// only: registered for good, every event of a busy loop would also wake
// the runtime's netpoller thread.
func (l *Loop) parkIdle(deadline time.Time) int {
	l.mu.Lock()
	l.idle++
	l.mu.Unlock()
	fd, err := unix.FcntlInt(uintptr(l.epfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	f := os.NewFile(uintptr(fd), "epoll")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(deadline) != nil {
		return 0
	}
	n := 0
	_ = rc.Read(func(fd uintptr) bool {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
		if e != 0 {
			return e != unix.EINTR
		}
		n = int(r)
		l.eventsWritten(n)
		return n > 0
	}) // an error is the deadline: nothing ready
	return n
}

// runPosted runs the posted functions; it reports whether the loop stops.
func (l *Loop) runPosted() bool {
	if !l.hasPosted.Load() {
		return false // Stop posts too
	}
	l.mu.Lock()
	l.run, l.posted = l.posted, l.run[:0]
	l.hasPosted.Store(false)
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
// It first records every event's readiness (and, with a ring, receives for
// all coroutines waiting in Read on a readable socket at once: see
// receiveAll), then resumes, flushes and starts in event order.
func (l *Loop) dispatch(n int) {
	for i := 0; i < n; i++ {
		ev := &l.events[i]
		fd := int(ev.Fd)
		if fd == l.efd {
			var b [8]byte
			r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(l.efd), uintptr(unsafe.Pointer(&b[0])), 8) // non-blocking: cannot block
			if e == 0 {
				raceWriteRange(unsafe.Pointer(&b[0]), int(r))
			}
			ev.Fd = -1
			continue
		}
		if fd >= len(l.fds) {
			ev.Fd = -1
			continue
		}
		s := &l.fds[fd]
		if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			s.ready |= readable
		}
		if ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			s.ready |= hup
		}
		if ev.Events&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			s.ready |= writable
		}
		if co := s.waiter; co != nil && l.ring != nil && s.ready&readable != 0 && co.rconn != nil && co.rconn.fd == fd && co.rconn.home == l && !co.rconn.closed.Load() {
			l.recvq = append(l.recvq, co)
		}
	}
	if len(l.recvq) > 0 {
		l.receiveAll()
	}
	for i := 0; i < n; i++ {
		fd := int(l.events[i].Fd)
		if fd < 0 {
			continue
		}
		s := &l.fds[fd]
		if c := s.flush; c != nil && s.ready&writable != 0 {
			s.flush = nil
			c.flushDeferred(l)
		}
		if co := s.waiter; co != nil && (co.rdone || co.wants(l)) {
			// rdone: receiveAll took bytes for it (no edge will come
			// for them), so it is resumed whatever its socket says now.
			l.resume(co)
			s = &l.fds[fd] // the coroutine may have grown the table
		}
		if fn := s.start; fn != nil && s.ready&readable != 0 {
			s.start = nil
			l.Go(fn)
			s = &l.fds[fd]
		}
		if lis := s.lis; lis != nil && s.ready&readable != 0 {
			s.ready &^= readable // level-triggered: reported again while connections wait
			l.acceptAll(lis)
		}
	}
	l.flush()
}

// flush writes the deferred writes of this turn: with one io_uring
// submission when there are several and the kernel has io_uring, else one
// send each.
func (l *Loop) flush() {
	if len(l.flushq) > 1 && l.ring != nil {
		l.flushRing()
	}
	for i, c := range l.flushq {
		if c != nil {
			c.flushDeferred(l)
		}
		l.flushq[i] = nil
	}
	l.flushq = l.flushq[:0]
}

// flushRing sends the first bytes of each queued connection through the
// ring; what a send did not take (rare) is left for flushDeferred.
func (l *Loop) flushRing() {
	r := l.ring
	for i, c := range l.flushq {
		if c == nil || len(c.wbuf) == 0 || c.closed.Load() || c.werr != nil || c.home != l || r.full() {
			continue
		}
		r.add(uringOpSend, c.fd, c.wbuf, uint64(i))
	}
	if !r.submit(l.sent) {
		r.close() // flush writes them one by one, as it will from now on
		l.ring = nil
	}
}

// receiveAll receives for the coroutines of l.recvq, each waiting in Read
// on a readable socket, into the buffer that Read is to fill (Co.rbuf),
// all with one io_uring submission; Read takes the result when its
// coroutine resumes. With one coroutine Read receives for itself (a
// submission of one costs what its recvfrom would).
func (l *Loop) receiveAll() {
	if r := l.ring; len(l.recvq) > 1 && r != nil {
		for i, co := range l.recvq {
			if r.full() {
				break // the rest read for themselves
			}
			r.add(uringOpRecv, co.rconn.fd, co.rbuf, uint64(i))
		}
		if !r.submit(l.received) {
			r.close() // from now on every Read and flush uses its own call
			l.ring = nil
		}
	}
	clear(l.recvq)
	l.recvq = l.recvq[:0]
}

// received takes the result of the ring's receive for l.recvq[tag]. One
// the kernel cancelled did not happen: Read, resumed because its socket is
// readable, receives for itself.
func (l *Loop) received(tag uint64, res int32) {
	if -res == int32(unix.ECANCELED) {
		return
	}
	co := l.recvq[tag]
	co.rres, co.rdone = res, true
	l.ringReceives++
}

// sent takes the result of the ring's send for l.flushq[tag].
func (l *Loop) sent(tag uint64, res int32) {
	c := l.flushq[tag]
	switch {
	case res > 0:
		l.ringSends++
		c.wbuf = c.wbuf[:copy(c.wbuf, c.wbuf[res:])]
		if len(c.wbuf) > 0 {
			return // flushDeferred writes the rest
		}
		if cap(c.wbuf) > 4<<10 {
			c.wbuf = nil
		}
	case res == 0 || -res == int32(unix.EAGAIN) || -res == int32(unix.EINTR) || -res == int32(unix.ECANCELED):
		return // flushDeferred tries again and waits for writability
	default:
		c.failDeferred(l, unix.Errno(-res))
	}
	c.queued = false
	l.flushq[tag] = nil
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

// maxSpareWorkers bounds the finished coroutines a loop keeps for reuse.
const maxSpareWorkers = 256

// Go runs fn as a coroutine of the loop. Call it on the loop goroutine
// (from a function given to Post, or from dispatch). A coroutine whose
// function returned is kept (up to maxSpareWorkers) and runs the next
// function given to Go: starting one costs a coroutine switch, not a new
// goroutine (whose creation would wake an idle P's thread).
func (l *Loop) Go(fn func(co *Co)) {
	l.goRan = true
	if n := len(l.spare); n > 0 {
		co := l.spare[n-1]
		l.spare[n-1] = nil
		l.spare = l.spare[:n-1]
		co.job = fn
		l.resume(co)
		return
	}
	co := &Co{loop: l, timerAt: -1, job: fn}
	co.waitFd = [2]int{-1, -1}
	co.unpark = func() {
		if co.waiting && co.waitFd[0] < 0 {
			l.resume(co)
		}
	}
	co.next, co.stop = iter.Pull(func(yield func(struct{}) bool) {
		co.yield = yield
		for {
			fn := co.job
			co.job, co.intr, co.timedOut = nil, nil, false
			fn(co)
			co.idle = true
			if !yield(struct{}{}) {
				return
			}
			co.idle = false
		}
	})
	l.live++
	l.resume(co)
}

// idleTurn lets the spare coroutines go once no Go ran for spareIdle.
func (l *Loop) idleTurn() {
	now := time.Now()
	if l.goRan || l.idleSince.IsZero() {
		l.goRan = false
		l.idleSince = now
		return
	}
	if now.Sub(l.idleSince) >= spareIdle {
		l.dropSpares()
		l.idleSince = time.Time{}
	}
}

// dropSpares ends the spare coroutines (their goroutines exit).
func (l *Loop) dropSpares() {
	for i, co := range l.spare {
		co.dead = true
		l.live--
		co.stop()
		l.spare[i] = nil
	}
	l.spare = l.spare[:0]
}

// GoOnReadable arranges for fn to start as a coroutine of l when c may be
// read (bytes, its end or an error), holding no coroutine until then: an
// idle session costs no stack. It reports false, arranging nothing, when c
// may be read already (the caller goes on reading). c must be homed on l;
// call it on l's goroutine or from a coroutine of l that is about to end.
func (l *Loop) GoOnReadable(c *Conn, fn func(*Co)) bool {
	s := l.slot(c.fd)
	if s.ready&readable != 0 && c.peekNow(s) {
		return false
	}
	s.start = fn
	return true
}

// StopOnReadable cancels GoOnReadable for c; it reports whether it was
// pending (and so did not start and now never will). Call it on l's
// goroutine.
func (l *Loop) StopOnReadable(c *Conn) bool {
	if c.fd < 0 || c.fd >= len(l.fds) || l.fds[c.fd].start == nil {
		return false
	}
	l.fds[c.fd].start = nil
	return true
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
		return
	}
	if co.idle {
		if len(l.spare) < maxSpareWorkers {
			l.spare = append(l.spare, co)
			return
		}
		co.dead = true
		l.live--
		co.stop()
	}
}

func (l *Loop) fireTimers(now time.Time) {
	for len(l.timers) > 0 && !l.timers[0].when.After(now) {
		co := l.timers[0]
		l.timers.remove(co)
		co.timedOut = true
		l.resume(co)
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

	waitFd   [2]int    // descriptors waited on (-1: none)
	waitWant [2]uint8  // readiness wanted of each
	waiting  bool      // suspended in a socket wait or Park (not an offload)
	when     time.Time // the wait's deadline, while in the timer heap
	timerAt  int       // index in the loop's timer heap (-1: none)
	timedOut bool
	intr     error     // a pending Interrupt
	job      func(*Co) // the function Go gave it (nil while spare)
	idle     bool      // its function returned: kept as a spare
	dead     bool
	unpark   func() // posted by Unpark

	// A Read suspended until its socket (rconn) is readable: the loop may
	// receive into rbuf for it (receiveAll) and leave the result in rres
	// (a count, or a negative errno) with rdone set.
	rconn *Conn
	rbuf  []byte
	rres  int32
	rdone bool
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
	if co.timerAt >= 0 {
		l.timers.remove(co)
	}
}

// wait suspends co until a (or b, when not nil) is ready as wanted, the
// deadline passes, or an Interrupt arrives. With neither it is Park.
func (co *Co) wait(a *Conn, wa uint8, b *Conn, wb uint8, deadline time.Time) error {
	if err := co.intr; err != nil {
		co.intr = nil
		return err
	}
	l := co.loop
	if !deadline.IsZero() {
		if !time.Now().Before(deadline) {
			return os.ErrDeadlineExceeded
		}
		co.when = deadline
		l.timers.push(co)
	}
	if a != nil {
		l.slot(a.fd).waiter = co
		co.waitFd[0], co.waitWant[0] = a.fd, wa
	}
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

// Park suspends co until Unpark, the deadline (zero: none; then
// os.ErrDeadlineExceeded) or an Interrupt (its error). It may return nil
// spuriously: the caller checks what it waits for and parks again.
func (co *Co) Park(deadline time.Time) error { return co.wait(nil, 0, nil, 0, deadline) }

// Unpark ends co's current Park (or, if it is not parked now, may end its
// next one spuriously). Any goroutine may call it; it never blocks on co.
func (co *Co) Unpark() { co.loop.Post(co.unpark) }

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
	if co.dead || co.idle {
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

// timerHeap orders the coroutines waiting with a deadline (each has at
// most one: Co.when, at index Co.timerAt). A coroutine leaves it when its
// wait ends, however it ends, so the heap holds only live deadlines.
type timerHeap []*Co

func (h timerHeap) less(i, j int) bool { return h[i].when.Before(h[j].when) }

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].timerAt, h[j].timerAt = i, j
}

func (h timerHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		j = i
	}
}

func (h timerHeap) down(i int) {
	n := len(h)
	for {
		j := 2*i + 1
		if j >= n {
			return
		}
		if k := j + 1; k < n && h.less(k, j) {
			j = k
		}
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		i = j
	}
}

func (h *timerHeap) push(co *Co) {
	co.timerAt = len(*h)
	*h = append(*h, co)
	h.up(co.timerAt)
}

func (h *timerHeap) remove(co *Co) {
	i := co.timerAt
	if i < 0 {
		return
	}
	old := *h
	last := len(old) - 1
	if i != last {
		old.swap(i, last)
	}
	old[last] = nil
	*h = old[:last]
	if i != last {
		h.down(i)
		h.up(i)
	}
	co.timerAt = -1
}

// errNotSocket is returned by Bind for a connection that is not a socket
// (net.Pipe in tests, a pipe): it stays an ordinary Go connection.
var errNotSocket = errors.New("evloop: not a socket")

var _ net.Conn = (*Conn)(nil)
