package session

import (
	"encoding/binary"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/rewrite"
)

// Statements lockpool answers itself (lease calls, advisory calls held
// under advisory_locks: hold, LISTEN under listen: shared,
// pg_terminate_backend and pg_cancel_backend of a key pid) are package
// local's kinds (see its doc for the contract). The core asks each kind of
// its table (Shared.kinds, localKinds), in order, whether an analysed
// statement is its own; the first that says so prepares it, and the core
// runs what it prepared in the client's protocol, in its place in the
// reply order: a simple Query is prepared, bound with no parameters and
// run at once; a Parse keeps the prepared local.Stmt under the client's
// name, Bind makes a local.Portal, Describe and Execute use them. The
// session is the kinds' local.Session (localsession.go).

// sendIdle writes what the local handlers have for an idle client.
func (s *Session) sendIdle() {
	if s.extras == nil || s.q.len() > 0 || s.status() != 'I' || s.pos.unsynced || s.pos.copyIn {
		return
	}
	for _, h := range s.extras.local {
		if i, ok := h.(local.IdleSender); ok {
			s.cout = i.IdleMessages(s, s.cout)
		}
	}
}

// The kinds' places in the table, in the order they are asked.
const (
	kindLease = iota
	kindHold
	kindListen // the core tells its handler of the session's transactions (localsession.go)
	kindSignal
	numLocalKinds
)

// localKinds is the table of kinds the sessions ask (Shared.kinds).
func localKinds() [numLocalKinds]local.Kind {
	return [numLocalKinds]local.Kind{
		kindLease:  local.LeaseKind(),
		kindHold:   local.HoldKind(),
		kindListen: local.ListenKind(),
		kindSignal: local.SignalKind(),
	}
}

// localStmtEntry is a client's prepared statement that lockpool answers.
type localStmtEntry struct {
	stmt  local.Stmt
	types []uint32 // parameter types, as Describe shows them
}

// localPortalEntry is a portal bound to a localStmtEntry.
type localPortalEntry struct {
	stmt    local.Stmt
	portal  local.Portal
	formats []int16
}

// claim returns the handler of the kind that claims the statement, made
// at the kind's first claim; nil when the statement is the server's.
func (s *Session) claim(f *rewrite.Findings, d policy.Decision) local.Handler {
	for i := range s.srv.kinds {
		if s.srv.kinds[i].Claims(s, f, d) {
			return s.handler(i)
		}
	}
	return nil
}

// handler returns kind i's handler for this session, made at first use.
func (s *Session) handler(i int) local.Handler {
	x := s.more()
	if x.local[i] == nil {
		x.local[i] = s.srv.kinds[i].Open(s)
	}
	return x.local[i]
}

// endHandlers ends every kind's per-session state (session end).
func (s *Session) endHandlers() {
	if s.extras == nil {
		return
	}
	for i, h := range s.extras.local {
		if h != nil {
			h.End(s)
			s.extras.local[i] = nil
		}
	}
}

// failLocal answers a local statement's error: a FATAL ends the session.
func (s *Session) failLocal(pe *pgError, simple bool) error {
	if pe.IsFatal() {
		return pe
	}
	return s.fail(pe, simple)
}

// answerQuery answers a claimed simple Query in its place in the reply
// order.
func (s *Session) answerQuery(h local.Handler, f *rewrite.Findings, sql string) error {
	if err := s.settle(); err != nil {
		return err
	}
	if s.status() == 'E' {
		s.pushLocal(wire.AppendReadyForQuery(appendError(nil, 'E', errAborted()), 'E'), nil)
		return nil
	}
	st, pe := h.Prepare(s, f, sql, nil)
	if pe != nil {
		return s.failLocal(pe, true)
	}
	p, pe := st.Bind(s, nil, nil)
	if pe != nil {
		return s.failLocal(pe, true)
	}
	buf, pe := p.Run(s, nil, true)
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
func (s *Session) answerParse(h local.Handler, f *rewrite.Findings, name string, rest []byte) error {
	query, _, _ := wire.CString(rest)
	st, pe := h.Prepare(s, f, string(query), rest)
	if pe != nil {
		return s.failLocal(pe, false)
	}
	types := st.ParamTypes()
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
func (s *Session) forgetVirtual(name []byte) {
	if s.extras != nil {
		delete(s.extras.virt, string(name))
	}
}

// bindLocal handles Bind of a local statement.
func (s *Session) bindLocal(e *localStmtEntry, portal []byte, tail []byte) error {
	var a wire.BindArgs
	if err := (wire.Bind{Tail: tail}).Args(&a); err != nil {
		return err
	}
	p, pe := e.stmt.Bind(s, &a, e.types)
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
func (s *Session) describeLocal(e *localStmtEntry, p *localPortalEntry) error {
	if p != nil {
		s.pushLocal(p.stmt.Describe(nil, p.formats), nil)
		return nil
	}
	buf, start := wire.AppendHeader(nil, 't')
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(e.types)))
	for _, t := range e.types {
		buf = binary.BigEndian.AppendUint32(buf, t)
	}
	buf = wire.FinishMsg(buf, start)
	s.pushLocal(e.stmt.Describe(buf, nil), nil)
	return nil
}

// executeLocal runs a bound local portal. It runs only if everything
// before it in the batch succeeded, as PostgreSQL would run it.
func (s *Session) executeLocal(p *localPortalEntry) error {
	if err := s.settle(); err != nil {
		return err
	}
	if s.pos.skipping {
		return nil
	}
	if s.status() == 'E' {
		return s.fail(errAborted(), false)
	}
	buf, pe := p.portal.Run(s, p.formats, false)
	if pe != nil {
		return s.failLocal(pe, false)
	}
	s.pushLocal(buf, nil)
	return nil
}
