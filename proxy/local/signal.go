package local

import (
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
// kind. A client's key pid (the pid of its BackendKeyData, Session.PID) is its
// identity for PostgreSQL's signal functions, as a backend's pid is on a
// direct connection.
//   - A statement that is one call, SELECT [pg_catalog.]pg_terminate_backend(pid
//     [, timeout]) or SELECT pg_cancel_backend(pid) with constants or $n
//     (rewrite.SignalCall), is claimed when its pid is a parameter, or a
//     constant that is the key pid of a client of this instance or carries
//     the number of another live instance of the cluster. Every other
//     statement that calls them, and a constant pid that is no client's (a
//     backend's pid among them), goes to the server unchanged.
//   - Terminating a client ends it as KILL_CLIENT does (Session.Kill): FATAL
//     57P01 with PostgreSQL's message; its transaction is rolled back with
//     its server connection, its leases, held locks and LISTENs are
//     released. With a timeout > 0 the call waits up to that many
//     milliseconds for the client's session to have ended and cleaned up,
//     else warns and returns false, as PostgreSQL does for a backend.
//   - Cancelling a client is a CancelRequest with its key: its statement
//     running on the server, or its wait in lockpool, ends with 57014.
//   - The caller may signal a client that logged in as the same user, or any
//     client when the caller logged in as one of admin_users; otherwise the
//     call fails with PostgreSQL 15's 42501 error.
//   - The caller's own key pid: pg_terminate_backend ends the caller with
//     the FATAL, pg_cancel_backend fails with 57014, as PostgreSQL does for
//     its own backend.
//   - A key pid with another instance's number goes to that instance
//     (Session.Signal forwards it), which answers as above for its clients.
//   - A backend's pid that a client of this instance read from
//     pg_backend_pid() (Session.ClientPID: the last client that read it) stands for
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

// SignalKind is the kind of pg_terminate_backend and pg_cancel_backend
// calls, whole statements, of a client's key pid (Session.Signal).
func SignalKind() Kind {
	return Kind{name: "signal", claims: signalClaims, open: openSignal}
}

// signalling is the signal kind's Handler; it keeps no per-session state.
type signalling struct{}

func openSignal(Session) Handler { return signalling{} }

// End implements Handler.
func (signalling) End(Session) {}

// signalClaims claims a whole-statement signal call PostgreSQL would run
// (see signalShape) whose pid is a parameter or a constant key pid of a
// live client (or of another live instance), or a backend's pid a client
// read.
func signalClaims(s Session, f *rewrite.Findings, _ policy.Decision) bool {
	c := f.Signal
	if c == nil || !signalShape(c) {
		return false
	}
	if c.Args[0].Kind == rewrite.ArgParam {
		return true
	}
	typ, _ := signalArgType(c.Args[0], 0)
	pid, _ := signalConstant(c.Args[0], typ)
	key, keyShaped, ok := s.ClientPID(pid)
	if keyShaped {
		return s.KeyPIDLive(key)
	}
	return ok
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
			return wire.OIDInt4, true
		}
		return wire.OIDInt8, true
	case "int2", "smallint":
		return wire.OIDInt2, true
	case "int", "int4", "integer":
		return wire.OIDInt4, true
	case "int8", "bigint":
		return wire.OIDInt8, i > 0
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
	case wire.OIDInt2:
		return "smallint"
	case wire.OIDInt8:
		return "bigint"
	}
	return "integer"
}

// fitsType reports whether v is in the range of integer type typ.
func fitsType(v int64, typ uint32) bool {
	switch typ {
	case wire.OIDInt2:
		return v >= math.MinInt16 && v <= math.MaxInt16
	case wire.OIDInt4:
		return v >= math.MinInt32 && v <= math.MaxInt32
	}
	return true
}

// parseIntText reads an integer of type typ from text as PostgreSQL's
// int2in, int4in and int8in do (spaces around, a sign), with their errors.
func parseIntText(text string, typ uint32) (int64, *pgerr.Error) {
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

// Prepare implements Handler: the parameters' types are what PostgreSQL
// infers (integer for the pid, bigint for the timeout, the type of a cast)
// unless the client declared them.
func (signalling) Prepare(_ Session, f *rewrite.Findings, _ string, rest []byte) (Stmt, *pgerr.Error) {
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
		if i < len(declared) && declared[i] != 0 && declared[i] != wire.OIDUnknown {
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
		case a.Cast == "" && (typ == wire.OIDInt2 || typ == wire.OIDInt4 || typ == wire.OIDInt8 && i > 0):
		case a.Cast != "" && (typ == wire.OIDInt2 || typ == wire.OIDInt4 || typ == wire.OIDInt8 || typ == wire.OIDText || typ == wire.OIDVarchar):
		case a.Cast == "":
			return nil, errNoSignalFunction(c, st.types)
		default:
			return nil, pgerr.Newf(pgerr.FeatureNotSupported, "Declare the parameter as an integer, or leave its type to the server.",
				"a parameter of type %d cast in a %s call is not supported", typ, c.Func)
		}
	}
	return st, nil
}

// errNoSignalFunction is PostgreSQL's error for a call whose argument
// types no signal function takes (types: the parameters' types).
func errNoSignalFunction(c *rewrite.SignalCall, types []uint32) *pgerr.Error {
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
	case wire.OIDBool:
		return "boolean"
	case wire.OIDInt2, wire.OIDInt4, wire.OIDInt8:
		return intTypeName(oid)
	case wire.OIDText:
		return "text"
	case wire.OIDFloat4:
		return "real"
	case wire.OIDFloat8:
		return "double precision"
	case wire.OIDVarchar:
		return "character varying"
	case wire.OIDNumeric:
		return "numeric"
	case wire.OIDTimestamptz:
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

// ParamTypes implements Stmt.
func (st *signalStmt) ParamTypes() []uint32 { return append([]uint32(nil), st.types...) }

func (st *signalStmt) cols() []column {
	return []column{{signalColName(st.call), wire.OIDBool, 1}}
}

// Describe implements Stmt.
func (st *signalStmt) Describe(buf []byte, formats []int16) []byte {
	return appendRowDescription(buf, st.cols(), formats)
}

// Bind reads the pid and the timeout: constants from the statement, $n
// from the Bind, each of the parameter's type (types) and then of its
// argument's.
func (st *signalStmt) Bind(_ Session, a *wire.BindArgs, types []uint32) (Portal, *pgerr.Error) {
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
func decodeIntParam(raw []byte, format int16, ptyp, typ uint32, n int) (int64, *pgerr.Error) {
	var v int64
	switch {
	case format == 0:
		from := ptyp
		if from == wire.OIDText || from == wire.OIDVarchar {
			from = typ // text cast to an integer type
		}
		var pe *pgerr.Error
		if v, pe = parseIntText(string(raw), from); pe != nil {
			return 0, pe
		}
	case ptyp == wire.OIDInt2 && len(raw) == 2:
		v = int64(int16(binary.BigEndian.Uint16(raw)))
	case ptyp == wire.OIDInt4 && len(raw) == 4:
		v = int64(int32(binary.BigEndian.Uint32(raw)))
	case ptyp == wire.OIDInt8 && len(raw) == 8:
		v = int64(binary.BigEndian.Uint64(raw))
	case ptyp == wire.OIDText || ptyp == wire.OIDVarchar:
		var pe *pgerr.Error
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
	case wire.OIDInt2:
		return 2
	case wire.OIDInt4:
		return 4
	case wire.OIDInt8:
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

// Run signals the client whose key pid the call names, or sends the call
// to the server when the pid is no client's.
func (p *signalPortal) Run(s Session, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
	c := p.st.call
	if p.null {
		return p.reply(nil, nil, formats, withDesc), nil
	}
	if c.Terminate() && p.timeout < 0 {
		return nil, pgerr.New(pgerr.NumericValueOutOfRange, `"timeout" must not be negative`, "")
	}
	// A backend's pid that a client read from pg_backend_pid() names that
	// client's session, as it would on PostgreSQL.
	pid, _, ok := s.ClientPID(p.pid)
	if !ok {
		return p.pass(s, formats, withDesc)
	}
	if pid == s.PID() {
		if c.Terminate() {
			return nil, ErrTerminated()
		}
		return nil, pgerr.New(pgerr.QueryCanceled, "canceling statement due to user request", "")
	}
	res, err := s.Signal(pid, c.Terminate(), time.Duration(p.timeout)*time.Millisecond)
	switch res {
	case SignalSent:
		return p.reply(true, nil, formats, withDesc), nil
	case SignalStillRunning:
		unit := "milliseconds"
		if p.timeout == 1 {
			unit = "millisecond"
		}
		return p.reply(false, pgerr.NoticeWarning(fmt.Sprintf("backend with PID %d did not terminate within %d %s", pid, p.timeout, unit), ""), formats, withDesc), nil
	case SignalDenied:
		return nil, errSignalDenied(c.Terminate())
	case SignalCanceled:
		return nil, pgerr.Canceled()
	case SignalUnreachable:
		return p.reply(false, pgerr.NoticeWarning(fmt.Sprintf("lockpool: could not send the signal to the lockpool instance serving PID %d: %v", pid, err),
			"That instance of the cluster did not answer; the client may still run."), formats, withDesc), nil
	}
	return p.pass(s, formats, withDesc) // no client has that key pid
}

// reply is the call's result v (a bool, or nil for NULL), with a notice
// before the row when there is one, as PostgreSQL sends them.
func (p *signalPortal) reply(v any, notice *pgerr.Error, formats []int16, withDesc bool) []byte {
	cols := p.st.cols()
	var buf []byte
	if withDesc {
		buf = appendRowDescription(buf, cols, formats)
	}
	if notice != nil {
		buf = notice.AppendTo(buf, 'N')
	}
	buf = appendDataRow(buf, cols, []any{v}, formats)
	return wire.AppendCommandComplete(buf, "SELECT 1")
}

// pass answers a call whose pid is no client's key pid. A bound call
// goes to the server as the client sent it: an unnamed Parse of its text
// and declared types, a Bind of its parameters and result formats, and an
// Execute, whose rows, notices or error take the call's place in the reply
// order (the ParseComplete and BindComplete are lockpool's, not passed on).
// A simple Query's pid is a constant that was a live client's key pid, or
// a backend pid a client had read, when the statement was claimed, and
// that client has ended since: PostgreSQL's answer for a pid that names no
// backend (for a backend pid that may be untrue: the backend may still
// run).
func (p *signalPortal) pass(s Session, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
	if p.tail == nil || p.st.rest == nil {
		return p.reply(false, pgerr.NoticeWarning(fmt.Sprintf("PID %d is not a PostgreSQL backend process", p.pid), ""), formats, withDesc), nil
	}
	return nil, s.Forward(p.st.rest, p.tail)
}

// ErrTerminated is PostgreSQL's FATAL for a backend pg_terminate_backend
// ended.
func ErrTerminated() *pgerr.Error {
	return &pgerr.Error{Severity: pgerr.SeverityFatal, Code: pgerr.AdminShutdown, Message: "terminating connection due to administrator command"}
}

// errSignalDenied is PostgreSQL 15's error for a caller that may not
// signal the client (terminate: pg_terminate_backend, else
// pg_cancel_backend).
func errSignalDenied(terminate bool) *pgerr.Error {
	if terminate {
		return pgerr.New(pgerr.InsufficientPrivilege, "must be a member of the role whose process is being terminated or member of pg_signal_backend", "")
	}
	return pgerr.New(pgerr.InsufficientPrivilege, "must be a member of the role whose query is being canceled or member of pg_signal_backend", "")
}

// SignalResult is what became of a signal of a key pid (Session.Signal).
type SignalResult uint8

// The results of a signal.
const (
	SignalNoClient     SignalResult = iota // no client has the key pid
	SignalSent                             // the client was terminated (and ended within the timeout) or its statement cancelled
	SignalStillRunning                     // terminate with a timeout: the client had not ended when it passed
	SignalDenied                           // the caller may not signal that client
	SignalCanceled                         // the caller's wait was cancelled
	SignalUnreachable                      // the instance serving the client did not answer
)

// SignalWarningPID returns the pid of pg_signal_backend's warning that a
// pid is no backend's (body: a NoticeResponse's), the one the signal kind
// gives for such a pid itself; ok is false for any other notice. The
// routine and SQLSTATE identify the warning in every language; the pid
// is the one number of its message.
func SignalWarningPID(body []byte) (int64, bool) {
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
	if err != nil {
		return 0, false
	}
	return v, true
}
