// Package listen answers lockpool's clients' LISTEN and UNLISTEN with one
// shared listener connection per database, and fans the notifications that
// connection receives out to the clients (the subscribers) that listen.
//
// # What it owns
//
//   - The listener connections: per database at most one live connection,
//     opened on demand (the first Listen, or the first after the previous
//     connection died) with Config.ConnConfig and application_name
//     "lockpool listener", outside every application budget. One goroutine
//     per connection owns it (the pgconn.PgConn is used by no one else): it
//     runs the connection's commands one at a time (LISTEN "x", UNLISTEN "x",
//     and barriers: an empty statement that doubles as the ping) and
//     otherwise waits for notifications with pgconn's WaitForNotification.
//     The wait's context is cancelled when a command becomes due; a
//     cancelled wait interrupts only a read (pgconn's deadline handler, set
//     here explicitly), keeps a partly read message for the next read and
//     leaves the connection usable. Notifications come through pgconn's
//     OnNotification callback, in stream order, also while a command runs.
//   - The state of each database (type database, guarded by its mutex): its
//     channels, each with its subscribers and what the connection has done
//     about it (unlistened, LISTEN sent, listening, UNLISTEN sent); per
//     subscriber its subscriptions; the subscriptions and barriers waiting
//     for a command; and the expectations (Expect) by server backend pid.
//     Fan-out and Lost calls run under that mutex, so a subscriber's
//     methods are never called after Unlisten, UnlistenAll or Lost has
//     ended what they belong to, and never concurrently for one database.
//   - The hub-wide counts behind Stats and the metrics.
//
// # Invariants
//
// PostgreSQL sends a listening backend's pending notifications before the
// ReadyForQuery of every command: a sender's backend signals the listening
// backends before its COMMIT is answered, and the listener backend reads
// the queue on that signal when idle, or at the latest right before its
// next ReadyForQuery (postgres.c). So a ReadyForQuery on the listener
// connection is a cut in the notification stream: every notification
// committed before the command was sent comes before it, and only
// notifications committed after that moment can come after it. Hence:
//
//   - A subscription is active (gets notifications) only from the
//     ReadyForQuery of a command sent after its Listen call, and only once
//     the connection LISTENs on its channel: the LISTEN itself for a channel
//     the connection did not listen on, otherwise a barrier. Notifications
//     received before that are not for it. So nothing committed before the
//     Listen call reaches the subscriber, and everything committed after
//     Listen returned does, until Unlisten, UnlistenAll or Lost.
//   - An active subscription's channel is LISTENed on the connection: an
//     UNLISTEN is sent only for a channel without subscribers, and a
//     subscription to a channel whose UNLISTEN is in flight waits for the
//     LISTEN after it.
//   - Each notification is handed, in stream order, to every subscription
//     of its channel active when it is received, exactly once; an
//     expectation matches at most one notification.
//   - Sync's barrier is the same cut: when it returns, every notification
//     committed before the call has been fanned out.
//
// PostgreSQL reads its queue in queue order and stops at an entry of a
// transaction still committing; a notification queued behind such an entry
// comes later even when its own transaction committed earlier. That is
// PostgreSQL's own rule for every listening session, and the hub passes it
// on unchanged (a direct session would see the same).
//
// # The life of a listener connection
//
//	connecting ──connected──▶ listening ──error, FATAL, ping unanswered──▶ closing ──▶ gone
//	     └─────────connect failed, Hub.Close──────────────┴─────Hub.Close────────┘
//
// A connection is the database's current connection while connecting or
// listening. When it dies (a read or write error, a FATAL such as 57P01 from
// pg_terminate_backend or a shutdown, a command or ping not answered within
// Config.PingInterval), the database's state is cleared in one critical
// section: every subscriber with an active subscription gets Lost once, a
// Listen or Sync waiting on it returns the error, and the connection is no
// longer current (closing) while its goroutine closes it. The next Listen
// opens a new one; nothing reconnects by itself. Hub.Close ends every
// connection the same way without Lost calls.
package listen
