package main

import (
	"context"
	"fmt"
	"math/rand"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease churn: clients take leases (ttl 3 s) on a few names, record each
// hold in soak_lease_log through lockpool (an entry record and later writes
// under lease_fence, an exit record right before lease_release, then what
// the release returned), and the checker verifies from that table
// that no two holds of one name overlap and that tokens grow in the order
// holds began.

var leaseNames = []string{"soak-a", "soak-b", "soak-c"}

const leaseTTL = 3

type leaseClient struct {
	base
	rng    *rand.Rand
	curRow atomic.Int64 // soak_lease_log id of the hold in progress (0 = none)
}

func newLeaseClient(s *soak, id int, seed int64) *leaseClient {
	c := &leaseClient{rng: rand.New(rand.NewSource(seed))}
	c.base = base{s: s, kind: "lease", id: id}
	c.beforeKill = func() {
		// Just before the socket closes: the holder can do nothing after
		// this, and lockpool releases the lease only after it.
		if row := c.curRow.Load(); row != 0 {
			s.markKilled(row)
		}
	}
	return c
}

func (c *leaseClient) mode() pgx.QueryExecMode { return lockModes[c.rng.Intn(len(lockModes))] }

func (c *leaseClient) failed(op string, err error) {
	c.curRow.Store(0)
	if _, ok := c.killed(); ok {
		c.s.count("lease: operations cut by a kill")
		c.drop()
		return
	}
	if sqlState(err) == "53300" {
		// Give the hold up by ending the session: lockpool releases the
		// lease at once. The open log row keeps only what was proven
		// (entered .. last fenced write).
		c.s.count("lease: 53300 (no connection within wait_timeout), session ended")
		c.drop()
		return
	}
	c.s.unexpectedf("%s: %s: %v", c.name(), op, err)
	c.drop()
}

// fenced runs sql (which must return one bigint) in a transaction after
// lease_fence(name, tok): the write happens only while tok holds the lease,
// and no takeover can happen before it commits.
func (c *leaseClient) fenced(ctx context.Context, conn *pgx.Conn, name string, tok int64, sql string, args ...any) (int64, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	var t int64
	if err := tx.QueryRow(ctx, "SELECT lease_fence($1, $2)", c.mode(), name, tok).Scan(&t); err != nil {
		_ = tx.Rollback(ctx)
		return 0, err
	}
	if t != tok {
		c.s.violatef("lease", "%s: lease_fence(%q, %d) returned %d", c.name(), name, tok, t)
	}
	var out int64
	if err := tx.QueryRow(ctx, sql, append([]any{c.mode()}, args...)...).Scan(&out); err != nil {
		_ = tx.Rollback(ctx)
		return 0, err
	}
	return out, tx.Commit(ctx)
}

// lostLease reports a hold that ended without the holder letting go: with
// ttl 3 s renewed every 0.75 s while the session lives, that means renewals
// ran more than 2 s late, or the lease was taken from a live session.
func (c *leaseClient) lostLease(name string, tok int64, how string) {
	c.s.count("lease: holds lost while connected")
	c.s.violatef("lease", "%s: lease %q (token %d) was lost while its session was connected: %s", c.name(), name, tok, how)
}

// cycle is one attempt: acquire, hold with fenced writes, release.
func (c *leaseClient) cycle() {
	conn := c.c()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	name := leaseNames[c.rng.Intn(len(leaseNames))]
	var tok *int64
	var err error
	if c.rng.Intn(10) < 3 {
		err = conn.QueryRow(ctx, fmt.Sprintf("SELECT lease_acquire($1, %d, 1)", leaseTTL), c.mode(), name).Scan(&tok)
	} else {
		err = conn.QueryRow(ctx, fmt.Sprintf("SELECT lease_acquire($1, %d)", leaseTTL), c.mode(), name).Scan(&tok)
	}
	if err != nil {
		c.failed("lease_acquire", err)
		return
	}
	c.s.leaseOps.Add(1)
	if tok == nil {
		c.s.count("lease: lease_acquire = NULL (held elsewhere)")
		return
	}
	c.s.count("lease: lease_acquire = token")
	c.holding.Store(true)
	lost := false
	row, err := c.fenced(ctx, conn, name, *tok,
		"INSERT INTO soak_lease_log (name, token, client, entered, last_ok) VALUES ($1, $2, $3, clock_timestamp(), clock_timestamp()) RETURNING id",
		name, *tok, c.id)
	switch {
	case sqlState(err) == "LP001":
		lost = true
		c.lostLease(name, *tok, "LP001 from lease_fence right after lease_acquire")
	case err != nil:
		c.failed("entry record", err)
		return
	default:
		c.curRow.Store(row)
		for i, n := 0, 1+c.rng.Intn(3); i < n; i++ {
			time.Sleep(time.Duration(50+c.rng.Intn(250)) * time.Millisecond)
			_, err := c.fenced(ctx, conn, name, *tok, "UPDATE soak_lease_log SET last_ok = clock_timestamp() WHERE id = $1 RETURNING id", row)
			if sqlState(err) == "LP001" {
				lost = true
				c.lostLease(name, *tok, "LP001 from lease_fence")
				break
			}
			if err != nil {
				c.failed("fenced write", err)
				return
			}
			c.s.count("lease: fenced writes")
		}
		if _, err := conn.Exec(ctx, "UPDATE soak_lease_log SET exited = clock_timestamp(), lost = $2 WHERE id = $1", c.mode(), row, lost); err != nil {
			c.failed("exit record", err)
			return
		}
		c.curRow.Store(0)
	}
	var released bool
	if err := conn.QueryRow(ctx, "SELECT lease_release($1)", c.mode(), name).Scan(&released); err != nil {
		c.failed("lease_release", err)
		return
	}
	c.s.leaseOps.Add(1)
	c.holding.Store(false)
	c.s.count(fmt.Sprintf("lease: lease_release = %v", released))
	if !released && !lost {
		c.lostLease(name, *tok, "lease_release returned false")
	}
	if row == 0 {
		return
	}
	// Only a successful release proves the hold lasted to the exit record;
	// otherwise just the fenced writes count.
	if _, err := conn.Exec(ctx, "UPDATE soak_lease_log SET released = $2, lost = lost OR NOT $2 WHERE id = $1", c.mode(), row, released); err != nil {
		c.failed("release record", err)
	}
}

func (c *leaseClient) run() {
	for c.ensure() {
		c.cycle()
		time.Sleep(time.Duration(20+c.rng.Intn(100)) * time.Millisecond)
	}
	c.curRow.Store(0)
	c.drop()
}

// leaseRow is one hold from soak_lease_log.
type leaseRow struct {
	id, token int64
	client    int
	name      string
	entered   time.Time
	end       time.Time // what the hold provably lasted to
	lost      bool
	killed    bool
	open      bool
}

// leaseCheckSQL: a hold provably lasted from its entry record to the latest
// of its last fenced write, its exit record if lease_release then returned
// true, and its kill if the lease was still held when the socket closed.
const leaseCheckSQL = `SELECT id, name, token, client, entered,
  greatest(last_ok, CASE WHEN released THEN exited END, killed_at),
  lost, killed_at IS NOT NULL, exited IS NULL AND killed_at IS NULL
FROM soak_lease_log ORDER BY name, entered, id`

// checkLeases verifies, per name, that each hold began after every earlier
// hold ended and that tokens grow in that order. It returns the row count and
// how many holds were lost or killed.
func (s *soak) checkLeases(ctx context.Context, conn *pgx.Conn) (n, lost, killed int, err error) {
	rows, err := conn.Query(ctx, leaseCheckSQL)
	if err != nil {
		return 0, 0, 0, err
	}
	var all []leaseRow
	for rows.Next() {
		var r leaseRow
		if err := rows.Scan(&r.id, &r.name, &r.token, &r.client, &r.entered, &r.end, &r.lost, &r.killed, &r.open); err != nil {
			rows.Close()
			return 0, 0, 0, err
		}
		all = append(all, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, 0, err
	}
	var prev *leaseRow // the earlier hold of this name with the latest end
	var last *leaseRow // the previous hold of this name
	for i := range all {
		r := &all[i]
		if r.lost {
			lost++
		}
		if r.killed {
			killed++
		}
		if last == nil || last.name != r.name {
			prev, last = r, r
			continue
		}
		if r.entered.Before(prev.end) {
			s.violateOnce("lease", fmt.Sprintf("overlap %d", prev.id),
				"lease %q: hold %d (token %d, lease client %d) began at %s, before hold %d (token %d, lease client %d) ended at %s",
				r.name, r.id, r.token, r.client, r.entered.Format("15:04:05.000000"),
				prev.id, prev.token, prev.client, prev.end.Format("15:04:05.000000"))
		}
		if r.token <= last.token {
			s.violateOnce("lease", fmt.Sprintf("token %d %d", last.id, r.id),
				"lease %q: hold %d got token %d after hold %d had token %d (tokens must grow)",
				r.name, r.id, r.token, last.id, last.token)
		}
		if r.end.After(prev.end) {
			prev = r
		}
		last = r
	}
	return len(all), lost, killed, nil
}
