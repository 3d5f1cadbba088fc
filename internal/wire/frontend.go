package wire

import "encoding/binary"

// Query is a simple Query message: one SQL string.
type Query struct {
	SQL []byte // without the terminating NUL
}

// ParseQuery parses a Query body.
func ParseQuery(body []byte) (Query, error) {
	sql, rest, ok := CString(body)
	if !ok {
		return Query{}, malformed("Query", "missing NUL after the query string")
	}
	if len(rest) > 0 {
		return Query{}, malformed("Query", "data after the query string")
	}
	return Query{SQL: sql}, nil
}

// AppendTo appends q as a message.
func (q Query) AppendTo(dst []byte) []byte { return AppendQuery(dst, q.SQL) }

// OIDs is a view of a list of type OIDs (big-endian uint32s).
type OIDs struct{ raw []byte }

// Len is the number of OIDs.
func (o OIDs) Len() int { return len(o.raw) / 4 }

// At returns the i-th OID (0 ≤ i < Len).
func (o OIDs) At(i int) uint32 { return binary.BigEndian.Uint32(o.raw[4*i:]) }

// Clone returns OIDs that own their bytes.
func (o OIDs) Clone() OIDs {
	if o.raw == nil {
		return OIDs{}
	}
	return OIDs{raw: append([]byte(nil), o.raw...)}
}

// Parse is a Parse message: a statement name (empty: the unnamed
// statement), its SQL and the parameter types the client declared (0:
// unspecified).
type Parse struct {
	Name      []byte
	SQL       []byte
	ParamOIDs OIDs
}

// ParseParse parses a Parse body.
func ParseParse(body []byte) (Parse, error) {
	name, rest, ok := CString(body)
	if !ok {
		return Parse{}, malformed("Parse", "missing NUL after the statement name")
	}
	sql, rest, ok := CString(rest)
	if !ok {
		return Parse{}, malformed("Parse", "missing NUL after the query string")
	}
	if len(rest) < 2 {
		return Parse{}, malformed("Parse", "missing parameter type count")
	}
	n := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 4*n {
		if len(rest) < 4*n {
			return Parse{}, malformed("Parse", "truncated parameter types")
		}
		return Parse{}, malformed("Parse", "data after the parameter types")
	}
	return Parse{Name: name, SQL: sql, ParamOIDs: OIDs{raw: rest[: 4*n : 4*n]}}, nil
}

// AppendTo appends p as a message.
func (p Parse) AppendTo(dst []byte) []byte {
	return AppendParseOIDs(dst, p.Name, p.SQL, p.ParamOIDs)
}

// Clone returns a copy of p that owns its bytes (one allocation).
func (p Parse) Clone() Parse {
	b := make([]byte, 0, len(p.Name)+len(p.SQL)+len(p.ParamOIDs.raw))
	b = append(b, p.Name...)
	b = append(b, p.SQL...)
	b = append(b, p.ParamOIDs.raw...)
	n, s := len(p.Name), len(p.Name)+len(p.SQL)
	return Parse{Name: b[:n:n], SQL: b[n:s:s], ParamOIDs: OIDs{raw: b[s:]}}
}

// Bind is a Bind message: a portal (empty: the unnamed portal), the
// statement it binds, and the rest of the body undecoded. ParseBind has
// checked Tail; Args decodes it.
type Bind struct {
	Portal []byte
	Stmt   []byte
	// Tail is parameter format codes, parameter values and result format
	// codes, as on the wire.
	Tail []byte
}

// ParseBind parses a Bind body, checking every length in it.
func ParseBind(body []byte) (Bind, error) {
	portal, rest, ok := CString(body)
	if !ok {
		return Bind{}, malformed("Bind", "missing NUL after the portal name")
	}
	stmt, tail, ok := CString(rest)
	if !ok {
		return Bind{}, malformed("Bind", "missing NUL after the statement name")
	}
	if err := walkBindTail(tail, nil); err != nil {
		return Bind{}, err
	}
	return Bind{Portal: portal, Stmt: stmt, Tail: tail[:len(tail):len(tail)]}, nil
}

// AppendTo appends b as a message.
func (b Bind) AppendTo(dst []byte) []byte { return AppendBind(dst, b.Portal, b.Stmt, b.Tail) }

// Clone returns a copy of b that owns its bytes (one allocation).
func (b Bind) Clone() Bind {
	buf := make([]byte, 0, len(b.Portal)+len(b.Stmt)+len(b.Tail))
	buf = append(buf, b.Portal...)
	buf = append(buf, b.Stmt...)
	buf = append(buf, b.Tail...)
	p, s := len(b.Portal), len(b.Portal)+len(b.Stmt)
	return Bind{Portal: buf[:p:p], Stmt: buf[p:s:s], Tail: buf[s:]}
}

// NumParams is the number of parameter values b carries (0 for a Tail
// that does not parse).
func (b Bind) NumParams() int {
	t := b.Tail
	if len(t) < 2 {
		return 0
	}
	off := 2 + 2*int(binary.BigEndian.Uint16(t))
	if len(t) < off+2 {
		return 0
	}
	return int(binary.BigEndian.Uint16(t[off:]))
}

// Args decodes b.Tail into a, reusing a's slices. The parameter values
// alias b's body (nil is NULL).
func (b Bind) Args(a *BindArgs) error {
	return walkBindTail(b.Tail, a)
}

// BindArgs is the decoded tail of a Bind.
type BindArgs struct {
	ParamFormats  []int16  // none: all text; one: for all; else one per parameter
	Params        [][]byte // nil is NULL
	ResultFormats []int16  // as ParamFormats, for the result columns
}

// ParamFormat is the format code of parameter i under the protocol's rule.
func (a *BindArgs) ParamFormat(i int) int16 { return formatAt(a.ParamFormats, i) }

// ResultFormat is the format code of result column i.
func (a *BindArgs) ResultFormat(i int) int16 { return formatAt(a.ResultFormats, i) }

func formatAt(f []int16, i int) int16 {
	switch {
	case len(f) == 1:
		return f[0]
	case i >= 0 && i < len(f):
		return f[i]
	}
	return 0
}

// AppendTail appends a as a Bind tail, for AppendBind.
func (a *BindArgs) AppendTail(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(a.ParamFormats)))
	for _, f := range a.ParamFormats {
		dst = binary.BigEndian.AppendUint16(dst, uint16(f))
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(a.Params)))
	for _, p := range a.Params {
		dst = AppendColumn(dst, p)
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(a.ResultFormats)))
	for _, f := range a.ResultFormats {
		dst = binary.BigEndian.AppendUint16(dst, uint16(f))
	}
	return dst
}

// walkBindTail checks a Bind tail and, when a is not nil, decodes it.
func walkBindTail(t []byte, a *BindArgs) error {
	if a != nil {
		a.ParamFormats, a.Params, a.ResultFormats = a.ParamFormats[:0], a.Params[:0], a.ResultFormats[:0]
	}
	if len(t) < 2 {
		return malformed("Bind", "missing parameter format count")
	}
	nf := int(binary.BigEndian.Uint16(t))
	t = t[2:]
	if len(t) < 2*nf {
		return malformed("Bind", "truncated parameter formats")
	}
	if a != nil {
		for i := range nf {
			a.ParamFormats = append(a.ParamFormats, int16(binary.BigEndian.Uint16(t[2*i:])))
		}
	}
	t = t[2*nf:]
	if len(t) < 2 {
		return malformed("Bind", "missing parameter count")
	}
	np := int(binary.BigEndian.Uint16(t))
	t = t[2:]
	for range np {
		if len(t) < 4 {
			return malformed("Bind", "truncated parameter length")
		}
		l := int32(binary.BigEndian.Uint32(t))
		t = t[4:]
		if l == -1 {
			if a != nil {
				a.Params = append(a.Params, nil)
			}
			continue
		}
		if l < 0 {
			return malformed("Bind", "negative parameter length")
		}
		if int64(len(t)) < int64(l) {
			return malformed("Bind", "truncated parameter value")
		}
		if a != nil {
			a.Params = append(a.Params, t[:l:l])
		}
		t = t[l:]
	}
	if len(t) < 2 {
		return malformed("Bind", "missing result format count")
	}
	nr := int(binary.BigEndian.Uint16(t))
	t = t[2:]
	if len(t) != 2*nr {
		if len(t) < 2*nr {
			return malformed("Bind", "truncated result formats")
		}
		return malformed("Bind", "data after the result formats")
	}
	if a != nil {
		for i := range nr {
			a.ResultFormats = append(a.ResultFormats, int16(binary.BigEndian.Uint16(t[2*i:])))
		}
	}
	return nil
}

// Describe is a Describe message: of a statement (Kind 'S') or a portal
// ('P'). ParseDescribe does not check Kind; PostgreSQL answers another one
// with an ERROR.
type Describe struct {
	Kind byte
	Name []byte
}

// ParseDescribe parses a Describe body.
func ParseDescribe(body []byte) (Describe, error) {
	kind, name, err := parseKindName("Describe", body)
	return Describe{Kind: kind, Name: name}, err
}

// AppendTo appends d as a message.
func (d Describe) AppendTo(dst []byte) []byte { return AppendDescribe(dst, d.Kind, d.Name) }

// Close is a Close message: of a statement (Kind 'S') or a portal ('P').
// ParseClose does not check Kind.
type Close struct {
	Kind byte
	Name []byte
}

// ParseClose parses a Close body.
func ParseClose(body []byte) (Close, error) {
	kind, name, err := parseKindName("Close", body)
	return Close{Kind: kind, Name: name}, err
}

// AppendTo appends c as a message.
func (c Close) AppendTo(dst []byte) []byte { return AppendClose(dst, c.Kind, c.Name) }

func parseKindName(msg string, body []byte) (byte, []byte, error) {
	if len(body) < 1 {
		return 0, nil, malformed(msg, "missing kind")
	}
	name, rest, ok := CString(body[1:])
	if !ok {
		return 0, nil, malformed(msg, "missing NUL after the name")
	}
	if len(rest) > 0 {
		return 0, nil, malformed(msg, "data after the name")
	}
	return body[0], name, nil
}

// Execute is an Execute message: a portal and the most rows to return
// (0, or as PostgreSQL reads the word, anything from 1<<31 up: all rows).
type Execute struct {
	Portal  []byte
	MaxRows uint32
}

// ParseExecute parses an Execute body.
func ParseExecute(body []byte) (Execute, error) {
	portal, rest, ok := CString(body)
	if !ok {
		return Execute{}, malformed("Execute", "missing NUL after the portal name")
	}
	if len(rest) != 4 {
		if len(rest) < 4 {
			return Execute{}, malformed("Execute", "truncated row limit")
		}
		return Execute{}, malformed("Execute", "data after the row limit")
	}
	return Execute{Portal: portal, MaxRows: binary.BigEndian.Uint32(rest)}, nil
}

// AppendTo appends e as a message.
func (e Execute) AppendTo(dst []byte) []byte { return AppendExecute(dst, e.Portal, e.MaxRows) }
