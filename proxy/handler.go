package proxy

import (
	"encoding/binary"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// Statements lockpool answers itself (lease calls, advisory calls held
// under advisory_locks: hold, LISTEN under listen: shared,
// pg_terminate_backend and pg_cancel_backend of a key pid) go through one
// small interface. The session core asks each kind in localKinds, in
// order, whether an analysed statement is its own (claims); the first that
// says so prepares it (localHandler.prepare), and the core runs what it
// prepared in the client's protocol: a simple Query is prepared, bound with
// no parameters and run at once; a Parse keeps the prepared localStmt under
// the client's name, Bind makes a localPortal, Describe and Execute use
// them. The core owns the order: every reply goes into the session's
// ordered reply queue as a local entry, after everything sent before it has
// been answered (settle), and a statement in a failed transaction gets
// 25P02 without running. A kind's per-session state lives in its
// localHandler, made at the kind's first claim and ended with the session.

// localHandler is one kind's per-session state and its answers.
type localHandler interface {
	// prepare makes the statement of a claimed Query or Parse. sql is the
	// statement's text; rest is the Parse's query and parameter types as on
	// the wire, nil for a simple Query; it aliases nothing that changes. A *pgError answers the
	// statement with that error instead (a FATAL one ends the session).
	prepare(s *session, f *rewrite.Findings, sql string, rest []byte) (localStmt, *pgError)
	// end releases the kind's per-session state when the session ends.
	end(s *session)
}

// localStmt is a prepared statement lockpool answers itself.
type localStmt interface {
	// paramTypes are the parameter types Describe of the statement shows.
	paramTypes() []uint32
	// describe appends what the statement returns: a RowDescription in
	// the result formats given (nil: text), or NoData.
	describe(buf []byte, formats []int16) []byte
	// bind makes a portal from the Bind's parameters, of the types the
	// statement was prepared with (the client's where it declared them); a
	// is nil for a simple Query, whose statement has no parameters to take.
	bind(s *session, a *wire.BindArgs, types []uint32) (localPortal, *pgError)
}

// localPortal is a bound localStmt.
type localPortal interface {
	// run executes the portal and returns its reply: the rows in formats
	// and CommandComplete, with the RowDescription when withDesc (a simple
	// Query), and any notices where PostgreSQL would send them.
	run(s *session, formats []int16, withDesc bool) ([]byte, *pgError)
}

// readyNoticer is a localHandler with notices for the client at the end of
// a transaction, put before its ReadyForQuery.
type readyNoticer interface {
	readyNotices(s *session, buf []byte) []byte
}

// idleSender is a localHandler with messages for a client that is idle
// outside a transaction block with nothing owed (notifications).
type idleSender interface {
	idleMessages(s *session, buf []byte) []byte
}

// sendIdle writes what the local handlers have for an idle client.
func (s *session) sendIdle() {
	if s.extras == nil || s.q.len() > 0 || s.status() != 'I' || s.unsynced || s.copyIn {
		return
	}
	for _, h := range s.extras.local {
		if i, ok := h.(idleSender); ok {
			s.cout = i.idleMessages(s, s.cout)
		}
	}
}

// localKind is one kind of statement lockpool answers itself.
type localKind struct {
	name string
	// claims reports whether the statement is this kind's, given the
	// policy's decision for it.
	claims func(s *session, f *rewrite.Findings, d policy.Decision) bool
	// open makes the kind's per-session state at its first claim.
	open func(s *session) localHandler
}

// numLocalKinds is len(localKinds), for the array of per-session handlers.
const numLocalKinds = 4

// localKinds are asked in this order.
var localKinds = [numLocalKinds]localKind{
	{name: "lease", claims: leaseClaims, open: openLeases},
	{name: "hold", claims: heldClaims, open: openHeld},
	{name: "listen", claims: listenClaims, open: openListen},
	{name: "signal", claims: signalClaims, open: openSignal},
}

// localStmtEntry is a client's prepared statement that lockpool answers.
type localStmtEntry struct {
	stmt  localStmt
	types []uint32 // parameter types, as Describe shows them
}

// localPortalEntry is a portal bound to a localStmtEntry.
type localPortalEntry struct {
	stmt    localStmt
	portal  localPortal
	formats []int16
}

// claim returns the handler of the kind that claims the statement, made
// at the kind's first claim; nil when the statement is the server's.
func (s *session) claim(f *rewrite.Findings, d policy.Decision) localHandler {
	for i := range localKinds {
		if localKinds[i].claims(s, f, d) {
			return s.handler(i)
		}
	}
	return nil
}

// handler returns kind i's handler for this session, made at first use.
func (s *session) handler(i int) localHandler {
	x := s.more()
	if x.local[i] == nil {
		x.local[i] = localKinds[i].open(s)
	}
	return x.local[i]
}

// endHandlers ends every kind's per-session state (session end).
func (s *session) endHandlers() {
	if s.extras == nil {
		return
	}
	for i, h := range s.extras.local {
		if h != nil {
			h.end(s)
			s.extras.local[i] = nil
		}
	}
}

// failLocal answers a local statement's error: a FATAL ends the session.
func (s *session) failLocal(pe *pgError, simple bool) error {
	if pe.IsFatal() {
		return pe
	}
	return s.fail(pe, simple)
}

// answerQuery answers a claimed simple Query in its place in the reply
// order.
func (s *session) answerQuery(h localHandler, f *rewrite.Findings, sql string) error {
	if err := s.settle(); err != nil {
		return err
	}
	if s.status() == 'E' {
		s.pushLocal(wire.AppendReadyForQuery(appendError(nil, 'E', errAborted()), 'E'), nil)
		return nil
	}
	st, pe := h.prepare(s, f, sql, nil)
	if pe != nil {
		return s.failLocal(pe, true)
	}
	p, pe := st.bind(s, nil, nil)
	if pe != nil {
		return s.failLocal(pe, true)
	}
	buf, pe := p.run(s, nil, true)
	if pe != nil {
		return s.failLocal(pe, true)
	}
	s.pushLocal(wire.AppendReadyForQuery(buf, s.status()), nil)
	return nil
}

// answerParse handles a claimed Parse: the statement is kept under the
// client's name, and its ParseComplete owed in order. Should an earlier
// error in the batch skip that reply, the Parse never happened: the name
// goes back to what it was.
func (s *session) answerParse(h localHandler, f *rewrite.Findings, name string, rest []byte) error {
	query, _, _ := wire.CString(rest)
	st, pe := h.prepare(s, f, string(query), rest)
	if pe != nil {
		return s.failLocal(pe, false)
	}
	types := st.paramTypes()
	// The client's declared parameter types win where given.
	if _, tail, ok := wire.CString(rest); ok && len(tail) >= 2 {
		n := int(binary.BigEndian.Uint16(tail))
		tail = tail[2:]
		for i := 0; i < n && len(tail) >= 4 && i < len(types); i++ {
			if oid := binary.BigEndian.Uint32(tail); oid != 0 {
				types[i] = oid
			}
			tail = tail[4:]
		}
	}
	x := s.more()
	if x.virt == nil {
		x.virt = make(map[string]*localStmtEntry)
	}
	prev := x.virt[name]
	x.virt[name] = &localStmtEntry{stmt: st, types: types}
	s.pushLocal(msgParseComplete, func() {
		if prev != nil {
			x.virt[name] = prev
		} else {
			delete(x.virt, name)
		}
	})
	return nil
}

// forgetVirtual drops a local statement when the client reuses the name.
func (s *session) forgetVirtual(name []byte) {
	if s.extras != nil {
		delete(s.extras.virt, string(name))
	}
}

// bindLocal handles Bind of a local statement.
func (s *session) bindLocal(e *localStmtEntry, portal []byte, tail []byte) error {
	var a wire.BindArgs
	if err := (wire.Bind{Tail: tail}).Args(&a); err != nil {
		return err
	}
	p, pe := e.stmt.bind(s, &a, e.types)
	if pe != nil {
		return s.failLocal(pe, false)
	}
	x := s.more()
	if x.vportals == nil {
		x.vportals = make(map[string]*localPortalEntry)
	}
	x.vportals[string(portal)] = &localPortalEntry{stmt: e.stmt, portal: p, formats: append([]int16(nil), a.ResultFormats...)}
	s.pushLocal(msgBindComplete, nil)
	return nil
}

// describeLocal answers Describe of a local statement (e) or portal (p).
func (s *session) describeLocal(e *localStmtEntry, p *localPortalEntry) error {
	if p != nil {
		s.pushLocal(p.stmt.describe(nil, p.formats), nil)
		return nil
	}
	buf, start := wire.AppendHeader(nil, 't')
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(e.types)))
	for _, t := range e.types {
		buf = binary.BigEndian.AppendUint32(buf, t)
	}
	buf = wire.FinishMsg(buf, start)
	s.pushLocal(e.stmt.describe(buf, nil), nil)
	return nil
}

// executeLocal runs a bound local portal. It runs only if everything
// before it in the batch succeeded, as PostgreSQL would run it.
func (s *session) executeLocal(p *localPortalEntry) error {
	if err := s.settle(); err != nil {
		return err
	}
	if s.skipping {
		return nil
	}
	if s.status() == 'E' {
		return s.fail(errAborted(), false)
	}
	buf, pe := p.portal.run(s, p.formats, false)
	if pe != nil {
		return s.failLocal(pe, false)
	}
	s.pushLocal(buf, nil)
	return nil
}
