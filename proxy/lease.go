package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// LeaseStore is what the proxy needs from the lease package.
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

func errLeasesOff() *pgError {
	return &pgError{Code: "0A000", Message: "lockpool: leases are not available on this lockpool instance", Hint: "Run lockpool with the leases section configured."}
}

func errLeaseWhole() *pgError {
	return &pgError{Code: "0A000", Message: "lockpool: lease functions must be the whole statement", Hint: "Call them alone: SELECT lease_acquire('name', ttl_seconds) or SELECT * FROM lease_list()."}
}

// Type OIDs of the virtual functions' parameters and results.
const (
	oidBool        = 16
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidFloat4      = 700
	oidFloat8      = 701
	oidUnknown     = 705
	oidVarchar     = 1043
	oidTimestamptz = 1184
	oidNumeric     = 1700
)

type leaseCol struct {
	name string
	oid  uint32
	size int16
}

// leaseCols returns the result columns of a lease call.
func leaseCols(c *rewrite.LeaseCall) []leaseCol {
	switch c.Func {
	case "lease_list":
		return []leaseCol{{"name", oidText, -1}, {"holder", oidText, -1}, {"token", oidInt8, 8}, {"taken_at", oidTimestamptz, 8}, {"expires_at", oidTimestamptz, 8}, {"mine", oidBool, 1}}
	case "lease_acquire":
		return []leaseCol{{colName(c), oidInt8, 8}}
	}
	return []leaseCol{{colName(c), oidBool, 1}}
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
			types[a.Param-1] = oidText
		} else {
			types[a.Param-1] = oidNumeric
		}
	}
	for i := range types {
		if types[i] == 0 {
			types[i] = oidText
		}
	}
	return types
}

// leases is a session's lease calls: the lease kind's localHandler.
type leases struct {
	ls LeaseSession // nil until the first call runs
}

func leaseClaims(_ *session, f *rewrite.Findings, _ policy.Decision) bool {
	return f.Lease != nil || f.LeaseMention
}

func openLeases(*session) localHandler { return &leases{} }

// session returns the session's leases, made at the first call.
func (l *leases) session(s *session) (LeaseSession, *pgError) {
	if s.srv.leases == nil {
		return nil, errLeasesOff()
	}
	if l.ls == nil {
		l.ls = s.srv.leases.NewSession(s.database, uint64(s.pid))
	}
	return l.ls, nil
}

// prepare implements localHandler.
func (l *leases) prepare(s *session, f *rewrite.Findings, _ string, rest []byte) (localStmt, *pgError) {
	if f.Lease == nil {
		return nil, errLeaseWhole()
	}
	if rest != nil && s.srv.leases == nil {
		return nil, errLeasesOff()
	}
	return &leaseStmt{l: l, call: f.Lease}, nil
}

// end releases the session's leases when it ends.
func (l *leases) end(s *session) {
	if l.ls == nil {
		return
	}
	ls := l.ls
	s.offload(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ls.Close(ctx)
	})
}

// readyNotices implements readyNoticer: a WARNING for each lease the
// session lost since the last call.
func (l *leases) readyNotices(_ *session, buf []byte) []byte {
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

func (st *leaseStmt) paramTypes() []uint32 { return leaseParamTypes(st.call) }

func (st *leaseStmt) describe(buf []byte, formats []int16) []byte {
	return appendRowDescription(buf, leaseCols(st.call), formats)
}

// bind takes the arguments by position: literals from the statement, $n
// from Bind (a simple Query has none).
func (st *leaseStmt) bind(_ *session, a *wire.BindArgs, types []uint32) (localPortal, *pgError) {
	var params []any
	if a != nil {
		if len(a.Params) != len(types) {
			return nil, &pgError{Code: "08P01", Message: fmt.Sprintf("lockpool: bind message supplies %d parameters, but prepared statement requires %d", len(a.Params), len(types))}
		}
		params = make([]any, len(a.Params))
		for i, v := range a.Params {
			if v == nil {
				continue
			}
			val, err := decodeParam(v, a.ParamFormat(i), types[i])
			if err != nil {
				return nil, &pgError{Code: "22P02", Message: "lockpool: invalid lease function argument: " + err.Error(), Hint: "Pass the lease name as text and seconds as numbers."}
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
				return nil, &pgError{Code: "08P01", Message: "lockpool: there is no parameter $" + strconv.Itoa(arg.Param), Hint: "Parameters need the extended protocol."}
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

func (p *leasePortal) run(s *session, formats []int16, withDesc bool) ([]byte, *pgError) {
	return p.st.l.exec(s, p.st.call, p.args, formats, withDesc)
}

// exec runs a lease call and encodes its result (RowDescription when
// withDesc, DataRows, CommandComplete), preceded by lost-lease warnings.
func (l *leases) exec(s *session, call *rewrite.LeaseCall, args []any, formats []int16, withDesc bool) ([]byte, *pgError) {
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
	argSecs := func(i int, what string, required bool) (time.Duration, *pgError) {
		v, ok := argStr(i)
		if !ok {
			if required {
				return 0, &pgError{Code: "22004", Message: "lockpool: " + what + " must not be null", Hint: "Pass a number of seconds."}
			}
			return 0, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 365*24*3600 {
			return 0, &pgError{Code: "22023", Message: fmt.Sprintf("lockpool: invalid %s %q", what, v), Hint: "Pass a number of seconds between 0 and 31536000."}
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	nargs := map[string][2]int{"lease_acquire": {2, 3}, "lease_renew": {1, 1}, "lease_release": {1, 1}, "lease_list": {0, 0}}[call.Func]
	if len(call.Args) < nargs[0] || len(call.Args) > nargs[1] {
		return nil, &pgError{Code: "42883", Message: fmt.Sprintf("lockpool: function %s takes %d to %d arguments, got %d", call.Func, nargs[0], nargs[1], len(call.Args)), Hint: "See the Leases section of lockpool's README."}
	}
	var name string
	if call.Func != "lease_list" {
		var ok bool
		name, ok = argStr(0)
		if !ok || name == "" {
			return nil, &pgError{Code: "22004", Message: "lockpool: lease name must not be null or empty", Hint: "Pass the lease name as text."}
		}
	}
	ctx := s.waitContext()
	defer s.endWait()
	cols := leaseCols(call)
	var rows [][]any
	switch call.Func {
	case "lease_acquire":
		ttl, pe := argSecs(1, "ttl_seconds", true)
		if pe != nil {
			return nil, pe
		}
		if ttl <= 0 {
			return nil, &pgError{Code: "22023", Message: "lockpool: ttl_seconds must be greater than 0", Hint: "Pass the lease's time to live in seconds."}
		}
		wait, pe := argSecs(2, "wait_seconds", false)
		if pe != nil {
			return nil, pe
		}
		var tok int64
		var ok bool
		var err error
		s.offload(func() { tok, ok, err = ls.Acquire(ctx, name, ttl, wait) })
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
		s.offload(func() {
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
		s.offload(func() { list, err = ls.List(ctx) })
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

func leaseErr(ctx context.Context, err error) *pgError {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return errCanceled()
	}
	var pe *pgError
	if errors.As(err, &pe) {
		return pe
	}
	if pe, ok := leaseError(err); ok {
		return pe
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
	return &pgError{Code: code, Message: msg, Hint: "Check lockpool's log and the lease schema in PostgreSQL."}
}

func formatFor(formats []int16, i int) int16 {
	switch len(formats) {
	case 0:
		return 0
	case 1:
		return formats[0]
	}
	if i < len(formats) {
		return formats[i]
	}
	return 0
}

func appendRowDescription(buf []byte, cols []leaseCol, formats []int16) []byte {
	buf, start := wire.AppendHeader(buf, 'T')
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(cols)))
	for i, c := range cols {
		buf = wire.AppendCString(buf, c.name)
		buf = binary.BigEndian.AppendUint32(buf, 0)
		buf = binary.BigEndian.AppendUint16(buf, 0)
		buf = binary.BigEndian.AppendUint32(buf, c.oid)
		buf = binary.BigEndian.AppendUint16(buf, uint16(c.size))
		buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
		buf = binary.BigEndian.AppendUint16(buf, uint16(formatFor(formats, i)))
	}
	return wire.FinishMsg(buf, start)
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func appendDataRow(buf []byte, cols []leaseCol, row []any, formats []int16) []byte {
	buf, start := wire.AppendHeader(buf, 'D')
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(cols)))
	for i, v := range row {
		if v == nil {
			buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
			continue
		}
		bin := formatFor(formats, i) == 1
		var val []byte
		switch x := v.(type) {
		case string:
			val = []byte(x)
		case int64:
			if bin {
				val = binary.BigEndian.AppendUint64(nil, uint64(x))
			} else {
				val = strconv.AppendInt(nil, x, 10)
			}
		case bool:
			val = boolValue(bin, x)
		case time.Time:
			if bin {
				val = binary.BigEndian.AppendUint64(nil, uint64(x.Sub(pgEpoch).Microseconds()))
			} else {
				val = []byte(x.UTC().Format("2006-01-02 15:04:05.999999") + "+00")
			}
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(val)))
		buf = append(buf, val...)
	}
	return wire.FinishMsg(buf, start)
}

// decodeParam decodes one lease-call parameter.
func decodeParam(v []byte, format int16, oid uint32) (any, error) {
	if format == 0 {
		return string(v), nil
	}
	switch oid {
	case oidText, oidVarchar, oidUnknown:
		return string(v), nil
	case oidInt2:
		if len(v) == 2 {
			return float64(int16(binary.BigEndian.Uint16(v))), nil
		}
	case oidInt4:
		if len(v) == 4 {
			return float64(int32(binary.BigEndian.Uint32(v))), nil
		}
	case oidInt8:
		if len(v) == 8 {
			return float64(int64(binary.BigEndian.Uint64(v))), nil
		}
	case oidFloat4:
		if len(v) == 4 {
			return float64(math.Float32frombits(binary.BigEndian.Uint32(v))), nil
		}
	case oidFloat8:
		if len(v) == 8 {
			return math.Float64frombits(binary.BigEndian.Uint64(v)), nil
		}
	case oidNumeric:
		return decodeNumeric(v)
	}
	return nil, fmt.Errorf("unsupported binary parameter of type %d", oid)
}

// decodeNumeric decodes PostgreSQL's binary numeric.
func decodeNumeric(v []byte) (any, error) {
	if len(v) < 8 {
		return nil, errors.New("short numeric")
	}
	ndigits := int(binary.BigEndian.Uint16(v))
	weight := int(int16(binary.BigEndian.Uint16(v[2:])))
	sign := binary.BigEndian.Uint16(v[4:])
	if sign == 0xC000 {
		return nil, errors.New("NaN")
	}
	if len(v) < 8+2*ndigits {
		return nil, errors.New("short numeric")
	}
	r := new(big.Float)
	base := big.NewFloat(10000)
	for i := 0; i < ndigits; i++ {
		d := binary.BigEndian.Uint16(v[8+2*i:])
		r.Mul(r, base)
		r.Add(r, big.NewFloat(float64(d)))
	}
	exp := weight - (ndigits - 1)
	f, _ := r.Float64()
	f *= math.Pow(10000, float64(exp))
	if sign == 0x4000 {
		f = -f
	}
	return f, nil
}

// appendLeaseWarnings appends a WARNING notice for each lease the session
// lost since the last call.
func appendLeaseWarnings(buf []byte, ls LeaseSession) []byte {
	for _, w := range ls.TakeWarnings() {
		buf = appendError(buf, 'N', &pgError{Severity: "WARNING", Code: "01000", Message: w, Hint: "Acquire the lease again; another holder may have taken it."})
	}
	return buf
}
