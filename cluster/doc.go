// Package cluster shares applications' connection budgets between lockpool
// instances through PostgreSQL (applications with budget_scope: cluster).
//
// # What it owns
//
//   - One coordination connection per instance (application_name
//     "lockpool cluster", logged in like the lease store's connections, to
//     cluster.database), opened and re-opened by the Coordinator's loop.
//   - Three tables in the leases schema of that database, created at first
//     use under pg_advisory_xact_lock(MigrationLockKey):
//     cluster_instances (one row per running instance: its number, the
//     address it takes forwarded cancel requests on, the key the signal
//     requests forwarded to it are authenticated with, its heartbeat, the pid
//     and backend_start of its coordination backend, and coord_server: the
//     pg_postmaster_start_time() of the server it registered on, which its
//     recorded pids belong to), cluster_apps (one row
//     per cluster and application, the lock every slot change takes) and
//     cluster_slots (per cluster, application and instance: the server
//     connections and pin slots the instance holds, what it wants — demand —
//     and the backend pids of the server connections it opened).
//   - One more connection per instance for recording those pids: the pool
//     calls back (pool.Manager.OnDial) after each dial of a cluster
//     application and the pid is appended to the instance's row before the
//     connection is used; when that fails the connection is closed.
//   - The run-time limits of the cluster applications in the pool
//     ([pool.Manager.SetLimit]): an instance's pool never has more open
//     connections of an application than the slots its row holds.
//
// # Invariants
//
//   - For every application, the sum of slots over all rows of the
//     application (live and dead instances alike) is at most its budget
//     (max_connections; max_pinned for pins). A row is only raised inside a
//     transaction that holds the application's cluster_apps row FOR UPDATE
//     and checks that sum; a row only leaves the table when its instance is
//     known to hold nothing (below).
//   - An instance's backends never exceed its row's slots: it raises its
//     pool's limit only after the raised row committed, and lowers the row
//     only after lowering the limit, to no less than the connections still
//     open and the backends of connections it closed that PostgreSQL has
//     not ended yet (still in pg_stat_activity; a backend ends when it
//     reads the Terminate, after lockpool let the connection go). The
//     heartbeat reads those backends only after it holds its row's lock
//     and has dropped the transaction's snapshot of pg_stat_activity, so a
//     backend recorded while it waited is seen. The pool never opens more
//     than max(open, limit) after a lower limit.
//     Together: the application's backends over all live instances never
//     exceed its budget, also while slots move.
//   - Every server backend an instance uses is in its row first. A dead
//     instance's slots (no heartbeat for cluster.ttl, by the server's
//     clock) are reclaimed only when its coordination backend is gone from
//     pg_stat_activity and none of the backends in its row is left: the
//     survivor locks the row (so the instance cannot record another
//     backend meanwhile), terminates those still there with
//     pg_terminate_backend, and deletes the row at a later tick when none
//     is left. This holds even if the "dead" instance still runs: its
//     backends are gone and it can record no new one.
//   - An instance dials only while its row is in place and covers every
//     connection its pool counts open (dials waiting at the gate included:
//     a row that could not be raised that far lets none through), and its
//     last successful heartbeat was sent less than ttl/2 ago (its own
//     monotonic clock), and each dial attempt ends by that send + 0.9 × ttl
//     (pool.Manager.DialGate): no dial of it is in flight when the others
//     may take it for dead. Each tick with a stale heartbeat its limits
//     fall to the connections it still has open. When PostgreSQL is
//     unreachable it keeps what it holds. An instance that finds its rows
//     gone (reclaimed) sets its limits to 0 and starts from an empty row.
//
// # Failover
//
// After a failover (or a restart) the coordination connection comes back on
// another server, told apart by pg_postmaster_start_time(). Its tables are
// a consistent past state of the old primary's (asynchronous replication
// loses the last commits), so the budget invariant holds in them; what this
// instance holds is rebuilt from them, not from memory. At registration the
// instance takes over its row (or inserts it under its old number) with the
// new coord_server, clears the pids of its slot rows (backends of the old
// server), lowers its limits to what is open and records no backend until a
// balance on the new server has moved its row as on every tick (up only by
// what is free) and recomputed the limits; recordDial also refuses a row
// whose instance row names another server, so a dial that passed the gate
// before the instance noticed the failover is closed. A row missing on the
// new server is started over as after a reclaim. A dead row whose instance
// registered last on another server is taken away without terminating
// anything (its pids are of the other server), and only once this instance
// has been on the new server for ttl, so that live instances re-register
// first and keep their rows.
//
// Slots follow demand: each tick every instance writes what it wants (in
// use + dialing + waiting, the peak since its last tick) and computes from
// all live rows the same max-min fair split of the budget, each live
// instance first getting min_share; it then moves its own row toward its
// share — down at once (to no less than what is open), up only by what is
// free.
package cluster
