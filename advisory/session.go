package advisory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgerr"
)

// Session is one client session's advisory locks. Its methods are called
// by the client's session goroutine, one at a time.
type Session struct {
	m      *Manager
	dbName string
	id     uint64
	label  string
	onLost func()
	db     *database

	// Guarded by db.mu.
	keys    map[Key]*keyState // keys held in some mode
	held    int               // holds, all keys and modes, stacked ones counted
	waiting *waiter
	lost    bool
}

// Limits are the client's timeouts for one statement (0: off).
type Limits struct {
	LockTimeout      time.Duration
	StatementTimeout time.Duration
	// DeadlockTimeout is how long a wait lasts before it is checked for a
	// deadlock, as PostgreSQL's deadlock_timeout (0: its default, 1s).
	DeadlockTimeout time.Duration
}

// maxLosses is how many lock connections may die under one Lock call
// before it gives up with an error (each loss is retried on a new one).
const maxLosses = 3

// defaultDeadlockTimeout is PostgreSQL's default deadlock_timeout.
const defaultDeadlockTimeout = time.Second

// SetLabel names the session in Snapshot (e.g. "api pid 123 10.0.0.7:5123").
func (s *Session) SetLabel(label string) { s.label = label }

func (s *Session) database() (*database, error) {
	if s.db == nil {
		d, err := s.m.db(s.dbName)
		if err != nil {
			return nil, err
		}
		s.db = d
		d.mu.Lock()
		s.keys = map[Key]*keyState{}
		d.mu.Unlock()
	}
	return s.db, nil
}

// Held returns the number of holds (stacked holds counted).
func (s *Session) Held() int {
	if s.db == nil {
		return 0
	}
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	return s.held
}

// Lost reports whether a lock connection holding one of the session's
// locks died.
func (s *Session) Lost() bool {
	if s.db == nil {
		return false
	}
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	return s.lost
}

// Lock takes key in mode for the session, as pg_advisory_lock (try false)
// or pg_try_advisory_lock (try true) and their _shared forms do. A try
// returns false when another session (of lockpool or not) holds a
// conflicting lock. A blocking call waits until it gets the lock or ctx
// ends (57014), or the limits do (55P03, 57014), or its wait closes a cycle
// among lockpool's sessions (40P01). A try waits only for lockpool's own
// work on the key (another call's statement on it): lock_timeout does not
// apply to it, as PostgreSQL's try never waits for a lock. Errors are
// *pgerr.Error.
func (s *Session) Lock(ctx context.Context, key Key, mode Mode, try bool, lim Limits) (bool, error) {
	d, err := s.database()
	if err != nil {
		return false, err
	}
	if try {
		lim.LockTimeout = 0
	}
	ctx, cancel := withLimits(ctx, lim)
	defer cancel()
	var w *waiter
	backoff := time.Millisecond
	dt := lim.DeadlockTimeout
	if dt <= 0 {
		dt = defaultDeadlockTimeout
	}
	checkAt := time.Now().Add(dt) // the first deadlock check, as PostgreSQL's
	losses := 0                   // lock connections that died under this call
	d.mu.Lock()
	defer func() {
		if w != nil {
			d.removeWaiterLocked(w)
		}
		d.mu.Unlock()
	}()
	for {
		if s.lost {
			return false, errLost()
		}
		ks := d.keyLocked(key)
		if ks.busy {
			if err := d.waitLocked(ctx, ks.changed, 0); err != nil {
				return false, err
			}
			continue
		}
		if len(ks.blockersLocked(s, mode, w)) > 0 {
			if try {
				d.tidyLocked(ks)
				return false, nil
			}
			if w == nil {
				if ks.upgradeDeadlockLocked(s, mode) {
					return false, errDeadlock(key, mode)
				}
				w = s.enqueueLocked(ks, mode)
			}
			w.remote = false
			untilCheck := time.Until(checkAt)
			if untilCheck <= 0 && d.deadlockLocked(s) {
				return false, errDeadlock(key, mode)
			}
			if untilCheck <= 0 {
				untilCheck = 0 // checked: from now on at every change
			}
			if err := d.waitLocked(ctx, ks.changed, untilCheck); err != nil {
				return false, err
			}
			continue
		}
		// join: the home connection holds the key shared and s holds
		// nothing of it; PostgreSQL is asked whether anyone waits for it
		// exclusively first (pgJoinShared).
		join := mode == Shared && ks.pg[Shared] && ks.holders[s] == nil
		if !join && (ks.pg[mode] || (mode == Shared && ks.pg[Exclusive])) {
			d.grantLocked(ks, s, mode)
			return true, nil
		}
		fn := "pg_try_advisory_lock"
		if mode == Shared {
			fn = "pg_try_advisory_lock_shared"
		}
		upgrade := !try && mode == Exclusive && ks.pg[Shared] && ks.onlyHolder(s)
		ks.busy = true
		d.mu.Unlock()
		var ok bool
		var gen uint64
		switch {
		case join:
			ok, gen, err = d.pgJoinShared(ks)
		case upgrade:
			ok, gen, err = d.pgUpgrade(ks)
		default:
			ok, gen, err = d.pgBool(ks, fn)
		}
		d.mu.Lock()
		ks.busy = false
		ks.broadcast()
		if err == nil && ok && !d.conns[ks.home].alive(gen) {
			// The connection died after granting the lock, and connLost
			// has run (or runs next) without this key: PostgreSQL has
			// released it.
			err = errConnLost
		}
		if err == nil && ok && join && (!ks.pg[Shared] || ks.gen != gen) {
			// The shared lock went with a connection that died before
			// the question was asked: start again.
			d.tidyLocked(ks)
			continue
		}
		if err != nil {
			d.tidyLocked(ks)
			if errors.Is(err, errConnLost) && losses < maxLosses {
				// The lock connection died under this operation (after
				// PostgreSQL granted it, perhaps). A session that held
				// something there is told (s.lost, checked at the top);
				// any other goes on with a new connection: a client that
				// held nothing there is not disconnected.
				losses++
				continue
			}
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == pgerr.DeadlockDetected {
				// An upgrade's wait in PostgreSQL closed a cycle with
				// sessions outside lockpool, and PostgreSQL chose it:
				// the client's call is the victim, as its own would be.
				return false, errDeadlock(key, mode)
			}
			return false, pgerr.Newf(pgerr.ConnectionFailure, "Retry; lockpool's log has the details.", "advisory lock operation failed: %v", err)
		}
		if ok {
			// Any flags already set are of gen too: a dead generation's
			// flags are cleared (deadLocked) before the next one is
			// dialled, and a grant is recorded only while gen is alive.
			ks.pg[mode] = true
			ks.gen = gen
			d.grantLocked(ks, s, mode)
			return true, nil
		}
		// Refused: a holder outside lockpool, or (join) a session outside
		// waiting for the key exclusively, which a new shared request
		// queues behind in PostgreSQL.
		if try {
			d.tidyLocked(ks)
			return false, nil
		}
		if w == nil {
			w = s.enqueueLocked(ks, mode)
		}
		w.remote = true
		if !w.slot {
			if err := d.takeTurnLocked(ctx, w); err != nil {
				return false, err
			}
			continue // the table may have changed while waiting for a turn
		}
		if err := d.waitLocked(ctx, ks.changed, backoff); err != nil {
			return false, err
		}
		if backoff *= 2; backoff > d.m.opts.PollMax {
			backoff = d.m.opts.PollMax
		}
	}
}

func (s *Session) enqueueLocked(ks *keyState, mode Mode) *waiter {
	w := &waiter{s: s, ks: ks, mode: mode, since: time.Now()}
	ks.waiters = append(ks.waiters, w)
	s.waiting = w
	s.db.sessions[s] = struct{}{}
	return w
}

// takeTurnLocked waits for one of max_waiters turns to wait behind a
// remote holder.
func (d *database) takeTurnLocked(ctx context.Context, w *waiter) error {
	select {
	case d.turns <- struct{}{}:
		w.slot = true
		return nil
	default:
	}
	d.mu.Unlock()
	defer d.mu.Lock()
	select {
	case d.turns <- struct{}{}:
		w.slot = true // d.mu is not held, but w is only read by its own goroutine and under d.mu after this
		return nil
	case <-ctx.Done():
		return waitErr(ctx)
	}
}

// waitLocked waits, with d.mu released, until ch is closed, poll elapses
// (0: no poll) or ctx ends.
func (d *database) waitLocked(ctx context.Context, ch <-chan struct{}, poll time.Duration) error {
	d.mu.Unlock()
	defer d.mu.Lock()
	var tc <-chan time.Time
	if poll > 0 {
		t := time.NewTimer(poll)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-ch:
		return nil
	case <-tc:
		return nil
	case <-ctx.Done():
		return waitErr(ctx)
	}
}

// withLimits bounds ctx by the client's timeouts, with the cause each
// one's error is told by.
func withLimits(ctx context.Context, lim Limits) (context.Context, context.CancelFunc) {
	var cancels []context.CancelFunc
	if lim.StatementTimeout > 0 {
		var c context.CancelFunc
		ctx, c = context.WithTimeoutCause(ctx, lim.StatementTimeout, errStatementTimeoutCause)
		cancels = append(cancels, c)
	}
	if lim.LockTimeout > 0 && (lim.StatementTimeout == 0 || lim.LockTimeout < lim.StatementTimeout) {
		var c context.CancelFunc
		ctx, c = context.WithTimeoutCause(ctx, lim.LockTimeout, errLockTimeoutCause)
		cancels = append(cancels, c)
	}
	return ctx, func() {
		for _, c := range cancels {
			c()
		}
	}
}

// Unlock gives back one hold of key in mode, as pg_advisory_unlock and
// pg_advisory_unlock_shared do. When the session holds none it returns
// false and the WARNING PostgreSQL sends then (a *pgerr.Error of severity
// WARNING, to be sent as a notice before the result).
func (s *Session) Unlock(key Key, mode Mode) (bool, *pgerr.Error, error) {
	d, err := s.database()
	if err != nil {
		return false, nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.lost {
		return false, nil, errLost()
	}
	ks := s.keys[key]
	if ks == nil || ks.holders[s][mode] == 0 {
		return false, NotHeldWarning(mode), nil
	}
	s.dropLocked(ks, mode, 1)
	d.syncPGLocked(ks)
	return true, nil, nil
}

// NotHeldWarning is PostgreSQL's WARNING for an unlock of a lock the
// session does not hold.
func NotHeldWarning(mode Mode) *pgerr.Error {
	return &pgerr.Error{Severity: pgerr.SeverityWarning, Code: pgerr.Warning, Message: "you don't own a lock of type " + mode.lockName()}
}

// dropLocked removes n holds of s on ks in mode (all when n < 0).
func (s *Session) dropLocked(ks *keyState, mode Mode, n int) {
	h := ks.holders[s]
	if h == nil {
		return
	}
	if n < 0 || n > h[mode] {
		n = h[mode]
	}
	h[mode] -= n
	s.held -= n
	if h[0]+h[1] == 0 {
		delete(ks.holders, s)
		delete(s.keys, ks.key)
		s.db.forgetLocked(s)
	}
	ks.broadcast()
}

// UnlockAll gives back every hold of the session, as
// pg_advisory_unlock_all does.
func (s *Session) UnlockAll() error {
	if s.db == nil {
		return nil
	}
	d := s.db
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.lost {
		return errLost()
	}
	s.releaseAllLocked()
	return nil
}

func (s *Session) releaseAllLocked() {
	for len(s.keys) > 0 {
		var ks *keyState
		for _, k := range s.keys {
			ks = k
			break
		}
		s.dropLocked(ks, Exclusive, -1)
		s.dropLocked(ks, Shared, -1)
		s.db.syncPGLocked(ks)
	}
}

// Close releases everything the session holds; the session is not used
// after.
func (s *Session) Close() {
	if s.db == nil {
		return
	}
	d := s.db
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := s.waiting; w != nil {
		d.removeWaiterLocked(w)
	}
	s.releaseAllLocked()
	s.lost = true // refuse later calls
	delete(d.sessions, s)
}

// Params are the client's parameter values for key expressions: values
// (nil for NULL), their type OIDs (0: let PostgreSQL infer) and formats.
type Params struct {
	Values  [][]byte
	OIDs    []uint32
	Formats []int16
}

// keySQL is the statement that evaluates key expressions as the advisory
// functions' arguments.
func keySQL(exprs []string) string {
	typ := "pg_catalog.int8"
	if len(exprs) == 2 {
		typ = "pg_catalog.int4"
	}
	var b strings.Builder
	b.WriteString("SELECT ")
	for i, e := range exprs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(")
		b.WriteString(e)
		b.WriteString(")::")
		b.WriteString(typ)
	}
	return b.String()
}

// ParamTypes returns the types PostgreSQL gives the parameters of key
// expressions (declared: the client's, 0 where it left one open), as a
// Describe of the client's statement reports them.
func (s *Session) ParamTypes(ctx context.Context, exprs []string, declared []uint32) ([]uint32, error) {
	d, err := s.database()
	if err != nil {
		return nil, err
	}
	opCtx, cancel := opContext()
	defer cancel()
	_ = ctx // never cancelled: see opContext
	types, err := d.keys.paramTypes(opCtx, keySQL(exprs), declared)
	if err != nil {
		return nil, pgError(err)
	}
	return types, nil
}

// pgError converts a lock connection's error to the client's.
func pgError(err error) *pgerr.Error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return &pgerr.Error{Code: pe.Code, Message: pe.Message, Detail: pe.Detail, Hint: pe.Hint}
	}
	if e, ok := pgerr.As(err); ok {
		return e
	}
	return pgerr.Newf(pgerr.ConnectionFailure, "Retry; lockpool's log has the details.", "advisory lock connection failed: %v", err)
}

// EvalKeys evaluates key expressions (the SQL text of a call's one or two
// arguments, which may use $n) on the database's key connection (which
// holds no lock), with the client's
// parameters, as the arguments of pg_advisory_lock(bigint) or (int, int).
// null reports a NULL key: the advisory functions are strict, so the call
// returns NULL and takes nothing. Errors are *pgerr.Error, as PostgreSQL
// reported them.
func (s *Session) EvalKeys(ctx context.Context, exprs []string, p Params) (key Key, null bool, err error) {
	if len(exprs) < 1 || len(exprs) > 2 {
		return Key{}, false, pgerr.Newf(pgerr.UndefinedFunction, "Advisory lock functions take one bigint key or two integer keys.", "advisory lock call with %d arguments", len(exprs))
	}
	d, err := s.database()
	if err != nil {
		return Key{}, false, err
	}
	opCtx, cancel := opContext()
	defer cancel()
	_ = ctx // the evaluation is short and never cancelled: see opContext
	row, err := d.keys.eval(opCtx, keySQL(exprs), p.Values, p.OIDs, p.Formats)
	if err != nil {
		return Key{}, false, pgError(err)
	}
	if len(row) != len(exprs) {
		return Key{}, false, pgerr.Newf(pgerr.InternalError, "", "advisory lock key evaluation returned %d values", len(row))
	}
	var v [2]int64
	for i, c := range row {
		if c == nil {
			return Key{}, true, nil
		}
		n, perr := strconv.ParseInt(string(c), 10, 64)
		if perr != nil {
			return Key{}, false, pgerr.Newf(pgerr.InternalError, "", "advisory lock key %q: %v", c, perr)
		}
		v[i] = n
	}
	if len(exprs) == 2 {
		return TwoKeys(int32(v[0]), int32(v[1])), false, nil
	}
	return OneKey(v[0]), false, nil
}

// String names the session for logs.
func (s *Session) String() string { return fmt.Sprintf("advisory session %d (%s)", s.id, s.label) }
