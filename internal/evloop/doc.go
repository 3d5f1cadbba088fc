// Package evloop runs many connections' conversations on a few event loops,
// so that the steady state of a session needs no thread hand-off per
// message.
//
// # What it owns
//
//   - Loop: one epoll instance, the goroutine that waits on it, and the
//     coroutines it drives. The loop's thread blocks in epoll_wait itself
//     (a raw syscall: the runtime leaves it its P), so a wake-up goes
//     straight to the thread that handles it, and a busy loop reads and
//     writes in place, as PgBouncer's single epoll loop does. The runtime
//     needs one P more than there are loops for everything else. A loop
//     that has had nothing to do for a second waits in Go's netpoller
//     instead (a duplicate of its epoll descriptor is readable there), so
//     an idle process holds no P and the runtime does not preempt its
//     loops every 10 ms.
//   - Co: a coroutine (iter.Pull) that runs one session's code in the
//     plain blocking style. A read or write that would block yields to the
//     loop; the loop resumes the coroutine when epoll says the socket is
//     ready. Switching between the loop and a coroutine is a direct
//     goroutine switch on the same thread, not a scheduler wake-up. A
//     coroutine whose function returned is kept as a spare for the next
//     Go, so starting one creates no goroutine. GoOnReadable starts one
//     when an idle socket speaks: an idle session needs no coroutine.
//   - Bytes written with WriteDeferred (replies to clients, queries to
//     servers) go out at the end of the loop's turn, all of the turn's
//     writes together, just before it waits: with one io_uring submission
//     when there are several and the kernel allows io_uring (ring, in
//     uring_linux.go), else one send(2) each. Every operation in the ring
//     carries MSG_DONTWAIT, so the kernel finishes it (bytes taken, or
//     EAGAIN) inside that one call: nothing is in flight when the call
//     returns, and what a socket did not take waits for its EPOLLOUT as
//     before. Should the call fail, or return before every completion is
//     there, the loop waits for the operations the kernel took (or cancels
//     them and waits for the cancellation) before any buffer goes back to
//     its owner: no path leaves the kernel writing into, or reading from,
//     Go memory after the submission (ring.submit). A deferred write that fails is reported by the owner's next
//     Write, and by its next Read that finds nothing to read (the peer
//     will not answer what it never got).
//   - Receives the other way round: when epoll reports several sockets
//     readable whose coroutines wait in Read, the loop receives for all of
//     them with one io_uring submission (receiveAll), each into the buffer
//     its Read is waiting to fill, before it resumes any of them; Read
//     returns what was received as if it had read it itself. A coroutine
//     so served is always resumed in that turn (edge-triggered epoll sends
//     no second event for bytes already taken).
//   - Listener (Listen): a TCP listening socket in the epoll of every loop
//     (EPOLLEXCLUSIVE: one loop is woken per connection). The woken loop
//     accepts on its own thread, up to a batch per turn, and hands each
//     connection, a Conn with its own descriptor that no netpoller ever
//     saw, to a callback on its goroutine, which starts a coroutine for it.
//     The socket options Go's net package sets on each connection (no
//     Nagle delay, keepalive) are set once on the listening socket: Linux
//     copies them to every socket it accepts. The socket defers accepts
//     until a connection's first bytes arrive (TCP_DEFER_ACCEPT), so a
//     login's first read finds its startup packet. Out of descriptors, a
//     loop stops accepting for a moment, longer each time. Close takes the
//     socket out of every loop before it returns; the loops must still
//     run.
//   - Conn: a net.Conn that starts as an ordinary Go connection (login, TLS
//     handshake, dial) and is adopted by a loop: its descriptor is taken out
//     of Go's netpoller and put in the loop's epoll. TLS and buffered
//     readers above it keep working, because they only see the Conn.
//
// # Rules
//
//   - A loop's state (its descriptor table, timers, the coroutines) is
//     touched only by the loop goroutine and the coroutine it is running.
//     Other goroutines reach a loop only through Post, which writes the
//     loop's eventfd only while the loop waits in epoll_wait (a running
//     loop looks at what was posted before it waits): a coroutine that
//     unparks another on its own loop costs no system call.
//   - An adopted Conn bound to a coroutine (Bind) is used only by that
//     coroutine: its Read and Write yield when the socket is not ready. An
//     adopted Conn bound to no coroutine (an idle pooled server connection)
//     may be used by any goroutine; its Read and Write then wait in poll(2).
//   - A coroutine never blocks its thread on anything but its sockets: a
//     wait another goroutine ends goes through Park and Unpark (the pool's
//     wait for a connection), and anything else that may block (a dial, a
//     lease call, a pin slot) through Co.Offload, which runs it on a
//     goroutine of its own while the coroutine is suspended and the loop
//     serves others.
//   - Readiness is edge-triggered. A socket is assumed ready until a
//     syscall on it returns EAGAIN or a short count; epoll reports the next
//     edge. Once the peer has closed (EPOLLRDHUP/HUP) a short read is not
//     "drained": the end is still to be read and no edge will announce it.
//     A spurious wake-up only costs one syscall that returns EAGAIN. The
//     same record answers Co.Quiet with no system call: a socket read to
//     its end on which epoll reported nothing since has received nothing
//     (how the pool checks an idle server connection before reuse).
//   - GOMAXPROCS is raised to one more than the loops running in the
//     process (each loop's thread keeps its P while it waits).
//
// # What the loop guarantees to callers
//
//   - A loop goroutine and the coroutines it drives never run at the same
//     time: a coroutine runs only while the loop is inside resume, and two
//     coroutines of one loop never run together. State owned by a loop
//     needs no lock; coroutines of different loops do run in parallel.
//   - Functions given to Post run on the loop goroutine, in the order
//     posted, soon; Post does not wait for the loop (only, briefly, for
//     its mutex). Those posted before Stop run before Run returns.
//   - The bytes of a bound Conn go out in the order they were given, across
//     WriteDeferred, Write and WriteDraining (deferred bytes are written
//     before a Write's); Flush and Close of a bound Conn write what is
//     deferred before they return (waiting up to a second when there is no
//     write deadline). A deferred write's error is returned by the next
//     Write, and by the next Read that would wait.
//   - Read returns the socket's bytes in order, at most len(p) of them, and
//     io.EOF only after the last byte.
//   - No operation of the kernel on a caller's buffer outlives the call that
//     was given it: once Read or Write returns, nothing reads or writes p
//     (WriteDeferred copies p before it returns). A ring operation is never
//     left in flight, even when io_uring_enter fails (ring.submit).
//   - After Flush (or DropDeferred) and Unbind, nothing of the loop touches
//     the Conn: another goroutine or loop may take it.
//   - Under the race detector, what the kernel reads from and writes into
//     Go buffers for the loop is visible (race_on.go), as it is for the
//     syscall package's calls. One difference: the syscall package also
//     orders every write to a descriptor before every later read (so memory
//     handed over by a byte sent through a socket is not reported); the
//     raw calls do not. Hand memory over with a channel, Post or Unpark.
//
// # What evloop needs of the Go runtime
//
// The package leans on behaviour of the Go runtime that its documentation
// only partly promises. Each item below says what is relied on, what breaks
// if it changes, and what catches that. Checked with Go 1.26.8 (go.mod's go
// line, and the go command here) on linux/amd64, Linux 6.18; re-check on
// every Go upgrade with go test -race ./internal/evloop and the benchmarks
// (go test ./internal/evloop -run '^$' -bench .). No runtime function is
// reached with go:linkname, and no thread is locked (runtime.LockOSThread).
//
//   - Raw system calls keep the P. epoll_pwait (at most busyWait),
//     recvfrom, sendto, accept4, epoll_ctl, close of a socket, the eventfd
//     read and write and io_uring_enter are
//     made with unix.RawSyscall/RawSyscall6, which do not tell the
//     scheduler (no entersyscall): the thread keeps its P, sysmon is not
//     woken, no other thread is handed the P. Only calls that cannot block,
//     or wait a bounded time, are made so; poll(2) for an unbound Conn, the
//     ring's cancellation and the idle loop's wait go through the
//     scheduler. If raw calls began to release the P, nothing would be
//     wrong but each wake-up would cost a P hand-off between threads: only
//     the benchmarks (BenchmarkSocketCallPair, BenchmarkEmptySyscall, and
//     proxy's) show it.
//   - The preemption signal ends a raw wait. A loop in epoll_pwait holds a
//     running P, so a stop-the-world (garbage collection) and sysmon's
//     10 ms preemption reach it by the signal the runtime sends a thread to
//     preempt it (SIGURG): epoll_pwait returns EINTR (never restarted,
//     whatever SA_RESTART says) and the loop reaches a safe point at once.
//     Without that signal every stop would wait for each loop's wait to time
//     out (up to busyWait): GODEBUG=asyncpreemptoff=1 does exactly that.
//     TestStopTheWorldInterruptsParkedLoops catches it.
//   - GOMAXPROCS. Run raises it to one more than the running loops (each
//     holds a P while it waits). Calling runtime.GOMAXPROCS also turns off
//     the automatic GOMAXPROCS updates of Go 1.25 and later; when it is
//     already high enough Run does not call it, and a later drop of the
//     container's CPU quota may lower GOMAXPROCS below the loops plus one:
//     the rest of the process then runs only when a loop is preempted
//     (every 10 ms), slower but not stuck. TestRunRaisesGOMAXPROCS checks
//     the raise.
//   - Coroutines are iter.Pull. Relied on: next runs the coroutine until it
//     yields and the caller does not run meanwhile (iter's documented
//     contract; every test relies on it); the switch is runtime.coroswitch,
//     a direct goroutine switch on the same thread with no scheduler
//     involved (performance only: BenchmarkCoroutineSwitch); next and yield
//     are a release and an acquire for the race detector (iter.go's
//     race.Release/Acquire), which orders a ring receive's bytes, written
//     on the loop goroutine, before the coroutine reads them (without it
//     every -race run reports races on Co's fields;
//     TestRaceDetectorSeesKernelAccess's ordered cases check the buffers);
//     stop ends a coroutine suspended in yield (dropSpares). The runtime
//     throws if a coroutine switches with a thread-lock state other than
//     the one it was created with (runtime/coro.go): code running in a
//     coroutine must not call runtime.LockOSThread.
//   - The netpoller takes an idle loop's wait (parkIdle): os.NewFile puts a
//     non-blocking descriptor in the netpoller, an epoll descriptor is
//     readable while it has events, and RawConn.Read waits for that (bounded
//     by SetReadDeadline). If os.NewFile stopped doing so, Read would fail
//     at once and an idle loop would spin: TestIdleLoopWaitsInNetpoller
//     counts the netpoller waits and catches it.
//   - The kernel holds Go addresses. Go's heap does not move objects;
//     goroutine stacks do (growth, and shrinking while parked). A raw call
//     holds an address only during the call, when the goroutine cannot be
//     moved. The ring holds one from add to the end of submit, in memory
//     the garbage collector does not scan: its buffers must be heap objects
//     kept alive meanwhile. Deferred bytes (Conn.wbuf) are; Read stores its
//     p in Co.rbuf, which makes the compiler put p's array on the heap; the
//     ring keeps the slices (ring.bufs) until their completions are reaped.
//     A moving heap, or a Read that no longer let p escape, would let a ring
//     receive write into memory that had moved; no test catches that
//     (go build -gcflags=-m shows "leaking param: p" for Read).
//   - Race annotations: runtime.RaceReadRange and runtime.RaceWriteRange,
//     exported in race builds (runtime/race.go). race_on.go calls them;
//     TestRaceDetectorSeesKernelAccess checks that a race on a buffer the
//     kernel reads or writes (raw and ring, receive and send) is reported.
package evloop
