package integration

// The randomized lock test under advisory_locks: hold: clients of lockpool
// and one direct client take, stack, release and abandon advisory locks at
// random, while a killer terminates lockpool's lock connections and a
// checker compares pg_locks (lockpool's lock connections and the direct
// client's backend) with what the clients believe they hold.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	lkhApp      = "lkh"
	lkhUser     = "lkhold"
	lkhClients  = 12 // through lockpool; one more connects directly
	lkhExclBase = 9400001
	lkhExclN    = 6
	lkhShBase   = 9500001
	lkhShN      = 3
	lkhXactBase = 9600001
	lkhXactN    = 3
	lkhPhases   = 4
	lkhPhaseDur = 2 * time.Second
	lkhGrace    = time.Second
	// lkhLockConnPID stands for any of lockpool's lock connections in the
	// lock log (which connection is lockpool's business).
	lkhLockConnPID = 1
	// lkhKillEvery is the mean time between two terminations of a lock
	// connection while the clients run.
	lkhKillEvery = 400 * time.Millisecond
)

// lkhRowsSQL lists the granted locks on this test's keys, with whether the
// backend is one of lockpool's lock connections.
const lkhRowsSQL = `SELECT l.pid, (l.classid::bigint << 32) | l.objid::bigint, l.mode, a.application_name = $1
	FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	AND ((l.classid::bigint << 32) | l.objid::bigint) BETWEEN 9400001 AND 9699999`

// lkhRows lists the granted locks on this test's keys.
func lkhRows(ctx context.Context, su *pgx.Conn) ([]lkrLock, error) {
	return lkrLocks(ctx, su, lkhRowsSQL, advisory.ApplicationName)
}

type lkhClient struct {
	lkrSession
	direct bool
	dsn    string
	pid    uint32                           // backend pid of the direct client
	held   map[int64][2][]*testenv.LockHold // by mode: 0 exclusive, 1 shared
	killer *lkhKiller
	since  time.Time // when this connection was made
	trail  []string  // the last operations, for the report of an unexpected error
}

// trace notes an operation in the client's trail.
func (c *lkhClient) trace(format string, args ...any) {
	if len(c.trail) == 12 {
		c.trail = c.trail[1:]
	}
	c.trail = append(c.trail, time.Now().Format("05.000000 ")+fmt.Sprintf(format, args...))
}

func (c *lkhClient) connect() error {
	c.since = time.Now()
	if err := c.dial(c.dsn); err != nil {
		return err
	}
	c.pid = c.conn.PgConn().PID()
	return nil
}

// lostLock reports an error that ends a lockpool client's session because
// a lock connection died: lockpool closes a client whose lock was on it
// with 57P01 (its locks were lost), or 08006, and one whose operation ran into the dead connection before
// lockpool noticed. It is accepted only when a termination began during
// the session or within the grace period before it (lockpool notices a
// dead connection at its next use or check).
func (c *lkhClient) lostLock(err error) bool {
	if c.direct || !c.killer.killedSince(c.since.Add(-lkhGrace)) {
		return false
	}
	return sqlState(err) == "57P01" || sqlState(err) == "08006" || c.conn.IsClosed()
}

// failedAt is when the hold of a lock call that failed with err ends: now,
// or, when err ended the session (lostLock), within the grace period, as for
// any session that ended: the call may have been granted just before.
func (c *lkhClient) failedAt(err error) time.Time {
	if c.lostLock(err) {
		return time.Now().Add(lkhGrace)
	}
	return time.Now()
}

// forgetLost ends a session lockpool closed for a lost lock connection:
// the locks on that connection are gone (PostgreSQL released them when it
// died, before now), the others lockpool releases as for any session that
// ended (within the grace period), and the client connects again.
func (c *lkhClient) forgetLost() {
	c.r.count("session-lost-with-lock-connection")
	at := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = c.conn.Close(ctx)
	cancel()
	c.conn = nil
	c.dropAll(at.Add(lkhGrace))
	if err := c.connect(); err != nil {
		c.r.failf("client %d: reconnect: %v", c.id, err)
	}
}

func (c *lkhClient) logPID() uint32 {
	if c.direct {
		return c.pid
	}
	return lkhLockConnPID
}

func (c *lkhClient) count(k int64, m int) int { return len(c.held[k][m]) }

func (c *lkhClient) push(k int64, m int, iv *testenv.LockHold) {
	c.r.log.SetPID(iv, c.logPID())
	h := c.held[k]
	h[m] = append(h[m], iv)
	c.held[k] = h
}

func (c *lkhClient) pop(k int64, m int, at time.Time) {
	h := c.held[k]
	c.r.log.Close(h[m][len(h[m])-1], at)
	h[m] = h[m][:len(h[m])-1]
	if len(h[0])+len(h[1]) == 0 {
		delete(c.held, k)
	} else {
		c.held[k] = h
	}
}

func (c *lkhClient) dropAll(at time.Time) {
	for k, h := range c.held {
		for _, s := range h {
			for _, iv := range s {
				c.r.log.Close(iv, at)
			}
		}
		delete(c.held, k)
	}
}

func (c *lkhClient) disconnect(abrupt bool) {
	at := c.hangUp(abrupt)
	c.dropAll(at.Add(lkhGrace))
}

func (c *lkhClient) unexpected(op string, err error) {
	if c.lostLock(err) {
		c.forgetLost()
		return
	}
	detail := ""
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Detail != "" {
		detail = " (detail: " + pe.Detail + ")"
	}
	c.r.failf("client %d (direct %v): %s at %s: unexpected error %v%s; its last operations:\n%s", c.id, c.direct, op, time.Now().Format("05.000000"), err, detail, strings.Join(c.trail, "\n"))
	c.disconnect(false)
	if err := c.connect(); err != nil {
		c.r.failf("client %d: reconnect: %v", c.id, err)
	}
}

func (c *lkhClient) opTry(ctx context.Context, m int) {
	key, fn := c.pickKey(lkhExclBase, lkhExclN), "pg_try_advisory_lock"
	if m == 1 {
		key, fn = c.pickKey(lkhShBase, lkhShN), "pg_try_advisory_lock_shared"
	}
	if c.rng.Intn(5) == 0 { // the other mode's keys: shared against exclusive
		key = c.pickKey(lkhShBase, lkhShN)
		if m == 1 {
			key = c.pickKey(lkhExclBase, lkhExclN)
		}
	}
	iv := c.r.log.Open(c.id, key)
	var ok bool
	mode := c.mode()
	c.trace("%s(%d) %v", fn, key, mode)
	err := c.conn.QueryRow(ctx, "SELECT "+fn+"($1)", mode, key).Scan(&ok)
	if err != nil {
		c.r.log.Close(iv, c.failedAt(err))
		c.unexpected(fn, err)
		return
	}
	c.r.count(fmt.Sprintf("%s=%v", fn, ok))
	if !ok {
		c.r.log.Close(iv, time.Now())
		if c.count(key, 0) > 0 {
			c.r.failf("client %d: %s(%d) = false although it holds the key exclusively", c.id, fn, key)
		}
		return
	}
	c.push(key, m, iv)
}

// opLock is a blocking pg_advisory_lock bounded by a lock_timeout set by
// SET or by SET LOCAL inside a transaction. When the client holds the key
// shared, the call is an upgrade, and it may also end in 40P01: another
// session that holds the key shared and waits for it exclusively, or asks
// for it while this one waits, closes a cycle that PostgreSQL reports at
// once (TestHoldUpgradeDeadlock), for a direct client as for lockpool's.
func (c *lkhClient) opLock(ctx context.Context) {
	key := c.pickKey(lkhExclBase, lkhExclN)
	local := c.rng.Intn(2) == 0
	mode := c.mode()
	upgrade := c.count(key, 1) > 0
	c.trace("pg_advisory_lock(%d) %v, lock_timeout by SET LOCAL %v, upgrade %v", key, mode, local, upgrade)
	iv := c.r.log.Open(c.id, key)
	var err error
	if local {
		var tx pgx.Tx
		if tx, err = c.conn.Begin(ctx); err != nil {
			c.r.log.Close(iv, c.failedAt(err))
			c.unexpected("BEGIN", err)
			return
		}
		if _, err = tx.Exec(ctx, "SET LOCAL lock_timeout = 100"); err == nil {
			_, err = tx.Exec(ctx, "SELECT pg_advisory_lock($1)", mode, key)
		}
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(ctx)
		}
	} else {
		if _, err = c.conn.Exec(ctx, "SET lock_timeout = '100ms'"); err == nil {
			_, err = c.conn.Exec(ctx, "SELECT pg_advisory_lock($1)", mode, key)
		}
		if _, rerr := c.conn.Exec(ctx, "RESET lock_timeout"); rerr != nil && err == nil {
			err = rerr
		}
	}
	switch {
	case err == nil:
		c.r.count(fmt.Sprintf("pg_advisory_lock/local=%v", local))
		c.push(key, 0, iv)
	case sqlState(err) == "55P03":
		c.r.count(fmt.Sprintf("pg_advisory_lock=lock_timeout/local=%v", local))
		if c.direct {
			// PostgreSQL may grant the lock in the instant lock_timeout
			// fires: ask the backend.
			var n int
			if err := c.conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() AND objsubid = 1 AND mode = 'ExclusiveLock' AND "+lkrKeyExpr+" = $1", key).Scan(&n); err != nil {
				c.unexpected("own locks", err)
				return
			}
			if n > c.count(key, 0) {
				c.push(key, 0, iv)
				return
			}
		}
		c.r.log.Close(iv, time.Now())
	case upgrade && sqlState(err) == "40P01":
		c.r.count(fmt.Sprintf("pg_advisory_lock=deadlock (upgrade)/local=%v", local))
		c.r.log.Close(iv, time.Now())
	default:
		c.r.log.Close(iv, c.failedAt(err))
		c.unexpected("pg_advisory_lock", err)
	}
}

func (c *lkhClient) opUnlock(ctx context.Context, m int) {
	base, n, fn := int64(lkhExclBase), lkhExclN, "pg_advisory_unlock"
	if m == 1 {
		base, n, fn = lkhShBase, lkhShN, "pg_advisory_unlock_shared"
	}
	key := c.pickKey(base, n)
	if c.rng.Intn(5) != 0 {
		for k := range c.held {
			if c.count(k, m) > 0 {
				key = k
				break
			}
		}
	}
	var ok bool
	err := c.conn.QueryRow(ctx, "SELECT "+fn+"($1)", c.mode(), key).Scan(&ok)
	at := time.Now()
	if err != nil {
		c.unexpected(fn, err)
		return
	}
	c.r.count(fmt.Sprintf("%s=%v", fn, ok))
	if want := c.count(key, m) > 0; ok != want {
		c.r.failf("client %d (direct %v): %s(%d) = %v, but the client holds it %d times", c.id, c.direct, fn, key, ok, c.count(key, m))
	}
	if ok && c.count(key, m) > 0 {
		c.pop(key, m, at)
	}
}

func (c *lkhClient) opUnlockAll(ctx context.Context) {
	if _, err := c.conn.Exec(ctx, "SELECT pg_advisory_unlock_all()", c.mode()); err != nil {
		c.unexpected("pg_advisory_unlock_all", err)
		return
	}
	c.r.count("pg_advisory_unlock_all")
	c.dropAll(time.Now())
}

func (c *lkhClient) opXact(ctx context.Context) {
	tx, err := c.conn.Begin(ctx)
	if err != nil {
		c.unexpected("BEGIN", err)
		return
	}
	key := c.pickKey(lkhXactBase, lkhXactN)
	iv := c.r.log.Open(c.id, key)
	// The lock ends with the transaction: at COMMIT, or, when the session
	// ends inside the transaction (lockpool closes it when a lock connection
	// it held a lock on dies), when lockpool has ended the server side,
	// within the grace period.
	end := time.Time{}
	defer func() {
		if end.IsZero() {
			end = time.Now().Add(lkhGrace)
		}
		c.r.log.Close(iv, end)
	}()
	var ok bool
	var pid int32
	mode := c.mode()
	c.trace("xact lock %d %v", key, mode)
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1), pg_backend_pid()", mode, key).Scan(&ok, &pid); err != nil {
		_ = tx.Rollback(ctx)
		c.unexpected("xact lock", err)
		return
	}
	c.r.log.SetPID(iv, uint32(pid))
	c.r.count(fmt.Sprintf("pg_try_advisory_xact_lock=%v", ok))
	if err := tx.Commit(ctx); err != nil {
		c.unexpected("COMMIT", err)
		return
	}
	end = time.Now()
}

// opBatch sends two to five try-locks, unlocks, unlock_alls and plain
// statements in one pipeline (pgx's batch: one Sync), with the
// connection's default exec mode: lockpool answers the held calls in their
// places among the server's replies, and each result must be what the
// client's holds say, in order.
func (c *lkhClient) opBatch(ctx context.Context) {
	type item struct {
		op   int // 0 try-lock, 1 unlock, 2 plain statement, 3 unlock_all
		m    int // mode: 0 exclusive, 1 shared
		key  int64
		fn   string
		iv   *testenv.LockHold
		want int32 // the plain statement's value
	}
	var items []*item
	b := &pgx.Batch{}
	for n := 2 + c.rng.Intn(4); len(items) < n; {
		it := &item{op: c.rng.Intn(7) % 4, m: c.rng.Intn(2)} // unlock_all 1 in 7
		base, kn := int64(lkhExclBase), lkhExclN
		if it.m == 1 {
			base, kn = lkhShBase, lkhShN
		}
		it.key = c.pickKey(base, kn)
		switch it.op {
		case 0:
			it.fn = [2]string{"pg_try_advisory_lock", "pg_try_advisory_lock_shared"}[it.m]
			it.iv = c.r.log.Open(c.id, it.key)
			b.Queue("SELECT "+it.fn+"($1)", it.key)
		case 1:
			it.fn = [2]string{"pg_advisory_unlock", "pg_advisory_unlock_shared"}[it.m]
			if c.rng.Intn(5) != 0 { // mostly a key the client held in that mode before the batch
				for k := range c.held {
					if c.count(k, it.m) > 0 {
						it.key = k
						break
					}
				}
			}
			b.Queue("SELECT "+it.fn+"($1)", it.key)
		case 2:
			it.want = int32(c.rng.Intn(1000))
			b.Queue("SELECT $1::int4", it.want)
		default:
			b.Queue("SELECT pg_advisory_unlock_all()")
		}
		items = append(items, it)
	}
	var sqls []string
	for _, q := range b.QueuedQueries {
		sqls = append(sqls, fmt.Sprintf("%s %v", q.SQL, q.Arguments))
	}
	c.trace("batch %q", sqls)
	br := c.conn.SendBatch(ctx, b)
	var err error
	for i, it := range items {
		if err != nil {
			if it.iv != nil {
				c.r.log.Close(it.iv, c.failedAt(err))
			}
			continue
		}
		switch it.op {
		case 0:
			var ok bool
			if err = br.QueryRow().Scan(&ok); err != nil {
				c.r.log.Close(it.iv, c.failedAt(err))
				continue
			}
			c.r.count(fmt.Sprintf("batch %s=%v", it.fn, ok))
			if !ok {
				c.r.log.Close(it.iv, time.Now())
				if c.count(it.key, 0) > 0 {
					c.r.failf("client %d: batch item %d: %s(%d) = false although it holds the key exclusively", c.id, i, it.fn, it.key)
				}
				continue
			}
			c.push(it.key, it.m, it.iv)
		case 1:
			var ok bool
			if err = br.QueryRow().Scan(&ok); err != nil {
				continue
			}
			c.r.count(fmt.Sprintf("batch %s=%v", it.fn, ok))
			if want := c.count(it.key, it.m) > 0; ok != want {
				c.r.failf("client %d (direct %v): batch item %d: %s(%d) = %v, but the client holds it %d times", c.id, c.direct, i, it.fn, it.key, ok, c.count(it.key, it.m))
			}
			if ok && c.count(it.key, it.m) > 0 {
				c.pop(it.key, it.m, time.Now())
			}
		case 2:
			var v int32
			if err = br.QueryRow().Scan(&v); err != nil {
				continue
			}
			if v != it.want {
				c.r.failf("client %d (direct %v): batch item %d: SELECT %d returned %d (a reply out of place)", c.id, c.direct, i, it.want, v)
			}
		default:
			if _, err = br.Exec(); err != nil {
				continue
			}
			c.r.count("batch pg_advisory_unlock_all")
			c.dropAll(time.Now())
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		c.unexpected("batch", err)
	}
}

func (c *lkhClient) step() {
	if c.conn == nil {
		if err := c.connect(); err != nil {
			c.r.failf("client %d: connect: %v", c.id, err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	holding := len(c.held) > 0
	p := c.rng.Intn(100)
	c.trace("step p=%d holding=%v backend pid %d", p, holding, c.conn.PgConn().PID())
	switch {
	case holding && p < 25, !holding && p < 5:
		c.opUnlock(ctx, 0)
	case holding && p < 33, !holding && p < 8:
		c.opUnlock(ctx, 1)
	case holding && p < 37:
		c.opUnlockAll(ctx)
	case p < 55:
		c.opTry(ctx, 0)
	case p < 65:
		c.opTry(ctx, 1)
	case p < 80:
		c.opLock(ctx)
	case p < 90:
		c.opXact(ctx)
	case p < 93:
		c.opBatch(ctx)
	case p < 95:
		if _, err := c.conn.Exec(ctx, "SELECT 1"); err != nil {
			c.unexpected("SELECT 1", err)
		}
	case p < 98:
		c.disconnect(true)
	default:
		c.disconnect(false)
	}
}

func TestLocksRandomizedHold(t *testing.T) {
	t.Parallel()
	seed := lkrSeed(t, 20261201)
	l := startLockpool(t, 12, "", appYAML{name: lkhApp, user: lkhUser, db: "appdb", max: 3, pinned: 1, advisory: "hold", state: "pin", wait: "5s"})
	r := newLkrRun(t, l)
	checkSU, su := superConn(t, "appdb"), superConn(t, "appdb")
	k := &lkhKiller{r: r, su: superConn(t, "appdb"), rng: rand.New(rand.NewSource(seed - 1)), stop: make(chan struct{}), done: make(chan struct{})}

	clients := lkrStartClients(t, r, seed, lkhClients+1, func(s lkrSession) *lkhClient {
		c := &lkhClient{lkrSession: s, held: map[int64][2][]*testenv.LockHold{}, dsn: l.dsn(lkhUser, "appdb"), killer: k}
		if s.id == lkhClients {
			c.direct, c.dsn = true, pgtestDSN(t, lkhUser)
		}
		return c
	})

	// The continuous checker: every granted lock on this test's keys is
	// explained by a client's hold on that backend (any lock connection
	// for lockpool's clients), and nothing is pinned.
	stopCheck := lkSampler(10*time.Millisecond, func() {
		if g := l.Pinned(lkhApp, ""); g != 0 {
			r.failf("checker: lockpool_pinned_sessions = %v under hold", g)
		}
		r.checkSample(func(ctx context.Context) ([]lkrLock, error) { return k.alive(lkhRows(ctx, checkSU)) },
			func(x lkrLock) uint32 {
				if x.lockConn {
					return lkhLockConnPID
				}
				return x.pid
			})
	})
	defer stopCheck()
	go k.run()
	defer k.end()

	ops := lkrRunPhases(r, clients, lkhPhases, lkhPhaseDur, math.MaxInt, func(when string) {
		k.mu.Lock() // no termination while the clients are compared with pg_locks
		defer k.mu.Unlock()
		lkhBarrier(t, r, su, clients, when)
	})
	k.end()

	lkrLeave(t, clients, lkhGrace, func(ctx context.Context) (bool, string) {
		rows, err := lkhRows(ctx, su)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == 0, fmt.Sprintf("%d advisory locks remain: %+v", len(rows), rows)
	})
	stopCheck()
	// Every lock operation lockpool ran found PostgreSQL as its table said.
	if n := strings.Count(l.Warnings.String(), "PostgreSQL disagrees with the lock table"); n > 0 {
		r.failf("lockpool logged %d operations where PostgreSQL disagreed with its lock table", n)
	}

	r.report(seed, ops, fmt.Sprintf("%d clients (one direct)", len(clients)), fmt.Sprintf("%d lock connections terminated, %d violations", k.kills.Load(), r.fails.Load()))
	if k.kills.Load() == 0 {
		t.Error("no lock connection was terminated")
	}
}

// lkhKiller terminates one of lockpool's lock connections that hold a key
// of the test, at random times while the clients run (each holder's session
// must be closed by lockpool, and the lock table must forget the
// connection's locks).
type lkhKiller struct {
	r     *lkrRun
	su    *pgx.Conn
	rng   *rand.Rand
	mu    sync.Mutex // held while terminating; a barrier holds it to pause the killer
	kills atomic.Int64
	last  atomic.Int64 // when the last termination began (Unix nanoseconds)
	dead  sync.Map     // backend pids terminated: a lock there is on its way out
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func (k *lkhKiller) run() {
	defer close(k.done)
	for {
		t := time.NewTimer(time.Duration(k.rng.Int63n(int64(2 * lkhKillEvery))))
		select {
		case <-k.stop:
			t.Stop()
			return
		case <-t.C:
		}
		k.mu.Lock()
		k.killOne()
		k.mu.Unlock()
	}
}

// alive drops the locks of terminated backends from rows: a terminated
// backend holds its locks until it has exited, and lockpool may have taken
// one there for a client it then told of the loss (or whose call failed).
// A client that believes it holds a lock there is still caught, by a
// barrier.
func (k *lkhKiller) alive(rows []lkrLock, err error) ([]lkrLock, error) {
	out := rows[:0]
	for _, x := range rows {
		if _, dead := k.dead.Load(x.pid); !dead {
			out = append(out, x)
		}
	}
	return out, err
}

// killedSince reports whether a termination began after t.
func (k *lkhKiller) killedSince(t time.Time) bool { return k.last.Load() > t.UnixNano() }

// end stops the killer and waits for it.
func (k *lkhKiller) end() {
	k.once.Do(func() { close(k.stop) })
	<-k.done
}

func (k *lkhKiller) killOne() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := lkhRows(ctx, k.su)
	if err != nil {
		k.r.failf("killer: %v", err)
		return
	}
	var pids []uint32
	for _, x := range rows {
		if x.lockConn && !slices.Contains(pids, x.pid) {
			pids = append(pids, x.pid)
		}
	}
	if len(pids) == 0 {
		return
	}
	slices.Sort(pids)
	pid := pids[k.rng.Intn(len(pids))]
	// Noted first: a client whose session ends for it sees the time.
	k.last.Store(time.Now().UnixNano())
	k.kills.Add(1)
	k.dead.Store(pid, true)
	if _, err := k.su.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(pid)); err != nil {
		k.r.failf("killer: terminate %d: %v", pid, err)
	}
	k.r.count("lock-connection-terminated")
}

// lkhBarrier checks, with every client idle, that no two clients believe
// they hold conflicting locks and that pg_locks agrees exactly with the
// beliefs: lockpool's lock connections hold each key lockpool's clients
// hold (exclusive when one of them holds it exclusively, shared when they
// hold it only shared), the direct client's backend what it holds, nothing
// else.
func lkhBarrier(t *testing.T, r *lkrRun, su *pgx.Conn, clients []*lkhClient, when string) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	type belief struct {
		lpExcl, lpShared, directExcl, directShared bool
		holders                                    map[int][2]int
	}
	var beliefs map[int64]*belief
	// believe asks every lockpool client whether its session still stands
	// (lockpool closes the sessions whose locks died with a terminated lock
	// connection; such a client forgets its locks) and collects what the
	// clients believe they hold.
	believe := func() {
		for _, c := range clients[:lkhClients] {
			if c.conn == nil {
				continue
			}
			if err := c.conn.Ping(ctx); err != nil {
				c.unexpected("ping", err)
			}
		}
		beliefs = map[int64]*belief{}
		for _, c := range clients {
			for k := range c.held {
				b := beliefs[k]
				if b == nil {
					b = &belief{holders: map[int][2]int{}}
					beliefs[k] = b
				}
				e, s := c.count(k, 0) > 0, c.count(k, 1) > 0
				b.holders[c.id] = [2]int{c.count(k, 0), c.count(k, 1)}
				if c.direct {
					b.directExcl, b.directShared = e, s
				} else {
					b.lpExcl = b.lpExcl || e
					b.lpShared = b.lpShared || s
				}
			}
		}
	}
	var bad []string
	conflicts := func() {
		for k, b := range beliefs {
			var excl []int
			for id, h := range b.holders {
				if h[0] > 0 {
					excl = append(excl, id)
				}
			}
			if len(excl) > 1 || len(excl) == 1 && len(b.holders) > 1 {
				bad = append(bad, fmt.Sprintf("key %d: conflicting beliefs %v", k, b.holders))
			}
		}
	}
	agree := func() bool {
		believe()
		rows, err := lkhRows(ctx, su)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int64]*belief{}
		lockConns := map[int64]map[uint32]bool{}
		for _, x := range rows {
			g := got[x.key]
			if g == nil {
				g = &belief{}
				got[x.key] = g
			}
			excl := x.mode == "ExclusiveLock"
			switch {
			case x.lockConn:
				if lockConns[x.key] == nil {
					lockConns[x.key] = map[uint32]bool{}
				}
				lockConns[x.key][x.pid] = true
				if excl {
					g.lpExcl = true
				} else {
					g.lpShared = true
				}
			case x.pid == clients[lkhClients].pid:
				if excl {
					g.directExcl = true
				} else {
					g.directShared = true
				}
			default:
				g.holders = map[int][2]int{-1: {}} // a backend nobody should have
			}
		}
		bad = nil
		conflicts()
		for k, g := range got {
			w := beliefs[k]
			if w == nil {
				w = &belief{}
			}
			switch {
			case g.holders != nil:
				bad = append(bad, fmt.Sprintf("key %d held by an unexpected backend", k))
			case len(lockConns[k]) > 1:
				bad = append(bad, fmt.Sprintf("key %d on %d lock connections", k, len(lockConns[k])))
			case g.lpExcl != w.lpExcl:
				bad = append(bad, fmt.Sprintf("key %d: lock connection exclusive %v, clients believe %v", k, g.lpExcl, w.lpExcl))
			case g.lpShared && !w.lpShared, !g.lpShared && w.lpShared && !w.lpExcl:
				bad = append(bad, fmt.Sprintf("key %d: lock connection shared %v, clients believe shared %v (exclusive %v)", k, g.lpShared, w.lpShared, w.lpExcl))
			case g.directExcl != w.directExcl || g.directShared != w.directShared:
				bad = append(bad, fmt.Sprintf("key %d: direct backend holds excl %v shared %v, it believes %v %v", k, g.directExcl, g.directShared, w.directExcl, w.directShared))
			}
		}
		for k, w := range beliefs {
			if got[k] == nil {
				bad = append(bad, fmt.Sprintf("key %d: clients believe %v, nothing in pg_locks", k, w.holders))
			}
		}
		return len(bad) == 0
	}
	// The deadline allows for releases of the last moment's disconnects,
	// and for lockpool to close the sessions of a terminated lock
	// connection.
	if !lkrPoll(time.Now().Add(lkhGrace+500*time.Millisecond), 20*time.Millisecond, agree) {
		for _, s := range bad {
			r.failf("%s: %s", when, s)
		}
		// What lockpool believes, and which lock connections PostgreSQL has.
		_, debug := r.l.get("/debug/locks")
		var conns []string
		if err := su.QueryRow(ctx, "SELECT array_agg(pid || ' since ' || backend_start::time) FROM pg_stat_activity WHERE application_name = $1", advisory.ApplicationName).Scan(&conns); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: /debug/locks: %s\nlock connections (all lockpools): %v", when, debug, conns)
	}
	// /debug/locks agrees with the lockpool clients' beliefs.
	n := 0
	for _, c := range hdDebugHeld(t, r.l) {
		for _, h := range c.Held {
			n += h.Count
		}
	}
	want := 0
	for _, c := range clients[:lkhClients] {
		for k := range c.held {
			want += c.count(k, 0) + c.count(k, 1)
		}
	}
	if n != want {
		r.failf("%s: /debug/locks shows %d holds, clients believe %d", when, n, want)
	}
}

// pgtestDSN is the DSN of appdb for user, directly (not through lockpool).
func pgtestDSN(t *testing.T, user string) string {
	return pgtest.Require(t).DSN(user, testenv.Password, "appdb")
}
