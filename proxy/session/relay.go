package session

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/local"
)

// pump relays server messages to the client until the server has answered
// everything it was asked to answer (s.pos.asked), or the server waits for COPY
// data from the client. At ReadyForQuery with nothing more owed it settles
// the session (probe, read-back, give the connection back).
func (s *Session) pump() error {
	sc := s.link.sc
	r := sc.Reader
	for s.pos.asked > 0 && !s.pos.copyIn && s.link.sc == sc {
		if r.Buffered() == 0 && len(s.cout) > 0 {
			if err := s.flushClient(); err != nil {
				return err
			}
		}
		// The body is consumed here and valid until the next read of r;
		// a safe point (which may give r to another session) runs only
		// after the message was handled.
		typ, body, whole := r.Next()
		if !whole {
			// Read until the message is all buffered, when it fits.
			filled, err := r.Fill()
			if err != nil {
				return s.serverLost(err)
			}
			if filled {
				typ, body, whole = r.Next()
			}
		}
		if !whole {
			var streamed bool
			var err error
			if typ, body, streamed, err = s.readServerMessage(r); err != nil {
				return err
			}
			if streamed {
				continue
			}
		}
		if err := s.onServerMessage(typ, body); err != nil {
			return err
		}
		if s.pos.settled {
			s.pos.settled = false
			if err := s.safePoint(); err != nil {
				return err
			}
		}
		if len(s.cout) >= 32<<10 {
			if err := s.flushClient(); err != nil {
				return err
			}
		}
	}
	return nil
}

// readServerMessage reads the next server message when pump does not have
// all of it buffered. A large DataRow or CopyData is streamed to the client
// without being held (streamed: there is nothing more to handle).
func (s *Session) readServerMessage(r *wire.Reader) (typ byte, body []byte, streamed bool, err error) {
	typ, n, err := wire.ReadHeader(r)
	if err != nil {
		return 0, nil, false, s.serverLost(err)
	}
	if n > r.Size() && (typ == 'D' || typ == 'd') {
		if err := s.flushClient(); err != nil {
			return 0, nil, false, err
		}
		if f := s.q.front(); f == nil || f.kind != replyQuery && f.kind != replyExecute {
			return 0, nil, false, s.serverLost(fmt.Errorf("%w: %q with no query running", errServerProtocol, typ))
		}
		head := []byte{typ, byte((n + 4) >> 24), byte((n + 4) >> 16), byte((n + 4) >> 8), byte(n + 4)}
		clientErr, srvErr := s.out.copyFrom(head, r, n)
		if clientErr != nil {
			return 0, nil, false, clientErr
		}
		if srvErr != nil {
			return 0, nil, false, s.serverLost(srvErr)
		}
		return 0, nil, true, nil
	}
	body, err = wire.ReadBody(r, n, &s.srvScratch)
	if err != nil {
		return 0, nil, false, s.serverLost(err)
	}
	return typ, body, false, nil
}

var errServerProtocol = errors.New("server sent an unexpected message")

// onServerMessage relays one server message and advances the reply queue.
// body is valid only during the call.
func (s *Session) onServerMessage(typ byte, body []byte) error {
	switch typ {
	case 'N':
		if !s.onSignalWarning(body) {
			s.cout = wire.AppendFrame(s.cout, typ, body)
		}
		return nil
	case 'A':
		s.cout = wire.AppendFrame(s.cout, typ, body)
		return nil
	case 'S':
		s.cout = wire.AppendFrame(s.cout, typ, body)
		s.onParameterStatus(body)
		return nil
	}
	f := s.q.front()
	if f == nil || f.kind == replyLocal {
		return s.serverLost(fmt.Errorf("%w: %q with no reply owed", errServerProtocol, typ))
	}
	if typ == 'E' {
		s.cout = wire.AppendFrame(s.cout, typ, body)
		if backend.EndsConnection(body) {
			s.pos.sawFatal = true
			s.serverGone(pool.FatalReason(body))
		}
		if l := s.listeningOf(); l != nil {
			l.NoteError()
		}
		switch f.kind {
		case replyQuery, replySync:
			// Part of the boundary's reply (an error in a simple query, a
			// failed implicit commit at Sync): ReadyForQuery follows.
			return nil
		}
		if f.srv != "" && backend.IsStalePlan(body) {
			s.retireStale(f.srv)
		}
		// An extended-protocol message failed: the server skips every
		// message up to the next Sync, and so do the replies owed for them.
		if r := s.popServer(true); r.lazy != nil {
			s.forgetStmt(r.lazy)
		}
		for g := s.q.front(); g != nil && g.kind != replySync; g = s.q.front() {
			s.popServer(true)
		}
		if s.q.front() == nil {
			s.pos.skipping = true // the rest of the batch has not come yet
		}
		return nil
	}
	if err := s.relayReply(f, typ, body); err != nil {
		return s.serverLost(fmt.Errorf("%w: %q while a reply of kind %d is owed (queue %v)", errServerProtocol, typ, f.kind, s.q.kinds()))
	}
	s.emitFront()
	return nil
}

// relayReply relays a message that belongs to the front reply f.
func (s *Session) relayReply(f *reply, typ byte, body []byte) error {
	switch f.kind {
	case replyQuery:
		if typ == 'Z' {
			return s.onReady(body)
		}
		s.noteCopy(f, typ)
		if typ == 'C' {
			s.onCommandComplete(f, &body)
		}
		if s.cout == nil {
			// A session's first reply: room for a short result set at once,
			// not four appends growing it (the buffer stays for the session).
			s.cout = make([]byte, 0, 256)
		}
		s.cout = wire.AppendFrame(s.cout, typ, body)
		return nil
	case replySync:
		if typ != 'Z' {
			return errServerProtocol
		}
		return s.onReady(body)
	case replyParse, replyBind, replyClose:
		if typ != completionOf(f.kind) {
			return errServerProtocol
		}
		if f.kind == replyParse && f.added != "" {
			s.srv.Stmts.Accepted(s.database, s.user, f.added)
		}
		pass := f.op == opPass
		s.dropServer()
		if pass {
			s.cout = append(s.cout, typ, 0, 0, 0, 4)
		}
	case replyDescribeStmt:
		switch typ {
		case 't':
			if f.op == opPass {
				s.cout = wire.AppendFrame(s.cout, typ, body)
				if f.desc != nil && f.desc.params == nil {
					f.desc.params = append([]byte{}, body...)
				}
			}
		case 'T', 'n':
			if f.op == opPass {
				s.cout = wire.AppendFrame(s.cout, typ, body)
			}
			s.noteDescription(f, typ, body)
			s.dropServer()
		default:
			return errServerProtocol
		}
	case replyDescribePortal:
		if typ != 'T' && typ != 'n' {
			return errServerProtocol
		}
		s.cout = wire.AppendFrame(s.cout, typ, body)
		s.dropServer()
	case replyExecute:
		switch typ {
		case 'C', 'I', 's':
			if typ == 'C' {
				s.onCommandComplete(f, &body)
			}
			if f.op == opPass {
				s.cout = wire.AppendFrame(s.cout, typ, body)
			}
			s.dropServer()
		case 'D', 'd', 'c', 'G', 'H', 'W':
			s.noteCopy(f, typ)
			s.cout = wire.AppendFrame(s.cout, typ, body)
		default:
			return errServerProtocol
		}
	}
	return nil
}

// onCommandComplete notes what a completed statement did to the session
// and gives the client the command tag it must see (*body).
func (s *Session) onCommandComplete(f *reply, body *[]byte) {
	if s.dropPrepared && backend.DroppedAll(*body) {
		s.forgetPrepared()
		s.discarded = s.discarded || (*body)[1] == 'I' // DISCARD ALL, not DEALLOCATE ALL
	}
	if l := s.listeningOf(); l != nil {
		l.CommandDone(s, *body)
	}
	if f.tags != nil {
		if fix := f.tags.next(); fix != nil {
			*body = append([]byte(fix.tag), 0)
			if fix.listen != nil {
				s.listenHandler().Note(*fix.listen)
			}
		}
	}
}

// noteDescription records what a statement returns (a hash of its
// RowDescription, or of NoData): for the server statement on this
// connection, and for the client's statement the first time the client is
// told. A check (opCheck) that finds the client was told otherwise marks the
// client's statement stale.
func (s *Session) noteDescription(f *reply, typ byte, body []byte) {
	h := backend.ResultTypeHash(typ, body)
	if f.srv != "" && s.link.st != nil {
		if s.link.st.Descs == nil {
			s.link.st.Descs = make(map[string]uint64)
		}
		s.link.st.Descs[f.srv] = h
	}
	if f.desc == nil {
		return
	}
	switch {
	case f.op == opCheck && f.desc.desc != 0 && f.desc.desc != h && !resultAtRunTime(f.desc, h):
		s.more().staleStmt = f.desc
	case f.desc.desc == 0:
		f.desc.desc = h
	}
}

// resultAtRunTime reports whether what statement st returns is decided
// when it runs, so PostgreSQL never refuses it for a changed result type:
// a FETCH or an SQL EXECUTE (a utility statement whose result is that of
// the cursor or statement it names, which PostgreSQL does not plan or
// revalidate), or a statement described once as returning no rows and
// once as returning rows (h: the new description's resultTypeHash), which
// only such a statement can be.
func resultAtRunTime(st *stmt, h uint64) bool {
	if st.desc == backend.ResultNoData || h == backend.ResultNoData {
		return true
	}
	query, _, _ := wire.CString(st.parse)
	q := bytes.TrimLeft(query, " \t\r\n\f")
	for _, kw := range []string{"fetch", "execute"} {
		if len(q) > len(kw) && bytes.EqualFold(q[:len(kw)], []byte(kw)) && !isIdentByte(q[len(kw)]) {
			return true
		}
	}
	return false
}

// isIdentByte reports whether b may continue an SQL keyword or identifier.
func isIdentByte(b byte) bool {
	return b == '_' || b == '$' || b >= '0' && b <= '9' || b|0x20 >= 'a' && b|0x20 <= 'z' || b >= 0x80
}

// completionOf is the message that completes a Parse, Bind or Close.
func completionOf(k replyKind) byte {
	switch k {
	case replyParse:
		return '1'
	case replyBind:
		return '2'
	}
	return '3'
}

// noteCopy notices the server waiting for COPY data.
func (s *Session) noteCopy(f *reply, typ byte) {
	if typ == 'G' || typ == 'W' {
		if !f.copyDone { // else the client already sent all of its data
			s.pos.copyIn = true
		}
	}
}

// popServer removes the front entry (a server reply), undoing what it
// registered when its message failed or was skipped.
func (s *Session) popServer(failed bool) reply {
	r := *s.q.front()
	s.dropServer()
	if failed {
		s.undo(r)
	}
	return r
}

// dropServer removes the front entry (a server reply that completed) when
// nothing of it is needed any more: popServer without the copy.
func (s *Session) dropServer() {
	if s.q.drop() && s.pos.asked > 0 {
		s.pos.asked--
	}
}

// undo reverts the bookkeeping of a message whose reply never came.
func (s *Session) undo(r reply) {
	if r.added != "" && s.link.st != nil {
		// The Parse failed or was skipped after an earlier error; a Close
		// of the same name before it may have been skipped too, leaving
		// the server's statement in place. Which, lockpool cannot tell:
		// the next Parse of that name closes it first (closing a statement
		// that does not exist is no error).
		st := s.link.st
		delete(st.Prepared, r.added)
		delete(st.Descs, r.added)
		if st.Stale == nil {
			st.Stale = make(map[string]bool)
		}
		st.Stale[r.added] = true
	}
	if r.stmt != nil && s.stmts[r.stmt.name] == r.stmt {
		delete(s.stmts, r.stmt.name)
	}
	if r.undo != nil {
		r.undo()
	}
}

// onReady handles ReadyForQuery: entries before the boundary whose replies
// never came (skipped after an error) are undone, and with nothing more
// owed the session settles at this safe point.
func (s *Session) onReady(body []byte) error {
	if len(body) != 1 {
		return s.serverLost(errServerProtocol)
	}
	for {
		r := s.popServer(true)
		if r.kind.boundary() {
			break
		}
	}
	s.pos.txStatus = body[0]
	s.app.Stats.Ready(s.pos.txStatus)
	if l := s.listeningOf(); l != nil {
		if err := l.Ready(s, s.pos.txStatus, false); err != nil {
			return err
		}
		if s.pos.txStatus == 'I' {
			s.cout = l.IdleMessages(s, s.cout) // as PostgreSQL, before the ReadyForQuery
		}
	}
	s.cout = wire.AppendReadyForQuery(s.cout, s.pos.txStatus)
	s.emitFront()
	s.pos.settled = s.pos.answered(s.q.server, len(s.sout))
	if s.q.server == 0 && s.extras != nil {
		s.extras.signals = 0
	}
	return nil
}

// safePoint runs when the server owes nothing and the client's messages
// are all answered: probe a session that may hold locks or state, read back
// changed settings, and give the connection back unless pinned.
func (s *Session) safePoint() error {
	sc := s.link.sc
	cancelling, err := s.link.settle()
	if err != nil {
		return err
	}
	if cancelling != nil {
		s.offload(func() { <-cancelling }) // see cancelRunning
	}
	if s.pos.txStatus == 'I' && (s.needProbe || s.setsPending) {
		if err := s.link.to(linkProbing); err != nil {
			return err
		}
		probe, sets := s.needProbe, s.setsPending
		s.needProbe, s.setsPending = false, false
		var names []string
		if s.extras != nil {
			names, s.extras.setNames = s.extras.setNames, nil
		}
		s.dropPrepared = false
		var held bool
		var reason string
		var err error
		if sets {
			err = s.readBackSettings(sc, s.link.st, names)
			if errors.Is(err, backend.ErrRefused) {
				// The server refused the read-back (the client's own
				// statement_timeout, say): what the connection holds is
				// unknown, so no other client may get it.
				s.srv.Log.Warn("settings read-back failed; the server connection will be closed", "app", s.app.Cfg.Name, "client", s.remote, "err", err)
				sc.Broken = true
			}
		}
		if probe && err == nil {
			held, reason, err = backend.Probe(sc, s.relayNotifications)
		}
		if err != nil {
			if backend.IsConnError(err) {
				return s.serverLost(err)
			}
			if !errors.Is(err, backend.ErrRefused) {
				// The exchange stopped half way (a kill's interrupt
				// ended its read): the connection's replies are out of
				// step. The link stays probing, so cleanup destroys the
				// connection instead of giving it to the next client.
				if ke := s.killedBy(); ke != nil {
					return ke
				}
				return err
			}
			if probe {
				s.srv.Log.Warn("lock probe failed; session stays pinned", "app", s.app.Cfg.Name, "client", s.remote, "err", err)
				held, reason = true, s.pinWant
			}
		}
		if probe {
			s.setPinned(held, reason)
		}
		if err := s.link.to(linkAttached); err != nil {
			return err
		}
	}
	if s.pos.txStatus == 'I' && s.extras != nil {
		s.insertReadyNotices()
	}
	if s.pos.txStatus == 'I' && !s.served.Load() && s.executed.Load() {
		s.served.Store(true) // a Handoff closes this client at its next idle point (session.drain)
	}
	s.link.mu.Lock()
	draining := s.link.draining || s.drainAfterTx.Load() && s.executed.Load()
	s.link.mu.Unlock()
	if s.pos.txStatus == 'I' && draining {
		if s.link.pinned || s.slot != nil {
			return errShutdown()
		}
		s.release()
		return errShutdown()
	}
	if s.pos.txStatus == 'I' && !s.link.pinned && s.slot == nil && !s.app.SessionPool {
		s.release()
	}
	return nil
}

// release gives the idle connection back to the pool.
func (s *Session) release() {
	sc := s.link.detach()
	s.pos.asked = 0
	if sc != nil {
		s.releaseServer(sc)
	}
}

// insertReadyNotices puts the notices of the session's local handlers
// (local.ReadyNoticer: leases the session lost) before the ReadyForQuery that
// ends the reply.
func (s *Session) insertReadyNotices() {
	if len(s.cout) < 6 || s.cout[len(s.cout)-6] != 'Z' {
		return
	}
	var w []byte
	for _, h := range s.extras.local {
		if n, ok := h.(local.ReadyNoticer); ok {
			w = n.ReadyNotices(s, w)
		}
	}
	if len(w) == 0 {
		return
	}
	rfq := append([]byte(nil), s.cout[len(s.cout)-6:]...)
	s.cout = append(append(s.cout[:len(s.cout)-6], w...), rfq...)
}

// onParameterStatus records a parameter the server reports changed while
// the client runs: it is now the client's value.
func (s *Session) onParameterStatus(b []byte) {
	k, rest, ok := wire.CString(b)
	if !ok {
		return
	}
	v, _, ok := wire.CString(rest)
	if !ok {
		return
	}
	st := s.link.st
	if st == nil {
		return
	}
	name, val := backend.Lower(string(k)), string(v)
	st.Params[name] = val
	s.params.Set(name, val)
	st.Synced = s.params.Fingerprint()
}

// setPinned applies a probe result.
func (s *Session) setPinned(held bool, reason string) {
	switch {
	case held && !s.link.pinned:
		if reason == "" {
			reason = "advisory_lock"
		}
		s.pinWant = reason
		s.link.setPin(true, reason)
		s.app.PinnedGauge.WithLabelValues(s.app.Cfg.Name, reason).Inc()
		s.app.Pins.Inc()
	case !held && s.link.pinned:
		s.app.PinnedGauge.WithLabelValues(s.app.Cfg.Name, s.link.pinReason).Dec()
		s.pinWant = ""
		s.link.setPin(false, "")
	case !held:
		s.pinWant = ""
	}
	if !s.link.pinned && s.slot != nil {
		s.slot.Release()
		s.slot = nil
	}
}

// serverLost handles the death of the server connection (a read or write
// failed). When the client is inside a transaction block, is owed replies,
// or is pinned (its locks and session state died with the backend), it gets
// the server's FATAL (or lockpool's 08006) and its connection is closed, as
// on a direct connection: nothing it sends after the loss runs. Otherwise the
// loss is invisible.
func (s *Session) serverLost(err error) error {
	var handled drainError
	if errors.As(err, &handled) {
		return handled.err // drainServer ran serverLost (or the message's handling) already
	}
	var killed *pgError
	if errors.As(err, &killed) {
		return err // a kill interrupted the wait: its FATAL ends the session
	}
	sc := s.link.sc
	mustEnd := s.q.len() > 0 || s.pos.unsynced || s.pos.txStatus != 'I' || s.link.pinned || s.slot != nil || s.app.SessionPool || s.pos.copyIn || len(s.sout) > 0
	wasPinned := s.link.pinned || s.slot != nil
	_ = s.link.to(linkLost)
	for s.q.len() > 0 {
		s.undo(s.q.pop())
	}
	s.pos.asked, s.pos.unsynced, s.pos.copyIn, s.pos.askPending = 0, false, false, false
	s.sout = s.sout[:0]
	s.link.detach()
	if sc != nil {
		sc.Broken = true
		if sc.Gone == "" && !errors.Is(err, errServerProtocol) {
			sc.Gone = pool.ErrReason(err)
		}
		s.destroyServer(sc)
	}
	s.needProbe = false
	s.setPinned(false, "")
	if s.slot != nil {
		s.slot.Release()
		s.slot = nil
	}
	switch {
	case errors.Is(err, errServerProtocol):
		s.srv.Log.Info("server connection lost", "app", s.app.Cfg.Name, "client", s.remote, "err", err)
	case sc != nil:
		// Closed by PostgreSQL or the network: destroyServer counted it
		// (pool.Conn.Gone), for one line for all the connections a
		// restart closes.
		s.srv.Log.Debug("server connection lost", "app", s.app.Cfg.Name, "client", s.remote, "err", err, "reason", sc.Gone)
	}
	if !mustEnd {
		s.pos.txStatus = 'I'
		return nil
	}
	if sc != nil && sc.Retired() {
		return pgerr.HostReplaced(wasPinned)
	}
	if s.pos.sawFatal {
		return errSessionEnd // the server's FATAL is the last message
	}
	return pgerr.ConnectionLost(wasPinned).Fatal()
}

// watchIdle waits for the idle, pinned (or session-mode) client's next
// message, or that of a client idle inside a transaction block (inTx),
// while it relays what the server sends on its own (notifications,
// notices, parameter changes) and notices the server's death: one wait in
// the loop on both sockets. At deadline (zero: none) it returns for the
// client's read to time out (idle_transaction_timeout).
func (s *Session) watchIdle(inTx bool, deadline time.Time) error {
	if err := s.flushClient(); err != nil {
		return err
	}
	sc := s.link.sc
	srv := serverSock(sc)
	if s.co == nil || srv == nil || !srv.Adopted() || !s.sock.Adopted() || s.r.Buffered() > 0 {
		return nil // outside the loop (tests): the server is read at the next statement
	}
	if err := s.link.watch(inTx); err != nil {
		return err
	}
	for {
		if sc.Reader.Buffered() == 0 {
			s.watching = true
			which, err := s.co.WaitReadable(s.sock, srv, deadline)
			s.watching = false
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return s.link.to(linkAttached) // the client's read times out next
			}
			if errors.Is(err, errDeliver) {
				s.sendIdle()
				if err := s.flushClient(); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			if which == s.sock {
				return s.link.to(linkAttached)
			}
		}
		typ, n, err := wire.ReadHeader(sc.Reader)
		var body []byte
		if err == nil {
			body, err = wire.ReadBody(sc.Reader, n, &s.srvScratch)
		}
		if err == nil {
			switch typ {
			case 'A', 'N', 'S', 'E':
			default:
				err = fmt.Errorf("%w: %q while idle", errServerProtocol, typ)
			}
		}
		if err != nil {
			// The server connection died while the client is idle and
			// pinned (its locks are gone) or inside a transaction block
			// (the transaction is gone). End the session now, as
			// PostgreSQL would.
			return s.serverLost(err)
		}
		switch typ {
		case 'E':
			if backend.EndsConnection(body) {
				s.pos.sawFatal = true
				s.serverGone(pool.FatalReason(body))
			}
		case 'S':
			s.onParameterStatus(body)
		}
		buf, start := wire.AppendHeader(s.cout, typ)
		s.cout = wire.FinishMsg(append(buf, body...), start)
		if err := s.flushClient(); err != nil {
			return err
		}
	}
}

// watchCopy waits, while the server waits for the client's COPY data, on
// both sockets at once: the server may end the COPY early (a bad row, a
// constraint, a trigger's error) and the client must see that error while
// it is still sending, as it would from PostgreSQL, not after its last row.
// It returns when the client has something to read, or the COPY ended and
// the rest of its reply was relayed.
func (s *Session) watchCopy() error {
	if err := s.flushClient(); err != nil {
		return err
	}
	sc := s.link.sc
	srv := serverSock(sc)
	if s.co == nil || srv == nil || !srv.Adopted() || !s.sock.Adopted() || s.r.Buffered() > 0 {
		return nil // outside the loop (tests): the server is read after the client's CopyDone
	}
	for s.pos.copyIn && s.link.sc == sc {
		if _, whole, large := sc.Reader.NextReady(); !whole && !large {
			which, err := s.co.WaitReadable(s.sock, srv, time.Time{})
			if errors.Is(err, errDeliver) {
				continue // notifications wait for the statement to end
			}
			if err != nil {
				return err
			}
			if which == s.sock {
				return nil
			}
		}
		more, err := s.drainServer()
		if err != nil {
			return s.serverLost(err)
		}
		if !more {
			break
		}
	}
	if s.link.sc == sc && !s.pos.copyIn && s.pos.asked > 0 {
		return s.flushBatch() // the rest of the reply (a simple query's ReadyForQuery)
	}
	return nil
}

// drainServer relays, while a write to the server waits, the messages
// the server sent meanwhile: replies to earlier messages of a large batch,
// notices, a COPY's CopyInResponse or the error that ends it early. A
// server that stops reading while its own output is unread (a notice per
// COPY row, a batch whose results fill the socket) would otherwise wait
// for lockpool as lockpool waits for it. It stops before the
// ReadyForQuery that ends the last reply owed (false: read nothing more
// during this write): the pump after the write reads that one and runs the
// safe point. Its errors come back as drainError: already handled.
func (s *Session) drainServer() (bool, error) {
	sc := s.link.sc
	if sc == nil {
		return false, nil
	}
	r := sc.Reader
	read := false
	for {
		var typ byte
		var body []byte
		head, whole, large := r.NextReady()
		switch {
		case large:
			// Larger than the buffer: PostgreSQL writes such a message
			// whole, so reading to its end does not wait on lockpool.
			t, n, err := wire.ReadHeader(r)
			if err == nil {
				body, err = wire.ReadBody(r, n, &s.srvScratch)
			}
			if err != nil {
				return false, drainError{s.serverLost(err)}
			}
			typ = t
		case whole:
			if head == 'Z' && s.q.server <= 1 {
				return false, s.drainFlush()
			}
			typ, body, _ = r.Next()
		case !read:
			// One read of what is there: the rest of a message may wait
			// in the server's buffer for input lockpool has not written.
			read = true
			if err := r.FillOnce(); err != nil {
				return false, drainError{s.serverLost(err)}
			}
			continue
		default:
			return true, s.drainFlush()
		}
		if typ == 'E' {
			s.pos.copyIn = false // a COPY ends with its error: the server ignores the rest of its data
		}
		if err := s.onServerMessage(typ, body); err != nil {
			return false, drainError{err}
		}
		if s.link.sc != sc {
			return false, nil
		}
	}
}

// drainFlush writes what drainServer relayed to the client.
func (s *Session) drainFlush() error {
	if err := s.flushClient(); err != nil {
		return drainError{err}
	}
	return nil
}

// drainError carries an error drainServer already handled out of the write
// it interrupted: serverLost returns its err as it is.
type drainError struct{ err error }

func (e drainError) Error() string {
	if e.err == nil {
		return "server connection lost during COPY"
	}
	return e.err.Error()
}

func (e drainError) Unwrap() error { return e.err }

// drainingWriter writes to the server with drainServer.
type drainingWriter struct {
	c     *evloop.Conn
	drain func() (bool, error)
}

func (w drainingWriter) Write(p []byte) (int, error) { return w.c.WriteDraining(p, w.drain) }

// serverSock returns the loop-adoptable socket below sc (nil: none, as for
// the scripted servers of unit tests).
func serverSock(sc *pool.Conn) *evloop.Conn {
	switch c := sc.Net.(type) {
	case *evloop.Conn:
		return c
	case *tls.Conn:
		if e, ok := c.NetConn().(*evloop.Conn); ok {
			return e
		}
	}
	return nil
}

// bindServer makes the session's coroutine the only user of sc's socket.
func (s *Session) bindServer(sc *pool.Conn) {
	sock := serverSock(sc)
	if sock == nil || s.co == nil {
		return
	}
	if err := sock.Bind(s.co); err != nil {
		s.srv.Log.Debug("server socket stays outside the event loop", "pid", sc.PID, "err", err)
	}
}

// releaseServer gives sc back to the pool (after the unbinding that lets
// another session's loop take it).
func (s *Session) releaseServer(sc *pool.Conn) {
	if sock := serverSock(sc); sock != nil {
		if err := sock.Flush(); err != nil {
			// Never seen: what a session writes is answered before it
			// releases the connection, so nothing is held by then.
			sc.Broken = true
		}
		sock.Unbind()
	}
	s.srv.Pool.Release(sc)
}

// destroyServer closes sc and frees its slot.
func (s *Session) destroyServer(sc *pool.Conn) {
	if sock := serverSock(sc); sock != nil {
		sock.DropDeferred() // nothing more is owed to a backend being closed
		sock.Unbind()
	}
	s.srv.Pool.Destroy(sc)
}

// relayNotifications wraps the reader of one of lockpool's own exchanges
// on the session's server connection (a probe, a settings read-back): a
// notification that arrives meanwhile (listen: pin) is the client's and
// goes to it, not to fn.
func (s *Session) relayNotifications(fn func(typ byte, body []byte)) func(typ byte, body []byte) {
	return func(typ byte, body []byte) {
		if typ == 'A' {
			s.cout = wire.AppendFrame(s.cout, typ, body)
			return
		}
		fn(typ, body)
	}
}

// endsConnection reports whether an ErrorResponse body is a FATAL (or
// PANIC): the server closes the connection after it.
// serverGone records on the session's server connection that the server
// ended it (reason: the FATAL's "SQLSTATE message"): when it is destroyed
// the pool counts it among the connections lost (pool.Conn.Gone).
func (s *Session) serverGone(reason string) {
	if sc := s.link.sc; sc != nil && sc.Gone == "" {
		sc.Gone = reason
	}
}

// resetServer cleans a server connection whose session ended while it was
// pinned (or in session mode), so the next client finds nothing of it. It
// reports whether the connection may be reused.
func (s *Session) resetServer(sc *pool.Conn) bool { return backend.Reset(sc) }
