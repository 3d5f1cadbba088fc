package wire

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// invalid is a body a parser must reject, and what its error names.
type invalid struct {
	name string
	body string
	want string
}

func checkInvalid[T any](t *testing.T, msg string, parse func([]byte) (T, error), cases []invalid) {
	t.Helper()
	for _, tt := range cases {
		t.Run(msg+"/"+tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.body))
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
			if !strings.Contains(err.Error(), "invalid "+msg+" message: "+tt.want) {
				t.Errorf("err = %q, want it to name %s and %q", err, msg, tt.want)
			}
		})
	}
}

func TestParseQuery(t *testing.T) {
	q, err := ParseQuery([]byte("SELECT 1\x00"))
	if err != nil || string(q.SQL) != "SELECT 1" || cap(q.SQL) != len(q.SQL) {
		t.Fatalf("ParseQuery = %q, %v", q.SQL, err)
	}
	if got := q.AppendTo(nil); !bytes.Equal(got, []byte("Q\x00\x00\x00\x0dSELECT 1\x00")) {
		t.Errorf("AppendTo = %q", got)
	}
	checkInvalid(t, "Query", ParseQuery, []invalid{
		{"empty", "", "missing NUL"},
		{"no NUL", "SELECT 1", "missing NUL"},
		{"NUL inside", "SELECT 1\x00; DROP TABLE t\x00", "data after the query string"},
	})
}

func TestParseParse(t *testing.T) {
	tests := []struct {
		name, body, stmt, sql string
		oids                  []uint32
	}{
		{"unnamed, no types", "\x00SELECT 1\x00\x00\x00", "", "SELECT 1", nil},
		{"named with types", "s1\x00SELECT $1, $2\x00\x00\x02\x00\x00\x00\x17\x00\x00\x00\x00", "s1", "SELECT $1, $2", []uint32{23, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseParse([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if string(p.Name) != tt.stmt || string(p.SQL) != tt.sql || !slices.Equal(oidList(p.ParamOIDs), tt.oids) {
				t.Errorf("ParseParse = %q %q %v", p.Name, p.SQL, oidList(p.ParamOIDs))
			}
			want := AppendFrame(nil, 'P', []byte(tt.body))
			if got := p.AppendTo(nil); !bytes.Equal(got, want) {
				t.Errorf("AppendTo = %q, want %q", got, want)
			}
			if got := AppendParse(nil, tt.stmt, tt.sql, tt.oids); !bytes.Equal(got, want) {
				t.Errorf("AppendParse = %q, want %q", got, want)
			}
			c := p.Clone()
			body := []byte(tt.body)
			p2, _ := ParseParse(body)
			c2 := p2.Clone()
			clear(body)
			if string(c.Name) != tt.stmt || string(c2.SQL) != tt.sql || !slices.Equal(oidList(c2.ParamOIDs), tt.oids) {
				t.Errorf("Clone aliases the body: %q %q %v", c2.Name, c2.SQL, oidList(c2.ParamOIDs))
			}
			// Renamed with the client's raw types.
			if got, want := AppendParseOIDs(nil, "lp_1", c.SQL, c.ParamOIDs), AppendParse(nil, "lp_1", tt.sql, tt.oids); !bytes.Equal(got, want) {
				t.Errorf("AppendParseOIDs = %q, want %q", got, want)
			}
		})
	}
	checkInvalid(t, "Parse", ParseParse, []invalid{
		{"no name NUL", "s1", "missing NUL after the statement name"},
		{"no query NUL", "s1\x00SELECT", "missing NUL after the query string"},
		{"no type count", "s1\x00SELECT 1\x00\x00", "missing parameter type count"},
		{"truncated types", "\x00q\x00\x00\x02\x00\x00\x00\x17", "truncated parameter types"},
		{"trailing", "\x00q\x00\x00\x00x", "data after the parameter types"},
	})
}

func oidList(o OIDs) []uint32 {
	var l []uint32
	for i := range o.Len() {
		l = append(l, o.At(i))
	}
	return l
}

func TestParseBind(t *testing.T) {
	args := BindArgs{
		ParamFormats:  []int16{0, 1, 0},
		Params:        [][]byte{[]byte("42"), nil, {}},
		ResultFormats: []int16{1},
	}
	tail := args.AppendTail(nil)
	body := AppendCString(AppendCString(nil, "p1"), "s1")
	body = append(body, tail...)
	b, err := ParseBind(body)
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Portal) != "p1" || string(b.Stmt) != "s1" || !bytes.Equal(b.Tail, tail) || b.NumParams() != 3 {
		t.Fatalf("ParseBind = %q %q %q (%d params)", b.Portal, b.Stmt, b.Tail, b.NumParams())
	}
	if got, want := b.AppendTo(nil), AppendFrame(nil, 'B', body); !bytes.Equal(got, want) {
		t.Errorf("AppendTo = %q, want %q", got, want)
	}
	var got BindArgs
	if err := b.Args(&got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, args) {
		t.Errorf("Args = %#v, want %#v", got, args)
	}
	if got.Params[1] != nil || got.Params[2] == nil {
		t.Errorf("NULL and empty parameters not told apart: %#v", got.Params)
	}
	if got.ParamFormat(1) != 1 || got.ResultFormat(5) != 1 {
		t.Errorf("formats: param 1 = %d, result 5 = %d", got.ParamFormat(1), got.ResultFormat(5))
	}
	// Args reuses the slices it was given.
	p0 := &got.Params[0]
	if err := b.Args(&got); err != nil || &got.Params[0] != p0 {
		t.Errorf("Args did not reuse its slices (%v)", err)
	}
	if (&BindArgs{}).ParamFormat(3) != 0 {
		t.Error("no formats should mean text")
	}
	c := b.Clone()
	clear(body)
	if string(c.Portal) != "p1" || string(c.Stmt) != "s1" || !bytes.Equal(c.Tail, tail) {
		t.Errorf("Clone aliases the body: %q %q %q", c.Portal, c.Stmt, c.Tail)
	}

	checkInvalid(t, "Bind", ParseBind, []invalid{
		{"no portal NUL", "p", "missing NUL after the portal name"},
		{"no statement NUL", "\x00s", "missing NUL after the statement name"},
		{"no format count", "\x00\x00\x00", "missing parameter format count"},
		{"truncated formats", "\x00\x00\x00\x02\x00\x01", "truncated parameter formats"},
		{"no parameter count", "\x00\x00\x00\x00", "missing parameter count"},
		{"truncated length", "\x00\x00\x00\x00\x00\x01\x00\x00", "truncated parameter length"},
		{"negative length", "\x00\x00\x00\x00\x00\x01\xff\xff\xff\xfe", "negative parameter length"},
		{"truncated value", "\x00\x00\x00\x00\x00\x01\x00\x00\x00\x05abc", "truncated parameter value"},
		{"no result count", "\x00\x00\x00\x00\x00\x00", "missing result format count"},
		{"truncated results", "\x00\x00\x00\x00\x00\x00\x00\x01\x00", "truncated result formats"},
		{"trailing", "\x00\x00\x00\x00\x00\x00\x00\x00x", "data after the result formats"},
	})
}

func TestParseDescribeCloseExecute(t *testing.T) {
	d, err := ParseDescribe([]byte("Sstmt\x00"))
	if err != nil || d.Kind != 'S' || string(d.Name) != "stmt" {
		t.Errorf("ParseDescribe = %c %q %v", d.Kind, d.Name, err)
	}
	if got := d.AppendTo(nil); !bytes.Equal(got, []byte("D\x00\x00\x00\x0aSstmt\x00")) {
		t.Errorf("Describe.AppendTo = %q", got)
	}
	c, err := ParseClose([]byte("P\x00"))
	if err != nil || c.Kind != 'P' || len(c.Name) != 0 {
		t.Errorf("ParseClose = %c %q %v", c.Kind, c.Name, err)
	}
	if got := c.AppendTo(nil); !bytes.Equal(got, []byte("C\x00\x00\x00\x06P\x00")) {
		t.Errorf("Close.AppendTo = %q", got)
	}
	e, err := ParseExecute([]byte("p\x00\x00\x00\x01\x00"))
	if err != nil || string(e.Portal) != "p" || e.MaxRows != 256 {
		t.Errorf("ParseExecute = %q %d %v", e.Portal, e.MaxRows, err)
	}
	if got := e.AppendTo(nil); !bytes.Equal(got, []byte("E\x00\x00\x00\x0ap\x00\x00\x00\x01\x00")) {
		t.Errorf("Execute.AppendTo = %q", got)
	}
	kindName := []invalid{
		{"empty", "", "missing kind"},
		{"no NUL", "Sname", "missing NUL after the name"},
		{"trailing", "S\x00x", "data after the name"},
	}
	checkInvalid(t, "Describe", ParseDescribe, kindName)
	checkInvalid(t, "Close", ParseClose, kindName)
	checkInvalid(t, "Execute", ParseExecute, []invalid{
		{"no NUL", "p", "missing NUL after the portal name"},
		{"truncated", "\x00\x00\x00", "truncated row limit"},
		{"trailing", "\x00\x00\x00\x00\x00\x00", "data after the row limit"},
	})
}

func TestBackendViews(t *testing.T) {
	for _, s := range []byte("ITE") {
		if got, err := ParseReadyForQuery([]byte{s}); got != s || err != nil {
			t.Errorf("ParseReadyForQuery(%c) = %c, %v", s, got, err)
		}
	}
	checkInvalid(t, "ReadyForQuery", ParseReadyForQuery, []invalid{
		{"empty", "", "body is not one byte"},
		{"long", "II", "body is not one byte"},
		{"unknown", "X", "unknown transaction status"},
	})

	name, value, err := ParseParameterStatus([]byte("TimeZone\x00UTC\x00"))
	if err != nil || string(name) != "TimeZone" || string(value) != "UTC" {
		t.Errorf("ParseParameterStatus = %q %q %v", name, value, err)
	}
	parseStatus := func(b []byte) (string, error) { n, _, err := ParseParameterStatus(b); return string(n), err }
	checkInvalid(t, "ParameterStatus", parseStatus, []invalid{
		{"no name NUL", "a", "missing NUL after the name"},
		{"no value NUL", "a\x00b", "missing NUL after the value"},
		{"trailing", "a\x00b\x00c", "data after the value"},
	})

	tag, err := ParseCommandComplete([]byte("SELECT 3\x00"))
	if err != nil || string(tag) != "SELECT 3" {
		t.Errorf("ParseCommandComplete = %q %v", tag, err)
	}
	checkInvalid(t, "CommandComplete", ParseCommandComplete, []invalid{
		{"no NUL", "SELECT", "missing NUL after the tag"},
		{"trailing", "SELECT 1\x00x", "data after the tag"},
	})

	f, err := ParseFields([]byte("SERROR\x00C42P01\x00Mno\x00\x00"))
	if err != nil || string(f.Get('C')) != "42P01" || string(f.Get('M')) != "no" || f.Get('H') != nil {
		t.Errorf("ParseFields: C %q M %q H %q, %v", f.Get('C'), f.Get('M'), f.Get('H'), err)
	}
	var codes []byte
	for c := range f.All() {
		codes = append(codes, c)
	}
	if string(codes) != "SCM" {
		t.Errorf("Fields.All codes = %q", codes)
	}
	checkInvalid(t, "ErrorResponse", ParseFields, []invalid{
		{"empty", "", "missing terminator"},
		{"no terminator", "Cx\x00", "missing terminator"},
		{"no NUL", "Cx", "missing NUL after a field"},
		{"trailing", "Cx\x00\x00y", "data after the terminator"},
	})
}

func TestDataRow(t *testing.T) {
	msg := AppendDataRow(nil, []byte("t"), nil, []byte{})
	typ, body, _, err := Frame(msg)
	if err != nil || typ != 'D' {
		t.Fatal(typ, err)
	}
	d, err := ParseDataRow(body)
	if err != nil || d.Len() != 3 {
		t.Fatalf("ParseDataRow: %d columns, %v", d.Len(), err)
	}
	var got []string
	for i, v := range d.All() {
		switch {
		case v == nil:
			got = append(got, "NULL")
		default:
			got = append(got, string(v)+"|")
		}
		if i != len(got)-1 {
			t.Errorf("index %d at position %d", i, len(got)-1)
		}
	}
	if want := []string{"t|", "NULL", "|"}; !slices.Equal(got, want) {
		t.Errorf("columns = %q, want %q", got, want)
	}
	if v, ok := d.Col(2); !ok || v == nil || len(v) != 0 {
		t.Errorf("Col(2) = %q, %v: want an empty, non-NULL value", v, ok)
	}
	if _, ok := d.Col(3); ok {
		t.Error("Col(3) of 3 columns")
	}
	checkInvalid(t, "DataRow", ParseDataRow, []invalid{
		{"empty", "", "missing column count"},
		{"truncated length", "\x00\x01\x00\x00", "truncated column length"},
		{"truncated value", "\x00\x01\x00\x00\x00\x03ab", "truncated column value"},
		{"negative length", "\x00\x01\xff\xff\xff\xfe", "truncated column value"},
		{"trailing", "\x00\x00x", "data after the last column"},
	})
}

func TestAppenders(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want string
	}{
		{"Query", AppendQuery(nil, "SELECT 1"), "Q\x00\x00\x00\x0dSELECT 1\x00"},
		{"Query bytes", AppendQuery(nil, []byte("x")), "Q\x00\x00\x00\x06x\x00"},
		{"Parse", AppendParse(nil, "", "q", nil), "P\x00\x00\x00\x09\x00q\x00\x00\x00"},
		{"Bind", AppendBind(nil, []byte("p"), "s", []byte{0, 0, 0, 0, 0, 0}), "B\x00\x00\x00\x0ep\x00s\x00\x00\x00\x00\x00\x00\x00"},
		{"BindExecute", AppendBindExecute(nil, "lp_1"), "B\x00\x00\x00\x10\x00lp_1\x00\x00\x00\x00\x00\x00\x00E\x00\x00\x00\x09\x00\x00\x00\x00\x00"},
		{"Describe", AppendDescribe(nil, 'S', "s"), "D\x00\x00\x00\x07Ss\x00"},
		{"Close", AppendClose(nil, 'S', "lockpool_noop"), "C\x00\x00\x00\x13Slockpool_noop\x00"},
		{"Execute", AppendExecute(nil, "", 0), "E\x00\x00\x00\x09\x00\x00\x00\x00\x00"},
		{"Sync", AppendSync(nil), "S\x00\x00\x00\x04"},
		{"Flush", AppendFlush(nil), "H\x00\x00\x00\x04"},
		{"ParseComplete", AppendEmpty(nil, '1'), "1\x00\x00\x00\x04"},
		{"ReadyForQuery", AppendReadyForQuery(nil, 'T'), "Z\x00\x00\x00\x05T"},
		{"ParameterStatus", AppendParameterStatus(nil, "a", "b"), "S\x00\x00\x00\x08a\x00b\x00"},
		{"CommandComplete", AppendCommandComplete(nil, "SELECT 1"), "C\x00\x00\x00\x0dSELECT 1\x00"},
		{"ParameterDescription", AppendParameterDescription(nil, []uint32{25}), "t\x00\x00\x00\x0a\x00\x01\x00\x00\x00\x19"},
		{"RowDescription", AppendRowDescription(nil, Field{Name: "ok", TypeOID: 16, TypeSize: 1, TypeMod: -1, Format: 1}),
			"T\x00\x00\x00\x1b\x00\x01ok\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x01\xff\xff\xff\xff\x00\x01"},
		{"DataRow", AppendDataRow(nil, []byte("1"), nil), "D\x00\x00\x00\x0f\x00\x02\x00\x00\x00\x011\xff\xff\xff\xff"},
		{"Frame", AppendFrame([]byte("x"), 'd', []byte("ab")), "xd\x00\x00\x00\x06ab"},
	}
	for _, tt := range tests {
		if string(tt.got) != tt.want {
			t.Errorf("%s = %q, want %q", tt.name, tt.got, tt.want)
		}
	}

	// A DataRow built in place equals one from whole values.
	buf, start := StartDataRow(nil, 3)
	buf, at := StartColumn(buf)
	buf = append(buf, "123"...)
	buf = FinishColumn(buf, at)
	buf = AppendNull(buf)
	buf = AppendColumn(buf, []byte("x"))
	buf = FinishMsg(buf, start)
	if want := AppendDataRow(nil, []byte("123"), nil, []byte("x")); !bytes.Equal(buf, want) {
		t.Errorf("DataRow in place = %q, want %q", buf, want)
	}
}
