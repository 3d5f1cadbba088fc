package proxy

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
	"github.com/prometheus/client_golang/prometheus"
)

// advisory_locks: hold. A statement that is one whole call of a
// session-level advisory function is answered here with a lock lockpool
// holds for the client on its own lock connections (package advisory); the
// client's transactions keep using the shared pool and the lock holder is
// never pinned. Everything else that touches the session-level functions
// is handled as under pin (a fallback, counted and logged once per
// statement text).

// oidVoid is PostgreSQL's void type, the result of pg_advisory_lock and
// pg_advisory_unlock_all.
const oidVoid = 2278

// holdApp is an application's hold metrics and fallback log.
type holdApp struct {
	held      prometheus.Gauge
	wait      prometheus.Observer
	fallbacks prometheus.Counter

	mu     sync.Mutex
	logged map[string]struct{} // statement texts whose fallback was logged
}

// maxFallbackTexts bounds the statement texts remembered for the log.
const maxFallbackTexts = 1000

// heldShape is the result column of a held call.
type heldShape struct {
	oid  uint32
	size int16
	void bool
}

// shapeOf returns the result column of a call, ok false when lockpool does
// not answer its cast itself (the statement then falls back to pin and
// PostgreSQL decides).
func shapeOf(c *rewrite.AdvisoryCall) (heldShape, bool) {
	void := c.Func == rewrite.AdvisoryLock || c.Func == rewrite.AdvisoryLockShared || c.Func == rewrite.AdvisoryUnlockAll
	if void {
		return heldShape{oid: oidVoid, size: 4, void: true}, c.Cast == ""
	}
	switch strings.TrimPrefix(c.Cast, "pg_catalog.") {
	case "", "bool", "boolean":
		return heldShape{oid: oidBool, size: 1}, true
	case "int", "integer", "int4":
		return heldShape{oid: oidInt4, size: 4}, true
	case "text":
		return heldShape{oid: oidText, size: -1}, true
	}
	return heldShape{}, false
}

// holdable reports whether lockpool answers the statement itself.
func holdable(f *rewrite.Findings) bool {
	if f.Hold == nil {
		return false
	}
	_, ok := shapeOf(f.Hold)
	return ok
}

// callsUnlock reports a session-level unlock among the statement's calls.
func callsUnlock(f *rewrite.Findings) bool {
	for _, fn := range f.Funcs {
		if fn.Unlock() {
			return true
		}
	}
	return false
}

// noteFallback counts a statement under hold that lockpool does not answer
// itself, and logs its text the first time.
func (s *session) noteFallback(d policy.Decision, sql string) {
	if !d.Fallback || s.app.hold == nil {
		return
	}
	h := s.app.hold
	h.fallbacks.Inc()
	h.mu.Lock()
	_, seen := h.logged[sql]
	if !seen && len(h.logged) < maxFallbackTexts {
		h.logged[sql] = struct{}{}
	}
	h.mu.Unlock()
	if !seen {
		s.srv.log.Info("advisory_locks: hold falls back to pin for this statement (not one whole advisory call)", "app", s.app.cfg.Name, "statement", truncate(sql, 200))
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// held is a session's held advisory locks: the hold kind's localHandler.
type held struct {
	locks   *advisory.Session // nil until the first held call
	counted int               // holds counted in lockpool_advisory_locks_held
}

func heldClaims(_ *session, _ *rewrite.Findings, d policy.Decision) bool {
	return d.Action == policy.Answer
}

func openHeld(*session) localHandler { return &held{} }

// session returns the session's held advisory locks, made at first use.
func (h *held) session(s *session) (*advisory.Session, *pgError) {
	if s.srv.locks == nil {
		return nil, pgerr.Newf(pgerr.FeatureNotSupported, "Run lockpool with a lock manager.", "advisory_locks: hold is not available on this lockpool instance")
	}
	if h.locks == nil {
		h.locks = s.srv.locks.NewSession(s.database, func() {
			s.kill(pgerr.ConnectionLost(true).Fatal())
		})
		h.locks.SetLabel(s.app.cfg.Name + " " + s.remote + " pid " + strconv.FormatUint(uint64(s.pid), 10))
	}
	return h.locks, nil
}

// count brings lockpool_advisory_locks_held up to date with n holds.
func (h *held) count(s *session, n int) {
	if s.app.hold != nil && n != h.counted {
		s.app.hold.held.Add(float64(n - h.counted))
	}
	h.counted = n
}

// stopWait ends a wait in lockpool of a session that another goroutine
// is closing (kill): a held lock's wait has no bound of its own, and the
// session goroutine must get to its cleanup.
func (s *session) stopWait() {
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	if s.link.waiting {
		s.link.stopWaitLocked()
	}
}

// end releases the session's held locks when it ends.
func (h *held) end(s *session) {
	if h.locks == nil {
		return
	}
	s.offload(h.locks.Close) // unlocks on the lock connections
	h.count(s, 0)
	h.locks = nil
}

// prepare implements localHandler. A Parse gets the parameter types
// PostgreSQL gives the key expressions; a simple Query takes no
// parameters.
func (h *held) prepare(s *session, f *rewrite.Findings, _ string, rest []byte) (localStmt, *pgError) {
	if rest == nil {
		if f.Hold.MaxParam > 0 {
			return nil, pgerr.New("42P02", "there is no parameter $"+strconv.Itoa(f.Hold.MaxParam), "")
		}
		return &heldStmt{h: h, call: f.Hold}, nil
	}
	var declared []uint32
	_, tail, _ := wire.CString(rest)
	if len(tail) >= 2 {
		n := int(binary.BigEndian.Uint16(tail))
		tail = tail[2:]
		for i := 0; i < n && len(tail) >= 4; i++ {
			declared = append(declared, binary.BigEndian.Uint32(tail))
			tail = tail[4:]
		}
	}
	types := declared
	if _, literal := advisory.LiteralKey(f.Hold.Args); !literal && f.Hold.Func != rewrite.AdvisoryUnlockAll || len(declared) > 0 {
		// PostgreSQL parses the key expressions now, as it would the
		// client's statement: types for Describe, errors at Parse.
		hs, pe := h.session(s)
		if pe != nil {
			return nil, pe
		}
		var err error
		ctx := s.waitContext()
		s.offload(func() { types, err = hs.ParamTypes(ctx, f.Hold.Args, declared) })
		s.endWait()
		if err != nil {
			pe, _ := pgerr.As(err)
			return nil, pe
		}
	}
	return &heldStmt{h: h, call: f.Hold, types: types}, nil
}

// heldStmt is a held advisory call, prepared.
type heldStmt struct {
	h     *held
	call  *rewrite.AdvisoryCall
	types []uint32 // parameter types PostgreSQL gave the key expressions
}

func (st *heldStmt) paramTypes() []uint32 { return append([]uint32(nil), st.types...) }

func (st *heldStmt) describe(buf []byte, formats []int16) []byte {
	sh, _ := shapeOf(st.call)
	return appendRowDescription(buf, []leaseCol{{heldColName(st.call), sh.oid, sh.size}}, formats)
}

// bind keeps the parameters as sent, for PostgreSQL to evaluate.
func (st *heldStmt) bind(_ *session, a *wire.BindArgs, types []uint32) (localPortal, *pgError) {
	if a == nil {
		return &heldPortal{st: st}, nil
	}
	if len(a.Params) != len(types) {
		return nil, pgerr.New(pgerr.ProtocolViolation, "bind message supplies "+strconv.Itoa(len(a.Params))+" parameters, but prepared statement \"\" requires "+strconv.Itoa(len(types)), "")
	}
	p := advisory.Params{Values: make([][]byte, len(a.Params)), OIDs: types, Formats: make([]int16, len(a.Params))}
	for i, v := range a.Params {
		if v != nil {
			p.Values[i] = append([]byte{}, v...)
		}
		p.Formats[i] = a.ParamFormat(i)
	}
	return &heldPortal{st: st, params: p}, nil
}

// heldPortal is a bound held call.
type heldPortal struct {
	st     *heldStmt
	params advisory.Params
}

func (p *heldPortal) run(s *session, formats []int16, withDesc bool) ([]byte, *pgError) {
	return p.st.h.run(s, p.st.call, p.params, formats, withDesc)
}

func heldColName(c *rewrite.AdvisoryCall) string {
	if c.Alias != "" {
		return c.Alias
	}
	return c.Func.String()
}

// run carries out a held call and encodes its result: RowDescription
// (when withDesc), PostgreSQL's WARNING for an unlock of a key not held,
// the row, CommandComplete.
func (h *held) run(s *session, call *rewrite.AdvisoryCall, p advisory.Params, formats []int16, withDesc bool) ([]byte, *pgError) {
	hs, pe := h.session(s)
	if pe != nil {
		return nil, pe
	}
	sh, _ := shapeOf(call)
	ctx := s.waitContext()
	defer s.endWait()
	var key advisory.Key
	null := false
	if call.Func != rewrite.AdvisoryUnlockAll {
		var ok bool
		if key, ok = advisory.LiteralKey(call.Args); !ok {
			key, ok = advisory.ParamKey(call.Args, p)
		}
		if !ok {
			var err error
			s.offload(func() { key, null, err = hs.EvalKeys(ctx, call.Args, p) })
			if err != nil {
				pe, _ := pgerr.As(err)
				return nil, pe
			}
		}
	}
	mode := advisory.Exclusive
	if call.Func.Shared() {
		mode = advisory.Shared
	}
	var result, isNull bool
	var warn *pgError
	var err error
	switch {
	case null:
		isNull = true
	case call.Func == rewrite.AdvisoryUnlockAll:
		s.offload(func() { err = hs.UnlockAll() })
	case call.Func.Unlock():
		s.offload(func() { result, warn, err = hs.Unlock(key, mode) })
	default:
		try := call.Func.Try()
		lim, lerr := s.lockLimits()
		if lerr != nil {
			return nil, lerr
		}
		start := time.Now()
		s.offload(func() { result, err = hs.Lock(ctx, key, mode, try, lim) })
		if !try && s.app.hold != nil {
			s.app.hold.wait.Observe(time.Since(start).Seconds())
		}
	}
	h.count(s, hs.Held())
	if err != nil {
		pe, _ := pgerr.As(err)
		return nil, pe
	}
	var buf []byte
	if withDesc {
		buf = appendRowDescription(buf, []leaseCol{{heldColName(call), sh.oid, sh.size}}, formats)
	}
	if warn != nil {
		buf = appendError(buf, 'N', warn)
	}
	buf = appendHeldRow(buf, sh, result, isNull, formatFor(formats, 0) == 1)
	buf, start := wire.AppendHeader(buf, 'C')
	buf = wire.AppendCString(buf, "SELECT 1")
	buf = wire.FinishMsg(buf, start)
	return buf, nil
}

// appendHeldRow appends the call's one DataRow.
func appendHeldRow(buf []byte, sh heldShape, v, null, bin bool) []byte {
	buf, start := wire.AppendHeader(buf, 'D')
	buf = binary.BigEndian.AppendUint16(buf, 1)
	var val []byte
	switch {
	case null:
		buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
		return wire.FinishMsg(buf, start)
	case sh.void:
		val = []byte{} // void: an empty value, in both formats
	case sh.oid == oidBool:
		val = boolValue(bin, v)
	case sh.oid == oidInt4:
		n := uint32(0)
		if v {
			n = 1
		}
		if bin {
			val = binary.BigEndian.AppendUint32(nil, n)
		} else {
			val = strconv.AppendUint(nil, uint64(n), 10)
		}
	case sh.oid == oidText:
		val = []byte(strconv.FormatBool(v))
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(val)))
	buf = append(buf, val...)
	return wire.FinishMsg(buf, start)
}

// lockLimits are the client's lock_timeout and statement_timeout as it set
// them: its session values, or inside a transaction block the values in
// force there (SET LOCAL included), read from its server connection. A
// read that does not complete cleanly ends the session (a FATAL): the
// connection's replies would be out of step, or lockpool's statement would
// have failed the client's transaction behind its back.
func (s *session) lockLimits() (advisory.Limits, *pgError) {
	lt, st := s.params.values()["lock_timeout"], s.params.values()["statement_timeout"]
	if s.link.sc != nil && s.txStatus == 'T' && s.q.len() == 0 && !s.unsynced && len(s.sout) == 0 && s.link.state == linkAttached {
		v, err := s.readTimeouts()
		if err != nil {
			return advisory.Limits{}, s.exchangeBroken(err)
		}
		lt, st = v[0], v[1]
	}
	return advisory.Limits{LockTimeout: gucDuration(lt), StatementTimeout: gucDuration(st)}, nil
}

// readTimeouts asks the client's server connection, idle inside the
// client's transaction block, for lock_timeout and statement_timeout. Any
// error leaves the link probing (cleanup destroys the connection).
func (s *session) readTimeouts() ([2]string, error) {
	var v [2]string
	sc := s.link.sc
	if err := s.link.to(linkProbing); err != nil {
		return v, err
	}
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(wire.AppendQuery(nil, "SELECT pg_catalog.current_setting('lock_timeout'), pg_catalog.current_setting('statement_timeout')")); err != nil {
		return v, err
	}
	rows := 0
	var refused error
	err := readUntilReady(sc, func(typ byte, body []byte) {
		switch typ {
		case 'D':
			rows++
			dataRowColumns(body, func(i int, b []byte, null bool) {
				if i < 2 && !null {
					v[i] = string(b)
				}
			})
		case 'E':
			refused = fmt.Errorf("%w: %s", errRefused, pgerr.FromBody(body).Message)
		}
	})
	switch {
	case err != nil:
		return v, err
	case refused != nil:
		return v, refused // the client's transaction failed with it
	case rows != 1:
		return v, fmt.Errorf("%w: %d rows for lock_timeout and statement_timeout", errServerProtocol, rows)
	}
	return v, s.link.to(linkAttached)
}

// gucDuration parses a time setting as PostgreSQL shows or accepts it
// ("0", "250", "250ms", "1s", "2min", "1h", "1d"; no unit: milliseconds).
func gucDuration(v string) time.Duration {
	v = strings.TrimSpace(strings.Trim(strings.TrimSpace(v), "'"))
	i := 0
	for i < len(v) && (v[i] >= '0' && v[i] <= '9' || v[i] == '.') {
		i++
	}
	n, err := strconv.ParseFloat(v[:i], 64)
	if err != nil || n <= 0 {
		return 0
	}
	unit := time.Millisecond
	switch strings.TrimSpace(v[i:]) {
	case "us":
		unit = time.Microsecond
	case "s":
		unit = time.Second
	case "min":
		unit = time.Minute
	case "h":
		unit = time.Hour
	case "d":
		unit = 24 * time.Hour
	}
	return time.Duration(n * float64(unit))
}

// newHoldApp makes an application's hold metrics.
func newHoldApp(m *metrics, app string) *holdApp {
	return &holdApp{
		held:      m.heldLocks.WithLabelValues(app),
		wait:      m.heldWait.WithLabelValues(app),
		fallbacks: m.heldFallbacks.WithLabelValues(app),
		logged:    map[string]struct{}{},
	}
}

// holdMetrics are the collectors of advisory_locks: hold.
func holdMetrics() (held *prometheus.GaugeVec, wait *prometheus.HistogramVec, fallbacks *prometheus.CounterVec) {
	held = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockpool_advisory_locks_held", Help: "Session-level advisory locks lockpool holds for its clients on its lock connections (advisory_locks: hold), stacked holds counted, by application.",
	}, []string{"app"})
	wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "lockpool_advisory_lock_wait_seconds", Help: "Time blocking pg_advisory_lock calls held by lockpool waited, by application.",
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60},
	}, []string{"app"})
	fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockpool_advisory_lock_fallbacks_total", Help: "Statements touching session-level advisory functions that advisory_locks: hold could not answer itself and handled as under pin, by application.",
	}, []string{"app"})
	return held, wait, fallbacks
}

// newLockManager builds the holder of advisory_locks: hold. Its lock
// connections log in as lockpool's lease connections do (ownConnConfig).
func newLockManager(cfg *config.Config, current func() *config.Config, log *slog.Logger) (*advisory.Manager, error) {
	return advisory.New(advisory.Options{
		MaxConnections: cfg.Locks.MaxConnections,
		MaxWaiters:     cfg.Locks.MaxWaiters,
		ConnConfig:     ownConnConfig(cfg, current),
		Logger:         log,
	})
}
