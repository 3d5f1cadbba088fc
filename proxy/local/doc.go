// Package local answers the statements lockpool answers itself, in place
// of the server: each is a kind, below the session core (package session),
// which runs them in the client's protocol.
//
// # What it owns
//
// The kinds and everything that is theirs alone:
//   - lease calls (LeaseKind, lease.go): lease_acquire, lease_renew,
//     lease_release, lease_list() on the lease store (LeaseStore);
//   - advisory calls held under advisory_locks: hold (HoldKind, hold.go):
//     one whole session-level advisory call, held on lockpool's own lock
//     connections (package advisory), with the hold metrics
//     (HoldMetrics: lockpool_advisory_locks_held,
//     lockpool_advisory_lock_wait_seconds,
//     lockpool_advisory_lock_fallbacks_total, by app) and the log of
//     statements that fall back to pin;
//   - LISTEN, UNLISTEN and pg_listening_channels() under listen: shared
//     (ListenKind, listen.go): the session's channels, the LISTENs and
//     UNLISTENs of its open transaction, and the inbox the listener hub
//     (package listen) queues its notifications in;
//   - pg_terminate_backend and pg_cancel_backend of a client's key pid
//     (SignalKind, signal.go): reading the call and its arguments as
//     PostgreSQL does, and PostgreSQL's answers;
//
// and what the kinds share: the Handler, Stmt and Portal interfaces, the
// Kind entry, the encoding of their rows (rows.go), and Session, which is
// all a kind knows of the session it answers for.
//
// # The contract with the core
//
// The core keeps a table of kinds, built from the constructors above, and
// asks them in its order whether an analysed statement is theirs
// (Kind.Claims); the first that says so prepares it (Handler.Prepare).
// The core then runs what was prepared in the client's protocol: a simple
// Query is prepared, bound with no parameters and run at once; a Parse
// keeps the Stmt under the client's name, Bind makes a Portal, Describe
// and Execute use them. The order of replies is the core's: every reply a
// kind makes goes into the session's one ordered reply queue, after
// everything sent before it has been answered, and a statement in a
// failed transaction gets 25P02 without reaching its kind. An error a
// kind returns (a *pgerr.Error, the one SQLSTATE error type) answers the
// statement in its place; a FATAL one ends the session. A Portal that
// sends the statement on to the server (Session.Forward) returns no
// reply of its own: the server's takes its place.
//
// A kind's per-session state lives in its Handler: the core makes it at
// the kind's first claim in the session (Kind.Open) and keeps it until the
// session ends, when it calls Handler.End once. The package keeps no
// state of its own: a Kind is a value, and everything shared by the
// sessions of an application or a server (the lease store, the lock
// manager, the listener hub, the hold metrics) comes from Session.
//
// Beyond the interfaces, the core tells the listen kind's handler
// (*Listening) of the session's transactions: the LISTENs and UNLISTENs
// of a multi-statement Query (Note), errors (NoteError), command tags
// (CommandDone), savepoints (Savepoint), NOTIFYs sent on the server
// (Expect), the subscriptions before a commit (SubscribeEarly) and each
// ReadyForQuery (Ready).
//
// # Goroutines
//
// Everything but the inbox runs on the session's coroutine, one call at a
// time: Kind.Claims and Kind.Open, every method of Handler, Stmt, Portal,
// ReadyNoticer, IdleSender and Listening; a handler's state is its
// session's alone and takes no lock (HoldApp, shared by an application's
// sessions, has its own). A wait on
// anything but the session's own sockets (the lease store, a held lock,
// the listener connection, another instance) runs through Session.Offload,
// within Session.WaitContext and Session.EndWait, so the session's event
// loop never stalls and the client's cancel request or a kill ends the
// wait. The inbox is the listen.Subscriber the listener hub calls on its
// own goroutine (Notify, Lost, KeyPID): it guards its queue with its own
// lock, and calls only the Session methods that are safe on any
// goroutine (PID, Database, Config, Hub, Kill, WakeIdle); the session
// takes the queue at an idle point (IdleSender).
//
// # Invariants
//   - The package imports neither proxy nor proxy/session: it sits below
//     the session core.
//   - What a Stmt or Portal keeps outlives the client message it came
//     from: arguments and parameters are copied.
//   - The metrics keep their names and labels; they are registered by the
//     core (HoldMetrics.Collectors, through package appstate).
package local
