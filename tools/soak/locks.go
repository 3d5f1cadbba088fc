package main

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// Lock churn: clients take (try-lock, or a blocking lock bounded by the
// session's lock_timeout), stack, release and drop advisory locks on a small
// key space, keeping a model of what they hold; the checker compares
// pg_locks with the models.

const (
	lockKeyBase = 7700001
	lockKeyN    = 6
	lockTimeout = "300ms"
)

const lockKeyExpr = "((l.classid::bigint << 32) | l.objid::bigint)"

// ownLocksSQL reports the serving backend, its soak keys and lock_timeout.
const ownLocksSQL = "SELECT pg_backend_pid(), ARRAY(SELECT " + lockKeyExpr +
	" FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = pg_backend_pid() AND " +
	lockKeyExpr + " BETWEEN 7700001 AND 7700006 ORDER BY 1)::bigint[], current_setting('lock_timeout')"

type lockClient struct {
	base
	rng  *rand.Rand
	held map[int64][]*testenv.LockHold
	pid  uint32 // the pinned backend while held is not empty (advisory_locks: pin)
	// hold: the application runs advisory_locks: hold. The locks live on
	// lockpool's lock connections, not on the client's backend (no pin, no
	// pid to check), and lockpool's table decides conflicts among the
	// clients: s.held checks that no two hold a key at once.
	hold bool
	// lostAt: when the soak terminated a lock connection that held this
	// client's locks (Unix nanoseconds; 0: none since it connected). Its
	// session must end: operations failing meanwhile are expected.
	lostAt atomic.Int64
}

var lockModes = []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec}

func newLockClient(s *soak, id int, seed int64) *lockClient {
	c := &lockClient{rng: rand.New(rand.NewSource(seed)), held: map[int64][]*testenv.LockHold{}, hold: s.o.advisory == "hold"}
	c.base = base{s: s, kind: "lock", id: id}
	if c.hold {
		// Before the socket closes: lockpool may give the keys to another
		// client as soon as it notices.
		c.beforeKill = func() { s.held.forget(id) }
	}
	c.afterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		// A session setting: it must follow the client to every server
		// connection (checked by verify).
		_, err := conn.Exec(ctx, "SET lock_timeout = '"+lockTimeout+"'", pgx.QueryExecModeSimpleProtocol)
		return err
	}
	return c
}

func (c *lockClient) mode() pgx.QueryExecMode { return lockModes[c.rng.Intn(len(lockModes))] }

// call runs one advisory function (fn of key; pg_advisory_unlock_all takes
// none) in a random protocol and returns its result (false for the void
// functions) and the serving backend. Under pin the statement also asks
// for pg_backend_pid(); under hold it is the call alone (anything more in
// the statement is handled as under pin, a fallback) and pid is 0.
func (c *lockClient) call(ctx context.Context, conn *pgx.Conn, fn string, key int64) (ok bool, pid int32, err error) {
	void := fn == "pg_advisory_lock" || fn == "pg_advisory_unlock_all"
	args := []any{c.mode()}
	call := fn + "()"
	switch {
	case fn == "pg_advisory_unlock_all":
	case c.hold:
		call, args = fn+"($1)", append(args, key) // a key lockpool reads without a round trip
	default:
		call, args = fn+"($1::bigint)", append(args, key)
	}
	switch {
	case c.hold && void:
		_, err = conn.Exec(ctx, "SELECT "+call, args...)
	case c.hold:
		err = conn.QueryRow(ctx, "SELECT "+call, args...).Scan(&ok)
	case void:
		var s string
		err = conn.QueryRow(ctx, "SELECT "+call+"::text, pg_backend_pid()", args...).Scan(&s, &pid)
	default:
		err = conn.QueryRow(ctx, "SELECT "+call+", pg_backend_pid()", args...).Scan(&ok, &pid)
	}
	return ok, pid, err
}

func (c *lockClient) heldKeys() []int64 {
	var ks []int64
	for k, s := range c.held {
		if len(s) > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

func (c *lockClient) pickKey() int64 { return lockKeyBase + int64(c.rng.Intn(lockKeyN)) }

func (c *lockClient) push(key int64, iv *testenv.LockHold, pid uint32) {
	if c.hold {
		c.took(key)
	} else {
		if len(c.heldKeys()) > 0 && pid != c.pid {
			c.s.violatef("lock", "%s: took %d on backend %d while pinned to backend %d", c.name(), key, pid, c.pid)
		}
		c.pid = pid
		c.s.locks.SetPID(iv, pid) // under hold the lock connection's pid is not the client's to know: any
	}
	c.held[key] = append(c.held[key], iv)
	c.holding.Store(true)
}

// took records, under hold, that the client got key: no other client may
// hold it. A client killed since its call was answered records nothing
// (the kill forgot its holds before the socket closed).
func (c *lockClient) took(key int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killedAt.Load() != 0 || c.lostAt.Load() != 0 {
		return
	}
	if other, ok := c.s.held.take(c.id, key); !ok {
		c.s.violatef("lock", "%s: got %d while lock client %d holds it (advisory_locks: hold)", c.name(), key, other)
	}
}

// dropAll forgets every lock, closing the intervals at `at`.
func (c *lockClient) dropAll(at time.Time) {
	c.s.held.forget(c.id)
	for k, s := range c.held {
		for _, iv := range s {
			c.s.locks.Close(iv, at)
		}
		delete(c.held, k)
	}
	c.pid = 0
	c.holding.Store(false)
}

// failed handles an error of an operation; ivs are the intervals that
// operation opened and did not push. Errors after a kill and 53300 are
// acceptable outcomes; anything else is counted as unexpected.
func (c *lockClient) failed(op string, err error, ivs ...*testenv.LockHold) {
	now := time.Now()
	if at, ok := c.killed(); ok {
		// lockpool has the grace from the moment the socket was closed.
		c.cut(at.Add(killGrace), "lock: operations cut by a kill", ivs)
		return
	}
	if _, ok := c.lost(); ok {
		// lockpool ended the session: it releases what the session held
		// on its other lock connections at once.
		c.cut(now.Add(killGrace), "lock: operations cut by a lost lock connection", ivs)
		return
	}
	if sqlState(err) == "53300" {
		for _, iv := range ivs {
			c.s.locks.Close(iv, now)
		}
		c.s.count("lock: 53300 (no pin slot / connection within wait_timeout)")
		return
	}
	c.s.unexpectedf("%s: %s: %v", c.name(), op, err)
	for _, iv := range ivs {
		c.s.locks.Close(iv, now.Add(killGrace))
	}
	c.dropAll(now.Add(killGrace))
	c.drop()
}

// cut ends the client's connection after an operation that failed as the
// soak expected (a kill, a lost lock connection): the operation's intervals
// ivs and every hold close at end, and the client connects again.
func (c *lockClient) cut(end time.Time, what string, ivs []*testenv.LockHold) {
	for _, iv := range ivs {
		c.s.locks.Close(iv, end)
	}
	c.dropAll(end)
	c.drop()
	c.lostAt.Store(0)
	c.s.count(what)
}

func (c *lockClient) opTry(ctx context.Context, conn *pgx.Conn) {
	key := c.pickKey()
	if ks := c.heldKeys(); len(ks) > 0 && c.rng.Intn(5) == 0 {
		key = ks[c.rng.Intn(len(ks))] // stack
	}
	iv := c.s.locks.Open(c.id, key)
	ok, pid, err := c.call(ctx, conn, "pg_try_advisory_lock", key)
	now := time.Now()
	if err != nil {
		c.failed("pg_try_advisory_lock", err, iv)
		return
	}
	c.s.lockOps.Add(1)
	if !ok {
		c.s.locks.Close(iv, now)
		c.s.count("lock: pg_try_advisory_lock = false")
		if _, lost := c.lost(); len(c.held[key]) > 0 && !lost {
			c.s.violatef("lock", "%s: pg_try_advisory_lock(%d) = false on backend %d although it holds the key (pinned to %d)", c.name(), key, pid, c.pid)
		}
		return
	}
	c.s.count("lock: pg_try_advisory_lock = true")
	c.push(key, iv, uint32(pid))
}

// opLock is a blocking pg_advisory_lock bounded by the session's
// lock_timeout.
func (c *lockClient) opLock(ctx context.Context, conn *pgx.Conn) {
	var key int64
	for i := 0; i < 4; i++ {
		key = c.pickKey()
		if len(c.held[key]) == 0 {
			break
		}
	}
	if len(c.held[key]) > 0 {
		return
	}
	iv := c.s.locks.Open(c.id, key)
	_, pid, err := c.call(ctx, conn, "pg_advisory_lock", key)
	switch {
	case err == nil:
		c.s.lockOps.Add(1)
		c.s.count("lock: pg_advisory_lock granted")
		c.push(key, iv, uint32(pid))
	case sqlState(err) == "55P03":
		c.s.lockOps.Add(1)
		c.s.count("lock: pg_advisory_lock 55P03 (lock_timeout)")
		// PostgreSQL may grant the lock in the instant lock_timeout fires:
		// ask the session what it holds.
		var p int32
		var keys []int64
		var lt string
		if err := conn.QueryRow(ctx, ownLocksSQL).Scan(&p, &keys, &lt); err != nil {
			c.failed("own-locks query after lock_timeout", err, iv)
			return
		}
		if slices.Contains(keys, key) {
			c.s.count("lock: lock_timeout but granted")
			c.push(key, iv, uint32(p))
			return
		}
		c.s.locks.Close(iv, time.Now())
	default:
		c.failed("pg_advisory_lock", err, iv)
	}
}

func (c *lockClient) opUnlock(ctx context.Context, conn *pgx.Conn) {
	key := c.pickKey()
	if ks := c.heldKeys(); len(ks) > 0 && c.rng.Intn(6) != 0 {
		key = ks[c.rng.Intn(len(ks))]
	}
	if len(c.held[key]) > 0 {
		c.s.held.give(c.id, key) // before lockpool can give the key to another client
	}
	ok, pid, err := c.call(ctx, conn, "pg_advisory_unlock", key)
	now := time.Now()
	if err != nil {
		c.failed("pg_advisory_unlock", err)
		return
	}
	c.s.lockOps.Add(1)
	c.s.count(fmt.Sprintf("lock: pg_advisory_unlock = %v", ok))
	holds := len(c.held[key]) > 0
	if _, lost := c.lost(); ok != holds && !lost {
		c.s.violatef("lock", "%s: pg_advisory_unlock(%d) = %v on backend %d, but the client holds it %d times (pinned backend %d)", c.name(), key, ok, pid, len(c.held[key]), c.pid)
	}
	if !c.hold && len(c.heldKeys()) > 0 && uint32(pid) != c.pid {
		c.s.violatef("lock", "%s: pg_advisory_unlock ran on backend %d while pinned to %d", c.name(), pid, c.pid)
	}
	if ok && holds {
		s := c.held[key]
		c.s.locks.Close(s[len(s)-1], now)
		c.held[key] = s[:len(s)-1]
		if len(c.held[key]) == 0 {
			delete(c.held, key)
		}
		if len(c.heldKeys()) == 0 {
			c.pid = 0
			c.holding.Store(false)
		}
	}
}

func (c *lockClient) opUnlockAll(ctx context.Context, conn *pgx.Conn) {
	c.s.held.forget(c.id)
	_, pid, err := c.call(ctx, conn, "pg_advisory_unlock_all", 0)
	if err != nil {
		c.failed("pg_advisory_unlock_all", err)
		return
	}
	c.s.lockOps.Add(1)
	c.s.count("lock: pg_advisory_unlock_all")
	if !c.hold && len(c.heldKeys()) > 0 && uint32(pid) != c.pid {
		c.s.violatef("lock", "%s: pg_advisory_unlock_all ran on backend %d while pinned to %d", c.name(), pid, c.pid)
	}
	c.dropAll(time.Now())
}

// opVerify asks the serving backend which soak keys it holds (exactly the
// model's, on the pinned backend) and whether lock_timeout followed.
func (c *lockClient) opVerify(ctx context.Context, conn *pgx.Conn) {
	var pid int32
	var keys []int64
	var lt string
	if err := conn.QueryRow(ctx, ownLocksSQL, c.mode()).Scan(&pid, &keys, &lt); err != nil {
		c.failed("own-locks query", err)
		return
	}
	c.s.count("lock: verify own locks")
	want := c.heldKeys()
	if c.hold {
		want = nil // the client's backend holds none of them: lockpool's lock connections do
	}
	if !slices.Equal(keys, want) && !(len(keys) == 0 && len(want) == 0) {
		c.s.violatef("lock", "%s: its backend %d holds %v, the client believes it holds %v (pinned backend %d)", c.name(), pid, keys, want, c.pid)
	}
	if !c.hold && len(want) > 0 && uint32(pid) != c.pid {
		c.s.violatef("lock", "%s: served by backend %d while pinned to %d", c.name(), pid, c.pid)
	}
	if lt != lockTimeout {
		c.s.violatef("state", "%s: lock_timeout is %q on backend %d, the session set %q", c.name(), lt, pid, lockTimeout)
	}
}

// run churns until the soak stops, then leaves politely.
func (c *lockClient) run() {
	for c.ensure() {
		conn := c.c()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		holding := len(c.heldKeys()) > 0
		p := c.rng.Intn(100)
		c.s.lockGate.RLock()
		switch {
		case holding && p < 35, !holding && p < 4:
			c.opUnlock(ctx, conn)
		case holding && p < 43:
			c.opUnlockAll(ctx, conn)
		case p < 70:
			c.opTry(ctx, conn)
		case p < 88:
			c.opLock(ctx, conn)
		default:
			c.opVerify(ctx, conn)
		}
		c.s.lockGate.RUnlock()
		cancel()
		c.checkLost()
		time.Sleep(time.Duration(20+c.rng.Intn(130)) * time.Millisecond)
	}
	c.leave()
}

// leave disconnects at the end (Terminate); lockpool has the grace to
// release what the client held.
func (c *lockClient) leave() {
	c.s.held.forget(c.id) // before the Terminate: lockpool releases at once
	if c.c() == nil {
		c.dropAll(time.Now())
		return
	}
	at := time.Now().Add(killGrace)
	c.drop()
	c.dropAll(at)
}

// exclusiveHolders is which lock client holds each key (stacked holds
// counted), kept under advisory_locks: hold, where lockpool's own table
// decides conflicts among its clients. A client records a key after its
// lock call answered and gives it back before its unlock is sent (or
// before its socket closes), so two clients recorded at once on a key
// held it at once.
type exclusiveHolders struct {
	mu    sync.Mutex
	byKey map[int64]map[int]int
}

func newExclusiveHolders() *exclusiveHolders {
	return &exclusiveHolders{byKey: map[int64]map[int]int{}}
}

// take records one more hold of key by client; ok is false when another
// client holds it (other).
func (h *exclusiveHolders) take(client int, key int64) (other int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hs := h.byKey[key]
	if hs == nil {
		hs = map[int]int{}
		h.byKey[key] = hs
	}
	for o := range hs {
		if o != client {
			other, ok = o, false
			hs[client]++
			return other, ok
		}
	}
	hs[client]++
	return 0, true
}

// give records one hold of key fewer.
func (h *exclusiveHolders) give(client int, key int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hs := h.byKey[key]; hs[client] > 1 {
		hs[client]--
	} else {
		delete(hs, client)
	}
}

// holdersOf returns the clients that hold any of keys.
func (h *exclusiveHolders) holdersOf(keys []int64) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []int
	for _, k := range keys {
		for id := range h.byKey[k] {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// dump describes the holds, by key, for a log line.
func (h *exclusiveHolders) dump() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprint(h.byKey)
}

// forget drops every hold of client.
func (h *exclusiveHolders) forget(client int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hs := range h.byKey {
		delete(hs, client)
	}
}
