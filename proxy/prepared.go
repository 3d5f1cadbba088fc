package proxy

import (
	"encoding/hex"
	"fmt"
	"hash/maphash"

	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// Named prepared statements under transaction pooling: a client's statement
// name maps to a server statement named after a hash of its text and
// parameter types, prepared on a server connection the first time the
// client needs it there, reused after, and evicted least-recently-used.

var stmtSeed = maphash.MakeSeed()

// noopClose is a Close of a statement that never exists: the server answers
// CloseComplete, which lockpool passes on or turns into the ParseComplete of
// a statement the server already had. The reply thus comes in order.
const noopStmt = "lockpool_noop"

func serverStmtName(parseRest []byte) string {
	h := maphash.Bytes(stmtSeed, parseRest)
	var b [8]byte
	for i := range b {
		b[i] = byte(h >> (56 - 8*i))
	}
	return "lp_" + hex.EncodeToString(b[:])
}

func (s *session) maxPrepared() int {
	if m := s.app.cfg.MaxPreparedStatements; m > 0 {
		return m
	}
	return 200
}

// onParse handles Parse.
func (s *session) onParse(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	name, rest, ok := cstring(body)
	if !ok {
		s.consume(n)
		return protoErrorf("invalid Parse message")
	}
	query, _, ok := cstring(rest)
	if !ok {
		s.consume(n)
		return protoErrorf("invalid Parse message")
	}
	if s.virt != nil {
		s.forgetVirtual(name)
	}
	f := analyze(query)
	if len(name) == 0 && !f.Hit() {
		s.unnamed = rewrite.Findings{}
		s.unnamedParse = append(s.unnamedParse[:0], rest...)
		s.consume(n)
		if _, err := s.reserve(fwdUnsynced, action{kind: '1'}); err != nil {
			return s.attachFailed(err, false)
		}
		s.unnamedHere = true
		s.sout = appendFrame(s.sout, 'P', body)
		return nil
	}
	nameS := string(name)
	restCopy := append([]byte(nil), rest...)
	s.consume(n)
	if f.Lease != nil || f.LeaseMention {
		return s.onLeaseParse(&f, nameS, restCopy)
	}
	if f.LeaseFence && s.srv.leases != nil {
		q := rewrite.RewriteFence(string(query), s.srv.leases.Schema())
		_, tail, _ := cstring(restCopy)
		restCopy = append(appendCString(nil, q), tail...)
	}
	// A refusal is decided at Parse. A statement that may take a session
	// lock takes its pin slot now too, before Parse attaches a server
	// connection, so that waiting for the slot never holds one; the probe
	// after the Sync frees the slot again if nothing was taken.
	switch d := s.decide(&f); d.Action {
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
		s.unnamed = f
		s.unnamedParse = append(s.unnamedParse[:0], restCopy...)
		if _, err := s.reserve(fwdUnsynced, action{kind: '1'}); err != nil {
			return s.attachFailed(err, false)
		}
		s.unnamedHere = true
		s.sout = appendHeaderBody(s.sout, 'P', nil, restCopy)
		return nil
	}
	s.mu.Lock()
	if s.stmts == nil {
		s.stmts = make(map[string]*stmt)
	}
	_, exists := s.stmts[nameS]
	s.mu.Unlock()
	if exists {
		return s.fail(&pgError{Code: "42P05", Message: fmt.Sprintf("lockpool: prepared statement %q already exists", nameS), Hint: "Close the statement before preparing it again."}, false)
	}
	st := &stmt{name: nameS, srvName: serverStmtName(restCopy), parse: restCopy, find: f}
	s.mu.Lock()
	attached := s.sc != nil
	if !attached {
		// Lazy preparation: with no server connection attached, the
		// statement is prepared on one when the client first needs it
		// there (Bind or Describe), so a Parse never waits for a
		// connection. An error in the statement then comes with that
		// message, as the client's reply to it.
		s.stmts[nameS] = st
	}
	s.mu.Unlock()
	if !attached {
		return s.writeLocal([]byte{'1', 0, 0, 0, 4})
	}
	return s.prepareOnServer(st, true)
}

func appendHeaderBody(dst []byte, typ byte, head, body []byte) []byte {
	dst, start := appendHeader(dst, typ)
	dst = append(dst, head...)
	dst = append(dst, 0)
	dst = append(dst, body...)
	return finishMsg(dst, start)
}

// prepareOnServer makes sure the attached server has st. When fromParse,
// the client is owed a ParseComplete for it.
func (s *session) prepareOnServer(st *stmt, fromParse bool) error {
	// Attach first (without owing anything yet) to look at the server's set.
	if _, err := s.reserve(fwdPlain); err != nil {
		return s.attachFailed(err, false)
	}
	s.mu.Lock()
	srv := s.st
	if srv.prepared == nil {
		srv.prepared = make(map[string]uint64)
	}
	srv.tick++
	_, have := srv.prepared[st.srvName]
	var evict string
	if !have && len(srv.prepared) >= s.maxPrepared() {
		var oldest uint64 = ^uint64(0)
		for k, t := range srv.prepared {
			if t < oldest {
				oldest, evict = t, k
			}
		}
		delete(srv.prepared, evict)
	}
	srv.prepared[st.srvName] = srv.tick
	if fromParse {
		s.stmts[st.name] = st
	}
	s.mu.Unlock()
	if have {
		s.app.prepHit.Inc()
	} else {
		s.app.prepMiss.Inc()
	}
	var acts []action
	if evict != "" {
		s.app.prepEvict.Inc()
		acts = append(acts, action{kind: '3', op: opSwallow})
	}
	switch {
	case have && fromParse:
		acts = append(acts, action{kind: '3', op: opAsParse, stmt: st})
	case have:
	case fromParse:
		acts = append(acts, action{kind: '1', added: st.srvName, stmt: st})
	default:
		acts = append(acts, action{kind: '1', op: opSwallow, added: st.srvName})
	}
	if _, err := s.reserve(fwdUnsynced, acts...); err != nil {
		return s.attachFailed(err, false)
	}
	if evict != "" {
		s.sout = appendClose(s.sout, 'S', evict)
	}
	switch {
	case have && fromParse:
		s.sout = appendClose(s.sout, 'S', noopStmt)
	case have:
	default:
		s.sout = appendHeaderBody(s.sout, 'P', []byte(st.srvName), st.parse)
	}
	return nil
}

// lookupStmt returns the client's named statement.
func (s *session) lookupStmt(name []byte) *stmt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stmts[string(name)]
}

func errNoStmt(name []byte) *pgError {
	return &pgError{Code: "26000", Message: fmt.Sprintf("lockpool: prepared statement %q does not exist", name), Hint: "Prepare the statement on this connection first."}
}

// onBind handles Bind: the statement's findings decide pins; a named
// statement is prepared on this server first if needed and renamed.
func (s *session) onBind(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	portal, rest, ok := cstring(body)
	if !ok {
		s.consume(n)
		return protoErrorf("invalid Bind message")
	}
	name, tail, ok := cstring(rest)
	if !ok {
		s.consume(n)
		return protoErrorf("invalid Bind message")
	}
	if s.virt != nil {
		if vs := s.virtualStmt(name); vs != nil {
			err := s.bindVirtual(vs, append([]byte(nil), portal...), append([]byte(nil), tail...))
			s.consume(n)
			return err
		}
	}
	if s.vportals != nil {
		delete(s.vportals, string(portal))
	}
	var f *rewrite.Findings
	var st *stmt
	if len(name) == 0 {
		f = &s.unnamed
	} else {
		st = s.lookupStmt(name)
		if st == nil {
			e := errNoStmt(name)
			s.consume(n)
			return s.fail(e, false)
		}
		f = &st.find
	}
	if f.Advisory || len(f.State) > 0 || len(f.Sets) > 0 {
		// Decisions may wait; keep a copy of the message meanwhile.
		body = append([]byte(nil), body...)
		portal, rest, _ = cstring(body)
		name, tail, _ = cstring(rest)
		s.consume(n)
		n = -1
		d := s.decide(f)
		ok, err := s.apply(d, f, false)
		if !ok || err != nil {
			return err
		}
		s.trackSets(f)
	}
	if st == nil {
		if n >= 0 {
			s.consume(n)
			if err := s.ensureUnnamed(); err != nil {
				return err
			}
			if s.skipping {
				return nil
			}
			if _, err := s.reserve(fwdUnsynced, action{kind: '2'}); err != nil {
				return s.attachFailed(err, false)
			}
			// body aliases the read buffer; no read happened since.
			s.sout = appendFrame(s.sout, 'B', body)
			return nil
		}
		if err := s.ensureUnnamed(); err != nil {
			return err
		}
		if s.skipping {
			return nil
		}
		if _, err := s.reserve(fwdUnsynced, action{kind: '2'}); err != nil {
			return s.attachFailed(err, false)
		}
		s.sout = appendFrame(s.sout, 'B', body)
		return nil
	}
	// body may alias the read buffer: nothing reads the client until the
	// Bind is appended below.
	if n >= 0 {
		defer s.consume(n)
	}
	if err := s.prepareOnServer(st, false); err != nil {
		return err
	}
	if s.skipping {
		return nil
	}
	if _, err := s.reserve(fwdUnsynced, action{kind: '2'}); err != nil {
		return s.attachFailed(err, false)
	}
	s.sout = appendBind(s.sout, portal, st.srvName, tail)
	return nil
}

func appendBind(dst, portal []byte, stmtName string, tail []byte) []byte {
	dst, start := appendHeader(dst, 'B')
	dst = append(dst, portal...)
	dst = append(dst, 0)
	dst = appendCString(dst, stmtName)
	dst = append(dst, tail...)
	return finishMsg(dst, start)
}

// onDescribe handles Describe.
func (s *session) onDescribe(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	if len(body) < 2 {
		s.consume(n)
		return protoErrorf("invalid Describe message")
	}
	kind := body[0]
	name, _, ok := cstring(body[1:])
	if !ok {
		s.consume(n)
		return protoErrorf("invalid Describe message")
	}
	if s.virt != nil {
		if kind == 'S' {
			if vs := s.virtualStmt(name); vs != nil {
				s.consume(n)
				return s.describeVirtual(vs, nil)
			}
		} else if vp := s.vportals[string(name)]; vp != nil {
			s.consume(n)
			return s.describeVirtual(nil, vp)
		}
	}
	if kind != 'S' || len(name) == 0 {
		msg := body // valid until the next read; nothing reads the client before it is appended
		s.consume(n)
		if kind == 'S' {
			if err := s.ensureUnnamed(); err != nil {
				return err
			}
			if s.skipping {
				return nil
			}
		}
		if _, err := s.reserve(fwdUnsynced); err != nil {
			return s.attachFailed(err, false)
		}
		s.sout = appendFrame(s.sout, 'D', msg)
		return nil
	}
	st := s.lookupStmt(name)
	if st == nil {
		e := errNoStmt(name)
		s.consume(n)
		return s.fail(e, false)
	}
	s.consume(n)
	if err := s.prepareOnServer(st, false); err != nil {
		return err
	}
	if _, err := s.reserve(fwdUnsynced); err != nil {
		return s.attachFailed(err, false)
	}
	buf, start := appendHeader(s.sout, 'D')
	buf = append(buf, 'S')
	buf = appendCString(buf, st.srvName)
	s.sout = finishMsg(buf, start)
	return nil
}

// onClose handles Close. Closing a named statement forgets the client's
// name; the server statement stays cached for reuse.
func (s *session) onClose(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	if len(body) < 2 {
		s.consume(n)
		return protoErrorf("invalid Close message")
	}
	kind := body[0]
	name, _, ok := cstring(body[1:])
	if !ok {
		s.consume(n)
		return protoErrorf("invalid Close message")
	}
	if s.virt != nil {
		_, isStmt := s.virt[string(name)]
		_, isPortal := s.vportals[string(name)]
		if kind == 'S' && isStmt || kind == 'P' && isPortal {
			if kind == 'S' {
				delete(s.virt, string(name))
			} else {
				delete(s.vportals, string(name))
			}
			s.consume(n)
			return s.writeLocal([]byte{'3', 0, 0, 0, 4})
		}
	}
	if kind == 'S' && len(name) > 0 {
		s.mu.Lock()
		delete(s.stmts, string(name))
		attached := s.sc != nil
		s.mu.Unlock()
		s.consume(n)
		if !attached {
			return s.writeLocal([]byte{'3', 0, 0, 0, 4})
		}
		if _, err := s.reserve(fwdUnsynced, action{kind: '3'}); err != nil {
			return s.attachFailed(err, false)
		}
		s.sout = appendClose(s.sout, 'S', noopStmt)
		return nil
	}
	msg := body // valid until the next read
	s.consume(n)
	if _, err := s.reserve(fwdUnsynced, action{kind: '3'}); err != nil {
		return s.attachFailed(err, false)
	}
	s.sout = appendFrame(s.sout, 'C', msg)
	return nil
}

// onExecute handles Execute: a bound lease call is run by lockpool, any
// other portal is the server's.
func (s *session) onExecute(n int) error {
	if s.vportals != nil && n <= s.r.Size() {
		body, err := s.body(n)
		if err != nil {
			return err
		}
		portal, _, ok := cstring(body)
		if !ok {
			s.consume(n)
			return protoErrorf("invalid Execute message")
		}
		if vp := s.vportals[string(portal)]; vp != nil {
			s.consume(n)
			return s.executeVirtual(vp)
		}
	}
	return s.forwardRaw('E', n, fwdUnsynced)
}

// ensureUnnamed makes sure the attached server connection has this client's
// unnamed statement: after a Sync the connection may have gone to another
// client, whose unnamed statement must never run for this one. The
// client's last unnamed Parse is sent again when needed.
func (s *session) ensureUnnamed() error {
	if _, err := s.reserve(fwdPlain); err != nil {
		return s.attachFailed(err, false)
	}
	if s.unnamedHere {
		return nil
	}
	if s.unnamedParse == nil {
		return s.fail(&pgError{Code: "26000", Message: "lockpool: unnamed prepared statement does not exist", Hint: "Send Parse before Bind or Describe of the unnamed statement."}, false)
	}
	if _, err := s.reserve(fwdUnsynced, action{kind: '1', op: opSwallow}); err != nil {
		return s.attachFailed(err, false)
	}
	s.sout = appendHeaderBody(s.sout, 'P', nil, s.unnamedParse)
	s.unnamedHere = true
	return nil
}
