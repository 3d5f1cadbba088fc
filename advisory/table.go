package advisory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// keyState is one key of a database's lock table.
type keyState struct {
	key     Key
	home    int                  // the lock connection slot the key lives on
	holders map[*Session]*[2]int // hold counts by mode
	pg      [2]bool              // the home connection holds the PostgreSQL lock in that mode
	gen     uint64               // the connection generation the PostgreSQL locks were taken on
	busy    bool                 // a PostgreSQL operation on the key is in flight
	waiters []*waiter            // in arrival order
	changed chan struct{}        // closed and replaced at every change
}

// waiter is one session waiting for a key.
type waiter struct {
	s      *Session
	ks     *keyState
	mode   Mode
	since  time.Time
	remote bool // the last obstacle was a holder outside lockpool
	slot   bool // holds a turn of max_waiters
}

// database is the lock table and the lock connections of one database.
type database struct {
	m     *Manager
	name  string
	conns []*lockConn
	// keys evaluates key expressions and holds no lock: a client's
	// expression (a function of its own, say) never runs where other
	// clients' locks live.
	keys  *lockConn
	turns chan struct{} // max_waiters: one token per waiter behind a remote holder

	mu       sync.Mutex
	table    map[Key]*keyState
	sessions map[*Session]struct{} // sessions that hold or wait
}

func newDatabase(m *Manager, name string) *database {
	d := &database{m: m, name: name, turns: make(chan struct{}, m.opts.MaxWaiters), table: map[Key]*keyState{}, sessions: map[*Session]struct{}{}}
	for i := 0; i < m.opts.MaxConnections; i++ {
		d.conns = append(d.conns, &lockConn{db: d, slot: i})
	}
	d.keys = &lockConn{db: d, slot: keySlot}
	return d
}

func (d *database) home(k Key) int {
	var h maphash.Hash
	h.SetSeed(d.m.seed)
	var b [17]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(uint64(k.A) >> (8 * i))
		b[8+i] = byte(uint64(k.B) >> (8 * i))
	}
	if k.Two {
		b[16] = 1
	}
	_, _ = h.Write(b[:])
	return int(h.Sum64() % uint64(len(d.conns)))
}

// keyLocked returns the key's state, creating it.
func (d *database) keyLocked(k Key) *keyState {
	ks := d.table[k]
	if ks == nil {
		ks = &keyState{key: k, home: d.home(k), holders: map[*Session]*[2]int{}, changed: make(chan struct{})}
		d.table[k] = ks
	}
	return ks
}

// tidyLocked forgets a key nobody holds, waits for or works on. ks may be
// stale (forgotten while its caller waited, and the key made anew since):
// then there is nothing to forget.
func (d *database) tidyLocked(ks *keyState) {
	if d.table[ks.key] != ks {
		return
	}
	if len(ks.holders) == 0 && len(ks.waiters) == 0 && !ks.busy && !ks.pg[0] && !ks.pg[1] {
		delete(d.table, ks.key)
	}
}

func (ks *keyState) broadcast() {
	close(ks.changed)
	ks.changed = make(chan struct{})
}

func (ks *keyState) total(m Mode) int {
	n := 0
	for _, h := range ks.holders {
		n += h[m]
	}
	return n
}

// blockersLocked returns the sessions s (asking for mode, queued as w, or
// not queued when w is nil) must wait for: other sessions holding a
// conflicting mode and, when s holds nothing on the key, conflicting
// waiters ahead of it (PostgreSQL's queue order).
func (ks *keyState) blockersLocked(s *Session, mode Mode, w *waiter) []*Session {
	var out []*Session
	for o, h := range ks.holders {
		if o == s {
			continue
		}
		if h[Exclusive] > 0 || (h[Shared] > 0 && conflicts(Shared, mode)) {
			out = append(out, o)
		}
	}
	if h := ks.holders[s]; h != nil && h[0]+h[1] > 0 {
		return out
	}
	for _, o := range ks.waiters {
		if o == w {
			break
		}
		if o.s != s && conflicts(o.mode, mode) {
			out = append(out, o.s)
		}
	}
	return out
}

// upgradeDeadlockLocked reports the cycle PostgreSQL reports at once, not
// after deadlock_timeout: s holds the key shared and asks for it
// exclusively while another session that holds it shared waits for it
// exclusively, so each waits for the other's shared lock. The later request
// is the one refused, as in PostgreSQL.
func (ks *keyState) upgradeDeadlockLocked(s *Session, mode Mode) bool {
	if h := ks.holders[s]; mode != Exclusive || h == nil || h[Shared] == 0 || h[Exclusive] > 0 {
		return false
	}
	for _, o := range ks.waiters {
		if h := ks.holders[o.s]; o.s != s && o.mode == Exclusive && h != nil && h[Shared] > 0 {
			return true
		}
	}
	return false
}

// deadlockLocked reports whether s's wait closes a cycle of waits among
// lockpool's own sessions.
func (d *database) deadlockLocked(s *Session) bool {
	seen := map[*Session]bool{}
	var visit func(x *Session) bool
	visit = func(x *Session) bool {
		w := x.waiting
		if w == nil {
			return false
		}
		for _, b := range w.ks.blockersLocked(x, w.mode, w) {
			if b == s {
				return true
			}
			if !seen[b] {
				seen[b] = true
				if visit(b) {
					return true
				}
			}
		}
		return false
	}
	return visit(s)
}

func (d *database) removeWaiterLocked(w *waiter) {
	ks := w.ks
	for i, o := range ks.waiters {
		if o == w {
			ks.waiters = append(ks.waiters[:i], ks.waiters[i+1:]...)
			break
		}
	}
	if w.s.waiting == w {
		w.s.waiting = nil
	}
	if w.slot {
		<-d.turns
		w.slot = false
	}
	ks.broadcast() // a waiter ahead of others left the queue
	d.tidyLocked(ks)
	d.forgetLocked(w.s)
}

// forgetLocked drops s from the sessions list when it holds and waits for nothing.
func (d *database) forgetLocked(s *Session) {
	if s.waiting == nil && len(s.keys) == 0 {
		delete(d.sessions, s)
	}
}

// grantLocked records one more hold of s.
func (d *database) grantLocked(ks *keyState, s *Session, mode Mode) {
	h := ks.holders[s]
	if h == nil {
		h = &[2]int{}
		ks.holders[s] = h
		s.keys[ks.key] = ks
	}
	h[mode]++
	d.sessions[s] = struct{}{}
	s.held++
}

// pgSQL is the statement for one PostgreSQL operation on a key.
func pgSQL(fn string, k Key) string { return "SELECT pg_catalog." + fn + "(" + k.args() + ")" }

// pgBool runs an advisory function for the key on its home connection and
// reports its boolean result (true for the void pg_advisory_lock_shared).
func (d *database) pgBool(ks *keyState, fn string) (bool, uint64, error) {
	ok, gen, err := d.homeBool(ks, pgSQL(fn, ks.key))
	if fn == fnDowngrade && err == nil {
		return true, gen, nil
	}
	return ok, gen, err
}

// homeBool runs a one-column statement on the key's home connection and
// reports whether it returned true.
func (d *database) homeBool(ks *keyState, sql string) (bool, uint64, error) {
	ctx, cancel := opContext()
	defer cancel()
	row, gen, err := d.conns[ks.home].query(ctx, sql, nil, nil, nil)
	if err != nil {
		return false, gen, err
	}
	if len(row) != 1 {
		return false, gen, fmt.Errorf("advisory: %q returned %d columns", sql, len(row))
	}
	return string(row[0]) == "t", gen, nil
}

// pgJoinShared reports whether a session that holds nothing of the key may
// join the shared hold the home connection has: whether no other session
// waits for the key exclusively. PostgreSQL queues a new shared request
// behind such a waiter (it conflicts with the waiter's request), where the
// home connection's own request would be granted at once; so lockpool asks
// pg_locks before it grants a new holder from its table.
func (d *database) pgJoinShared(ks *keyState) (bool, uint64, error) {
	return d.homeBool(ks, "SELECT NOT "+keyLocksSQL(ks.key, "NOT granted AND mode = 'ExclusiveLock'"))
}

// keyLocksSQL is an EXISTS over the key's rows in pg_locks (of the current
// database) that also meet cond.
func keyLocksSQL(k Key, cond string) string {
	classid, objid, objsubid := k.ClassObj()
	return fmt.Sprintf("EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND %s"+
		" AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())"+
		" AND classid = '%d'::pg_catalog.oid AND objid = '%d'::pg_catalog.oid AND objsubid = %d)", cond, classid, objid, objsubid)
}

// pgUpgrade takes the exclusive lock on a key the home connection holds
// shared for the asking session alone, as that session's blocking
// pg_advisory_lock would: PostgreSQL queues the request ahead of the
// sessions that wait for the key (they wait for the shared lock anyway) and
// grants it unless another session holds the key. The try form is refused
// while anyone waits, so a waiter and the upgrading session would wait for
// each other for ever. The wait in PostgreSQL is bounded by upgradeWait
// (lock_timeout, set and reset in the same implicit transaction), so a
// remote holder costs the connection no more than that per attempt; ok is
// false when it elapsed.
func (d *database) pgUpgrade(ks *keyState) (ok bool, gen uint64, err error) {
	ctx, cancel := opContext()
	defer cancel()
	sql := "SET lock_timeout = " + strconv.FormatInt(upgradeWait.Milliseconds(), 10) + "; " +
		pgSQL("pg_advisory_lock", ks.key) + "; SET lock_timeout = 0"
	gen, err = d.conns[ks.home].simple(ctx, sql)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == pgerr.LockNotAvailable || pe.Code == pgerr.QueryCanceled) {
		// PostgreSQL may grant the lock in the instant the timeout fires
		// and still end the statement with the timeout's error: the
		// connection is asked what it holds.
		held, hgen, herr := d.homeBool(ks, "SELECT "+keyLocksSQL(ks.key, "granted AND mode = 'ExclusiveLock' AND pid = pg_catalog.pg_backend_pid()"))
		switch {
		case herr != nil:
			return false, hgen, herr
		case hgen != gen:
			return false, hgen, errConnLost
		case held:
			return true, gen, nil
		case pe.Code == pgerr.LockNotAvailable:
			return false, gen, nil
		}
	}
	return err == nil, gen, err
}

// upgradeWait bounds one attempt of pgUpgrade.
const upgradeWait = 10 * time.Millisecond

// onlyHolder reports whether s is the one session that holds the key.
func (ks *keyState) onlyHolder(s *Session) bool {
	_, ok := ks.holders[s]
	return ok && len(ks.holders) == 1
}

// fnDowngrade takes the shared lock on a key the connection holds
// exclusively, before the exclusive lock is given back. It is the blocking
// form, and it cannot block: PostgreSQL queues a request of a backend that
// holds a lock conflicting with a waiter ahead of that waiter and grants it
// at once when only the backend's own locks conflict with it. The try form
// is refused whenever another session waits for the key (its request
// conflicts with the waiter's before the backend's own locks are
// considered), and giving the exclusive lock back then would leave the
// shared holders with no lock in PostgreSQL.
const fnDowngrade = "pg_advisory_lock_shared"

// syncPGLocked brings the home connection's PostgreSQL locks in line with
// the table after holds were dropped: the shared lock is taken
// (fnDowngrade) before the exclusive one is given back when shared holds
// remain, and a mode nobody holds is unlocked. It is called with d.mu held
// and returns with it held; it waits for the key's busy flag and sets it
// while PostgreSQL works.
func (d *database) syncPGLocked(ks *keyState) {
	for ks.busy {
		ch := ks.changed
		d.mu.Unlock()
		<-ch
		d.mu.Lock()
	}
	if d.table[ks.key] != ks {
		// Forgotten while this waited (another release synced it, with
		// no PostgreSQL lock left): whatever the key is now is another
		// keyState's.
		return
	}
	// The steps, in order: each sets the flag of its mode to take.
	type step struct {
		fn   string
		mode Mode
		take bool
	}
	var steps []step
	want := ks.pg
	if ks.pg[Exclusive] && ks.total(Exclusive) == 0 {
		if ks.total(Shared) > 0 && !ks.pg[Shared] {
			steps = append(steps, step{fnDowngrade, Shared, true})
			want[Shared] = true
		}
		steps = append(steps, step{"pg_advisory_unlock", Exclusive, false})
		want[Exclusive] = false
	}
	if want[Shared] && ks.total(Shared) == 0 {
		steps = append(steps, step{"pg_advisory_unlock_shared", Shared, false})
	}
	if len(steps) == 0 {
		d.tidyLocked(ks)
		return
	}
	gen := ks.gen
	done := ks.pg // the flags after the steps that succeeded
	ks.busy = true
	d.mu.Unlock()
	var err error
	for _, st := range steps {
		var ok bool
		var g uint64
		ok, g, err = d.pgBool(ks, st.fn)
		if err == nil && g != gen {
			err = errConnLost // taken on a connection that has died since
		}
		if err != nil {
			// Nothing after a failed step runs: the exclusive lock is
			// not given back unless the shared one was taken.
			break
		}
		if !ok {
			d.m.log.Error("advisory: PostgreSQL disagrees with the lock table", "database", d.name, "key", ks.key.String(), "call", st.fn)
		}
		done[st.mode] = st.take
	}
	d.mu.Lock()
	ks.busy = false
	if !d.conns[ks.home].alive(gen) {
		// connLost has run, or runs next and clears the flags: also when
		// a step failed otherwise after gen died under it (no new
		// connection could be dialled, say while the primary stops), the
		// flags must not come back with the locks PostgreSQL released.
		err = errConnLost
	}
	// A lost connection released everything on it (connLost cleared the
	// flags); any other failure leaves the failed step's lock as it was:
	// it is logged, and a later release retries.
	if err != nil && !errors.Is(err, errConnLost) {
		d.m.log.Error("advisory: unlock failed", "database", d.name, "key", ks.key.String(), "err", err)
	}
	if !errors.Is(err, errConnLost) && ks.gen == gen {
		ks.pg = done
	}
	ks.broadcast()
	d.tidyLocked(ks)
}

// holdsOn reports whether the connection slot holds any PostgreSQL lock.
func (d *database) holdsOn(slot int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ks := range d.table {
		if ks.home == slot && (ks.pg[0] || ks.pg[1]) {
			return true
		}
	}
	return false
}

// connLost drops every hold on generation gen of the slot's connection
// (PostgreSQL released them when it ended) and tells their sessions.
func (d *database) connLost(slot int, gen uint64) {
	var told []*Session
	d.mu.Lock()
	for _, ks := range d.table {
		if ks.home != slot || ks.gen != gen || !(ks.pg[0] || ks.pg[1]) {
			continue
		}
		for s, h := range ks.holders {
			s.held -= h[0] + h[1]
			delete(s.keys, ks.key)
			if !s.lost {
				s.lost = true
				told = append(told, s)
			}
			delete(ks.holders, s)
			d.forgetLocked(s)
		}
		ks.pg = [2]bool{}
		ks.broadcast()
		d.tidyLocked(ks)
	}
	d.mu.Unlock()
	if len(told) > 0 {
		d.m.log.Warn("advisory: a lock connection was lost; its holders are told", "database", d.name, "sessions", len(told))
	}
	// Told before this returns, so before a replacement connection can
	// be dialled: no holder is left believing it holds a lock that
	// another client can take on the new connection (onLost must not
	// block; lockpool's marks the session killed and posts its FATAL).
	for _, s := range told {
		if s.onLost != nil {
			s.onLost()
		}
	}
}

func (d *database) close() {
	for _, lc := range d.conns {
		lc.close()
	}
	d.keys.close()
}

// keySlot is the slot number of the key evaluation connection.
const keySlot = -1

func (d *database) snapshot() []ClientLocks {
	pids := make([]uint32, len(d.conns))
	for i, lc := range d.conns {
		pids[i] = lc.backendPID()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	var out []ClientLocks
	for s := range d.sessions {
		cl := ClientLocks{Client: s.label, Database: d.name, Held: []HeldLock{}}
		for _, ks := range s.keys {
			h := ks.holders[s]
			for m := Exclusive; m <= Shared; m++ {
				if h[m] > 0 {
					cl.Held = append(cl.Held, HeldLock{Key: ks.key, Mode: m.String(), Count: h[m], PID: pids[ks.home]})
				}
			}
		}
		if w := s.waiting; w != nil {
			behind := "local"
			if w.remote {
				behind = "remote"
			}
			cl.Waiting = &Waiting{Key: w.ks.key, Mode: w.mode.String(), Behind: behind, Since: now.Sub(w.since).Seconds(), PID: pids[w.ks.home]}
		}
		out = append(out, cl)
	}
	return out
}

// Errors with PostgreSQL's SQLSTATEs and messages.

func errLockTimeout() *pgerr.Error {
	return pgerr.New(pgerr.LockNotAvailable, "canceling statement due to lock timeout", "")
}

func errStatementTimeout() *pgerr.Error {
	return pgerr.New(pgerr.QueryCanceled, "canceling statement due to statement timeout", "")
}

func errCanceled() *pgerr.Error {
	return pgerr.New(pgerr.QueryCanceled, "canceling statement due to user request", "")
}

func errDeadlock(k Key, mode Mode) *pgerr.Error {
	return pgerr.New(pgerr.DeadlockDetected, "deadlock detected", "See server log for query details.").
		WithDetail(fmt.Sprintf("lockpool: this session waits for %s on advisory lock [%s], held by a session that waits (directly or not) for a lock this session holds.", mode.lockName(), k))
}

func errLost() *pgerr.Error {
	return pgerr.LocksLost()
}

func errClosed() *pgerr.Error { return pgerr.Shutdown() }

// waitErr maps the end of a wait to its error.
func waitErr(ctx context.Context) *pgerr.Error {
	if errors.Is(context.Cause(ctx), errLockTimeoutCause) {
		return errLockTimeout()
	}
	if errors.Is(context.Cause(ctx), errStatementTimeoutCause) {
		return errStatementTimeout()
	}
	return errCanceled()
}

var (
	errLockTimeoutCause      = errors.New("lock timeout")
	errStatementTimeoutCause = errors.New("statement timeout")
)
