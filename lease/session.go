package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Row is one lease as lease_list() shows it.
type Row struct {
	Name      string
	Holder    string
	Token     int64
	TakenAt   time.Time
	ExpiresAt time.Time
	Mine      bool
}

// ErrSessionClosed is returned by operations on a closed Session.
var ErrSessionClosed = &Error{Code: "57P01", Message: "lockpool: the session is closing; its leases are being released"}

// Session is one client session's view of the leases: its holder identity,
// the leases it holds, and the warnings about leases it lost. All methods
// are safe for concurrent use.
type Session struct {
	s        *Store
	database string
	id       uint64
	holder   string
	ctx      context.Context // cancelled by Close: ends waiting acquires
	cancel   context.CancelFunc

	// mu guards everything below and the *held values; lock order is
	// Session.mu, then keeper.mu.
	mu       sync.Mutex
	held     map[string]*held
	warnings []string
	closed   bool
}

type held struct {
	token     int64
	ttl       time.Duration
	k         *kentry
	releasing bool
}

func (ss *Session) lock()   { ss.mu.Lock() }
func (ss *Session) unlock() { ss.mu.Unlock() }

// NewSession returns the lease view of one client session on database.
// Its holder is "<instance>:<sessionID>:<random>".
func (s *Store) NewSession(database string, sessionID uint64) *Session {
	var b [6]byte
	_, _ = rand.Read(b[:])
	ctx, cancel := context.WithCancel(s.ctx)
	ss := &Session{
		s:        s,
		database: database,
		id:       sessionID,
		holder:   fmt.Sprintf("%s:%d:%s", s.opts.InstanceID, sessionID, hex.EncodeToString(b[:])),
		ctx:      ctx,
		cancel:   cancel,
		held:     map[string]*held{},
	}
	s.mu.Lock()
	if s.closed {
		ss.closed = true
	} else {
		s.sessions[ss] = struct{}{}
	}
	s.mu.Unlock()
	return ss
}

// Holder returns the session's holder identity as stored in the table.
func (ss *Session) Holder() string { return ss.holder }

// Database returns the session's database.
func (ss *Session) Database() string { return ss.database }

func invalid(format string, args ...any) error {
	return &Error{Code: "22023", Message: "lockpool: " + fmt.Sprintf(format, args...)}
}

func checkName(name string) error {
	if name == "" {
		return invalid("lease name must not be empty")
	}
	if len(name) > MaxNameLength {
		return invalid("lease name is longer than %d bytes", MaxNameLength)
	}
	if !utf8.ValidString(name) {
		return invalid("lease name is not valid UTF-8")
	}
	return nil
}

type attempt struct {
	token  int64
	got    bool
	left   time.Duration // how long the current holder has left
	known  bool          // left is known
	fenced bool          // the row is locked by a lease_fence transaction
}

// tryAcquire runs one acquire of name for holder. held is the token the
// session believes it holds (nil: none): only that token is kept by a
// re-acquire.
func (s *Store) tryAcquire(ctx context.Context, database, name, holder string, held *int64, ttl time.Duration) (attempt, error) {
	var a attempt
	err := s.withConn(ctx, database, func(c *pgx.Conn) error {
		a = attempt{}
		rows, err := c.Query(ctx, s.names.acquire, name, holder, ttl.Seconds(), held)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var got bool
			var tok *int64
			var left *float64
			if err := rows.Scan(&got, &tok, &left); err != nil {
				return err
			}
			if got && tok != nil {
				a.got, a.token = true, *tok
			} else if left != nil {
				a.known = true
				a.left = time.Duration(*left * float64(time.Second))
			}
		}
		return rows.Err()
	})
	if isLockTimeout(err) {
		return attempt{fenced: true}, nil
	}
	return a, err
}

// Acquire takes the lease name for ttl. ok=false means another holder has it
// (after waiting up to wait). While waiting no connection is held: the
// waiter is woken by the release notification, at the current holder's
// expiry (server clock), or by ctx (then ctx.Err() is returned). A second
// Acquire by the same session while it holds the lease extends it and keeps
// the token.
func (ss *Session) Acquire(ctx context.Context, name string, ttl, wait time.Duration) (token int64, ok bool, err error) {
	s := ss.s
	if err := checkName(name); err != nil {
		s.m.op(OpAcquire, ResultError)
		return 0, false, err
	}
	if ttl < MinTTL || ttl > MaxTTL {
		s.m.op(OpAcquire, ResultError)
		return 0, false, invalid("lease ttl must be between %s and %s, got %s", MinTTL, MaxTTL, ttl)
	}
	if wait < 0 {
		wait = 0
	}
	if ss.isClosed() {
		return 0, false, ErrSessionClosed
	}
	start := time.Now()
	observe := func() {
		if wait > 0 {
			s.m.wait.Observe(time.Since(start).Seconds())
		}
	}
	d, err := s.db(ctx, ss.database)
	if err != nil {
		s.m.op(OpAcquire, ResultError)
		return 0, false, err
	}
	var w *waiter
	if wait > 0 {
		w = s.addWaiter(d, name)
		defer s.removeWaiter(d, name, w)
	}
	deadline := start.Add(wait)
	for {
		at := time.Now()
		a, err := s.tryAcquire(ctx, ss.database, name, ss.holder, ss.heldToken(name), ttl)
		if err != nil {
			observe()
			if ctx.Err() != nil {
				s.m.op(OpAcquire, ResultCanceled)
				return 0, false, ctx.Err()
			}
			s.m.op(OpAcquire, ResultError)
			return 0, false, s.wrapPg(err, fmt.Sprintf("acquiring lease %q", name))
		}
		if a.got {
			observe()
			if err := ss.recordHeld(name, a.token, ttl, at); err != nil {
				return 0, false, err
			}
			s.m.op(OpAcquire, ResultOK)
			return a.token, true, nil
		}
		if a.fenced {
			// The row is locked by a lease_fence transaction. If that is
			// ours, we still hold the lease: answer with our token (the
			// keeper extends it once the fence ends).
			if tok, ok := ss.stillHeld(ctx, name); ok {
				observe()
				s.m.op(OpAcquire, ResultOK)
				return tok, true, nil
			}
		} else {
			ss.forgetIfHeld(name)
		}
		now := time.Now()
		left := deadline.Sub(now)
		if wait <= 0 {
			s.m.op(OpAcquire, ResultNotHeld)
			return 0, false, nil
		}
		if left <= 0 {
			observe()
			s.m.op(OpAcquire, ResultTimeout)
			return 0, false, nil
		}
		sleep := left
		switch {
		case a.fenced:
			sleep = min(sleep, 250*time.Millisecond)
		case a.known:
			sleep = min(sleep, max(a.left+5*time.Millisecond, 5*time.Millisecond))
		default:
			sleep = min(sleep, 20*time.Millisecond)
		}
		if !d.listening() {
			sleep = min(sleep, 250*time.Millisecond)
		}
		sleep = min(sleep, s.pollCap)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			observe()
			s.m.op(OpAcquire, ResultCanceled)
			return 0, false, ctx.Err()
		case <-ss.ctx.Done():
			t.Stop()
			observe()
			s.m.op(OpAcquire, ResultCanceled)
			return 0, false, ErrSessionClosed
		case <-w.ch:
			t.Stop()
		case <-t.C:
		}
	}
}

// heldToken is the token the session believes it holds name with, or nil.
func (ss *Session) heldToken(name string) *int64 {
	ss.lock()
	defer ss.unlock()
	if h := ss.held[name]; h != nil {
		tok := h.token
		return &tok
	}
	return nil
}

func (ss *Session) isClosed() bool {
	ss.lock()
	defer ss.unlock()
	return ss.closed
}

// recordHeld notes a granted lease and schedules its renewal. If the session
// closed meanwhile the lease is released again at once.
func (ss *Session) recordHeld(name string, token int64, ttl time.Duration, at time.Time) error {
	s := ss.s
	ss.lock()
	if ss.closed {
		ss.unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = ss.releaseToken(ctx, name, token)
		return ErrSessionClosed
	}
	due := at.Add(ttl / 4)
	h := ss.held[name]
	switch {
	case h != nil && h.token == token:
		h.ttl = ttl
		h.k.ttl = ttl
		s.keeper.schedule(h.k, due)
	case h != nil:
		// The session held the lease under another token, which the
		// table no longer has (it expired, or its grant was lost in a
		// failover): that token is lost, whatever the new grant.
		if !h.releasing {
			ss.warnLostLocked(name, h.token)
		}
		s.keeper.remove(h.k)
		h.token, h.ttl, h.releasing = token, ttl, false
		h.k = &kentry{ss: ss, name: name, token: token, ttl: ttl, idx: -1}
		s.keeper.schedule(h.k, due)
	default:
		h = &held{token: token, ttl: ttl}
		h.k = &kentry{ss: ss, name: name, token: token, ttl: ttl, idx: -1}
		ss.held[name] = h
		s.m.held.Inc()
		s.keeper.schedule(h.k, due)
	}
	ss.unlock()
	return nil
}

// stillHeld reports, without taking a row lock, whether the session's token
// for name still holds the lease.
func (ss *Session) stillHeld(ctx context.Context, name string) (int64, bool) {
	ss.lock()
	h := ss.held[name]
	if h == nil || h.releasing {
		ss.unlock()
		return 0, false
	}
	token := h.token
	ss.unlock()
	live, err := ss.s.peek(ctx, ss.database, name, ss.holder, token)
	return token, err == nil && live
}

func (s *Store) peek(ctx context.Context, database, name, holder string, token int64) (bool, error) {
	var live bool
	err := s.withConn(ctx, database, func(c *pgx.Conn) error {
		live = false
		err := c.QueryRow(ctx, s.names.peek, name, holder, token).Scan(&live)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	return live, err
}

// forgetIfHeld drops a lease this session believed it held but that an
// acquire just found held by someone else.
func (ss *Session) forgetIfHeld(name string) {
	ss.lock()
	defer ss.unlock()
	h := ss.held[name]
	if h == nil || h.releasing {
		return
	}
	ss.dropLocked(name, h)
	ss.warnLostLocked(name, h.token)
}

func (ss *Session) dropLocked(name string, h *held) {
	if ss.held[name] != h {
		return
	}
	delete(ss.held, name)
	ss.s.keeper.remove(h.k)
	ss.s.m.held.Dec()
}

func (ss *Session) warnLostLocked(name string, token int64) {
	ss.warnings = append(ss.warnings, fmt.Sprintf(
		"lockpool: lease %q was lost: it expired or was taken over by another holder before it could be renewed (token %d no longer holds it)", name, token))
}

// Renew extends a lease this session holds by its ttl. false: the session
// does not hold it (never did, released it, or lost it).
func (ss *Session) Renew(ctx context.Context, name string) (bool, error) {
	s := ss.s
	ss.lock()
	h := ss.held[name]
	if h == nil || ss.closed || h.releasing {
		ss.unlock()
		s.m.op(OpRenew, ResultNotHeld)
		return false, nil
	}
	token, ttl := h.token, h.ttl
	ss.unlock()

	start := time.Now()
	var n int64
	err := s.withConn(ctx, ss.database, func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, s.names.renew, name, ss.holder, token, ttl.Seconds())
		n = tag.RowsAffected()
		return err
	})
	if isLockTimeout(err) {
		// Our own lease_fence transaction (or a takeover blocked by it)
		// holds the row: nobody can take it over right now. Report whether
		// it is still ours and unexpired; the keeper keeps trying to extend it.
		var live bool
		live, err = s.peek(ctx, ss.database, name, ss.holder, token)
		if err == nil {
			n = 0
			if live {
				s.m.op(OpRenew, ResultOK)
				return true, nil
			}
		}
	}
	if err != nil {
		s.m.op(OpRenew, ResultError)
		return false, s.wrapPg(err, fmt.Sprintf("renewing lease %q", name))
	}
	ss.lock()
	defer ss.unlock()
	if n == 1 {
		if ss.held[name] == h && h.token == token && !h.releasing {
			s.keeper.schedule(h.k, start.Add(ttl/4))
		}
		s.m.op(OpRenew, ResultOK)
		return true, nil
	}
	if ss.held[name] == h && h.token == token {
		ss.dropLocked(name, h)
	}
	s.m.op(OpRenew, ResultLost)
	return false, nil
}

func (ss *Session) releaseToken(ctx context.Context, name string, token int64) (bool, error) {
	s := ss.s
	var n int64
	err := s.withConn(ctx, ss.database, func(c *pgx.Conn) error {
		n = 0
		rows, err := c.Query(ctx, s.names.release, name, ss.holder, token, s.names.channel)
		if err != nil {
			return err
		}
		for rows.Next() {
			n++
		}
		return rows.Err()
	})
	if isLockTimeout(err) {
		return false, &Error{Code: "55P03",
			Message: fmt.Sprintf("lockpool: lease %q cannot be released while a transaction that called lease_fence on it is open", name),
			Hint:    "Commit or roll back the transaction that fenced the lease, then release it.", Err: err}
	}
	if err != nil {
		return false, s.wrapPg(err, fmt.Sprintf("releasing lease %q", name))
	}
	return n == 1, nil
}

// Release gives up a lease this session holds and wakes its waiters. true:
// this call released it; false: the session did not hold it (any more).
func (ss *Session) Release(ctx context.Context, name string) (bool, error) {
	s := ss.s
	ss.lock()
	h := ss.held[name]
	if h == nil || ss.closed || h.releasing {
		ss.unlock()
		s.m.op(OpRelease, ResultNotHeld)
		return false, nil
	}
	h.releasing = true
	token := h.token
	s.keeper.remove(h.k)
	ss.unlock()

	ok, err := ss.releaseToken(ctx, name, token)
	ss.lock()
	defer ss.unlock()
	if err != nil {
		if ss.held[name] == h {
			h.releasing = false
			s.keeper.schedule(h.k, time.Now())
		}
		s.m.op(OpRelease, ResultError)
		return false, err
	}
	ss.dropLocked(name, h)
	if ok {
		s.m.op(OpRelease, ResultOK)
	} else {
		s.m.op(OpRelease, ResultNotHeld)
	}
	return ok, nil
}

// List returns the live leases of the session's database; Mine marks this
// session's.
func (ss *Session) List(ctx context.Context) ([]Row, error) {
	s := ss.s
	if _, err := s.db(ctx, ss.database); err != nil {
		s.m.op(OpList, ResultError)
		return nil, err
	}
	var out []Row
	err := s.withConn(ctx, ss.database, func(c *pgx.Conn) error {
		out = out[:0]
		rows, err := c.Query(ctx, s.names.list)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r Row
			if err := rows.Scan(&r.Name, &r.Holder, &r.Token, &r.TakenAt, &r.ExpiresAt); err != nil {
				return err
			}
			r.Mine = r.Holder == ss.holder
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		s.m.op(OpList, ResultError)
		return nil, s.wrapPg(err, "listing leases")
	}
	s.m.op(OpList, ResultOK)
	return out, nil
}

// Held returns the names and tokens this session believes it holds.
func (ss *Session) Held() map[string]int64 {
	ss.lock()
	defer ss.unlock()
	out := make(map[string]int64, len(ss.held))
	for n, h := range ss.held {
		out[n] = h.token
	}
	return out
}

// TakeWarnings returns the lost-lease warnings queued since the last call.
func (ss *Session) TakeWarnings() []string {
	ss.lock()
	defer ss.unlock()
	w := ss.warnings
	ss.warnings = nil
	return w
}

// Close releases every lease the session holds (each retried a few times),
// stops their renewals and ends any waiting Acquire. After Close the TTL is
// the only thing left that frees a lease whose release failed.
func (ss *Session) Close(ctx context.Context) {
	s := ss.s
	ss.lock()
	if ss.closed {
		ss.unlock()
		ss.cancel()
		return
	}
	ss.closed = true
	type item struct {
		name  string
		token int64
	}
	var items []item
	for name, h := range ss.held {
		h.releasing = true
		s.keeper.remove(h.k)
		items = append(items, item{name, h.token})
	}
	ss.unlock()
	ss.cancel()

	for _, it := range items {
		var err error
		for try := 0; try < 5; try++ {
			var ok bool
			ok, err = ss.releaseToken(ctx, it.name, it.token)
			if err == nil {
				if ok {
					s.m.op(OpRelease, ResultOK)
				} else {
					s.m.op(OpRelease, ResultNotHeld)
				}
				break
			}
			if ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(50<<try) * time.Millisecond):
			}
		}
		if err != nil {
			s.m.op(OpRelease, ResultError)
			s.log.Warn("lockpool: could not release a lease of a closed session; it expires at its ttl",
				"database", ss.database, "holder", ss.holder, "lease", it.name, "err", err)
		}
	}

	ss.lock()
	for name, h := range ss.held {
		ss.dropLocked(name, h)
	}
	ss.unlock()
	s.mu.Lock()
	delete(s.sessions, ss)
	s.mu.Unlock()
}
