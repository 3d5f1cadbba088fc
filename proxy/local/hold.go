package local

import (
	"encoding/binary"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// advisory_locks: hold. A statement that is one whole call of a
// session-level advisory function is answered here with a lock lockpool
// holds for the client on its own lock connections (package advisory); the
// client's transactions keep using the shared pool and the lock holder is
// never pinned. Everything else that touches the session-level functions
// is handled as under pin (a fallback, counted and logged once per
// statement text).

// HoldApp is an application's advisory_locks: hold metrics and fallback
// log, shared by its sessions.
type HoldApp struct {
	held      prometheus.Gauge
	wait      prometheus.Observer
	fallbacks prometheus.Counter
	lost      prometheus.Counter

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
		return heldShape{oid: wire.OIDVoid, size: 4, void: true}, c.Cast == ""
	}
	switch strings.TrimPrefix(c.Cast, "pg_catalog.") {
	case "", "bool", "boolean":
		return heldShape{oid: wire.OIDBool, size: 1}, true
	case "int", "integer", "int4":
		return heldShape{oid: wire.OIDInt4, size: 4}, true
	case "text":
		return heldShape{oid: wire.OIDText, size: -1}, true
	}
	return heldShape{}, false
}

// Holdable reports whether lockpool answers the statement itself under
// advisory_locks: hold.
func Holdable(f *rewrite.Findings) bool {
	if f.Hold == nil {
		return false
	}
	_, ok := shapeOf(f.Hold)
	return ok
}

// CallsUnlock reports a session-level unlock among the statement's calls.
func CallsUnlock(f *rewrite.Findings) bool {
	for _, fn := range f.Funcs {
		if fn.Unlock() {
			return true
		}
	}
	return false
}

// NoteFallback counts a statement of application app under hold that
// lockpool does not answer itself (the policy's decision d says so), and
// logs its text to log the first time.
func (h *HoldApp) NoteFallback(log *slog.Logger, app string, d policy.Decision, sql string) {
	if !d.Fallback || h == nil {
		return
	}
	h.fallbacks.Inc()
	h.mu.Lock()
	_, seen := h.logged[sql]
	if !seen && len(h.logged) < maxFallbackTexts {
		h.logged[sql] = struct{}{}
	}
	h.mu.Unlock()
	if !seen {
		log.Info("advisory_locks: hold falls back to pin for this statement (not one whole advisory call)", "app", app, "statement", truncate(sql, 200))
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// HoldKind is the kind of the advisory calls held under advisory_locks:
// hold: a statement that is one whole call of a session-level advisory
// function, with a result lockpool shapes itself, which the policy
// answers (policy.Answer).
func HoldKind() Kind {
	return Kind{name: "hold", claims: heldClaims, open: openHeld}
}

// held is a session's held advisory locks: the hold kind's Handler.
type held struct {
	locks   *advisory.Session // nil until the first held call
	counted int               // holds counted in lockpool_advisory_locks_held
}

func heldClaims(_ Session, _ *rewrite.Findings, d policy.Decision) bool {
	return d.Action == policy.Answer
}

func openHeld(Session) Handler { return &held{} }

// session returns the session's held advisory locks, made at first use.
func (h *held) session(s Session) (*advisory.Session, *pgerr.Error) {
	m := s.Locks()
	if m == nil {
		return nil, pgerr.Newf(pgerr.FeatureNotSupported, "Run lockpool with a lock manager.", "advisory_locks: hold is not available on this lockpool instance")
	}
	if h.locks == nil {
		h.locks = m.NewSession(s.Database(), func() {
			if a := s.HoldApp(); a != nil {
				a.lost.Inc()
			}
			s.Kill(pgerr.LocksLost())
		})
		h.locks.SetLabel(s.App().Name + " " + s.Remote() + " pid " + strconv.FormatUint(uint64(s.PID()), 10))
	}
	return h.locks, nil
}

// count brings lockpool_advisory_locks_held up to date with n holds.
func (h *held) count(s Session, n int) {
	if a := s.HoldApp(); a != nil && n != h.counted {
		a.held.Add(float64(n - h.counted))
	}
	h.counted = n
}

// End releases the session's held locks when it ends.
func (h *held) End(s Session) {
	if h.locks == nil {
		return
	}
	s.Offload(h.locks.Close) // unlocks on the lock connections
	h.count(s, 0)
	h.locks = nil
}

// Prepare implements Handler. A Parse gets the parameter types
// PostgreSQL gives the key expressions; a simple Query takes no
// parameters.
func (h *held) Prepare(s Session, f *rewrite.Findings, _ string, rest []byte) (Stmt, *pgerr.Error) {
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
		ctx := s.WaitContext()
		s.Offload(func() { types, err = hs.ParamTypes(ctx, f.Hold.Args, declared) })
		s.EndWait()
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

// ParamTypes implements Stmt.
func (st *heldStmt) ParamTypes() []uint32 { return append([]uint32(nil), st.types...) }

// Describe implements Stmt.
func (st *heldStmt) Describe(buf []byte, formats []int16) []byte {
	sh, _ := shapeOf(st.call)
	return appendRowDescription(buf, []column{{heldColName(st.call), sh.oid, sh.size}}, formats)
}

// Bind keeps the parameters as sent, for PostgreSQL to evaluate.
func (st *heldStmt) Bind(_ Session, a *wire.BindArgs, types []uint32) (Portal, *pgerr.Error) {
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

// Run implements Portal.
func (p *heldPortal) Run(s Session, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
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
func (h *held) run(s Session, call *rewrite.AdvisoryCall, p advisory.Params, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
	hs, pe := h.session(s)
	if pe != nil {
		return nil, pe
	}
	sh, _ := shapeOf(call)
	ctx := s.WaitContext()
	defer s.EndWait()
	var key advisory.Key
	null := false
	if call.Func != rewrite.AdvisoryUnlockAll {
		var ok bool
		if key, ok = advisory.LiteralKey(call.Args); !ok {
			key, ok = advisory.ParamKey(call.Args, p)
		}
		if !ok {
			var err error
			s.Offload(func() { key, null, err = hs.EvalKeys(ctx, call.Args, p) })
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
	var warn *pgerr.Error
	var err error
	switch {
	case null:
		isNull = true
	case call.Func == rewrite.AdvisoryUnlockAll:
		s.Offload(func() { err = hs.UnlockAll() })
	case call.Func.Unlock():
		s.Offload(func() { result, warn, err = hs.Unlock(key, mode) })
	default:
		try := call.Func.Try()
		lim, lerr := s.LockLimits()
		if lerr != nil {
			return nil, lerr
		}
		start := time.Now()
		s.Offload(func() { result, err = hs.Lock(ctx, key, mode, try, lim) })
		if a := s.HoldApp(); !try && a != nil {
			a.wait.Observe(time.Since(start).Seconds())
		}
	}
	h.count(s, hs.Held())
	if err != nil {
		pe, _ := pgerr.As(err)
		return nil, pe
	}
	var buf []byte
	if withDesc {
		buf = appendRowDescription(buf, []column{{heldColName(call), sh.oid, sh.size}}, formats)
	}
	if warn != nil {
		buf = warn.AppendTo(buf, 'N')
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
	case sh.oid == wire.OIDBool:
		val = boolValue(bin, v)
	case sh.oid == wire.OIDInt4:
		n := uint32(0)
		if v {
			n = 1
		}
		if bin {
			val = binary.BigEndian.AppendUint32(nil, n)
		} else {
			val = strconv.AppendUint(nil, uint64(n), 10)
		}
	case sh.oid == wire.OIDText:
		val = []byte(strconv.FormatBool(v))
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(val)))
	buf = append(buf, val...)
	return wire.FinishMsg(buf, start)
}

// HoldMetrics are the collectors of advisory_locks: hold, by application.
type HoldMetrics struct {
	held      *prometheus.GaugeVec
	wait      *prometheus.HistogramVec
	fallbacks *prometheus.CounterVec
	lost      *prometheus.CounterVec
}

// NewHoldMetrics makes the collectors of advisory_locks: hold,
// unregistered (Collectors).
func NewHoldMetrics() *HoldMetrics {
	held := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockpool_advisory_locks_held", Help: "Session-level advisory locks lockpool holds for its clients on its lock connections (advisory_locks: hold), stacked holds counted, by application.",
	}, []string{"app"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "lockpool_advisory_lock_wait_seconds", Help: "Time blocking pg_advisory_lock calls held by lockpool waited, by application.",
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60},
	}, []string{"app"})
	fallbacks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockpool_advisory_lock_fallbacks_total", Help: "Statements touching session-level advisory functions that advisory_locks: hold could not answer itself and handled as under pin, by application.",
	}, []string{"app"})
	lost := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockpool_advisory_locks_lost_total", Help: "Clients closed (FATAL 57P01) because the advisory locks lockpool held for them were lost with a lock connection (a server restart, a failover or switchover), by application.",
	}, []string{"app"})
	return &HoldMetrics{held: held, wait: wait, fallbacks: fallbacks, lost: lost}
}

// Collectors are the collectors to register.
func (m *HoldMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.held, m.wait, m.fallbacks, m.lost}
}

// Show makes application app's series visible at zero.
func (m *HoldMetrics) Show(app string) {
	m.held.WithLabelValues(app)
	m.wait.WithLabelValues(app)
	m.fallbacks.WithLabelValues(app)
	m.lost.WithLabelValues(app)
}

// App makes the metrics and fallback log of application app, for the
// sessions of an application under advisory_locks: hold.
func (m *HoldMetrics) App(app string) *HoldApp {
	return &HoldApp{
		held:      m.held.WithLabelValues(app),
		wait:      m.wait.WithLabelValues(app),
		fallbacks: m.fallbacks.WithLabelValues(app),
		lost:      m.lost.WithLabelValues(app),
		logged:    map[string]struct{}{},
	}
}
