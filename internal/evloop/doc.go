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
package evloop
