package integration

// Adversarial: many clients take, stack, release and abandon
// advisory locks at random through one application with few pin slots,
// while a checker compares pg_locks with what the clients believe they hold.

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	lkrApp       = "lkr"
	lkrUser      = "lkrand"
	lkrClients   = 16
	lkrBudget    = 6
	lkrMaxPinned = 4
	lkrExclBase  = 9000001 // exclusive session keys
	lkrExclN     = 8
	lkrShBase    = 9200001 // shared session keys
	lkrShN       = 3
	lkrXactBase  = 9100001 // transaction-level keys
	lkrXactN     = 4
	lkrPhases    = 5
	lkrPhaseDur  = 2 * time.Second
	lkrMaxOps    = 400 // per client per phase
	lkrGrace     = time.Second
)

// lkrKeyRange is the SQL condition selecting this test's keys in pg_locks.
const lkrKeyExpr = "((classid::bigint << 32) | objid::bigint)"
const lkrKeyCond = "locktype = 'advisory' AND granted AND objsubid = 1 AND " + lkrKeyExpr + " BETWEEN 9000001 AND 9299999"

// lkrLocksSQL lists the granted locks on this test's keys for [lkrLocks]
// (none is on a lock connection under advisory_locks: pin).
const lkrLocksSQL = "SELECT pid, " + lkrKeyExpr + ", mode, false FROM pg_locks WHERE " + lkrKeyCond + " ORDER BY 1, 2"

// lkrOwnSQL lists the advisory keys the serving backend holds.
const lkrOwnSQL = "SELECT pg_backend_pid(), ARRAY(SELECT " + lkrKeyExpr + " FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = pg_backend_pid() ORDER BY 1)"

// lkrRun is one randomized lock test: its lockpool, the lock log the
// clients keep, the invariant violations and the operation counts.
type lkrRun struct {
	t       *testing.T
	l       *lp
	log     *testenv.LockLog
	fails   atomic.Int64
	dumped  atomic.Bool
	samples atomic.Int64 // checker samples taken
	mu      sync.Mutex
	counts  map[string]int
}

func newLkrRun(t *testing.T, l *lp) *lkrRun {
	return &lkrRun{t: t, l: l, log: testenv.NewLockLog(), counts: map[string]int{}}
}

func (r *lkrRun) failf(format string, args ...any) {
	if n := r.fails.Add(1); n <= 25 {
		r.t.Errorf(format, args...)
	} else if n == 26 {
		r.t.Errorf("(further invariant violations not shown)")
	}
}

func (r *lkrRun) count(what string) {
	r.mu.Lock()
	r.counts[what]++
	r.mu.Unlock()
}

type lkrClient struct {
	lkrSession
	local string
	held  map[int64][]*testenv.LockHold
	pid   uint32 // the pinned backend while held is not empty
}

// QueryExecModeDescribeExec is left out: it reuses the unnamed statement
// across a Sync, which pgx documents as unsafe behind poolers.
var lkrModes = []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec}

func (c *lkrClient) connect() error {
	if err := c.dial(c.r.l.dsn(lkrUser, "appdb")); err != nil {
		return err
	}
	c.local = c.conn.PgConn().Conn().LocalAddr().String()
	return nil
}

func (c *lkrClient) heldKeys() []int64 {
	var ks []int64
	for k, s := range c.held {
		if len(s) > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

func (c *lkrClient) push(key int64, iv *testenv.LockHold, pid uint32) {
	if len(c.heldKeys()) > 0 && pid != c.pid {
		c.r.failf("client %d: took %d on backend %d while pinned to backend %d", c.id, key, pid, c.pid)
	}
	c.pid = pid
	c.r.log.SetPID(iv, pid)
	c.held[key] = append(c.held[key], iv)
}

// dropAll forgets every lock, closing the intervals at `at`.
func (c *lkrClient) dropAll(at time.Time) {
	for k, s := range c.held {
		for _, iv := range s {
			c.r.log.Close(iv, at)
		}
		delete(c.held, k)
	}
	c.pid = 0
}

// disconnect ends the session, abruptly (socket closed, no Terminate) or
// not, and reconnects.
func (c *lkrClient) disconnect(abrupt bool) {
	at := c.hangUp(abrupt)
	// lockpool must release the locks within the grace period.
	c.dropAll(at.Add(lkrGrace))
}

func (c *lkrClient) reconnect() {
	if c.conn != nil {
		return
	}
	if err := c.connect(); err != nil {
		c.r.failf("client %d: reconnect: %v", c.id, err)
	}
}

// unexpected handles an error no operation should produce: report it and
// start over with a fresh session.
func (c *lkrClient) unexpected(op string, err error) {
	extra := ""
	if strings.Contains(err.Error(), "timeout") && c.r.dumped.CompareAndSwap(false, true) {
		extra = fmt.Sprintf(" (pool stats %+v; %s)", c.r.l.srv.Pool().Stats(lkrApp), testenv.DumpGoroutines(c.r.t))
	}
	c.r.failf("client %d: %s: unexpected error %v%s", c.id, op, err, extra)
	c.disconnect(false)
	c.reconnect()
}

// acceptable reports 53300 (no connection or pin slot within wait_timeout).
func (c *lkrClient) acceptable(err error) bool {
	if sqlState(err) == "53300" {
		c.r.count("53300")
		return true
	}
	return false
}

// failed handles the error of op: acceptable, or unexpected.
func (c *lkrClient) failed(op string, err error) {
	if !c.acceptable(err) {
		c.unexpected(op, err)
	}
}

// begin starts a transaction; nil when it could not (the error handled).
func (c *lkrClient) begin(ctx context.Context) pgx.Tx {
	tx, err := c.conn.Begin(ctx)
	if err != nil {
		rollbackFailedBegin(ctx, c.conn)
		c.failed("BEGIN", err)
		return nil
	}
	return tx
}

// verifyOwn asks the serving backend which of this test's keys it holds:
// exactly the model's keys, on the pinned backend.
func (c *lkrClient) verifyOwn(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, extra []int64, where string) bool {
	var pid int32
	var keys []int64
	if err := q.QueryRow(ctx, lkrOwnSQL, c.mode()).Scan(&pid, &keys); err != nil {
		if c.acceptable(err) {
			return true
		}
		c.unexpected("own-locks query "+where, err)
		return false
	}
	want := append(c.heldKeys(), extra...)
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	var got []int64
	for _, k := range keys {
		if k >= 9000001 && k <= 9299999 {
			got = append(got, k)
		}
	}
	if !slices.Equal(got, want) {
		c.r.failf("client %d (%s): its backend %d holds %v, the client holds %v (pinned backend %d)", c.id, where, pid, got, want, c.pid)
		return false
	}
	if len(c.heldKeys()) > 0 && uint32(pid) != c.pid {
		c.r.failf("client %d (%s): served by backend %d while pinned to %d", c.id, where, pid, c.pid)
	}
	return true
}

func (c *lkrClient) opTry(ctx context.Context, shared bool) {
	key, fn := c.pickKey(lkrExclBase, lkrExclN), "pg_try_advisory_lock"
	if shared {
		key, fn = c.pickKey(lkrShBase, lkrShN), "pg_try_advisory_lock_shared"
	}
	iv := c.r.log.Open(c.id, key)
	var ok bool
	var pid int32
	err := c.conn.QueryRow(ctx, "SELECT "+fn+"($1::bigint), pg_backend_pid()", c.mode(), key).Scan(&ok, &pid)
	now := time.Now()
	if err != nil {
		c.r.log.Close(iv, now)
		c.failed(fn, err)
		return
	}
	if !ok {
		c.r.log.Close(iv, now)
		c.r.count(fn + "=f")
		if len(c.held[key]) > 0 {
			c.r.failf("client %d: %s(%d) = false although it holds the key", c.id, fn, key)
		}
		return
	}
	c.r.count(fn + "=t")
	c.push(key, iv, uint32(pid))
}

// opLock is a blocking pg_advisory_lock bounded by lock_timeout.
func (c *lkrClient) opLock(ctx context.Context) {
	var key int64
	for i := 0; i < 4; i++ {
		key = c.pickKey(lkrExclBase, lkrExclN)
		if len(c.held[key]) == 0 {
			break
		}
	}
	if len(c.held[key]) > 0 {
		return
	}
	iv := c.r.log.Open(c.id, key)
	var s string
	var pid int32
	err := c.conn.QueryRow(ctx, "SELECT pg_advisory_lock($1::bigint)::text, pg_backend_pid() FROM (SELECT set_config('lock_timeout', '100ms', true)) s", c.mode(), key).Scan(&s, &pid)
	now := time.Now()
	switch {
	case err == nil:
		c.r.count("pg_advisory_lock")
		c.push(key, iv, uint32(pid))
	case sqlState(err) == "55P03":
		c.r.count("pg_advisory_lock=lock_timeout")
		// PostgreSQL may grant the lock in the instant lock_timeout fires:
		// ask the session what it holds.
		var p int32
		var keys []int64
		if err := c.conn.QueryRow(ctx, lkrOwnSQL).Scan(&p, &keys); err != nil {
			c.r.log.Close(iv, time.Now())
			c.failed("own-locks after lock_timeout", err)
			return
		}
		if slices.Contains(keys, key) {
			c.r.count("lock_timeout-but-granted")
			c.push(key, iv, uint32(p))
			return
		}
		c.r.log.Close(iv, time.Now())
	default:
		c.r.log.Close(iv, now)
		c.failed("pg_advisory_lock", err)
	}
}

// opTryInTx takes a session lock inside an explicit transaction (it outlives
// COMMIT and ROLLBACK alike).
func (c *lkrClient) opTryInTx(ctx context.Context) {
	m := c.mode()
	tx := c.begin(ctx)
	if tx == nil {
		return
	}
	key := c.pickKey(lkrExclBase, lkrExclN)
	iv := c.r.log.Open(c.id, key)
	var ok bool
	var pid int32
	err := tx.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::bigint), pg_backend_pid()", m, key).Scan(&ok, &pid)
	if err != nil {
		_ = tx.Rollback(ctx)
		c.r.log.Close(iv, time.Now())
		c.failed("try-lock in a transaction", err)
		return
	}
	if ok {
		c.push(key, iv, uint32(pid))
	} else if len(c.held[key]) > 0 {
		c.r.failf("client %d: try-lock(%d) in a transaction = false although it holds the key", c.id, key)
	}
	end := "COMMIT"
	if c.rng.Intn(3) == 0 {
		end = "ROLLBACK"
		err = tx.Rollback(ctx)
	} else {
		err = tx.Commit(ctx)
	}
	if !ok {
		c.r.log.Close(iv, time.Now())
	}
	c.r.count(fmt.Sprintf("try-lock-in-tx=%v/%s", ok, end))
	if err != nil {
		c.unexpected(end, err)
	}
}

// opXact takes a transaction-level lock and checks the backend's view inside
// the transaction.
func (c *lkrClient) opXact(ctx context.Context) {
	tx := c.begin(ctx)
	if tx == nil {
		return
	}
	key := c.pickKey(lkrXactBase, lkrXactN)
	fn := "pg_try_advisory_xact_lock"
	if c.rng.Intn(2) == 0 {
		fn += "_shared"
	}
	iv := c.r.log.Open(c.id, key)
	var ok bool
	var pid int32
	err := tx.QueryRow(ctx, "SELECT "+fn+"($1::bigint), pg_backend_pid()", c.mode(), key).Scan(&ok, &pid)
	if err != nil {
		_ = tx.Rollback(ctx)
		c.r.log.Close(iv, time.Now())
		c.failed(fn, err)
		return
	}
	c.r.count(fmt.Sprintf("%s=%v", fn, ok))
	var extra []int64
	if ok {
		c.r.log.SetPID(iv, uint32(pid))
		extra = []int64{key}
	}
	if len(c.heldKeys()) > 0 && uint32(pid) != c.pid {
		c.r.failf("client %d: transaction on backend %d while pinned to %d", c.id, pid, c.pid)
	}
	if !c.verifyOwn(ctx, tx, extra, "inside a transaction with an xact lock") {
		_ = tx.Rollback(ctx)
		c.r.log.Close(iv, time.Now())
		return
	}
	if c.rng.Intn(2) == 0 {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	c.r.log.Close(iv, time.Now())
	if err != nil {
		c.unexpected("end of xact-lock transaction", err)
	}
}

func (c *lkrClient) opUnlock(ctx context.Context, shared bool) {
	base, n, fn := int64(lkrExclBase), lkrExclN, "pg_advisory_unlock"
	if shared {
		base, n, fn = lkrShBase, lkrShN, "pg_advisory_unlock_shared"
	}
	key := c.pickKey(base, n)
	if c.rng.Intn(5) != 0 {
		for _, k := range c.heldKeys() {
			if k >= base && k < base+int64(n) {
				key = k
				break
			}
		}
	}
	var ok bool
	var pid int32
	err := c.conn.QueryRow(ctx, "SELECT "+fn+"($1::bigint), pg_backend_pid()", c.mode(), key).Scan(&ok, &pid)
	now := time.Now()
	if err != nil {
		c.failed(fn, err)
		return
	}
	c.r.count(fmt.Sprintf("%s=%v", fn, ok))
	holds := len(c.held[key]) > 0
	if ok != holds {
		c.r.failf("client %d: %s(%d) = %v on backend %d, but the client holds it %d times (pinned backend %d)", c.id, fn, key, ok, pid, len(c.held[key]), c.pid)
	}
	if holds && uint32(pid) != c.pid {
		c.r.failf("client %d: %s ran on backend %d while pinned to %d", c.id, fn, pid, c.pid)
	}
	if ok && holds {
		s := c.held[key]
		c.r.log.Close(s[len(s)-1], now)
		c.held[key] = s[:len(s)-1]
		if len(c.held[key]) == 0 {
			delete(c.held, key)
		}
		if len(c.heldKeys()) == 0 {
			c.pid = 0
		}
	}
}

func (c *lkrClient) opUnlockAll(ctx context.Context) {
	var s string
	var pid int32
	err := c.conn.QueryRow(ctx, "SELECT pg_advisory_unlock_all()::text, pg_backend_pid()", c.mode()).Scan(&s, &pid)
	if err != nil {
		c.failed("pg_advisory_unlock_all", err)
		return
	}
	c.r.count("pg_advisory_unlock_all")
	if len(c.heldKeys()) > 0 && uint32(pid) != c.pid {
		c.r.failf("client %d: unlock_all ran on backend %d while pinned to %d", c.id, pid, c.pid)
	}
	c.dropAll(time.Now())
}

func (c *lkrClient) opPlainTx(ctx context.Context) {
	tx := c.begin(ctx)
	if tx == nil {
		return
	}
	if !c.verifyOwn(ctx, tx, nil, "plain transaction") {
		_ = tx.Rollback(ctx)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		c.unexpected("COMMIT", err)
		return
	}
	c.r.count("plain-transaction")
}

// step runs one random operation, then checks the session's own view.
func (c *lkrClient) step() {
	c.reconnect()
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	holding := len(c.heldKeys()) > 0
	p := c.rng.Intn(100)
	switch {
	case holding && p < 30, !holding && p < 5:
		c.opUnlock(ctx, false)
	case holding && p < 37, !holding && p < 8:
		c.opUnlock(ctx, true)
	case holding && p < 41:
		c.opUnlockAll(ctx)
	case p < 55:
		c.opTry(ctx, false)
	case p < 62:
		c.opTry(ctx, true)
	case p < 72:
		c.opLock(ctx)
	case p < 80:
		c.opTryInTx(ctx)
	case p < 88:
		c.opXact(ctx)
	case p < 95:
		c.opPlainTx(ctx)
	case p < 98:
		c.disconnect(true)
		c.reconnect()
		return
	default:
		c.disconnect(false)
		c.reconnect()
		return
	}
	if c.conn != nil && c.rng.Intn(2) == 0 {
		c.verifyOwn(ctx, c.conn, nil, "after an operation")
	}
}

func TestLocksRandomized(t *testing.T) {
	t.Parallel()
	seed := lkrSeed(t, 20240603)

	l := startLockpool(t, 12, "", appYAML{name: lkrApp, user: lkrUser, db: "appdb", max: lkrBudget, pinned: lkrMaxPinned, advisory: "pin", state: "pin", wait: "500ms"})
	r := newLkrRun(t, l)
	checkSU := superConn(t, "appdb")
	su := superConn(t, "appdb")

	clients := lkrStartClients(t, r, seed, lkrClients, func(s lkrSession) *lkrClient {
		return &lkrClient{lkrSession: s, held: map[int64][]*testenv.LockHold{}}
	})

	// The continuous checker: every granted lock on this test's keys is one
	// some client holds (or just released) on that very backend, and pins
	// never exceed max_pinned.
	var maxPins atomic.Int64
	stopCheck := lkSampler(10*time.Millisecond, func() {
		if st := l.srv.Pool().Stats(lkrApp); st.Pinned > lkrMaxPinned {
			r.failf("checker: %d pin slots held, max_pinned %d", st.Pinned, lkrMaxPinned)
		}
		g := l.Pinned(lkrApp, "")
		if int64(g) > maxPins.Load() {
			maxPins.Store(int64(g))
		}
		if g > lkrMaxPinned {
			r.failf("checker: lockpool_pinned_sessions = %v > max_pinned %d", g, lkrMaxPinned)
		}
		r.checkSample(func(ctx context.Context) ([]lkrLock, error) { return lkrLocks(ctx, checkSU, lkrLocksSQL) },
			func(x lkrLock) uint32 { return x.pid })
	})
	defer stopCheck()

	ops := lkrRunPhases(r, clients, lkrPhases, lkrPhaseDur, lkrMaxOps, func(when string) { lkrBarrier(t, r, su, clients, when) })

	// Everyone leaves: half abruptly, half politely.
	lkrLeave(t, clients, lkrGrace, func(ctx context.Context) (bool, string) {
		var n int
		if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND (a.usename = $1 OR "+lkrKeyCond+")", lkrUser).Scan(&n); err != nil {
			t.Fatal(err)
		}
		pinned := l.Pinned(lkrApp, "")
		st := l.srv.Pool().Stats(lkrApp)
		return n == 0 && pinned == 0 && st.Pinned == 0,
			fmt.Sprintf("%d advisory locks remain, lockpool_pinned_sessions = %v, pool stats %+v", n, pinned, st)
	})
	stopCheck()

	r.report(seed, ops, fmt.Sprintf("%d clients", lkrClients), fmt.Sprintf("max pinned %d", maxPins.Load()))
}

// lkrBarrier checks, with every client idle, that pg_locks, lockpool's pins
// and /debug/locks agree exactly with what the clients hold.
func lkrBarrier(t *testing.T, r *lkrRun, su *pgx.Conn, clients []*lkrClient, when string) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	want := map[uint32][]int64{}
	byPID := map[uint32]*lkrClient{}
	for _, c := range clients {
		if ks := c.heldKeys(); len(ks) > 0 {
			if _, dup := want[c.pid]; dup {
				r.failf("%s: clients %d and %d both believe they are pinned to backend %d", when, c.id, byPID[c.pid].id, c.pid)
			}
			want[c.pid] = ks
			byPID[c.pid] = c
		}
	}
	var got map[uint32][]int64
	var pinned float64
	var st struct{ Pinned, PinWaiting int }
	agree := func() bool {
		got = map[uint32][]int64{}
		locks, err := lkrLocks(ctx, su, lkrLocksSQL)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range locks {
			got[x.pid] = append(got[x.pid], x.key)
		}
		pinned = r.l.Pinned(lkrApp, "")
		s := r.l.srv.Pool().Stats(lkrApp)
		st.Pinned, st.PinWaiting = s.Pinned, s.PinWaiting
		same := len(got) == len(want)
		for pid, ks := range want {
			if !slices.Equal(got[pid], ks) {
				same = false
			}
		}
		return same && int(pinned) == len(want) && st.Pinned == len(want) && st.PinWaiting == 0
	}
	// The deadline allows for disconnects of the last moment.
	if !lkrPoll(time.Now().Add(lkrGrace+500*time.Millisecond), 10*time.Millisecond, agree) {
		r.failf("%s: pg_locks %v, clients hold %v; lockpool_pinned_sessions %v, pin slots %d, pin waiters %d (want %d, %d, 0)",
			when, got, want, pinned, st.Pinned, st.PinWaiting, len(want), len(want))
		return
	}
	d := lkGetDebugLocks(t, r.l)
	seen := map[uint32]bool{}
	for _, h := range d.Holders {
		var ks []int64
		for _, lk := range h.Locks {
			var cl, ob uint32
			var sub int
			if _, err := fmt.Sscanf(lk.Key, "%d:%d:%d", &cl, &ob, &sub); err != nil {
				r.failf("%s: /debug/locks key %q: %v", when, lk.Key, err)
				continue
			}
			k := int64(uint64(cl)<<32 | uint64(ob))
			if sub == 1 && k >= 9000001 && k <= 9299999 {
				ks = append(ks, k)
			}
		}
		if len(ks) == 0 {
			continue
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
		seen[h.BackendPID] = true
		c := byPID[h.BackendPID]
		if c == nil {
			r.failf("%s: /debug/locks holder %d (%s, %s) holds %v but no client is pinned there", when, h.BackendPID, h.Application, h.Client, ks)
			continue
		}
		if h.Application != lkrApp || h.Reason != "advisory_lock" || h.PinnedSince.IsZero() || h.Client != c.local {
			r.failf("%s: /debug/locks holder %d: application %q reason %q pinned_since %v client %q; want %q, advisory_lock, a time, %q (client %d)",
				when, h.BackendPID, h.Application, h.Reason, h.PinnedSince, h.Client, lkrApp, c.local, c.id)
		}
		if !slices.Equal(ks, want[h.BackendPID]) {
			r.failf("%s: /debug/locks holder %d locks %v, client %d holds %v", when, h.BackendPID, ks, c.id, want[h.BackendPID])
		}
	}
	for pid, c := range byPID {
		if !seen[pid] {
			r.failf("%s: /debug/locks does not list client %d's backend %d", when, c.id, pid)
		}
	}
}

// What both randomized lock tests (this one and TestLocksRandomizedHold)
// share besides [lkrRun]: the session every client is, the seed, starting
// the clients, the phases with a barrier after each, the continuous
// checker's sample of pg_locks, everyone leaving, and the summary.

// lkrSeed is the seed of a randomized lock test: def, or
// LOCKPOOL_LOCKS_SEED when it is set.
func lkrSeed(t *testing.T, def int64) int64 {
	t.Helper()
	seed := def
	if s := os.Getenv("LOCKPOOL_LOCKS_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("LOCKPOOL_LOCKS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (set LOCKPOOL_LOCKS_SEED to change it)", seed)
	return seed
}

// lkrSession is what every client of a randomized lock test is: its
// number, its random source (seeded from the test's seed and the number)
// and its connection, nil while disconnected.
type lkrSession struct {
	r    *lkrRun
	id   int
	rng  *rand.Rand
	conn *pgx.Conn
}

func (s *lkrSession) session() *lkrSession { return s }

func (s *lkrSession) mode() pgx.QueryExecMode { return lkrModes[s.rng.Intn(len(lkrModes))] }

func (s *lkrSession) pickKey(base int64, n int) int64 { return base + int64(s.rng.Intn(n)) }

// dial connects to dsn.
func (s *lkrSession) dial(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	s.conn = conn
	return nil
}

// hangUp ends the session, abruptly (socket closed, no Terminate) or not,
// and returns when it began to.
func (s *lkrSession) hangUp(abrupt bool) time.Time {
	at := time.Now()
	if abrupt {
		_ = s.conn.PgConn().Conn().Close()
		s.r.count("disconnect-abrupt")
	} else {
		s.r.count("disconnect-terminate")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = s.conn.Close(ctx)
	cancel()
	s.conn = nil
	return at
}

// lkrClientOf is a randomized lock test's client type.
type lkrClientOf interface {
	session() *lkrSession
	connect() error
	// step runs one random operation and checks what it can.
	step()
	// disconnect ends the session and forgets its locks.
	disconnect(abrupt bool)
}

// lkrStartClients makes n clients with newClient and connects them; they
// are closed when t ends.
func lkrStartClients[C lkrClientOf](t *testing.T, r *lkrRun, seed int64, n int, newClient func(s lkrSession) C) []C {
	t.Helper()
	clients := make([]C, n)
	for i := range clients {
		c := newClient(lkrSession{r: r, id: i, rng: rand.New(rand.NewSource(seed + int64(i)))})
		if err := c.connect(); err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	t.Cleanup(func() {
		for _, c := range clients {
			if s := c.session(); s.conn != nil {
				_ = s.conn.Close(context.Background())
			}
		}
	})
	return clients
}

// lkrRunPhases runs phases phases of dur each, every client stepping at most
// maxOps times a phase, then barrier; it stops after the first phase with
// an invariant violation and returns the number of operations.
func lkrRunPhases[C lkrClientOf](r *lkrRun, clients []C, phases int, dur time.Duration, maxOps int, barrier func(when string)) int {
	ops := 0
	for phase := 0; phase < phases; phase++ {
		end := time.Now().Add(dur)
		var wg sync.WaitGroup
		var phaseOps atomic.Int64
		for _, c := range clients {
			wg.Add(1)
			go func(c C) {
				defer wg.Done()
				for n := 0; n < maxOps && time.Now().Before(end); n++ {
					c.step()
					phaseOps.Add(1)
				}
			}(c)
		}
		wg.Wait()
		ops += int(phaseOps.Load())
		barrier(fmt.Sprintf("after phase %d", phase+1))
		if r.fails.Load() > 0 {
			break
		}
	}
	return ops
}

// lkrPoll calls done every interval until it returns true (lkrPoll
// returns true) or deadline passes (false). It polls PostgreSQL's and
// lockpool's state, which send no signal.
func lkrPoll(deadline time.Time, interval time.Duration, done func() bool) bool {
	for {
		if done() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// lkrLeave disconnects every client, half abruptly, half politely, and
// requires gone to return true within grace: no lock and no pin remains.
// gone describes what remains when it returns false.
func lkrLeave[C lkrClientOf](t *testing.T, clients []C, grace time.Duration, gone func(ctx context.Context) (bool, string)) {
	t.Helper()
	for _, c := range clients {
		if s := c.session(); s.conn != nil {
			c.disconnect(s.id%2 == 0)
		}
	}
	ctx := testenv.Context(t, 10*time.Second)
	var remains string
	if !lkrPoll(time.Now().Add(grace), 10*time.Millisecond, func() bool {
		var ok bool
		ok, remains = gone(ctx)
		return ok
	}) {
		t.Errorf("%v after every client left: %s", grace, remains)
	}
}

// lkrLock is a granted advisory lock on one of a test's keys, with whether
// its backend is one of lockpool's lock connections.
type lkrLock struct {
	pid      uint32
	key      int64
	mode     string
	lockConn bool
}

// lkrLocks runs query, which selects a backend pid, a key, a lock mode and
// whether the backend is a lock connection.
func lkrLocks(ctx context.Context, su *pgx.Conn, query string, args ...any) ([]lkrLock, error) {
	rows, err := su.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []lkrLock
	for rows.Next() {
		var x lkrLock
		var pid int32
		if err := rows.Scan(&pid, &x.key, &x.mode, &x.lockConn); err != nil {
			return nil, err
		}
		x.pid = uint32(pid)
		out = append(out, x)
	}
	return out, rows.Err()
}

// checkSample is one sample of the continuous checker: every lock that
// locks lists (the granted locks on the test's keys) must be explained by
// a client's hold in the lock log, at logPID of it, between the query's
// start and end.
func (r *lkrRun) checkSample(locks func(ctx context.Context) ([]lkrLock, error), logPID func(lkrLock) uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qs := time.Now()
	got, err := locks(ctx)
	if err != nil {
		r.failf("checker: %v", err)
		return
	}
	qe := time.Now()
	for _, x := range got {
		if !r.log.Explains(logPID(x), x.key, qs, qe) {
			r.failf("checker: backend %d (lock connection %v) holds %s %d, but no client holds it there (a lock outlived its session or went to another client)",
				x.pid, x.lockConn, x.mode, x.key)
		}
	}
	r.samples.Add(1)
}

// report logs the run (who made ops operations; extra) with its operation
// counts, and requires the checker to have run at least ten times.
func (r *lkrRun) report(seed int64, ops int, who, extra string) {
	r.t.Helper()
	r.mu.Lock()
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, r.counts[k])
	}
	r.mu.Unlock()
	r.t.Logf("seed %d: %d operations by %s, %d checker samples, %s;%s", seed, ops, who, r.samples.Load(), extra, b.String())
	if r.samples.Load() < 10 {
		r.t.Errorf("the checker only ran %d times", r.samples.Load())
	}
}
