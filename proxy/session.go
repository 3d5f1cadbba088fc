package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/rewrite"
)

// action is one entry of the queue of replies the server still owes: a
// boundary (one ReadyForQuery) or a Parse/Bind/Close completion.
type action struct {
	kind  byte  // '1', '2', '3' or 'Z'
	op    uint8 // opPass, opSwallow, opAsParse
	added string
	stmt  *stmt // client statement registered by this Parse (undone if it fails)
}

const (
	opPass    uint8 = iota // forward the reply
	opSwallow              // lockpool's own message: drop the reply
	opAsParse              // a no-op Close stands in for a Parse: send ParseComplete
)

// stmt is a client's named prepared statement.
type stmt struct {
	name    string
	srvName string
	parse   []byte // Parse body after the statement name: query, parameter types
	find    rewrite.Findings
}

// session is one logged-in client.
type session struct {
	srv      *Server
	conn     net.Conn
	r        *lazyReader
	app      *appState
	user     string
	database string
	remote   string
	pid      uint32
	secret   uint32
	params   clientParams
	startup  map[string]string // the client's startup parameters (RESET ALL returns to them)

	// Owned by the session goroutine.
	sout         []byte // buffered writes to the server
	skipping     bool   // discarding until Sync after an error in an extended batch
	lastBoundary bool   // the last message written to the server was Query, Sync or FunctionCall
	unnamed      rewrite.Findings
	// unnamedParse is the client's last unnamed Parse (query and types);
	// unnamedHere says the attached connection has it.
	unnamedParse []byte
	unnamedHere  bool
	scratch      []byte
	idleDL       atomic.Bool   // a read deadline for idle_transaction_timeout is set
	idleTx       time.Duration // idle_transaction_timeout (0: off)

	// lostUnsynced: the server died before the client's Sync; skip to the
	// Sync and answer it with an error.
	lostUnsynced atomic.Bool

	wmu sync.Mutex // client writes

	mu           sync.Mutex
	cond         sync.Cond
	sc           *pool.Conn
	st           *serverState
	q            []action
	boundaries   int
	unsynced     bool
	txStatus     byte
	pinned       bool
	pinReason    string
	pinnedSince  time.Time
	slotHeld     bool
	needProbe    bool
	probing      bool
	stopping     bool
	relayDone    chan struct{}
	relayOn      bool // a relay reads the attached connection
	relayClean   bool
	draining     bool
	closed       bool
	waitCtx      context.Context
	waitCancelFn context.CancelFunc
	waiting      bool
	qbuf         [8]action // backing store of q while it is short
	stmts        map[string]*stmt
	// SET/RESET seen: read the values back at the next idle point.
	// Lease calls (owned by the session goroutine).
	lease        LeaseSession
	virt         map[string]*virtStmt
	vportals     map[string]*virtPortal
	setsPending  bool
	setsAll      bool
	dropPrepared bool // DEALLOCATE ALL / DISCARD ALL ran: the server forgot every prepared statement
	setNames     []string
	pendingPS    []byte // ParameterStatus to send the client with the next reply
}

func newSession(srv *Server, conn net.Conn, br *bufio.Reader, as *appState, user, database string, params map[string]string) *session {
	// Carry over whatever the client sent after its login (pipelined
	// statements) into the session's own reader.
	var early []byte
	if n := br.Buffered(); n > 0 {
		early, _ = br.Peek(n)
	}
	s := &session{
		srv: srv, conn: conn, r: newLazyReader(conn, early), app: as, user: user, database: database,
		remote: conn.RemoteAddr().String(), txStatus: 'I',
	}
	s.cond.L = &s.mu
	if _, isTLS := conn.(*tls.Conn); isTLS {
		// A read that times out may leave TLS state unusable: TLS clients
		// keep their buffer.
		s.r.releaseAfter = 0
	}
	s.startup = s.params.init(params)
	return s
}

// serve is the session goroutine: it reads client messages until the client
// leaves, then cleans up.
func (s *session) serve() {
	s.app.clients.Inc()
	defer s.app.clients.Dec()
	defer s.srv.unadmit(s.app)
	defer s.cleanup()
	maxMsg := s.srv.rc.Load().cfg.MaxMessageSize
	s.idleTx = s.srv.rc.Load().cfg.IdleTransactionTimeout
	if s.idleTx > 0 {
		// The session uses read deadlines itself: keep the read buffer.
		s.r.releaseAfter = 0
	}
	for {
		if s.r.Buffered() == 0 && len(s.sout) > 0 {
			s.flushServer()
			s.startRelay(s.lastBoundary && s.r.Buffered() == 0)
		}
		if s.idleTx > 0 {
			s.armIdleTimeout(s.idleTx)
		}
		typ, n, err := readHeader(s.r)
		if err != nil && isTimeout(err) && s.idleDL.Load() && s.idleTx > 0 {
			s.mu.Lock()
			stillIdle := s.sc != nil && s.txStatus != 'I' && s.boundaries == 0 && !s.probing
			s.mu.Unlock()
			if !stillIdle {
				// The server is working for the client: not idle.
				_ = s.conn.SetReadDeadline(time.Time{})
				s.idleDL.Store(false)
				continue
			}
			s.fatal(&pgError{Severity: "FATAL", Code: "25P03", Message: "lockpool: terminating connection due to idle-in-transaction timeout", Hint: "The client left a transaction open longer than idle_transaction_timeout."})
			return
		}
		if err != nil {
			if errors.Is(err, errProtocol) {
				s.fatal(&pgError{Severity: "FATAL", Code: "08P01", Message: "lockpool: " + err.Error(), Hint: "The client sent a malformed message; the connection is closed."})
			}
			return
		}
		if s.idleDL.Load() {
			_ = s.conn.SetReadDeadline(time.Time{})
			s.idleDL.Store(false)
		}
		if n > maxMsg && maxMsg > 0 {
			s.fatal(&pgError{Severity: "FATAL", Code: "08P01", Message: fmt.Sprintf("lockpool: message of %d bytes exceeds max_message_size (%d)", n, maxMsg), Hint: "Send smaller messages or raise max_message_size."})
			return
		}
		if s.lostUnsynced.Load() {
			s.skipping = true
		}
		if s.skipping && typ != 'S' && typ != 'X' {
			if err := s.discard(n); err != nil {
				return
			}
			continue
		}
		switch typ {
		case 'X':
			return
		case 'Q':
			err = s.onQuery(n)
		case 'P':
			err = s.onParse(n)
		case 'B':
			err = s.onBind(n)
		case 'D':
			err = s.onDescribe(n)
		case 'C':
			err = s.onClose(n)
		case 'S':
			err = s.onSync(n)
		case 'H':
			err = s.onFlush(n)
		case 'E':
			err = s.onExecute(n)
		case 'F':
			err = s.forwardRaw(typ, n, fwdBoundary)
		case 'd', 'c', 'f':
			if s.attached() {
				err = s.forwardRaw(typ, n, fwdPlain)
			} else {
				err = s.discard(n)
			}
		default:
			s.fatal(&pgError{Severity: "FATAL", Code: "08P01", Message: fmt.Sprintf("lockpool: invalid frontend message type %d", typ), Hint: "The client sent a message lockpool does not know; the connection is closed."})
			return
		}
		if err != nil {
			var pe *pgError
			if errors.As(err, &pe) && pe.Severity == "FATAL" {
				s.fatal(pe)
			} else if errors.Is(err, errProtocol) {
				s.fatal(&pgError{Severity: "FATAL", Code: "08P01", Message: "lockpool: " + err.Error(), Hint: "The client sent a malformed message; the connection is closed."})
			}
			return
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (s *session) armIdleTimeout(d time.Duration) {
	s.mu.Lock()
	inTx := s.sc != nil && s.txStatus != 'I' && s.boundaries == 0
	s.mu.Unlock()
	if inTx && s.r.Buffered() == 0 && !s.idleDL.Load() {
		_ = s.conn.SetReadDeadline(time.Now().Add(d))
		s.idleDL.Store(true)
	}
}

// body returns the n-byte message body. It aliases the read buffer when it
// fits (valid until consume) and is a fresh slice otherwise.
func (s *session) body(n int) ([]byte, error) {
	if n <= s.r.Size() {
		b, err := s.r.Peek(n)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	if cap(s.scratch) < n {
		s.scratch = make([]byte, n)
	}
	b := s.scratch[:n]
	if _, err := io.ReadFull(s.r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// consume drops a body obtained from body.
func (s *session) consume(n int) {
	if n <= s.r.Size() {
		_, _ = s.r.Discard(n)
	} else if n > 64<<10 {
		s.scratch = nil
	}
}

func (s *session) discard(n int) error {
	_, err := s.r.Discard(n)
	return err
}

func (s *session) attached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sc != nil
}

// fwdKind says how a forwarded message changes the session's bookkeeping.
type fwdKind uint8

const (
	fwdPlain    fwdKind = iota // no effect (copy data)
	fwdUnsynced                // a message the next Sync completes
	fwdBoundary                // Query, Sync, FunctionCall: one ReadyForQuery
)

// reserve attaches a server connection if needed and records, atomically
// with the check, what the next written messages owe: after it returns the
// relay cannot give the connection back until those replies have come.
func (s *session) reserve(kind fwdKind, acts ...action) (*pool.Conn, error) {
	s.mu.Lock()
	for s.sc == nil {
		s.mu.Unlock()
		if err := s.attach(); err != nil {
			return nil, err
		}
		s.mu.Lock()
	}
	for s.probing {
		s.cond.Wait()
	}
	sc := s.sc
	if sc == nil {
		s.mu.Unlock()
		return s.reserve(kind, acts...)
	}
	s.q = append(s.q, acts...)
	s.lastBoundary = kind == fwdBoundary
	switch kind {
	case fwdUnsynced:
		s.unsynced = true
	case fwdBoundary:
		s.q = append(s.q, action{kind: 'Z'})
		s.boundaries++
		s.unsynced = false
	}
	s.mu.Unlock()
	return sc, nil
}

// forwardRaw forwards one client message unchanged.
func (s *session) forwardRaw(typ byte, n int, kind fwdKind, acts ...action) error {
	sc, err := s.reserve(kind, acts...)
	if err != nil {
		_ = s.discard(n)
		return s.attachFailed(err, kind == fwdBoundary && typ == 'Q')
	}
	s.sout = append(s.sout, typ, byte((n+4)>>24), byte((n+4)>>16), byte((n+4)>>8), byte(n+4))
	if n <= s.r.Size() {
		b, err := s.r.Peek(n)
		if err != nil {
			return err
		}
		s.sout = append(s.sout, b...)
		_, _ = s.r.Discard(n)
		return nil
	}
	// Large message: stream it through without holding it in memory.
	s.flushServerTo(sc)
	s.startRelay(false)
	if _, err := io.CopyN(sc.Net, s.r, int64(n)); err != nil {
		if s.r.Buffered() == 0 {
			// Could be either side; the relay reports a server failure.
			s.serverWriteFailed(sc)
		}
		return nil
	}
	return nil
}

// flushServer writes the buffered messages to the attached server.
func (s *session) flushServer() {
	s.mu.Lock()
	sc := s.sc
	s.mu.Unlock()
	if sc == nil {
		s.sout = s.sout[:0]
		return
	}
	s.flushServerTo(sc)
}

func (s *session) flushServerTo(sc *pool.Conn) {
	if len(s.sout) == 0 {
		return
	}
	_, err := sc.Net.Write(s.sout)
	if cap(s.sout) > 64<<10 {
		s.sout = nil
	} else {
		s.sout = s.sout[:0]
	}
	if err != nil {
		s.serverWriteFailed(sc)
	}
}

// serverWriteFailed closes the server socket so the relay notices and
// reports the loss to the client in order.
func (s *session) serverWriteFailed(sc *pool.Conn) {
	sc.Broken = true
	_ = sc.Net.Close()
}

// attachFailed reports a failure to get a server connection. For a pool
// timeout the client stays connected and may retry.
func (s *session) attachFailed(err error, simple bool) error {
	// A pin slot taken for this statement must not outlive it: nothing will
	// run, so nothing can be held.
	s.mu.Lock()
	if s.sc == nil && s.slotHeld && !s.pinned {
		s.slotHeld = false
		s.needProbe = false
		s.pinReason = ""
		s.srv.pool.ReleasePin(s.app.cfg.Name)
	}
	s.mu.Unlock()
	var pe *pgError
	switch {
	case errors.As(err, &pe):
	case errors.Is(err, pool.ErrWaitTimeout):
		pe = toPG(policy.PoolTimeout(s.app.cfg.Name, s.app.cfg.MaxConnections, s.app.cfg.WaitTimeout.String()))
	case errors.Is(err, context.Canceled):
		pe = errCanceled
	case errors.Is(err, pool.ErrClosed):
		pe = errShutdown
	default:
		pe = serverLoginError(err, s.database, s.app).(*pgError)
	}
	if pe.Severity == "FATAL" {
		return pe
	}
	return s.localError(pe, simple)
}

var errCanceled = &pgError{Code: "57014", Message: "lockpool: canceling statement due to user request", Hint: "A cancel request ended the wait."}

func toPG(e *pgerr.Error) *pgError {
	return &pgError{Severity: e.Severity, Code: e.Code, Message: e.Message, Detail: e.Detail, Hint: e.Hint}
}

// localError answers an error with no server involved: with ReadyForQuery
// for a simple query, else by discarding until the client's Sync.
func (s *session) localError(pe *pgError, simple bool) error {
	buf := appendError(nil, 'E', pe)
	if simple {
		buf = appendReadyForQuery(buf, 'I')
	} else {
		s.skipping = true
	}
	return s.writeLocal(buf)
}

// fail answers a statement with an error, keeping the client's and the
// server's transaction states in agreement: with no server attached the
// error is local; otherwise the server raises it.
func (s *session) fail(pe *pgError, simple bool) error {
	s.mu.Lock()
	attached := s.sc != nil
	s.mu.Unlock()
	if !attached {
		return s.localError(pe, simple)
	}
	sql := raiseSQL(pe)
	if simple {
		if _, err := s.reserve(fwdBoundary); err != nil {
			return s.attachFailed(err, true)
		}
		s.sout = appendQuery(s.sout, sql)
		return nil
	}
	if _, err := s.reserve(fwdUnsynced, action{kind: '1', op: opSwallow}, action{kind: '2', op: opSwallow}); err != nil {
		return s.attachFailed(err, false)
	}
	s.sout = appendParse(s.sout, "", sql, nil)
	s.sout = appendBindExecute(s.sout, "")
	s.unnamedHere = false
	s.skipping = true
	return nil
}

// raiseSQL is a statement that makes the server raise pe.
func raiseSQL(pe *pgError) string {
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	var b strings.Builder
	b.WriteString("DO $lockpool$BEGIN RAISE EXCEPTION USING ERRCODE = ")
	b.WriteString(q(pe.Code))
	b.WriteString(", MESSAGE = ")
	b.WriteString(q(pe.Message))
	if pe.Hint != "" {
		b.WriteString(", HINT = ")
		b.WriteString(q(pe.Hint))
	}
	if pe.Detail != "" {
		b.WriteString(", DETAIL = ")
		b.WriteString(q(pe.Detail))
	}
	b.WriteString("; END$lockpool$")
	return b.String()
}

// writeLocal writes lockpool's own answer. The caller made sure the server
// owes the client nothing.
func (s *session) writeLocal(buf []byte) error {
	// Wait (without wmu: the relay needs it to finish) until the server owes
	// the client nothing, then write.
	s.mu.Lock()
	for s.sc != nil && (s.boundaries > 0 || s.probing) {
		s.cond.Wait()
	}
	s.mu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if len(s.pendingPS) > 0 {
		buf = append(s.pendingPS, buf...)
		s.pendingPS = nil
	}
	s.mu.Unlock()
	_, err := s.conn.Write(buf)
	return err
}

// fatal sends a FATAL error; the caller then returns and the session ends.
func (s *session) fatal(pe *pgError) {
	pe.Severity = "FATAL"
	s.wmu.Lock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = s.conn.Write(appendError(nil, 'E', pe))
	s.wmu.Unlock()
}

// analyze runs the prefilter and, on a hit, the lexer. sql aliases the
// read buffer: Analyze's results that are kept are copied by the caller.
func analyze(body []byte) rewrite.Findings {
	if len(body) == 0 {
		return rewrite.Findings{}
	}
	sql := unsafe.String(unsafe.SliceData(body), len(body))
	if !rewrite.MayHit(sql) {
		return rewrite.Findings{}
	}
	return rewrite.Analyze(strings.Clone(sql))
}

// decide maps findings to a policy decision for this session.
func (s *session) decide(f *rewrite.Findings) policy.Decision {
	if !f.Advisory && len(f.State) == 0 {
		return policy.Decision{}
	}
	in := policy.Input{
		App:            s.app.cfg.Name,
		AdvisoryLocks:  s.app.advisory,
		SessionState:   s.app.sessionState,
		SessionPool:    s.app.sessionPool,
		SessionAcquire: f.SessionAcquire,
		Advisory:       f.Advisory,
	}
	for _, fn := range f.Funcs {
		if fn.SessionAcquire() {
			in.AcquireFunc = fn.String()
			break
		}
	}
	for _, c := range f.State {
		switch c.Kind {
		case rewrite.Listen, rewrite.TempTable, rewrite.DeclareHold, rewrite.Prepare, rewrite.Load:
			if !in.State {
				in.State, in.StateKind = true, stateReason(c.Kind)
			}
		case rewrite.SetRole:
			if c.Name != "" && !in.State {
				in.State, in.StateKind = true, stateReason(c.Kind)
			} else {
				in.StateEnd = true
			}
		default:
			in.StateEnd = true
		}
	}
	s.mu.Lock()
	in.Pinned = s.pinned
	s.mu.Unlock()
	return policy.Decide(in)
}

func stateReason(k rewrite.StateKind) string {
	switch k {
	case rewrite.Listen:
		return "listen"
	case rewrite.TempTable:
		return "temp_table"
	case rewrite.DeclareHold:
		return "cursor"
	case rewrite.Prepare:
		return "prepare"
	case rewrite.SetRole:
		return "role"
	case rewrite.Load:
		return "load"
	}
	return "state"
}

// apply carries out a decision before the statement is forwarded. It
// returns false when the statement was answered with an error instead.
func (s *session) apply(d policy.Decision, f *rewrite.Findings, simple bool) (bool, error) {
	switch d.Action {
	case policy.Refuse:
		for _, fn := range f.Funcs {
			if fn.SessionAcquire() {
				s.app.rejected(fn.String())
			}
		}
		return false, s.fail(toPG(d.Err), simple)
	case policy.PinFirst:
		s.mu.Lock()
		held := s.slotHeld
		s.mu.Unlock()
		if !held {
			ctx := s.waitContext()
			err := s.srv.pool.AcquirePin(ctx, s.app.cfg.Name)
			s.endWait()
			if err != nil {
				var pe *pgError
				switch {
				case errors.Is(err, pool.ErrPinTimeout):
					pe = toPG(policy.PinTimeout(s.app.cfg.Name, s.app.cfg.MaxPinned, s.app.cfg.WaitTimeout.String()))
				case errors.Is(err, context.Canceled):
					pe = errCanceled
				default:
					pe = &pgError{Code: "53300", Message: "lockpool: cannot take a pin slot: " + err.Error(), Hint: "Retry later."}
				}
				return false, s.fail(pe, simple)
			}
			s.mu.Lock()
			s.slotHeld = true
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.needProbe = true
		if s.pinReason == "" {
			s.pinReason = d.Reason
		}
		s.mu.Unlock()
	case policy.Probe:
		s.mu.Lock()
		s.needProbe = true
		s.mu.Unlock()
	}
	return true, nil
}

// waitContext returns the context for a wait in lockpool (a connection, a
// pin slot, a lease) that a CancelRequest ends; call endWait after. The
// context is reused until a cancel request consumes it.
func (s *session) waitContext() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waitCtx == nil {
		s.waitCtx, s.waitCancelFn = context.WithCancel(s.srv.baseCtx)
	}
	s.waiting = true
	return s.waitCtx
}

func (s *session) endWait() {
	s.mu.Lock()
	s.waiting = false
	s.mu.Unlock()
}

// cancelRunning handles a CancelRequest for this session. A wait in
// lockpool (for a connection, a pin slot, a lease) ends with 57014. A
// statement running on the server is cancelled there, while mu is held:
// the connection cannot be given back (and reach another client) before
// PostgreSQL has taken the cancel, and a backend that finished meanwhile
// ignores a cancel that arrives while it is idle.
func (s *session) cancelRunning(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting && s.waitCancelFn != nil {
		s.waitCancelFn()
		s.waitCtx, s.waitCancelFn = nil, nil
	}
	sc := s.sc
	if sc == nil || s.boundaries == 0 && !s.unsynced {
		return // nothing of the client's runs on the server
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.srv.pool.Cancel(cctx, sc); err != nil {
		s.srv.log.Debug("cancel failed", "err", err)
	}
}

// onQuery handles a simple Query.
func (s *session) onQuery(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	if len(body) == 0 || body[len(body)-1] != 0 {
		s.consume(n)
		return protoErrorf("invalid Query message")
	}
	f := analyze(body[:len(body)-1])
	if !f.Hit() {
		s.consume(n)
		return s.forwardQueryBody(body)
	}
	sql := string(body[:len(body)-1])
	s.consume(n)
	if f.Lease != nil || f.LeaseMention {
		return s.onLeaseQuery(&f, sql)
	}
	d := s.decide(&f)
	ok, err := s.apply(d, &f, true)
	if !ok || err != nil {
		return err
	}
	if f.LeaseFence && s.srv.leases != nil {
		sql = rewrite.RewriteFence(sql, s.srv.leases.Schema())
	}
	s.trackSets(&f)
	if _, err := s.reserve(fwdBoundary); err != nil {
		return s.attachFailed(err, true)
	}
	s.sout = appendQuery(s.sout, sql)
	return nil
}

// forwardQueryBody forwards a Query unchanged; body may alias the read
// buffer (nothing reads the client before it is appended).
func (s *session) forwardQueryBody(body []byte) error {
	if _, err := s.reserve(fwdBoundary); err != nil {
		return s.attachFailed(err, true)
	}
	s.sout = appendFrame(s.sout, 'Q', body)
	return nil
}

// onSync handles Sync.
func (s *session) onSync(n int) error {
	if err := s.discard(n); err != nil {
		return err
	}
	s.skipping = false
	s.mu.Lock()
	attached := s.sc != nil
	if !attached && s.slotHeld && !s.pinned {
		// Nothing ran on a server: nothing can be held.
		s.slotHeld, s.needProbe, s.pinReason = false, false, ""
		s.srv.pool.ReleasePin(s.app.cfg.Name)
	}
	s.mu.Unlock()
	lost := s.lostUnsynced.Swap(false)
	if !attached {
		var buf []byte
		if lost {
			buf = appendError(buf, 'E', &pgError{Code: "08006", Message: "lockpool: the server connection was lost; the current transaction is gone", Hint: "Retry the transaction."})
		}
		return s.writeLocal(appendReadyForQuery(buf, 'I'))
	}
	if _, err := s.reserve(fwdBoundary); err != nil {
		return s.attachFailed(err, false)
	}
	s.sout = append(s.sout, 'S', 0, 0, 0, 4)
	return nil
}

// onFlush handles Flush.
func (s *session) onFlush(n int) error {
	if err := s.discard(n); err != nil {
		return err
	}
	s.mu.Lock()
	sc := s.sc
	s.mu.Unlock()
	if sc == nil {
		return nil
	}
	s.sout = append(s.sout, 'H', 0, 0, 0, 4)
	s.flushServerTo(sc)
	s.startRelay(false)
	return nil
}

// drain is called at shutdown: an idle client is told and closed now, a
// client inside a transaction when its transaction ends.
func (s *session) drain() {
	s.mu.Lock()
	s.draining = true
	busy := s.sc != nil && (s.txStatus != 'I' || s.boundaries > 0 || s.unsynced || s.probing)
	s.mu.Unlock()
	if !busy {
		s.kill(errShutdown)
	}
}

// kill sends a FATAL error and closes the client connection; the session
// goroutine then ends and cleans up.
func (s *session) kill(pe *pgError) {
	_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	s.wmu.Lock()
	s.mu.Lock()
	closed := s.closed
	s.closed = true
	s.mu.Unlock()
	if !closed {
		_, _ = s.conn.Write(appendError(nil, 'E', pe))
	}
	s.wmu.Unlock()
	_ = s.conn.Close()
}

// cleanup runs when the session goroutine ends, however it ends.
func (s *session) cleanup() {
	s.srv.unregister(s)
	s.mu.Lock()
	s.stopping = true
	sc, done := s.sc, s.relayDone
	s.mu.Unlock()
	if sc != nil && done != nil {
		// Wake the relay out of its read. A probe may reset the deadline
		// meanwhile, so keep nudging until the relay is gone.
		for stopped := false; !stopped; {
			_ = sc.Net.SetReadDeadline(time.Now())
			select {
			case <-done:
				stopped = true
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	s.mu.Lock()
	sc = s.sc
	s.sc = nil
	clean := s.relayClean && s.boundaries == 0 && !s.unsynced && s.txStatus == 'I'
	busy := s.boundaries > 0 || s.unsynced
	pinned, slot := s.pinned, s.slotHeld
	reason := s.pinReason
	s.pinned, s.slotHeld = false, false
	st := s.st
	s.mu.Unlock()
	if sc != nil {
		_ = sc.Net.SetReadDeadline(time.Time{})
		switch {
		case clean && s.resetServer(sc, st):
			s.srv.pool.Release(sc)
		case !clean && busy:
			// A statement may still run (a lock wait, say): cancel it so
			// the backend notices its client is gone and ends now, not
			// when the statement would have finished.
			ctx, cancel := context.WithTimeout(s.srv.baseCtx, 2*time.Second)
			_ = s.srv.pool.Cancel(ctx, sc)
			cancel()
			s.srv.pool.Destroy(sc)
		default:
			s.srv.pool.Destroy(sc)
		}
	}
	if pinned {
		s.app.pinnedGauge.WithLabelValues(s.app.cfg.Name, reason).Dec()
	}
	if slot {
		s.srv.pool.ReleasePin(s.app.cfg.Name)
	}
	s.closeLeases()
	_ = s.conn.Close()
}
