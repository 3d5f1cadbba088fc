// Package lease is lockpool's lease store: the table behind lease_acquire,
// lease_renew, lease_release, lease_list and lease_fence.
//
// # What it owns
//
//   - The schema (Options.Schema, default "lockpool") in every database that
//     uses leases: a NO CYCLE bigint sequence <schema>.lease_token_seq
//     (MAXVALUE TokenSeqMax; a sequence made before is capped), the
//     LOGGED table <schema>.leases and the SQL function
//     <schema>.lease_fence(p_name text, p_token bigint). They are created at
//     first use per database, idempotently, in one transaction under
//     pg_advisory_xact_lock(MigrationLockKey). A role that may not create them
//     gets an *Error with SQLSTATE 42501 whose message contains the one-time
//     SQL an administrator can run (MigrationSQL and GrantSQL).
//   - Its own connections: at most Options.MaxConnections (default 2) across
//     all databases, opened with Options.ConnConfig, autocommit, READ
//     COMMITTED, lock_timeout 300ms and statement_timeout 30s (so a lease
//     connection is never parked behind a client's open transaction), plus
//     one LISTEN connection per database that has had a waiting acquire.
//     Never a connection of an application's pool.
//   - The keeper: one goroutine per Store renews every held lease every
//     ttl/4, batching all due leases of a database in one UPDATE. A renewal
//     that finds the lease gone marks it lost: Renew then returns false,
//     TakeWarnings returns a warning, and
//     lockpool_lease_operations_total{op="keeper_renew",result="lost"} counts it.
//
// # Time
//
// Only the server's clock decides expiry: every comparison is done in SQL
// with now() / clock_timestamp(). The proxy's clock only measures how long to
// sleep (the server tells a waiter how long the current holder has left).
//
// # Tokens
//
// A token is
//
//	timeline << 40 | nextval(<schema>.lease_token_seq)
//
// where timeline is the server's current WAL insert timeline, read in the
// statement that grants the token (from pg_walfile_name(pg_current_wal_lsn()),
// which is right at once after a promotion; pg_control_checkpoint() lags
// until the next checkpoint). Tokens strictly increase, also across a
// failover: a promotion always starts a higher timeline, so a token granted by
// a promoted standby is above every token its old primary granted, those
// whose commits never reached the standby included. The lower 40 bits hold
// the sequence (at most TokenSeqMax = 2^40-1 ≈ 1.1e12 grants; then acquires
// fail with 2200H), the upper 23 the timeline (up to 2^23-1; then 22003).
// Tokens of timeline 1 are above 2^40, so they do not fit in 32 bits; they
// stay below 2^53 (exact in a float64) while the timeline is below 2^13.
// Clients should treat tokens as opaque, increasing numbers. Tokens granted
// before tokens carried the timeline (plain nextval, below 2^40) are below
// every new one, so no row needs migrating.
//
// The token is taken while the lease row is locked (inside ON CONFLICT DO
// UPDATE), so tokens are strictly increasing in grant order. To keep that
// true, a release does not DELETE the row: it marks it free (expires_at =
// now()) and the next acquire takes it over through ON CONFLICT. Rows that
// have been free for more than an hour are deleted by the keeper. (A DELETE
// would let an INSERT whose nextval was evaluated before an earlier grant
// land after it, with a smaller token.)
//
// # Failover
//
// The store's connections follow the primary. After a promotion, a lease a
// session holds is either still its own on the new primary (the row with its
// holder and token was replicated) or it is lost: every renewal, the
// keeper's and lease_renew, matches name, holder and token, so a row that is
// missing (its grant's commit did not reach the new primary), expired, or
// holds another token does not renew; the session forgets the lease and
// gets the lost-lease warning. Nothing re-creates a row for a holder except
// that session's own lease_acquire, which then grants a new, larger token
// (and warns that the old one was lost). A re-acquire keeps the token only
// when the row holds the token the session believes it holds: when the new
// primary missed a release (and the takeover after it), its row still names
// the releasing session with its old token, and that session's next
// lease_acquire gets a new token, above the takeover's, not the old one
// back. Expiry is judged by the new primary's clock: keep the servers'
// clocks in sync.
//
// # Fencing
//
// <schema>.lease_fence(name, token) runs in the client's own transaction. It
// returns the token when that token holds the lease at that moment
// (clock_timestamp(), not the transaction start) and takes a FOR SHARE lock on
// the lease row, so no takeover (and no renewal or release) can commit until
// the client's transaction ends. Otherwise it raises SQLSTATE LP001
// (FenceSQLState) with the message `lockpool: lease "<name>" is not held by
// token <n>`. The function is SECURITY DEFINER with a fixed search_path, so a
// client role needs no privilege on the table. It cannot be used in a READ
// ONLY transaction or on a standby (FOR SHARE needs a writable transaction).
//
// In a REPEATABLE READ or SERIALIZABLE transaction, call lease_fence first:
// the keeper updates the row every ttl/4, and a FOR SHARE on a row changed
// after the transaction's snapshot fails with 40001 (retryable).
//
// While a lease is fenced, its row is locked: lease connections never wait
// for it longer than lock_timeout (300ms). An acquire then reports the lease
// as held (a waiting acquire retries every 250ms; the holder's own re-acquire
// returns its token), a renewal reports whether the lease is still live
// without extending it (the keeper retries every ttl/8), and a release fails
// with 55P03 (Session.Close retries, then leaves the lease to its ttl).
//
// Lease calls are not transactional: ROLLBACK does not undo an acquire,
// renew or release. Waiting is not fair (no FIFO among waiters).
//
// # Errors
//
// Errors meant for the client are *Error values carrying a SQLSTATE:
// 22023 bad argument, 42501 privileges (message holds the SQL to run),
// 55P03 release blocked by a fence, 57P01 session or store closing, 08006
// PostgreSQL unreachable, otherwise the server's own SQLSTATE. A cancelled
// wait returns ctx.Err() (the proxy answers 57014).
package lease
