package local

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/lease"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// LeaseStore is what the lease kind needs from the lease package.
type LeaseStore interface {
	NewSession(database string, id uint64) LeaseSession
	Schema() string
	Close()
}

// LeaseSession is one client session's leases.
type LeaseSession interface {
	Acquire(ctx context.Context, name string, ttl, wait time.Duration) (token int64, ok bool, err error)
	Renew(ctx context.Context, name string) (bool, error)
	Release(ctx context.Context, name string) (bool, error)
	List(ctx context.Context) ([]LeaseRow, error)
	TakeWarnings() []string
	Close(ctx context.Context)
}

// LeaseRow is one row of lease_list().
type LeaseRow struct {
	Name, Holder       string
	Token              int64
	TakenAt, ExpiresAt time.Time
	Mine               bool
}

func errLeasesOff() *pgerr.Error {
	return &pgerr.Error{Code: "0A000", Message: "lockpool: leases are not available on this lockpool instance", Hint: "Run lockpool with the leases section configured."}
}

func errLeaseWhole() *pgerr.Error {
	return &pgerr.Error{Code: "0A000", Message: "lockpool: lease functions must be the whole statement", Hint: "Call them alone: SELECT lease_acquire('name', ttl_seconds) or SELECT * FROM lease_list()."}
}

// leaseCols returns the result columns of a lease call.
func leaseCols(c *rewrite.LeaseCall) []column {
	switch c.Func {
	case "lease_list":
		return []column{{"name", wire.OIDText, -1}, {"holder", wire.OIDText, -1}, {"token", wire.OIDInt8, 8}, {"taken_at", wire.OIDTimestamptz, 8}, {"expires_at", wire.OIDTimestamptz, 8}, {"mine", wire.OIDBool, 1}}
	case "lease_acquire":
		return []column{{colName(c), wire.OIDInt8, 8}}
	}
	return []column{{colName(c), wire.OIDBool, 1}}
}

func colName(c *rewrite.LeaseCall) string {
	if c.Alias != "" {
		return c.Alias
	}
	return c.Func
}

// leaseParamTypes are the declared types of a call's parameters.
func leaseParamTypes(c *rewrite.LeaseCall) []uint32 {
	n := 0
	for _, a := range c.Args {
		if a.Kind == rewrite.ArgParam && a.Param > n {
			n = a.Param
		}
	}
	types := make([]uint32, n)
	for i, a := range c.Args {
		if a.Kind != rewrite.ArgParam {
			continue
		}
		if i == 0 {
			types[a.Param-1] = wire.OIDText
		} else {
			types[a.Param-1] = wire.OIDNumeric
		}
	}
	for i := range types {
		if types[i] == 0 {
			types[i] = wire.OIDText
		}
	}
	return types
}

// LeaseKind is the kind of lease_acquire, lease_renew, lease_release and
// lease_list calls: each must be the whole statement, and runs on the
// lease store (Session.Leases).
func LeaseKind() Kind {
	return Kind{name: "lease", claims: leaseClaims, open: openLeases}
}

// leases is a session's lease calls: the lease kind's Handler.
type leases struct {
	ls LeaseSession // nil until the first call runs
}

func leaseClaims(_ Session, f *rewrite.Findings, _ policy.Decision) bool {
	return f.Lease != nil || f.LeaseMention
}

func openLeases(Session) Handler { return &leases{} }

// session returns the session's leases, made at the first call.
func (l *leases) session(s Session) (LeaseSession, *pgerr.Error) {
	store := s.Leases()
	if store == nil {
		return nil, errLeasesOff()
	}
	if l.ls == nil {
		l.ls = store.NewSession(s.Database(), uint64(s.PID()))
	}
	return l.ls, nil
}

// Prepare implements Handler.
func (l *leases) Prepare(s Session, f *rewrite.Findings, _ string, rest []byte) (Stmt, *pgerr.Error) {
	if f.Lease == nil {
		return nil, errLeaseWhole()
	}
	if rest != nil && s.Leases() == nil {
		return nil, errLeasesOff()
	}
	return &leaseStmt{l: l, call: f.Lease}, nil
}

// End releases the session's leases when it ends.
func (l *leases) End(s Session) {
	if l.ls == nil {
		return
	}
	ls := l.ls
	s.Offload(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ls.Close(ctx)
	})
}

// ReadyNotices implements ReadyNoticer: a WARNING for each lease the
// session lost since the last call.
func (l *leases) ReadyNotices(_ Session, buf []byte) []byte {
	if l.ls == nil {
		return buf
	}
	return appendLeaseWarnings(buf, l.ls)
}

// leaseStmt is a lease call, prepared.
type leaseStmt struct {
	l    *leases
	call *rewrite.LeaseCall
}

// ParamTypes implements Stmt.
func (st *leaseStmt) ParamTypes() []uint32 { return leaseParamTypes(st.call) }

// Describe implements Stmt.
func (st *leaseStmt) Describe(buf []byte, formats []int16) []byte {
	return appendRowDescription(buf, leaseCols(st.call), formats)
}

// Bind takes the arguments by position: literals from the statement, $n
// from Bind (a simple Query has none).
func (st *leaseStmt) Bind(_ Session, a *wire.BindArgs, types []uint32) (Portal, *pgerr.Error) {
	var params []any
	if a != nil {
		if len(a.Params) != len(types) {
			return nil, &pgerr.Error{Code: "08P01", Message: fmt.Sprintf("lockpool: bind message supplies %d parameters, but prepared statement requires %d", len(a.Params), len(types))}
		}
		params = make([]any, len(a.Params))
		for i, v := range a.Params {
			if v == nil {
				continue
			}
			val, err := decodeParam(v, a.ParamFormat(i), types[i])
			if err != nil {
				return nil, &pgerr.Error{Code: "22P02", Message: "lockpool: invalid lease function argument: " + err.Error(), Hint: "Pass the lease name as text and seconds as numbers."}
			}
			params[i] = val
		}
	}
	args := make([]any, len(st.call.Args))
	for i, arg := range st.call.Args {
		switch arg.Kind {
		case rewrite.ArgString, rewrite.ArgNumber:
			args[i] = arg.Text
		case rewrite.ArgParam:
			if a == nil {
				return nil, &pgerr.Error{Code: "08P01", Message: "lockpool: there is no parameter $" + strconv.Itoa(arg.Param), Hint: "Parameters need the extended protocol."}
			}
			if arg.Param-1 < len(params) {
				args[i] = params[arg.Param-1]
			}
		}
	}
	return &leasePortal{st: st, args: args}, nil
}

// leasePortal is a bound lease call.
type leasePortal struct {
	st   *leaseStmt
	args []any // string, float64, or nil
}

// Run implements Portal.
func (p *leasePortal) Run(s Session, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
	return p.st.l.exec(s, p.st.call, p.args, formats, withDesc)
}

// exec runs a lease call and encodes its result (RowDescription when
// withDesc, DataRows, CommandComplete), preceded by lost-lease warnings.
func (l *leases) exec(s Session, call *rewrite.LeaseCall, args []any, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
	ls, err := l.session(s)
	if err != nil {
		return nil, err
	}
	argStr := func(i int) (string, bool) {
		if i >= len(args) || args[i] == nil {
			return "", false
		}
		switch v := args[i].(type) {
		case string:
			return v, true
		case float64:
			return strconv.FormatFloat(v, 'f', -1, 64), true
		}
		return fmt.Sprint(args[i]), true
	}
	argSecs := func(i int, what string, required bool) (time.Duration, *pgerr.Error) {
		v, ok := argStr(i)
		if !ok {
			if required {
				return 0, &pgerr.Error{Code: "22004", Message: "lockpool: " + what + " must not be null", Hint: "Pass a number of seconds."}
			}
			return 0, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 365*24*3600 {
			return 0, &pgerr.Error{Code: "22023", Message: fmt.Sprintf("lockpool: invalid %s %q", what, v), Hint: "Pass a number of seconds between 0 and 31536000."}
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	nargs := map[string][2]int{"lease_acquire": {2, 3}, "lease_renew": {1, 1}, "lease_release": {1, 1}, "lease_list": {0, 0}}[call.Func]
	if len(call.Args) < nargs[0] || len(call.Args) > nargs[1] {
		return nil, &pgerr.Error{Code: "42883", Message: fmt.Sprintf("lockpool: function %s takes %d to %d arguments, got %d", call.Func, nargs[0], nargs[1], len(call.Args)), Hint: "See the Leases section of lockpool's README."}
	}
	var name string
	if call.Func != "lease_list" {
		var ok bool
		name, ok = argStr(0)
		if !ok || name == "" {
			return nil, &pgerr.Error{Code: "22004", Message: "lockpool: lease name must not be null or empty", Hint: "Pass the lease name as text."}
		}
	}
	ctx := s.WaitContext()
	defer s.EndWait()
	cols := leaseCols(call)
	var rows [][]any
	switch call.Func {
	case "lease_acquire":
		ttl, pe := argSecs(1, "ttl_seconds", true)
		if pe != nil {
			return nil, pe
		}
		if ttl <= 0 {
			return nil, &pgerr.Error{Code: "22023", Message: "lockpool: ttl_seconds must be greater than 0", Hint: "Pass the lease's time to live in seconds."}
		}
		wait, pe := argSecs(2, "wait_seconds", false)
		if pe != nil {
			return nil, pe
		}
		var tok int64
		var ok bool
		var err error
		s.Offload(func() { tok, ok, err = ls.Acquire(ctx, name, ttl, wait) })
		if err != nil {
			return nil, leaseErr(ctx, err)
		}
		if ok {
			rows = [][]any{{tok}}
		} else {
			rows = [][]any{{nil}}
		}
	case "lease_renew", "lease_release":
		var ok bool
		var err error
		s.Offload(func() {
			if call.Func == "lease_renew" {
				ok, err = ls.Renew(ctx, name)
			} else {
				ok, err = ls.Release(ctx, name)
			}
		})
		if err != nil {
			return nil, leaseErr(ctx, err)
		}
		rows = [][]any{{ok}}
	case "lease_list":
		var list []LeaseRow
		var err error
		s.Offload(func() { list, err = ls.List(ctx) })
		if err != nil {
			return nil, leaseErr(ctx, err)
		}
		for _, r := range list {
			rows = append(rows, []any{r.Name, r.Holder, r.Token, r.TakenAt, r.ExpiresAt, r.Mine})
		}
	}
	buf := appendLeaseWarnings(nil, ls)
	if withDesc {
		buf = appendRowDescription(buf, cols, formats)
	}
	for _, r := range rows {
		buf = appendDataRow(buf, cols, r, formats)
	}
	buf, start := wire.AppendHeader(buf, 'C')
	buf = wire.AppendCString(buf, "SELECT "+strconv.Itoa(len(rows)))
	buf = wire.FinishMsg(buf, start)
	return buf, nil
}

func leaseErr(ctx context.Context, err error) *pgerr.Error {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return pgerr.Canceled()
	}
	var pe *pgerr.Error
	if errors.As(err, &pe) {
		return pe
	}
	var le *lease.Error
	if errors.As(err, &le) {
		return &pgerr.Error{Code: le.Code, Message: le.Message, Hint: le.Hint}
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "lockpool:") {
		msg = "lockpool: lease operation failed: " + msg
	}
	code := "58000"
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) && coded.SQLState() != "" {
		code = coded.SQLState()
	}
	return &pgerr.Error{Code: code, Message: msg, Hint: "Check lockpool's log and the lease schema in PostgreSQL."}
}

// appendLeaseWarnings appends a WARNING notice for each lease the session
// lost since the last call.
func appendLeaseWarnings(buf []byte, ls LeaseSession) []byte {
	for _, w := range ls.TakeWarnings() {
		buf = (&pgerr.Error{Severity: "WARNING", Code: "01000", Message: w, Hint: "Acquire the lease again; another holder may have taken it."}).AppendTo(buf, 'N')
	}
	return buf
}
