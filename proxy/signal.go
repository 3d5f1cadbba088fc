package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// pg_terminate_backend and pg_cancel_backend of a key pid: the signal
// kind. A client's key pid (the pid of its BackendKeyData, keyPID) is its
// identity for PostgreSQL's signal functions, as a backend's pid is on a
// direct connection.
//   - A statement that is one call, SELECT [pg_catalog.]pg_terminate_backend(pid
//     [, timeout]) or SELECT pg_cancel_backend(pid) with constants or $n
//     (rewrite.SignalCall), is claimed when its pid is a parameter, or a
//     constant that is the key pid of a client of this instance or carries
//     the number of another live instance of the cluster. Every other
//     statement that calls them, and a constant pid that is no client's (a
//     backend's pid among them), goes to the server unchanged.
//   - Terminating a client ends it as KILL_CLIENT does (session.kill): FATAL
//     57P01 with PostgreSQL's message; its transaction is rolled back with
//     its server connection, its leases, held locks and LISTENs are
//     released. With a timeout > 0 the call waits up to that many
//     milliseconds for the client's session to have ended and cleaned up,
//     else warns and returns false, as PostgreSQL does for a backend.
//   - Cancelling a client is a CancelRequest with its key
//     (Server.cancelSession): its statement running on the server, or its
//     wait in lockpool, ends with 57014.
//   - The caller may signal a client that logged in as the same user, or any
//     client when the caller logged in as one of admin_users; otherwise the
//     call fails with PostgreSQL 15's 42501 error.
//   - The caller's own key pid: pg_terminate_backend ends the caller with
//     the FATAL, pg_cancel_backend fails with 57014, as PostgreSQL does for
//     its own backend.
//   - A key pid with another instance's number goes to that instance
//     (clustersignal.go), which answers as above for its clients.
//   - A backend's pid that a client of this instance read from
//     pg_backend_pid() (seenPIDs: the last client that read it) stands for
//     that client's key pid, as above: on PostgreSQL that pid names the
//     reader's session. The backend itself is not signalled (it is
//     lockpool's, and may serve another client by now). Such a constant
//     pid is claimed like a key pid; a pid no client read goes to the
//     server as before.
//   - A $n pid that is no client's key pid: the call is sent to the server
//     as the client sent it (its text, parameters and formats), which
//     answers for its backends: true, a WARNING and false for a pid that is
//     no backend, its own permission error. A constant key pid whose client
//     ended after the statement was claimed gets PostgreSQL's WARNING and
//     false from lockpool (no backend has a pid of 2^22 or more).

// signalling is the signal kind's localHandler; it keeps no per-session
// state.
type signalling struct{}

func openSignal(*session) localHandler { return signalling{} }

// end implements localHandler.
func (signalling) end(*session) {}

// signalClaims claims a whole-statement signal call PostgreSQL would run
// (see signalShape) whose pid is a parameter or a constant key pid of a
// live client (or of another live instance).
func signalClaims(s *session, f *rewrite.Findings, _ policy.Decision) bool {
	c := f.Signal
	if c == nil || !signalShape(c) {
		return false
	}
	if c.Args[0].Kind == rewrite.ArgParam {
		return true
	}
	typ, _ := signalArgType(c.Args[0], 0)
	pid, _ := signalConstant(c.Args[0], typ)
	if isKeyPID(pid) {
		return s.srv.keyPIDLive(uint32(pid))
	}
	_, seen := s.seenBy(pid)
	return seen
}

// seenBy returns the key pid of the client that last read pid from
// pg_backend_pid() (seenPIDs), when pid is a backend's pid one did.
func (s *session) seenBy(pid int64) (uint32, bool) {
	if pid <= 0 || pid > math.MaxInt32 {
		return 0, false
	}
	return s.srv.seen.client(uint32(pid))
}

// signalShape reports whether PostgreSQL would run the call as lockpool
// answers it: pg_cancel_backend(integer) or pg_terminate_backend(integer
// [, bigint]), no NULL constant (the functions are strict), constants it
// reads as those types, casts to integer types only. Anything else is left
// to the server, which answers or refuses it.
func signalShape(c *rewrite.SignalCall) bool {
	most := 1
	if c.Terminate() {
		most = 2
	}
	if len(c.Args) < 1 || len(c.Args) > most {
		return false
	}
	for i, a := range c.Args {
		typ, ok := signalArgType(a, i)
		if !ok {
			return false
		}
		switch a.Kind {
		case rewrite.ArgParam:
		case rewrite.ArgNumber, rewrite.ArgString:
			if _, ok := signalConstant(a, typ); !ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// signalArgType is the type argument i of a signal call has: integer for
// the pid, bigint for the timeout, or the integer type a cast names; ok is
// false for a cast to anything else, or to bigint for the pid (no function
// takes it).
func signalArgType(a rewrite.Arg, i int) (uint32, bool) {
	switch a.Cast {
	case "":
		if i == 0 {
			return oidInt4, true
		}
		return oidInt8, true
	case "int2", "smallint":
		return oidInt2, true
	case "int", "int4", "integer":
		return oidInt4, true
	case "int8", "bigint":
		return oidInt8, i > 0
	}
	return 0, false
}

// signalConstant is the value of a constant argument of type typ, as
// PostgreSQL reads it; ok is false when PostgreSQL would refuse it or
// resolve the call otherwise (a numeric constant, an uncast integer
// constant too large for an integer pid, a value out of range).
func signalConstant(a rewrite.Arg, typ uint32) (int64, bool) {
	switch a.Kind {
	case rewrite.ArgNumber:
		digits := strings.TrimPrefix(a.Text, "-")
		if digits == "" || strings.Trim(digits, "0123456789") != "" {
			return 0, false // numeric, or a form PostgreSQL 15 does not read as an integer
		}
		v, err := strconv.ParseInt(a.Text, 10, 64)
		if err != nil {
			return 0, false
		}
		return v, fitsType(v, typ)
	case rewrite.ArgString:
		v, pe := parseIntText(a.Text, typ)
		return v, pe == nil
	}
	return 0, false
}

// intTypeName is PostgreSQL's name of an integer type.
func intTypeName(typ uint32) string {
	switch typ {
	case oidInt2:
		return "smallint"
	case oidInt8:
		return "bigint"
	}
	return "integer"
}

// fitsType reports whether v is in the range of integer type typ.
func fitsType(v int64, typ uint32) bool {
	switch typ {
	case oidInt2:
		return v >= math.MinInt16 && v <= math.MaxInt16
	case oidInt4:
		return v >= math.MinInt32 && v <= math.MaxInt32
	}
	return true
}

// parseIntText reads an integer of type typ from text as PostgreSQL's
// int2in, int4in and int8in do (spaces around, a sign), with their errors.
func parseIntText(text string, typ uint32) (int64, *pgError) {
	t := strings.Trim(text, " \t\n\r\f\v")
	digits := strings.TrimLeft(t, "+-")
	if len(t)-len(digits) > 1 || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, pgerr.New(pgerr.InvalidTextRepresentation, fmt.Sprintf("invalid input syntax for type %s: %q", intTypeName(typ), text), "")
	}
	v, err := strconv.ParseInt(strings.TrimPrefix(t, "+"), 10, 64)
	if err != nil || !fitsType(v, typ) {
		return 0, pgerr.New(pgerr.NumericValueOutOfRange, fmt.Sprintf("value %q is out of range for type %s", text, intTypeName(typ)), "")
	}
	return v, nil
}

// signalColName is the result column's name: the alias, else the
// function's name, as PostgreSQL names it.
func signalColName(c *rewrite.SignalCall) string {
	if c.Alias != "" {
		return c.Alias
	}
	return c.Func
}

// prepare implements localHandler: the parameters' types are what
// PostgreSQL infers (integer for the pid, bigint for the timeout, the type
// of a cast) unless the client declared them.
func (signalling) prepare(_ *session, f *rewrite.Findings, _ string, rest []byte) (localStmt, *pgError) {
	c := f.Signal
	st := &signalStmt{call: c, rest: rest}
	n := 0
	for _, a := range c.Args {
		if a.Kind == rewrite.ArgParam && a.Param > n {
			n = a.Param
		}
	}
	inferred := make([]uint32, n)
	for i, a := range c.Args {
		if a.Kind == rewrite.ArgParam && inferred[a.Param-1] == 0 {
			inferred[a.Param-1], _ = signalArgType(a, i)
		}
	}
	declared := declaredTypes(rest)
	st.types = make([]uint32, n)
	for i := range st.types {
		st.types[i] = inferred[i]
		if i < len(declared) && declared[i] != 0 && declared[i] != oidUnknown {
			st.types[i] = declared[i]
		}
		if st.types[i] == 0 {
			return nil, pgerr.New(pgerr.IndeterminateDatatype, fmt.Sprintf("could not determine data type of parameter $%d", i+1), "")
		}
	}
	// A declared type must be one the function takes (or, under a cast,
	// one lockpool reads).
	for i, a := range c.Args {
		if a.Kind != rewrite.ArgParam {
			continue
		}
		switch typ := st.types[a.Param-1]; {
		case a.Cast == "" && (typ == oidInt2 || typ == oidInt4 || typ == oidInt8 && i > 0):
		case a.Cast != "" && (typ == oidInt2 || typ == oidInt4 || typ == oidInt8 || typ == oidText || typ == oidVarchar):
		case a.Cast == "":
			return nil, errNoSignalFunction(c, st.types)
		default:
			return nil, pgerr.Newf(pgerr.FeatureNotSupported, "Declare the parameter as an integer, or leave its type to the server.",
				"a parameter of type %d cast in a %s call is not supported", typ, c.Func)
		}
	}
	return st, nil
}

// declaredTypes are the parameter types a Parse declares (rest: its query
// and types as on the wire; nil for a simple Query).
func declaredTypes(rest []byte) []uint32 {
	_, tail, ok := wire.CString(rest)
	if !ok || len(tail) < 2 {
		return nil
	}
	n := int(binary.BigEndian.Uint16(tail))
	tail = tail[2:]
	out := make([]uint32, 0, n)
	for i := 0; i < n && len(tail) >= 4; i++ {
		out = append(out, binary.BigEndian.Uint32(tail))
		tail = tail[4:]
	}
	return out
}

// errNoSignalFunction is PostgreSQL's error for a call whose argument
// types no signal function takes (types: the parameters' types).
func errNoSignalFunction(c *rewrite.SignalCall, types []uint32) *pgError {
	names := make([]string, len(c.Args))
	for i, a := range c.Args {
		typ, _ := signalArgType(a, i)
		if a.Kind == rewrite.ArgParam {
			typ = types[a.Param-1]
		}
		names[i] = typeName(typ)
	}
	return pgerr.New(pgerr.UndefinedFunction, fmt.Sprintf("function %s(%s) does not exist", c.Func, strings.Join(names, ", ")),
		"No function matches the given name and argument types. You might need to add explicit type casts.")
}

// typeName is PostgreSQL's name of a type lockpool knows.
func typeName(oid uint32) string {
	switch oid {
	case oidBool:
		return "boolean"
	case oidInt2, oidInt4, oidInt8:
		return intTypeName(oid)
	case oidText:
		return "text"
	case oidFloat4:
		return "real"
	case oidFloat8:
		return "double precision"
	case oidVarchar:
		return "character varying"
	case oidNumeric:
		return "numeric"
	case oidTimestamptz:
		return "timestamp with time zone"
	}
	return "unknown"
}

// signalStmt is a signal call, prepared.
type signalStmt struct {
	call  *rewrite.SignalCall
	types []uint32 // the parameters' types
	rest  []byte   // the Parse's query and declared types (nil: a simple Query), to send on unchanged
}

func (st *signalStmt) paramTypes() []uint32 { return append([]uint32(nil), st.types...) }

func (st *signalStmt) cols() []leaseCol {
	return []leaseCol{{signalColName(st.call), oidBool, 1}}
}

func (st *signalStmt) describe(buf []byte, formats []int16) []byte {
	return appendRowDescription(buf, st.cols(), formats)
}

// bind reads the pid and the timeout: constants from the statement, $n
// from the Bind, each of the parameter's type (types) and then of its
// argument's.
func (st *signalStmt) bind(_ *session, a *wire.BindArgs, types []uint32) (localPortal, *pgError) {
	p := &signalPortal{st: st}
	if a != nil {
		if len(a.Params) != len(types) {
			return nil, pgerr.New(pgerr.ProtocolViolation, fmt.Sprintf("bind message supplies %d parameters, but prepared statement requires %d", len(a.Params), len(types)), "")
		}
		p.tail = a.AppendTail(nil)
	}
	var vals [2]int64
	for i, arg := range st.call.Args {
		typ, _ := signalArgType(arg, i)
		if arg.Kind != rewrite.ArgParam {
			vals[i], _ = signalConstant(arg, typ)
			continue
		}
		if a == nil {
			return nil, pgerr.New(pgerr.UndefinedParameter, fmt.Sprintf("there is no parameter $%d", arg.Param), "")
		}
		raw := a.Params[arg.Param-1]
		if raw == nil {
			p.null = true // strict: the call returns NULL
			continue
		}
		v, pe := decodeIntParam(raw, a.ParamFormat(arg.Param-1), types[arg.Param-1], typ, arg.Param)
		if pe != nil {
			return nil, pe
		}
		vals[i] = v
	}
	p.pid, p.timeout = vals[0], vals[1]
	return p, nil
}

// decodeIntParam reads parameter n, sent as type ptyp in format, as a
// value of the integer type typ of its argument.
func decodeIntParam(raw []byte, format int16, ptyp, typ uint32, n int) (int64, *pgError) {
	var v int64
	switch {
	case format == 0:
		from := ptyp
		if from == oidText || from == oidVarchar {
			from = typ // text cast to an integer type
		}
		var pe *pgError
		if v, pe = parseIntText(string(raw), from); pe != nil {
			return 0, pe
		}
	case ptyp == oidInt2 && len(raw) == 2:
		v = int64(int16(binary.BigEndian.Uint16(raw)))
	case ptyp == oidInt4 && len(raw) == 4:
		v = int64(int32(binary.BigEndian.Uint32(raw)))
	case ptyp == oidInt8 && len(raw) == 8:
		v = int64(binary.BigEndian.Uint64(raw))
	case ptyp == oidText || ptyp == oidVarchar:
		var pe *pgError
		if v, pe = parseIntText(string(raw), typ); pe != nil {
			return 0, pe
		}
	case len(raw) < intSize(ptyp):
		return 0, pgerr.New(pgerr.ProtocolViolation, "insufficient data left in message", "")
	default:
		return 0, pgerr.New(pgerr.InvalidBinaryRepresentation, fmt.Sprintf("incorrect binary data format in bind parameter %d", n), "")
	}
	if !fitsType(v, typ) {
		return 0, pgerr.New(pgerr.NumericValueOutOfRange, intTypeName(typ)+" out of range", "")
	}
	return v, nil
}

// intSize is the size of a binary value of integer type typ (0 for
// another type).
func intSize(typ uint32) int {
	switch typ {
	case oidInt2:
		return 2
	case oidInt4:
		return 4
	case oidInt8:
		return 8
	}
	return 0
}

// signalPortal is a bound signal call.
type signalPortal struct {
	st      *signalStmt
	pid     int64
	timeout int64  // milliseconds (pg_terminate_backend's second argument; 0 when absent)
	null    bool   // an argument is NULL
	tail    []byte // the Bind's formats and parameters (nil: a simple Query), to send on unchanged
}

// run signals the client whose key pid the call names, or sends the call
// to the server when the pid is no client's.
func (p *signalPortal) run(s *session, formats []int16, withDesc bool) ([]byte, *pgError) {
	c := p.st.call
	if p.null {
		return p.reply(nil, nil, formats, withDesc), nil
	}
	if c.Terminate() && p.timeout < 0 {
		return nil, pgerr.New(pgerr.NumericValueOutOfRange, `"timeout" must not be negative`, "")
	}
	pid := uint32(p.pid)
	if !isKeyPID(p.pid) {
		// A backend's pid that a client read from pg_backend_pid() names
		// that client's session, as it would on PostgreSQL.
		client, ok := s.seenBy(p.pid)
		if !ok {
			return s.passSignal(p, formats, withDesc)
		}
		pid = client
	}
	if pid == s.pid {
		if c.Terminate() {
			return nil, errTerminated()
		}
		return nil, pgerr.New(pgerr.QueryCanceled, "canceling statement due to user request", "")
	}
	r := signalRequest{pid: pid, terminate: c.Terminate(), timeout: time.Duration(p.timeout) * time.Millisecond,
		user: s.user, admin: s.srv.Config().IsAdmin(s.user)}
	res, err := s.signalKeyPID(r)
	switch res {
	case signalSent:
		return p.reply(true, nil, formats, withDesc), nil
	case signalStillRunning:
		unit := "milliseconds"
		if p.timeout == 1 {
			unit = "millisecond"
		}
		return p.reply(false, pgerr.NoticeWarning(fmt.Sprintf("backend with PID %d did not terminate within %d %s", pid, p.timeout, unit), ""), formats, withDesc), nil
	case signalDenied:
		return nil, errSignalDenied(r.terminate)
	case signalCanceled:
		return nil, errCanceled()
	case signalUnreachable:
		return p.reply(false, pgerr.NoticeWarning(fmt.Sprintf("lockpool: could not send the signal to the lockpool instance serving PID %d: %v", pid, err),
			"That instance of the cluster did not answer; the client may still run."), formats, withDesc), nil
	}
	return s.passSignal(p, formats, withDesc) // no client has that key pid
}

// reply is the call's result v (a bool, or nil for NULL), with a notice
// before the row when there is one, as PostgreSQL sends them.
func (p *signalPortal) reply(v any, notice *pgError, formats []int16, withDesc bool) []byte {
	cols := p.st.cols()
	var buf []byte
	if withDesc {
		buf = appendRowDescription(buf, cols, formats)
	}
	if notice != nil {
		buf = appendError(buf, 'N', notice)
	}
	buf = appendDataRow(buf, cols, []any{v}, formats)
	return wire.AppendCommandComplete(buf, "SELECT 1")
}

// passSignal answers a call whose pid is no client's key pid. A bound call
// goes to the server as the client sent it: an unnamed Parse of its text
// and declared types, a Bind of its parameters and result formats, and an
// Execute, whose rows, notices or error take the call's place in the reply
// order (the ParseComplete and BindComplete are lockpool's, not passed on).
// A simple Query's pid is a constant that was a live client's key pid, or
// a backend pid a client had read, when the statement was claimed, and
// that client has ended since: PostgreSQL's answer for a pid that names no
// backend (for a backend pid that may be untrue: the backend may still
// run).
func (s *session) passSignal(p *signalPortal, formats []int16, withDesc bool) ([]byte, *pgError) {
	if p.tail == nil || p.st.rest == nil {
		return p.reply(false, pgerr.NoticeWarning(fmt.Sprintf("PID %d is not a PostgreSQL backend process", p.pid), ""), formats, withDesc), nil
	}
	if err := s.toServer(replyParse, opSwallow); err != nil {
		// attachFailed answers the call with the error, or ends the session.
		if err := s.attachFailed(err, false, false); err != nil {
			if pe, ok := pgerr.As(err); ok {
				return nil, pe
			}
			return nil, pgerr.ConnectionLost(false).Fatal()
		}
		return nil, nil
	}
	s.expect(reply{kind: replyBind, op: opSwallow})
	s.expect(reply{kind: replyExecute, op: opPass})
	s.sout = wire.AppendFrame(s.sout, 'P', append([]byte{0}, p.st.rest...))
	s.sout = wire.AppendBind(s.sout, "", "", p.tail)
	s.sout = wire.AppendExecute(s.sout, "", 0)
	s.unnamedHere = false // the server's unnamed statement is no longer the client's
	return nil, nil
}

// errTerminated is PostgreSQL's FATAL for a backend pg_terminate_backend
// ended.
func errTerminated() *pgError {
	return &pgError{Severity: pgerr.SeverityFatal, Code: pgerr.AdminShutdown, Message: "terminating connection due to administrator command"}
}

// errSignalDenied is PostgreSQL 15's error for a caller that may not
// signal the client (terminate: pg_terminate_backend, else
// pg_cancel_backend).
func errSignalDenied(terminate bool) *pgError {
	if terminate {
		return pgerr.New(pgerr.InsufficientPrivilege, "must be a member of the role whose process is being terminated or member of pg_signal_backend", "")
	}
	return pgerr.New(pgerr.InsufficientPrivilege, "must be a member of the role whose query is being canceled or member of pg_signal_backend", "")
}

// signalRequest is one pg_terminate_backend or pg_cancel_backend of a key
// pid, as the calling session asks it (or another instance of the cluster
// on its behalf, clustersignal.go).
type signalRequest struct {
	pid       uint32
	terminate bool          // pg_terminate_backend, else pg_cancel_backend
	timeout   time.Duration // terminate: how long to wait for the client to end (0: no wait)
	user      string        // the caller's login user
	admin     bool          // the caller's user is in admin_users
}

// allows reports whether the caller may signal a client that logged in as
// user.
func (r signalRequest) allows(user string) bool { return r.admin || r.user == user }

// signalResult is what became of a signalRequest.
type signalResult uint8

const (
	signalNoClient     signalResult = iota // no client has the key pid
	signalSent                             // the client was terminated (and ended within the timeout) or its statement cancelled
	signalStillRunning                     // terminate with a timeout: the client had not ended when it passed
	signalDenied                           // the caller may not signal that client
	signalCanceled                         // the caller's wait was cancelled
	signalUnreachable                      // the instance serving the client did not answer
)

// signalKeyPID carries out r for a client of this instance or, when the
// key pid carries another instance's number, sends it to that instance.
// The wait ends with the caller's cancel request or kill.
func (s *session) signalKeyPID(r signalRequest) (signalResult, error) {
	ctx := s.waitContext()
	defer s.endWait()
	var res signalResult
	var err error
	s.offload(func() {
		if n := pidNumber(r.pid); n != 0 && s.srv.cluster != nil && n != s.srv.cluster.Number() {
			res, err = s.srv.forwardSignal(ctx, n, r)
			return
		}
		res = s.srv.signalClient(ctx, r)
	})
	return res, err
}

// keyPIDLive reports whether pid is the key pid of a client of this
// instance, or carries the number of another live instance of the cluster
// (which may or may not serve such a client).
func (s *Server) keyPIDLive(pid uint32) bool {
	if n := pidNumber(pid); n != 0 && s.cluster != nil && n != s.cluster.Number() {
		_, ok := s.cluster.PeerInfo(n)
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[pid]
	return ok
}

// signalClient carries out r for a client of this instance, whose key pid
// is not the caller's own: a terminate kills the session and, with a
// timeout, waits for it to have ended; a cancel is the cancel request of
// its key.
func (s *Server) signalClient(ctx context.Context, r signalRequest) signalResult {
	s.mu.Lock()
	t := s.sessions[r.pid]
	switch {
	case t == nil:
		s.mu.Unlock()
		return signalNoClient
	case !r.allows(t.user):
		s.mu.Unlock()
		return signalDenied
	}
	var ended chan struct{}
	if r.terminate && r.timeout > 0 {
		// Made while t is registered: its sessionEnded has not run yet.
		ended = s.watchEndLocked(t)
	}
	s.mu.Unlock()
	if !r.terminate {
		s.cancelSession(t.pid, t.secret)
		return signalSent
	}
	s.log.Info("pg_terminate_backend: client terminated", "client", t.remote, "id", t.pid, "app", t.app.cfg.Name, "by_user", r.user)
	t.kill(errTerminated())
	if ended == nil {
		return signalSent
	}
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	select {
	case <-ended:
		return signalSent
	case <-timer.C:
		return signalStillRunning
	case <-ctx.Done():
		return signalCanceled
	}
}

// watchEndLocked returns a channel closed when ss has ended and cleaned up
// (sessionEnded); s.mu is held and ss registered.
func (s *Server) watchEndLocked(ss *session) chan struct{} {
	if s.ends == nil {
		s.ends = make(map[*session]chan struct{})
	}
	ch := s.ends[ss]
	if ch == nil {
		ch = make(chan struct{})
		s.ends[ss] = ch
	}
	return ch
}

// sessionEnded runs at the end of a session's cleanup: whoever waits for
// it to end (watchEndLocked) is told.
func (s *Server) sessionEnded(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.ends[ss]; ch != nil {
		close(ch)
		delete(s.ends, ss)
	}
}

// Signal calls inside larger statements (SELECT pg_terminate_backend(pid)
// FROM unnest($1::int[]) pid, …) run on the server, which knows no key
// pid: for one it warns "PID … is not a PostgreSQL backend process"
// (routine pg_signal_backend, SQLSTATE 01000) and returns false. While a
// statement that calls the signal functions runs (expectSignals), such a
// warning naming the key pid of a client the caller may signal is carried
// out by lockpool instead (onSignalWarning), as KILL_CLIENT or a
// CancelRequest, and not relayed: the client ends as with a backend's
// pid. What lockpool cannot change is the call's value in the row, which
// the server computed: false (PostgreSQL: true), and a timeout argument is
// not waited for. A warning for the caller's own key pid, for a pid the
// caller may not signal, for no client's, or in a statement that calls
// both functions (the warning does not say which) is relayed as it is.

// Bits of sessionExtras.signals: the signal functions a statement running
// on the server calls.
const (
	signalsTerminate = 1 << iota
	signalsCancel
)

// expectSignals notes that a statement with findings f (nil: none) is
// going to the server: its signal functions' warnings are looked at until
// the server owes nothing (onReady clears them).
//
// A statement that calls pg_backend_pid() makes this client the one that
// last read the pid of the backend it runs on (seenPIDs).
func (s *session) expectSignals(f *rewrite.Findings) {
	if f != nil && f.BackendPID && s.link.sc != nil {
		s.srv.seen.note(s.link.sc.PID, s.pid)
	}
	if f == nil || !f.Terminates && !f.Cancels {
		return
	}
	x := s.more()
	if f.Terminates {
		x.signals |= signalsTerminate
	}
	if f.Cancels {
		x.signals |= signalsCancel
	}
}

// onSignalWarning handles a NoticeResponse body the server sent while a
// statement that calls a signal function runs: when it is
// pg_signal_backend's warning for the key pid of a client the caller may
// signal, the signal is sent to that client and onSignalWarning reports
// true (the warning is not the client's: a direct connection has none).
func (s *session) onSignalWarning(body []byte) bool {
	x := s.extras
	if x == nil || x.signals == 0 {
		return false
	}
	var terminate bool
	switch x.signals {
	case signalsTerminate:
		terminate = true
	case signalsCancel:
	default:
		return false // both are called: which one warned is not known
	}
	pid, ok := signalWarningPID(body)
	if !ok || pid == s.pid {
		return false
	}
	r := signalRequest{pid: pid, terminate: terminate, user: s.user, admin: s.srv.Config().IsAdmin(s.user)}
	var res signalResult
	if n := pidNumber(pid); n != 0 && s.srv.cluster != nil && n != s.srv.cluster.Number() {
		ctx, cancel := context.WithTimeout(s.srv.baseCtx, s.srv.rc.Load().cfg.Server.ConnectTimeout)
		s.offload(func() { res, _ = s.srv.forwardSignal(ctx, n, r) })
		cancel()
	} else {
		res = s.srv.signalClient(s.srv.baseCtx, r) // no timeout: it does not wait
	}
	return res == signalSent
}

// signalWarningPID returns the pid of pg_signal_backend's warning that a
// pid is no backend's (body: a NoticeResponse's), when it is a key pid.
// The routine and SQLSTATE identify the warning in every language; the
// pid is the one number of its message.
func signalWarningPID(body []byte) (uint32, bool) {
	var sev, sevV, code, routine, msg string
	for len(body) > 0 && body[0] != 0 {
		field := body[0]
		v, rest, ok := wire.CString(body[1:])
		if !ok {
			return 0, false
		}
		switch field {
		case 'S':
			sev = string(v)
		case 'V':
			sevV = string(v)
		case 'C':
			code = string(v)
		case 'R':
			routine = string(v)
		case 'M':
			msg = string(v)
		}
		body = rest
	}
	if sevV != "" {
		sev = sevV
	}
	if sev != "WARNING" || code != "01000" || routine != "pg_signal_backend" {
		return 0, false
	}
	var num string
	for i := 0; i < len(msg); {
		if msg[i] < '0' || msg[i] > '9' {
			i++
			continue
		}
		j := i
		for j < len(msg) && msg[j] >= '0' && msg[j] <= '9' {
			j++
		}
		if num != "" {
			return 0, false // more than one number: not the message it should be
		}
		num = msg[i:j]
		i = j
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || !isKeyPID(v) {
		return 0, false
	}
	return uint32(v), true
}
