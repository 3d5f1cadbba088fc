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

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/internal/wire"

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

// virtStmt is a prepared lease call (extended protocol).
type virtStmt struct {
	call  *rewrite.LeaseCall
	hold  *rewrite.AdvisoryCall // a held advisory call instead (hold.go)
	types []uint32              // parameter types: the client's where given, else ours
}

// virtPortal is a bound lease call.
type virtPortal struct {
	vs      *virtStmt
	held    advisory.Params // a held call's parameters, as sent
	params  []any           // string, float64, or nil
	formats []int16
}

func (s *session) leaseSession() (LeaseSession, *pgError) {
	if s.srv.leases == nil {
		return nil, errLeasesOff()
	}
	x := s.more()
	if x.lease == nil {
		x.lease = s.srv.leases.NewSession(s.database, uint64(s.pid))
	}
	return x.lease, nil
}

// closeLeases releases the session's leases when it ends.
func (s *session) closeLeases() {
	if s.extras == nil || s.extras.lease == nil {
		return
	}
	ls := s.extras.lease
	s.offload(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ls.Close(ctx)
	})
}

// onLeaseQuery answers a simple-protocol lease call, in its place in the
// client's reply order.
func (s *session) onLeaseQuery(f *rewrite.Findings, _ string) error {
	if f.Lease == nil {
		return s.fail(errLeaseWhole(), true)
	}
	if err := s.settle(); err != nil {
		return err
	}
	status := s.status()
	if status == 'E' {
		s.pushLocal(wire.AppendReadyForQuery(appendError(nil, 'E', errAborted()), 'E'), nil)
		return nil
	}
	args := make([]any, len(f.Lease.Args))
	for i, a := range f.Lease.Args {
		switch a.Kind {
		case rewrite.ArgString, rewrite.ArgNumber:
			args[i] = a.Text
		case rewrite.ArgParam:
			return s.fail(&pgError{Code: "08P01", Message: "lockpool: there is no parameter $" + strconv.Itoa(a.Param), Hint: "Parameters need the extended protocol."}, true)
		}
	}
	buf, pe := s.execLease(f.Lease, args, nil, true)
	if pe != nil {
		return s.fail(pe, true)
	}
	s.pushLocal(wire.AppendReadyForQuery(buf, s.status()), nil)
	return nil
}

// execLease runs a lease call and encodes its result (RowDescription when
// withDesc, DataRows, CommandComplete), preceded by lost-lease warnings.
func (s *session) execLease(call *rewrite.LeaseCall, args []any, formats []int16, withDesc bool) ([]byte, *pgError) {
	ls, err := s.leaseSession()
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

// onLeaseParse handles Parse of a lease call: answered by lockpool.
func (s *session) onLeaseParse(f *rewrite.Findings, name string, rest []byte) error {
	if f.Lease == nil {
		return s.fail(errLeaseWhole(), false)
	}
	if s.srv.leases == nil {
		return s.fail(errLeasesOff(), false)
	}
	vs := &virtStmt{call: f.Lease, types: leaseParamTypes(f.Lease)}
	// The client's declared parameter types win where given.
	_, tail, _ := wire.CString(rest)
	if len(tail) >= 2 {
		n := int(binary.BigEndian.Uint16(tail))
		tail = tail[2:]
		for i := 0; i < n && len(tail) >= 4; i++ {
			oid := binary.BigEndian.Uint32(tail)
			tail = tail[4:]
			if oid != 0 && i < len(vs.types) {
				vs.types[i] = oid
			}
		}
	}
	s.prepareVirtual(name, vs)
	return nil
}

// prepareVirtual registers vs, a statement lockpool answers itself, under
// name and owes the client its ParseComplete. Should an earlier error in
// the batch skip that reply, the Parse never happened: the name goes back
// to what it was.
func (s *session) prepareVirtual(name string, vs *virtStmt) {
	x := s.more()
	if x.virt == nil {
		x.virt = make(map[string]*virtStmt)
	}
	prev := x.virt[name]
	x.virt[name] = vs
	s.pushLocal(msgParseComplete, func() {
		if prev != nil {
			x.virt[name] = prev
		} else {
			delete(x.virt, name)
		}
	})
}

// forgetVirtual drops a virtual statement when the client reuses the name.
func (s *session) forgetVirtual(name []byte) {
	if s.extras != nil {
		delete(s.extras.virt, string(name))
	}
}

// bindVirtual handles Bind of a lease call.
func (s *session) bindVirtual(vs *virtStmt, portal []byte, tail []byte) error {
	if vs.hold != nil {
		return s.bindHeld(vs, portal, tail)
	}
	var a wire.BindArgs
	if err := (wire.Bind{Tail: tail}).Args(&a); err != nil {
		return err
	}
	if len(a.Params) != len(vs.types) {
		return s.fail(&pgError{Code: "08P01", Message: fmt.Sprintf("lockpool: bind message supplies %d parameters, but prepared statement requires %d", len(a.Params), len(vs.types))}, false)
	}
	params := make([]any, len(a.Params))
	for i, v := range a.Params {
		if v == nil {
			continue
		}
		val, err := decodeParam(v, a.ParamFormat(i), vs.types[i])
		if err != nil {
			return s.fail(&pgError{Code: "22P02", Message: "lockpool: invalid lease function argument: " + err.Error(), Hint: "Pass the lease name as text and seconds as numbers."}, false)
		}
		params[i] = val
	}
	rf := append([]int16(nil), a.ResultFormats...)
	x := s.more()
	if x.vportals == nil {
		x.vportals = make(map[string]*virtPortal)
	}
	x.vportals[string(portal)] = &virtPortal{vs: vs, params: params, formats: rf}
	s.pushLocal(msgBindComplete, nil)
	return nil
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

// describeVirtual answers Describe of a lease statement or portal.
func (s *session) describeVirtual(vs *virtStmt, vp *virtPortal) error {
	if vs != nil && vs.hold != nil || vp != nil && vp.vs.hold != nil {
		return s.describeHeld(vs, vp)
	}
	var buf []byte
	if vp == nil {
		buf, start := wire.AppendHeader(buf, 't')
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(vs.types)))
		for _, t := range vs.types {
			buf = binary.BigEndian.AppendUint32(buf, t)
		}
		buf = wire.FinishMsg(buf, start)
		s.pushLocal(appendRowDescription(buf, leaseCols(vs.call), nil), nil)
		return nil
	}
	s.pushLocal(appendRowDescription(buf, leaseCols(vp.vs.call), vp.formats), nil)
	return nil
}

// executeVirtual runs a bound lease call.
func (s *session) executeVirtual(vp *virtPortal) error {
	if vp.vs.hold != nil {
		return s.executeHeld(vp)
	}
	// The call runs only if everything before it in the batch succeeded,
	// as PostgreSQL would run it.
	if err := s.settle(); err != nil {
		return err
	}
	if s.skipping {
		return nil
	}
	if s.status() == 'E' {
		return s.fail(errAborted(), false)
	}
	// Arguments by position: literals from the statement, $n from Bind.
	args := make([]any, len(vp.vs.call.Args))
	for i, a := range vp.vs.call.Args {
		switch a.Kind {
		case rewrite.ArgString, rewrite.ArgNumber:
			args[i] = a.Text
		case rewrite.ArgParam:
			if a.Param-1 < len(vp.params) {
				args[i] = vp.params[a.Param-1]
			}
		}
	}
	buf, pe := s.execLease(vp.vs.call, args, vp.formats, false)
	if pe != nil {
		return s.fail(pe, false)
	}
	s.pushLocal(buf, nil)
	return nil
}

// appendLeaseWarnings appends a WARNING notice for each lease the session
// lost since the last call.
func appendLeaseWarnings(buf []byte, ls LeaseSession) []byte {
	for _, w := range ls.TakeWarnings() {
		buf = appendError(buf, 'N', &pgError{Severity: "WARNING", Code: "01000", Message: w, Hint: "Acquire the lease again; another holder may have taken it."})
	}
	return buf
}
