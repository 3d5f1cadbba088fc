// Package session is the session core: one logged-in client's session,
// which relays each transaction to a pooled server connection and runs
// lockpool's own functions (their kinds are package local's) in their place
// in the reply order. The server (package session) logs the client in, makes
// its Session (New), gives it its key (SetKey) and runs it on an event loop
// (Run); what the sessions share it hands over once as a Shared, and what a
// session asks of it goes through Host (its registry, key-pid signals,
// pg_stat_activity, the configuration in force).
//
// # Who owns what
//
// Sessions run on event loops (internal/evloop, event_loops of them): a
// loop's thread waits in epoll on its clients' and server connections'
// sockets and runs each session as a coroutine, in the plain blocking
// style: a read or write that would block yields to the loop, which resumes
// the coroutine when epoll says the socket is ready. One coroutine owns the
// session at a time: it reads the client, writes the server, reads the
// server's replies and writes them to the client. A session that is idle
// with no server connection rests: it has no coroutine (no stack), and its
// loop starts one when the client speaks. Login, TLS handshake and startup
// checks run before, on the accepting goroutine; the socket is then handed
// to a loop (adopted: taken out of Go's netpoller into the loop's epoll).
// Waits on anything but the session's own sockets never block the loop: a
// wait for a pool connection (with the pin slot a statement wants, when the
// session has no connection: pool.AcquireWithPin) parks the coroutine in
// its loop (the pool unparks it when it grants a connection; the session's
// serverLink when a cancel request or a kill ends the wait's context), and
// pin-slot waits of attached sessions, lease calls, dials and cancels run
// through session.offload on a goroutine of their own.
//
// Two small types hold what other goroutines may see:
//   - serverLink (link.go): the server connection and its life-cycle state,
//     changed by the session under the link's lock, read by cancel
//     requests, shutdown and the admin server.
//   - clientOut (link.go): the client socket's write side. A FATAL is the
//     last thing written; nothing is written after it. Replies go out once
//     per loop turn (evloop.Conn.WriteDeferred), with the queries sessions
//     wrote to their servers in the same turn (writeServer): one io_uring
//     submission for all of them where the kernel allows it.
//
// Other goroutines reach a session only through its loop: kill posts an
// interrupt, which ends the coroutine's current socket wait with the FATAL
// (or wakes a resting session to say it). The listener hub (package
// listen) queues a listening client's notifications in its inbox (package
// local's listen kind; the inbox's own lock) and posts a wake
// (postDeliver): a resting session is resumed and
// writes them at its idle point, an idle pinned one's wait is interrupted. While a pinned (or session-mode)
// client is idle, or a client is idle inside a transaction block, its
// coroutine waits on both sockets at once (watchIdle), relaying
// notifications and noticing the server's death.
//
// # States of the server link
//
//	           attach (pool.Acquire + parameter sync)
//	detached ───────────────────────────────────────> attached
//	   ▲   ▲                                           │  ▲  │ ▲
//	   │   │ release at a safe point (unpinned)        │  │  │ │ client idle, pinned
//	   │   └───────────────────────────────────────────┘  │  ▼ │  or in a tx (watchIdle)
//	   │                       write client messages      │ watched
//	   │                          ┌───────────────────────┘
//	   │                          ▼            ReadyForQuery, nothing owed
//	   │                      relaying ──────────────────> probing ──> attached
//	   │                          │   (needs a probe or read-back)
//	   │  loss outside a tx,      │ read/write error, FATAL
//	   │  nothing owed, unpinned  ▼
//	   └──────────────────────  lost ──> client gets FATAL and is closed
//	                                     (inside a transaction, owed
//	                                      replies, or pinned)
//
// Any state moves to closing when the session ends. serverLink.to refuses
// every other move.
//
// # The path of one query
//
//  1. serve reads a message header; onQuery (or onParse, onBind, …) decodes
//     only what it must: Query and Parse texts pass a byte prefilter and,
//     on a hit, the lexer (rewrite.Analyze); policy.Decide says pin, refuse
//     or forward. An unnamed Parse with the same bytes as one of the last
//     eight that had nothing found is forwarded without looking again
//     (session.plainParses).
//     A statement lockpool answers itself is claimed by one of the kinds
//     of package local (lease calls, advisory calls held under
//     advisory_locks: hold, LISTEN, UNLISTEN and pg_listening_channels()
//     under listen: shared, pg_terminate_backend and pg_cancel_backend of
//     a key pid), which the Server's table lists (handler.go: localKinds):
//     the kind prepares it, and the core binds, describes and runs it in
//     the client's protocol, in its place in the reply order. The session
//     is the kinds' local.Session (localsession.go: the mechanics they use
//     stay with the session, its link and its loop). A new kind is a new
//     entry of localKinds and touches no other file of the core.
//  2. toServer attaches a connection if the session has none, and pushes
//     the reply the message owes onto the reply queue (replies.go); the
//     message is appended to sout, rewritten where lockpool must
//     (rewriteStatements: resets to startup values, LISTEN among other
//     statements, lease_fence). Replies lockpool makes itself (the local
//     kinds, lazily answered Parse, Close, its own errors) are pushed as
//     local entries in the same queue.
//  3. When the client has nothing more buffered, flushBatch writes sout in
//     one write and pump relays the server's replies, popping the queue:
//     each entry knows the message that completes it. A local entry is
//     written the moment it reaches the front, so the client sees one
//     ordered stream. After an error in an extended batch every entry up to
//     the next Sync is dropped, local or not, as the server skips them.
//  4. At ReadyForQuery with nothing owed (a safe point) the session probes
//     pg_locks if a statement touched advisory locks or session state,
//     reads back changed settings, and gives the connection back unless it
//     is pinned (or in session mode).
//  5. If the server connection dies, serverLost decides: inside a
//     transaction block, with replies owed, or pinned, the client gets the
//     server's FATAL (or lockpool's 08006) and is closed, so no later
//     statement of it runs outside the broken transaction. Otherwise the
//     loss is invisible.
//
// # Invariants
//   - Waits for pin slots and connections have one order: a session with no
//     server connection whose statement may pin waits for the slot and the
//     connection together holding neither (apply marks the slot wanted,
//     attach takes both: pool.AcquireWithPin); a session holding its
//     connection (inside a transaction) waits for a slot only
//     (pool.AcquirePin). A session never waits holding a pin slot without
//     its connection, so no wait cycle can form between the two.
//   - A server connection goes back to the pool only at a safe point: every
//     message the client sent is answered, nothing was written after the
//     last Sync, the server said ReadyForQuery 'I', and the session is not
//     pinned. Any other server connection a session lets go of is
//     destroyed.
//   - A statement that opens a transaction block and cannot reach a server
//     leaves the client in a failed transaction (localTx): everything but
//     ROLLBACK gets 25P02, so nothing runs in autocommit by mistake.
//   - Frames are forwarded as raw bytes; a decoded client message aliases the
//     read buffer and is valid until the next read: whatever is kept
//     (statement text, names) is copied. Writes are buffered and flushed
//     once per batch.
package session
