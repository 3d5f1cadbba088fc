package session

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/wire"

	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/txcmd"
	"github.com/lockpool/lockpool/rewrite"
)

// Named prepared statements under transaction pooling: a client's statement
// name maps to a server statement named after a hash of its text and
// parameter types, prepared on a server connection the first time the
// client needs it there, reused after, and evicted least-recently-used.

func (s *Session) maxPrepared() int {
	if m := s.app.Cfg.MaxPreparedStatements; m > 0 {
		return m
	}
	return 200
}

// onParse handles Parse.
func (s *Session) onParse(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	msg, err := wire.ParseParse(body)
	if err != nil {
		return err
	}
	name, query := msg.Name, msg.SQL
	rest := body[len(name)+1:] // query and parameter types, as on the wire
	s.forgetVirtual(name)
	if m := s.plainParses; len(name) == 0 && m != nil {
		if c := m.current; c >= 0 && bytes.Equal(m.slots[c].rest, rest) {
			// The session's unnamed statement again, as it is.
			return s.sendUnnamedParse(body, m.slots[c].begins)
		}
		if slot, begins, ok := m.find(rest); ok {
			// A recent unnamed statement again (drivers send the Parse
			// with every execution): what the checks below found for
			// these very bytes still holds, and it was nothing.
			return s.sendPlainUnnamedParse(body, rest, slot, begins)
		}
	}
	begins := txcmd.Of(query) == txcmd.Begin
	f, mayHit := analyze(query)
	schema := mayHit && changesSchema(query)
	if schema {
		s.srv.Stmts.Retire()
	}
	if len(name) == 0 && !f.Hit() {
		slot := -1
		if !schema {
			if s.plainParses == nil {
				s.plainParses = &parseMemo{current: -1}
			}
			slot = s.plainParses.add(rest, begins)
		}
		return s.sendPlainUnnamedParse(body, rest, slot, begins)
	}
	return s.onParseNoted(name, query, rest, begins, f)
}

// sendPlainUnnamedParse sends an unnamed Parse that lockpool has nothing
// to say about; rest is its query and types (aliasing body), slot the
// parseMemo slot that remembers it (-1: none). When the session's unnamed
// statement is already that slot's, nothing about it changes.
func (s *Session) sendPlainUnnamedParse(body, rest []byte, slot int, begins bool) error {
	m := s.plainParses
	if slot < 0 || m.current != slot {
		if s.unnamed != nil {
			*s.unnamed = rewrite.Findings{} // the last unnamed statement's findings are not this one's
		}
		s.unnamedParse = append(s.unnamedParse[:0], rest...)
	}
	if m != nil {
		m.current = slot
	}
	return s.sendUnnamedParse(body, begins)
}

// sendUnnamedParse sends the session's unnamed statement (s.unnamedParse,
// as body has it) to the server.
func (s *Session) sendUnnamedParse(body []byte, begins bool) error {
	s.unnamedBegin = begins
	if err := s.toServer(replyParse, opPass); err != nil {
		return s.attachFailed(err, false, begins)
	}
	s.unnamedHere = true
	s.sout = wire.AppendFrame(s.sout, 'P', body)
	return nil
}

// onParseNoted handles a Parse that names its statement or that the lexer
// has something to say about. It is a function of its own so that the
// common Parse (unnamed, nothing found) allocates nothing: the findings
// escape here.
func (s *Session) onParseNoted(name, query, rest []byte, begins bool, f rewrite.Findings) error {
	nameS := string(name)
	restCopy := append([]byte(nil), rest...)
	// A refusal is decided at Parse. A statement that may take a session
	// lock takes its pin slot now too, before Parse attaches a server
	// connection, so that waiting for the slot never holds one; the probe
	// after the Sync frees the slot again if nothing was taken.
	d := s.decide(&f)
	if h := s.claim(&f, d); h != nil {
		return s.answerParse(h, &f, nameS, restCopy)
	}
	// An unnamed statement parsed first in a batch outside a transaction
	// block runs by itself there (drivers send Parse, Bind, Execute, Sync).
	clientRest := restCopy
	restCopy = s.serverParse(restCopy, &f, nameS == "" && s.pos.txStatus == 'I' && s.localTx == 0 && !s.pos.unsynced)
	s.noteFallback(d, string(query))
	switch d.Action {
	case policy.Refuse:
		_, err := s.apply(d, &f, false)
		return err
	case policy.PinFirst:
		if nameS == "" {
			if ok, err := s.apply(d, &f, false); !ok || err != nil {
				return err
			}
		}
	}
	if nameS == "" {
		if s.unnamed == nil {
			s.unnamed = new(rewrite.Findings)
		}
		*s.unnamed = f
		s.unnamedParse = append(s.unnamedParse[:0], restCopy...)
		s.unnamedBegin = begins
		if s.plainParses != nil {
			s.plainParses.current = -1
		}
		if err := s.toServer(replyParse, opPass); err != nil {
			return s.attachFailed(err, false, begins)
		}
		s.unnamedHere = true
		s.sout = appendHeaderBody(s.sout, 'P', nil, restCopy)
		return nil
	}
	if s.stmts == nil {
		s.stmts = make(map[string]*stmt)
	}
	if _, exists := s.stmts[nameS]; exists {
		return s.fail(&pgError{Code: "42P05", Message: fmt.Sprintf("prepared statement %q already exists", nameS), Hint: "Close the statement before preparing it again."}, false)
	}
	st := &stmt{name: nameS, srvName: backend.ServerStmtName(restCopy, s.srv.Stmts.Epoch()), parse: restCopy, find: f, begins: begins, at: time.Now().UnixMicro()}
	if !bytes.Equal(clientRest, restCopy) {
		st.client = clientRest
	}
	if s.link.sc == nil && s.srv.Stmts.Known(s.database, s.user, st.srvName) && !s.timesStatements() {
		// Lazy preparation: PostgreSQL accepted this very statement for
		// this database and user, so its Parse cannot fail; it is prepared
		// on a server connection when the client first needs it there, and
		// a Parse never waits for a connection.
		st.fresh = true
		s.stmts[nameS] = st
		s.pushLocal(msgParseComplete, func() { s.forgetStmt(st) })
		return nil
	}
	return s.prepareOnServer(st, true)
}

// serverParse is the Parse body (query and parameter types, rest) the
// server gets for a client's: rest with lockpool's rewrites (f: its
// findings; alone: see rewriteParse) and lease_fence's.
func (s *Session) serverParse(rest []byte, f *rewrite.Findings, alone bool) []byte {
	rest = s.rewriteParse(rest, f, alone)
	if f.LeaseFence && s.srv.Leases != nil {
		query, tail, _ := wire.CString(rest)
		q := rewrite.RewriteFence(string(query), s.srv.Leases.Schema())
		rest = append(wire.AppendCString(nil, q), tail...)
	}
	return rest
}

// sessionDependent reports whether the server's text of a statement with
// findings f depends on the session's state when it runs: it reads
// pg_prepared_statements or pg_listening_channels(), which lockpool
// writes out as the client's statements and channels, or
// pg_stat_activity, which shows lockpool's clients (see
// preparedViewEdits, listenEdits, activityViewEdits).
func sessionDependent(f *rewrite.Findings) bool {
	return len(f.PreparedViews) > 0 || len(f.ChannelsCalls) > 0 || len(f.ActivityViews) > 0
}

// refreshStmt brings a named statement whose server text depends on the
// session's state (sessionDependent) up to date before a Bind: on
// PostgreSQL the view and the function are read when the statement runs,
// not when it was prepared. A changed text is another server statement,
// prepared on the connection as any statement is at its first use there.
func (s *Session) refreshStmt(st *stmt) {
	if st.client == nil || !sessionDependent(&st.find) {
		return
	}
	rest := s.serverParse(append([]byte(nil), st.client...), &st.find, false)
	if bytes.Equal(rest, st.parse) {
		return
	}
	st.parse = rest
	st.srvName = backend.ServerStmtName(rest, s.srv.Stmts.Epoch())
}

// timesStatements reports whether the client set a statement_timeout. Its
// Parse then goes to the server at once, as it would directly: PostgreSQL
// times the extended-protocol messages up to the Sync as one statement, so
// a client that is slow between its Parse and its Describe gets 57014
// with the statement prepared, and must see the same through lockpool.
func (s *Session) timesStatements() bool {
	return backend.GUCDuration(s.params.Values()["statement_timeout"]) > 0
}

// forgetStmt drops a client statement that never came to be.
func (s *Session) forgetStmt(st *stmt) {
	if s.stmts[st.name] == st {
		delete(s.stmts, st.name)
	}
}

func appendHeaderBody(dst []byte, typ byte, head, body []byte) []byte {
	dst, start := wire.AppendHeader(dst, typ)
	dst = append(dst, head...)
	dst = append(dst, 0)
	dst = append(dst, body...)
	return wire.FinishMsg(dst, start)
}

// prepareOnServer makes sure the attached server has st. When fromParse,
// the client is owed a ParseComplete for it.
func (s *Session) prepareOnServer(st *stmt, fromParse bool) error {
	if err := s.attach(); err != nil {
		return s.attachFailed(err, false, st.begins)
	}
	srv := s.link.st
	if srv.Prepared == nil {
		srv.Prepared = make(map[string]uint64)
	}
	srv.Tick++
	_, have := srv.Prepared[st.srvName]
	var evict string
	if !have && len(srv.Prepared) >= s.maxPrepared() {
		var oldest uint64 = ^uint64(0)
		for k, t := range srv.Prepared {
			if t < oldest {
				oldest, evict = t, k
			}
		}
		delete(srv.Prepared, evict)
	}
	srv.Prepared[st.srvName] = srv.Tick
	if have && !fromParse && st.desc != 0 && srv.Descs[st.srvName] != 0 && srv.Descs[st.srvName] != st.desc {
		// The server statement was prepared afresh (after DDL) and returns
		// other columns than the client was told: PostgreSQL would refuse
		// the client's old statement.
		return s.fail(errStalePlan(), false)
	}
	if !have && srv.Stale[st.srvName] || have && (fromParse || st.fresh) {
		// PostgreSQL still has the (stale, or maybe stale) statement
		// under this name: a client's Parse always prepares afresh, so it
		// sees the tables as they are now and its errors come with it.
		delete(srv.Stale, st.srvName)
		delete(srv.Descs, st.srvName)
		s.expect(reply{kind: replyClose, op: opSwallow})
		s.sout = wire.AppendClose(s.sout, 'S', st.srvName)
		have = false
	}
	if fromParse {
		s.stmts[st.name] = st
	}
	if have {
		s.app.PrepHit.Inc()
	} else {
		s.app.PrepMiss.Inc()
	}
	if evict != "" {
		delete(srv.Descs, evict)
		s.app.PrepEvict.Inc()
		s.expect(reply{kind: replyClose, op: opSwallow})
		s.sout = wire.AppendClose(s.sout, 'S', evict)
	}
	st.fresh = false
	switch {
	case have:
	case fromParse:
		s.expect(reply{kind: replyParse, added: st.srvName, stmt: st})
		s.sout = appendHeaderBody(s.sout, 'P', []byte(st.srvName), st.parse)
	default:
		// The client's statement, prepared on this connection for the
		// first time: a failure forgets it, as PostgreSQL never had it.
		s.expect(reply{kind: replyParse, op: opSwallow, added: st.srvName, lazy: st})
		s.sout = appendHeaderBody(s.sout, 'P', []byte(st.srvName), st.parse)
		if st.desc != 0 {
			// The client was told what the statement returns: check the
			// fresh one returns the same before the client uses it, and
			// refuse it as PostgreSQL refuses a statement whose result
			// type changed.
			s.expect(reply{kind: replyDescribeStmt, op: opCheck, desc: st, srv: st.srvName})
			s.sout = wire.AppendDescribe(s.sout, 'S', st.srvName)
			if err := s.settle(); err != nil {
				return err
			}
			if s.extras != nil && s.extras.staleStmt == st {
				s.extras.staleStmt = nil
				s.retireStale(st.srvName)
				return s.fail(errStalePlan(), false)
			}
		}
	}
	return nil
}

// errStalePlan is PostgreSQL's error for a prepared statement whose result
// type changed since the client prepared it.
func errStalePlan() *pgError {
	return &pgError{Code: "0A000", Message: "cached plan must not change result type"}
}

func errNoStmt(name []byte) *pgError {
	return &pgError{Code: "26000", Message: fmt.Sprintf("prepared statement %q does not exist", name), Hint: "Prepare the statement on this connection first."}
}

// onBind handles Bind: the statement's findings decide pins; a named
// statement is prepared on this server first if needed and renamed.
func (s *Session) onBind(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	msg, err := wire.ParseBind(body)
	if err != nil {
		return err
	}
	portal, name, tail := msg.Portal, msg.Stmt, msg.Tail
	if x := s.extras; x != nil {
		if e := x.virt[string(name)]; e != nil {
			return s.bindLocal(e, append([]byte(nil), portal...), append([]byte(nil), tail...))
		}
		delete(x.vportals, string(portal))
		delete(x.tagged, string(portal))
	}
	var f *rewrite.Findings
	var st *stmt
	if len(name) == 0 {
		f = s.unnamed // nil: none
	} else {
		st = s.stmts[string(name)]
		if st == nil {
			e := errNoStmt(name)
			return s.fail(e, false)
		}
		f = &st.find
	}
	// Anything below may wait or read; keep a copy of the message when it
	// must outlive the read buffer.
	if f != nil && (f.Advisory || len(f.State) > 0 || len(f.Sets) > 0) {
		body = append([]byte(nil), body...)
		msg, _ = wire.ParseBind(body)
		portal, tail = msg.Portal, msg.Tail
		d := s.decide(f)
		ok, err := s.apply(d, f, false)
		if !ok || err != nil {
			return err
		}
		s.trackSets(f)
		if tag := s.portalTag(f); tag != "" {
			x := s.more()
			if x.tagged == nil {
				x.tagged = make(map[string]string)
			}
			x.tagged[string(portal)] = tag
		}
	}
	if st == nil {
		if err := s.ensureUnnamed(); err != nil {
			return err
		}
		if s.pos.skipping {
			return nil
		}
		s.expectNotifies(f, tail)
		s.expectSignals(f)
		s.expect(reply{kind: replyBind})
		// body aliases the read buffer; nothing read the client since.
		s.sout = wire.AppendFrame(s.sout, 'B', body)
		return nil
	}
	s.refreshStmt(st)
	if err := s.prepareOnServer(st, false); err != nil {
		return err
	}
	if s.pos.skipping {
		return nil
	}
	s.expectNotifies(f, tail)
	s.expectSignals(f)
	s.expect(reply{kind: replyBind, srv: st.srvName})
	s.sout = wire.AppendBind(s.sout, portal, st.srvName, tail)
	return nil
}

// onDescribe handles Describe.
func (s *Session) onDescribe(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	d, err := wire.ParseDescribe(body)
	if err != nil {
		return err
	}
	kind, name := d.Kind, d.Name
	if x := s.extras; x != nil {
		if kind == 'S' {
			if e := x.virt[string(name)]; e != nil {
				return s.describeLocal(e, nil)
			}
		} else if p := x.vportals[string(name)]; p != nil {
			return s.describeLocal(nil, p)
		}
	}
	rk := replyDescribePortal
	if kind == 'S' {
		rk = replyDescribeStmt
	}
	if kind != 'S' || len(name) == 0 {
		msg := body // valid until the next read; nothing reads the client before it is appended
		if kind == 'S' {
			if err := s.ensureUnnamed(); err != nil {
				return err
			}
			if s.pos.skipping {
				return nil
			}
		}
		if err := s.toServer(rk, opPass); err != nil {
			return s.attachFailed(err, false, false)
		}
		s.sout = wire.AppendFrame(s.sout, 'D', msg)
		return nil
	}
	st := s.stmts[string(name)]
	if st == nil {
		return s.fail(errNoStmt(name), false)
	}
	if err := s.prepareOnServer(st, false); err != nil {
		return err
	}
	if s.pos.skipping {
		return nil
	}
	s.expect(reply{kind: replyDescribeStmt, srv: st.srvName, desc: st})
	s.sout = wire.AppendDescribe(s.sout, 'S', st.srvName)
	return nil
}

// onClose handles Close. Closing a named statement forgets the client's
// name; the server statement stays cached for reuse.
func (s *Session) onClose(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	c, err := wire.ParseClose(body)
	if err != nil {
		return err
	}
	kind, name := c.Kind, c.Name
	if x := s.extras; x != nil {
		_, isStmt := x.virt[string(name)]
		_, isPortal := x.vportals[string(name)]
		if kind == 'S' && isStmt || kind == 'P' && isPortal {
			if kind == 'S' {
				delete(x.virt, string(name))
			} else {
				delete(x.vportals, string(name))
			}
			s.pushLocal(msgCloseComplete, nil)
			return nil
		}
	}
	if kind == 'S' && len(name) > 0 {
		delete(s.stmts, string(name))
		s.pushLocal(msgCloseComplete, nil)
		return nil
	}
	msg := body // valid until the next read
	if err := s.toServer(replyClose, opPass); err != nil {
		return s.attachFailed(err, false, false)
	}
	s.sout = wire.AppendFrame(s.sout, 'C', msg)
	return nil
}

// onExecute handles Execute: a bound lease call is run by lockpool, any
// other portal is the server's.
func (s *Session) onExecute(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	e, err := wire.ParseExecute(body)
	if err != nil {
		return err
	}
	if x := s.extras; x != nil {
		if p := x.vportals[string(e.Portal)]; p != nil {
			return s.executeLocal(p)
		}
	}
	if err := s.toServer(replyExecute, opPass); err != nil {
		return s.attachFailed(err, false, false)
	}
	if x := s.extras; x != nil {
		if tag, ok := x.tagged[string(e.Portal)]; ok {
			s.q.back().tags = &tagFixes{fixes: []tagFix{{stmt: 1, tag: tag}}}
		}
	}
	// body aliases the read buffer; nothing read the client since.
	s.sout = wire.AppendFrame(s.sout, 'E', body)
	return nil
}

// ensureUnnamed makes sure the attached server connection has this client's
// unnamed statement: after a Sync the connection may have gone to another
// client, whose unnamed statement must never run for this one. The
// client's last unnamed Parse is sent again when needed.
func (s *Session) ensureUnnamed() error {
	if err := s.attach(); err != nil {
		return s.attachFailed(err, false, s.unnamedBegin)
	}
	if s.unnamedHere {
		return nil
	}
	if s.unnamedParse == nil {
		return s.fail(&pgError{Code: "26000", Message: "unnamed prepared statement does not exist", Hint: "Send Parse before Bind or Describe of the unnamed statement."}, false)
	}
	s.expect(reply{kind: replyParse, op: opSwallow})
	s.sout = appendHeaderBody(s.sout, 'P', nil, s.unnamedParse)
	s.unnamedHere = true
	return nil
}

// deallocates reports whether f holds a DEALLOCATE or DISCARD ALL.
func deallocates(f *rewrite.Findings) bool {
	for _, c := range f.State {
		if c.Kind == rewrite.Deallocate || c.Kind == rewrite.Discard && c.Name == "all" {
			return true
		}
	}
	return false
}

// deallocate handles SQL DEALLOCATE and DISCARD ALL, which in PostgreSQL
// act on protocol-level statements too: DEALLOCATE of a client's
// protocol-level name is answered by lockpool; DEALLOCATE ALL and DISCARD
// ALL forget the client's names and still go to the server. It reports
// whether the statement was answered.
func (s *Session) deallocate(f *rewrite.Findings, simple bool) bool {
	for _, c := range f.State {
		switch {
		case c.Kind == rewrite.Deallocate && f.Statements == 1 && simple && s.status() != 'E':
			if _, ok := s.stmts[c.Name]; ok {
				delete(s.stmts, c.Name)
				buf, start := wire.AppendHeader(nil, 'C')
				buf = wire.AppendCString(buf, "DEALLOCATE")
				buf = wire.FinishMsg(buf, start)
				s.pushLocal(wire.AppendReadyForQuery(buf, s.status()), nil)
				return true
			}
		}
	}
	return false
}

// forgetPrepared follows a DEALLOCATE ALL or DISCARD ALL that succeeded:
// the client's protocol-level statements are gone, as on PostgreSQL, and so
// is every statement lockpool prepared on the connection. One that failed
// (inside a transaction block, say) changes nothing.
func (s *Session) forgetPrepared() {
	for k := range s.stmts {
		delete(s.stmts, k)
	}
	if st := s.link.st; st != nil {
		st.Prepared = nil
	}
}

// retireStale handles a stale-plan error of the server statement srvName on
// the attached connection: it is closed there before its next use, and a
// new epoch makes later Parses of any client prepare afresh.
func (s *Session) retireStale(srvName string) {
	if st := s.link.st; st != nil {
		delete(st.Prepared, srvName)
		delete(st.Descs, srvName)
		if st.Stale == nil {
			st.Stale = make(map[string]bool)
		}
		st.Stale[srvName] = true
	}
	s.srv.Stmts.Retire()
}

// parseMemo remembers the last few unnamed Parses (query and parameter
// types, as on the wire) that lockpool had nothing to say about: no
// findings and no schema change. What the checks find is a function of
// these bytes alone, so the same bytes again skip them: a client that
// cycles through a few statements on the unnamed statement (drivers that
// send Parse with every execution, pgbench's TPC-B with -M extended) has
// each looked at once. Slots keep their arrays, so a steady client
// allocates nothing; a Parse longer than parseMemoMax is not remembered.
type parseMemo struct {
	slots [parseMemoSlots]parseMemoSlot
	next  int // the slot the next new entry takes (round robin)
	// current is the slot whose bytes are the session's unnamed statement
	// now (s.unnamedParse, with no findings), -1 when it is none of them:
	// the same statement again changes nothing. Whoever sets the unnamed
	// statement otherwise sets it to -1.
	current int
}

type parseMemoSlot struct {
	rest   []byte // empty: unused (a Parse's query and types are never empty)
	begins bool   // it opens a transaction block
}

const (
	parseMemoSlots = 8
	parseMemoMax   = 256
)

// find returns the slot that remembers rest and whether it opens a
// transaction block; ok is false when none does.
func (m *parseMemo) find(rest []byte) (slot int, begins, ok bool) {
	if len(rest) == 0 {
		return -1, false, false
	}
	for i := range m.slots {
		if sl := &m.slots[i]; len(sl.rest) == len(rest) && bytes.Equal(sl.rest, rest) {
			return i, sl.begins, true
		}
	}
	return -1, false, false
}

// add remembers rest (copied) in the oldest slot and returns that slot;
// -1 when rest is not remembered (too long).
func (m *parseMemo) add(rest []byte, begins bool) int {
	if len(rest) == 0 || len(rest) > parseMemoMax {
		return -1
	}
	i := m.next
	if m.current == i {
		m.current = -1 // its bytes change
	}
	m.slots[i].rest = append(m.slots[i].rest[:0], rest...)
	m.slots[i].begins = begins
	m.next = (i + 1) % parseMemoSlots
	return i
}

// preparedViewEdits replaces each pg_prepared_statements in a FROM list
// with the client's statements: the server's view lists lockpool's
// server statements (lp_…, shared by clients) and none of the client's
// names. Each client statement is a row with its name and text, the time
// the client prepared it, and what the server knows of its server
// statement on this connection (parameter types, plan counts; none while
// it is not prepared there); the server's own rows that are not lockpool's
// (SQL PREPARE on a pinned session) follow. The expression keeps the
// view's row type, whatever the server's version, and its name when the
// query gives no alias.
func (s *Session) preparedViewEdits(f *rewrite.Findings, sql string) []sqlEdit {
	if len(f.PreparedViews) == 0 {
		return nil
	}
	names := make([]string, 0, len(s.stmts))
	for name := range s.stmts {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("pg_catalog.jsonb_populate_recordset(NULL::pg_catalog.pg_prepared_statements, coalesce((SELECT pg_catalog.jsonb_agg(r) FROM (")
	if len(names) > 0 {
		b.WriteString("SELECT coalesce(pg_catalog.to_jsonb(p), '{}') || pg_catalog.jsonb_build_object('name', c.name, 'statement', c.statement, " +
			"'prepare_time', c.at, 'parameter_types', coalesce(c.types, p.parameter_types), 'from_sql', false, 'generic_plans', coalesce(p.generic_plans, 0), 'custom_plans', coalesce(p.custom_plans, 0)) AS r " +
			"FROM (VALUES ")
		for i, name := range names {
			st := s.stmts[name]
			text := st.parse
			if st.client != nil {
				text = st.client // the client's text, not lockpool's rewrite of it
			}
			query, _, _ := wire.CString(text)
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "(%s, %s, %s, pg_catalog.to_timestamp(%d / 1e6), %s)", backend.EscapedLiteral(name), backend.EscapedLiteral(st.srvName), backend.EscapedLiteral(string(query)), st.at, paramTypesArray(st.params))
		}
		b.WriteString(") c(name, srv, statement, at, types) LEFT JOIN pg_catalog.pg_prepared_statements p ON p.name = c.srv UNION ALL ")
	}
	b.WriteString("SELECT pg_catalog.to_jsonb(p) FROM pg_catalog.pg_prepared_statements p WHERE p.name !~ '^lp_[0-9a-f]{16}$') q(r)), '[]'))")
	return viewEdits(f.PreparedViews, sql, b.String(), "pg_prepared_statements")
}

// paramTypesArray is the regtype[] of a ParameterDescription body, NULL
// when there is none.
func paramTypesArray(desc []byte) string {
	if len(desc) < 2 {
		return "NULL::pg_catalog.regtype[]"
	}
	n := int(binary.BigEndian.Uint16(desc))
	if len(desc) < 2+4*n {
		return "NULL::pg_catalog.regtype[]"
	}
	var b strings.Builder
	b.WriteString("'{")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(binary.BigEndian.Uint32(desc[2+4*i:])), 10))
	}
	b.WriteString("}'::pg_catalog.oid[]::pg_catalog.regtype[]")
	return b.String()
}
