package proxy

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/lockpool/lockpool/pool"
)

// outPool recycles the relay's client write buffers, so an idle session
// holds none.
var outPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// serverState is lockpool's bookkeeping for one server connection, kept in
// pool.Conn.Aux: its parameter values and its prepared statements.
type serverState struct {
	defaults map[string]string // lower-case name -> value at login (reported parameters)
	params   map[string]string // lower-case name -> current value, when known
	synced   string            // fingerprint of the client parameters it matches
	prepared map[string]uint64 // server statement name -> last use tick
	tick     uint64
}

func stateOf(sc *pool.Conn) *serverState {
	if st, ok := sc.Aux.(*serverState); ok {
		return st
	}
	st := &serverState{defaults: make(map[string]string, len(sc.StartupParams)), params: make(map[string]string, len(sc.StartupParams))}
	for k, v := range sc.StartupParams {
		lk := lower(k)
		st.defaults[lk] = v
		st.params[lk] = v
	}
	sc.Aux = st
	return st
}

// attach takes a server connection for this session and starts its relay.
func (s *session) attach() error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return errShutdown
	}
	s.mu.Unlock()
	ctx := s.waitContext()
	sc, err := s.srv.pool.Acquire(ctx, s.app.cfg.Name, s.database)
	s.endWait()
	if err != nil {
		return err
	}
	sc.LastClient = s.remote
	s.unnamedHere = false
	st := stateOf(sc)
	ps, err := s.syncParams(sc, st)
	if err != nil {
		s.srv.pool.Destroy(sc)
		var pe *pgError
		if errors.As(err, &pe) {
			pe.Severity = "FATAL"
			return pe
		}
		return err
	}
	s.mu.Lock()
	s.sc, s.st = sc, st
	s.txStatus = 'I'
	s.relayClean = false
	s.pendingPS = append(s.pendingPS, ps...)
	s.relayDone = nil
	s.relayOn = false
	s.mu.Unlock()
	return nil
}

// startRelay starts reading the attached server connection once the first
// batch went out. inline runs the relay on the session goroutine itself
// (the batch ended in Query or Sync and the client sent nothing more): the
// common request/response transaction then needs no second goroutine. An
// inline relay hands over to a goroutine when the conversation goes on
// past a ReadyForQuery without giving the connection back, or when the
// server waits for COPY data from the client.
func (s *session) startRelay(inline bool) {
	s.mu.Lock()
	sc := s.sc
	if sc == nil || s.relayOn {
		s.mu.Unlock()
		return
	}
	s.relayOn = true
	var done chan struct{}
	if !inline {
		done = make(chan struct{})
		s.relayDone = done
	}
	s.mu.Unlock()
	if inline {
		s.relay(sc, nil, true)
		return
	}
	go s.relay(sc, done, false)
}

// handOff moves an inline relay to its own goroutine.
func (s *session) handOff(sc *pool.Conn, out []byte) {
	if len(out) > 0 {
		s.writeClient(out)
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.relayDone = done
	s.mu.Unlock()
	go s.relay(sc, done, false)
}

// relay copies server messages to the client until the connection is given
// back, fails, or the session stops.
func (s *session) relay(sc *pool.Conn, done chan struct{}, inline bool) {
	if done != nil {
		defer close(done)
	}
	r := sc.Reader
	bp := outPool.Get().(*[]byte)
	out := (*bp)[:0]
	defer func() {
		if cap(out) <= 64<<10 {
			*bp = out[:0]
			outPool.Put(bp)
		}
	}()
	s.mu.Lock()
	if len(s.pendingPS) > 0 {
		out = append(out, s.pendingPS...)
		s.pendingPS = nil
	}
	s.mu.Unlock()
	for {
		if r.Buffered() == 0 && len(out) > 0 {
			out = s.writeClient(out)
		}
		typ, n, err := readHeader(r)
		if err != nil {
			s.relayFailed(sc, out, err, true)
			return
		}
		switch typ {
		case 'Z':
			b, err := r.Peek(n)
			if err != nil || n != 1 {
				s.relayFailed(sc, out, err, false)
				return
			}
			status := b[0]
			_, _ = r.Discard(n)
			out = appendReadyForQuery(out, status)
			var keep bool
			out, keep = s.onReady(sc, status, out)
			if !keep {
				return
			}
			if inline {
				s.handOff(sc, out)
				return
			}
		case '1', '2', '3':
			_, _ = r.Discard(n)
			out = s.onCompletion(typ, out)
		case 'G', 'W':
			// The server waits for COPY data: the client must be read.
			b, err := r.Peek(n)
			if err != nil {
				s.relayFailed(sc, out, err, false)
				return
			}
			out = appendFrame(out, typ, b)
			_, _ = r.Discard(n)
			if inline {
				s.handOff(sc, out)
				return
			}
		case 'S':
			b, err := r.Peek(n)
			if err != nil {
				s.relayFailed(sc, out, err, false)
				return
			}
			out = appendFrame(out, 'S', b)
			s.onParameterStatus(b)
			_, _ = r.Discard(n)
		default:
			if n <= r.Size() {
				b, err := r.Peek(n)
				if err != nil {
					s.relayFailed(sc, out, err, false)
					return
				}
				out = appendFrame(out, typ, b)
				_, _ = r.Discard(n)
				if len(out) >= 32<<10 {
					out = s.writeClient(out)
				}
				continue
			}
			// A large message (a big DataRow): stream it.
			out = append(out, typ, byte((n+4)>>24), byte((n+4)>>16), byte((n+4)>>8), byte(n+4))
			out = s.writeClient(out)
			s.wmu.Lock()
			_, err := io.CopyN(s.conn, r, int64(n))
			s.wmu.Unlock()
			if err != nil {
				// Distinguish: if the server side failed, report it.
				s.relayFailed(sc, out, err, false)
				return
			}
		}
	}
}

// writeClient writes out to the client and returns it emptied. A client
// write error closes the client; the session goroutine then cleans up.
func (s *session) writeClient(out []byte) []byte {
	s.wmu.Lock()
	_, err := s.conn.Write(out)
	s.wmu.Unlock()
	if err != nil {
		_ = s.conn.Close()
	}
	return out[:0]
}

// onCompletion handles ParseComplete, BindComplete and CloseComplete.
func (s *session) onCompletion(typ byte, out []byte) []byte {
	s.mu.Lock()
	var a action
	if len(s.q) > 0 && s.q[0].kind != 'Z' {
		a = s.q[0]
		s.q = s.q[1:]
	}
	s.mu.Unlock()
	switch a.op {
	case opSwallow:
		return out
	case opAsParse:
		return append(out, '1', 0, 0, 0, 4)
	}
	return append(out, typ, 0, 0, 0, 4)
}

// onParameterStatus records a parameter the server reports changed while
// the client runs: it is now the client's value.
func (s *session) onParameterStatus(b []byte) {
	k, rest, ok := cstring(b)
	if !ok {
		return
	}
	v, _, ok := cstring(rest)
	if !ok {
		return
	}
	name, val := lower(string(k)), string(v)
	s.mu.Lock()
	if s.st != nil {
		s.st.params[name] = val
		s.params.set(name, val)
		s.st.synced = s.params.fingerprint()
	}
	s.mu.Unlock()
}

// onReady handles ReadyForQuery: it settles the owed replies, probes a
// session that may hold locks or state, and gives the connection back at a
// safe point. It returns false when the relay must end.
func (s *session) onReady(sc *pool.Conn, status byte, out []byte) ([]byte, bool) {
	s.wmu.Lock()
	s.mu.Lock()
	// Pop through the first boundary; entries before it whose replies never
	// came (skipped after an error) are undone.
	for len(s.q) > 0 {
		a := s.q[0]
		s.q = s.q[1:]
		if a.kind == 'Z' {
			break
		}
		s.undo(a)
	}
	if len(s.q) == 0 {
		s.q = s.qbuf[:0]
	}
	if s.boundaries > 0 {
		s.boundaries--
	}
	s.txStatus = status
	idle := s.boundaries == 0 && !s.unsynced
	if idle && status == 'I' && (s.needProbe || s.setsPending) && !s.stopping {
		s.probing = true
		probe, sets, setsAll, names := s.needProbe, s.setsPending, s.setsAll, s.setNames
		s.needProbe, s.setsPending, s.setsAll, s.setNames = false, false, false, nil
		st := s.st
		if s.dropPrepared && st != nil {
			st.prepared = nil
			s.dropPrepared = false
		}
		s.mu.Unlock()
		var held bool
		var reason string
		var err error
		if sets {
			err = s.readBackSets(sc, st, setsAll, names)
		}
		if probe && err == nil {
			held, reason, err = s.probe(sc)
		}
		s.mu.Lock()
		s.probing = false
		s.cond.Broadcast()
		if err != nil {
			if isConnError(err) {
				s.mu.Unlock()
				s.wmu.Unlock()
				s.relayFailed(sc, out, err, false)
				return out[:0], false
			}
			if probe {
				s.srv.log.Warn("lock probe failed; session stays pinned", "app", s.app.cfg.Name, "client", s.remote, "err", err)
				held, reason = true, s.pinReason
			}
		}
		if probe {
			s.setPinned(held, reason)
		}
	}
	release := idle && status == 'I' && !s.pinned && !s.app.sessionPool && !s.stopping
	if idle && status != 'I' && s.idleTx > 0 {
		// Idle inside a transaction from now on: the client has
		// idle_transaction_timeout to send its next message.
		_ = s.conn.SetReadDeadline(time.Now().Add(s.idleTx))
		s.idleDL.Store(true)
	}
	if idle && s.lease != nil && len(out) >= 6 {
		// Lost-lease warnings go with the next result, before its ReadyForQuery.
		if w := appendLeaseWarnings(nil, s.lease); len(w) > 0 {
			rfq := append([]byte(nil), out[len(out)-6:]...)
			out = append(append(out[:len(out)-6], w...), rfq...)
		}
	}
	drainNow := idle && status == 'I' && s.draining && !s.closed
	if drainNow {
		s.closed = true
	}
	if release {
		s.sc, s.st = nil, nil
		s.relayDone = nil
		s.relayOn = false
	}
	if idle || release {
		s.cond.Broadcast()
	}
	s.mu.Unlock()
	if release {
		s.srv.pool.Release(sc)
	}
	if idle || release {
		if drainNow {
			out = appendError(out, 'E', errShutdown)
		}
		if _, err := s.conn.Write(out); err != nil {
			_ = s.conn.Close()
		}
		out = out[:0]
		if drainNow {
			_ = s.conn.Close()
		}
	}
	s.wmu.Unlock()
	return out, !release
}

// undo reverts the bookkeeping of a message whose reply never came.
func (s *session) undo(a action) {
	if a.added != "" && s.st != nil {
		delete(s.st.prepared, a.added)
	}
	if a.stmt != nil && s.stmts[a.stmt.name] == a.stmt {
		delete(s.stmts, a.stmt.name)
	}
}

// setPinned applies a probe result. Called with mu held.
func (s *session) setPinned(held bool, reason string) {
	switch {
	case held && !s.pinned:
		s.pinned = true
		if reason == "" {
			reason = "advisory_lock"
		}
		s.pinReason = reason
		s.pinnedSince = time.Now()
		s.app.pinnedGauge.WithLabelValues(s.app.cfg.Name, reason).Inc()
		s.app.pins.Inc()
	case !held && s.pinned:
		s.pinned = false
		s.app.pinnedGauge.WithLabelValues(s.app.cfg.Name, s.pinReason).Dec()
		s.pinReason = ""
	case !held:
		s.pinReason = ""
	}
	if !s.pinned && s.slotHeld {
		s.slotHeld = false
		s.srv.pool.ReleasePin(s.app.cfg.Name)
	}
}

// relayFailed ends the relay after a read error. When the session asked the
// relay to stop, the connection is handed back intact; otherwise the server
// connection is lost: the client gets an error for each reply it was owed,
// stays connected, and its pin (and whatever it held) is gone.
func (s *session) relayFailed(sc *pool.Conn, out []byte, err error, atBoundary bool) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if s.stopping && isTimeout(err) {
		s.relayClean = atBoundary
		s.mu.Unlock()
		if len(out) > 0 {
			_, _ = s.conn.Write(out)
		}
		return
	}
	owed := s.boundaries
	unsynced := s.unsynced
	// A pin slot held means a statement that may have taken a session lock
	// ran: the client may believe it holds one, so it must learn that its
	// session is gone.
	wasPinned := s.pinned || s.slotHeld
	for _, a := range s.q {
		s.undo(a)
	}
	s.q = nil
	s.boundaries = 0
	s.unsynced = false
	s.sc, s.st = nil, nil
	s.relayDone = nil
	s.relayOn = false
	s.needProbe = false
	s.setPinned(false, "")
	if unsynced {
		s.lostUnsynced.Store(true)
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	sc.Broken = true
	s.srv.pool.Destroy(sc)
	if !errors.Is(err, io.EOF) {
		s.srv.log.Info("server connection lost", "app", s.app.cfg.Name, "client", s.remote, "err", err)
	}
	msg := "lockpool: the server connection was lost; the current transaction is gone"
	hint := "Retry the transaction."
	if wasPinned {
		msg = "lockpool: the server connection was lost; the session's advisory locks and session state are gone"
		hint = "Take the locks again; they were released when the server connection ended."
	}
	pe := &pgError{Code: "08006", Message: msg, Hint: hint}
	for i := 0; i < owed; i++ {
		out = appendError(out, 'E', pe)
		out = appendReadyForQuery(out, 'I')
	}
	if wasPinned {
		// The session's locks and state died with its backend: end the
		// session too, as PostgreSQL would, so the client cannot go on
		// believing it holds them.
		fe := *pe
		fe.Severity = "FATAL"
		out = appendError(out, 'E', &fe)
	}
	if len(out) > 0 {
		if _, err := s.conn.Write(out); err != nil {
			_ = s.conn.Close()
		}
	}
	if wasPinned {
		_ = s.conn.Close()
	}
}

func isConnError(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// probeSQL asks the server whether this backend still holds anything that
// must keep the session pinned.
const probeSQL = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid() AND granted)," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_listening_channels())," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema())," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_cursors WHERE is_holdable)," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_statements WHERE from_sql)," +
	" current_user <> session_user"

var probeReasons = [...]string{"advisory_lock", "listen", "temp_table", "cursor", "prepare", "role"}

// probe runs probeSQL on sc, which nobody else uses meanwhile.
func (s *session) probe(sc *pool.Conn) (held bool, reason string, err error) {
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(appendQuery(nil, probeSQL)); err != nil {
		return false, "", err
	}
	var row []byte
	var perr error
	err = readUntilReady(sc, func(typ byte, body []byte) {
		switch typ {
		case 'D':
			row = append(row[:0], body...)
		case 'E':
			perr = errors.New("probe failed: " + errorMessage(body))
		}
	})
	if err != nil {
		return false, "", err
	}
	if perr != nil {
		return false, "", perr
	}
	if len(row) < 2 {
		return false, "", errors.New("probe returned no row")
	}
	dataRowColumns(row, func(i int, v []byte, null bool) {
		if i < len(probeReasons) && !null && len(v) > 0 && v[0] == 't' && !held {
			held, reason = true, probeReasons[i]
		}
	})
	return held, reason, nil
}

// readUntilReady reads server messages up to and including ReadyForQuery,
// passing each to fn (body valid only during the call).
func readUntilReady(sc *pool.Conn, fn func(typ byte, body []byte)) error {
	for {
		typ, n, err := readHeader(sc.Reader)
		if err != nil {
			return err
		}
		var body []byte
		if n <= sc.Reader.Size() {
			body, err = sc.Reader.Peek(n)
		} else {
			body = make([]byte, n)
			_, err = io.ReadFull(sc.Reader, body)
			n = 0
		}
		if err != nil {
			return err
		}
		fn(typ, body)
		if n > 0 {
			_, _ = sc.Reader.Discard(n)
		}
		if typ == 'Z' {
			return nil
		}
	}
}

// errorMessage extracts the M field of an ErrorResponse body.
func errorMessage(body []byte) string {
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		v, rest, ok := cstring(body[1:])
		if !ok {
			break
		}
		if f == 'M' {
			return string(v)
		}
		body = rest
	}
	return "unknown error"
}

// errorCode extracts the C field of an ErrorResponse body.
func errorCode(body []byte) string {
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		v, rest, ok := cstring(body[1:])
		if !ok {
			break
		}
		if f == 'C' {
			return string(v)
		}
		body = rest
	}
	return ""
}

// resetServer cleans a server connection whose session ended while it was
// pinned (or in session mode), so the next client finds nothing of it. It
// reports whether the connection may be reused.
func (s *session) resetServer(sc *pool.Conn, st *serverState) bool {
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(appendQuery(nil, "DISCARD ALL")); err != nil {
		return false
	}
	failed := false
	if err := readUntilReady(sc, func(typ byte, body []byte) {
		if typ == 'E' {
			failed = true
		}
	}); err != nil || failed {
		return false
	}
	if st == nil {
		st = stateOf(sc)
	}
	// DISCARD ALL dropped every prepared statement and reset every setting.
	st.prepared = nil
	for k := range st.params {
		delete(st.params, k)
	}
	for k, v := range st.defaults {
		st.params[k] = v
	}
	st.synced = ""
	held, _, err := s.probe(sc)
	return err == nil && !held
}

func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return string(bytes.ToLower([]byte(s)))
		}
	}
	return s
}
