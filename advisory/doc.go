// Package advisory holds PostgreSQL session-level advisory locks for
// lockpool's clients (the advisory_locks: hold policy), so that a lock
// holder keeps no application connection.
//
// # What it owns
//
//   - Its lock connections: per database at most Options.MaxConnections
//     (default 2), opened lazily with Options.ConnConfig and
//     application_name "lockpool locks", outside every application budget.
//     A key always lives on the same connection of its database (its home,
//     chosen by the key's hash), so lockpool never conflicts with itself in
//     PostgreSQL. Every lock lockpool holds is a real lock on its home
//     connection, taken with the real function: other sessions (direct, or
//     through another lockpool) conflict with it exactly as PostgreSQL
//     decides.
//   - The lock table of each database: per client session, per key and
//     mode, a hold count. Conflicts among lockpool's own clients (who share
//     one PostgreSQL session per home connection and would otherwise
//     re-enter each other's locks) are decided here, with PostgreSQL's
//     rules: shared locks are compatible with each other, an exclusive lock
//     with nothing held by another session; a session never conflicts with
//     itself; holds stack and each unlock undoes one. A session that holds
//     nothing of a key joins the home connection's shared hold only when
//     pg_locks shows no session waiting for the key exclusively, as
//     PostgreSQL queues a new session's shared request behind such a waiter.
//   - Waiting. A blocked acquire waits in lockpool, holding no connection:
//     behind a local holder in the key's queue (first come, first served, as
//     in PostgreSQL), behind a remote holder by retrying the try-lock form on
//     the home connection with a capped backoff (the blocking form under a
//     10 ms lock_timeout for a session upgrading its own shared lock, which
//     PostgreSQL queues ahead of the key's waiters), so one blocked key never
//     stops the others. The wait ends with the lock, the context (57014),
//     the client's lock_timeout (55P03) or statement_timeout (57014), or a
//     deadlock among lockpool's own waiters (40P01, checked after
//     deadlock_timeout as PostgreSQL does; at once for an upgrade while
//     another holder of the shared lock waits for it exclusively, as
//     PostgreSQL does), with PostgreSQL's messages.
//   - Keys. Key expressions are evaluated by PostgreSQL (Session.EvalKeys),
//     never re-implemented here, on one more connection per database, the
//     key connection, which holds no lock: a client's expression never runs
//     where other clients' locks live, and pg_advisory_unlock_all() runs
//     after each evaluation so that nothing it did to advisory locks stays.
//
// # Invariants
//
//   - For every key and mode, the home connection holds the PostgreSQL lock
//     exactly once while at least one client session holds it in that mode,
//     and not at all otherwise (an exclusive hold also covers a shared hold
//     of the same session: the shared lock is taken in PostgreSQL, with the
//     blocking form that PostgreSQL grants at once to the holder of the
//     exclusive lock even when others wait for the key, before the exclusive
//     one is given back).
//   - Only one PostgreSQL operation per key is in flight (the key's busy
//     flag), and each connection runs one statement at a time (its mutex).
//   - When a lock connection dies, every session that held a key on it is
//     told once (the lost callback of NewSession) and loses those holds; its
//     later calls fail with FATAL 57P01 (pgerr.LocksLost). lockpool's proxy closes such a client, so
//     it never believes it still holds a lock PostgreSQL has released. The
//     loss is reported (and the table purged) before a replacement
//     connection is dialled, by whichever operation or check finds the
//     connection dead first; a lock is recorded only while its connection
//     generation is alive (checked under the table's mutex), so no grant
//     slips past a loss.
//   - Session.Close releases everything the session held or waited for.
package advisory
