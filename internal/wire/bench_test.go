package wire

import (
	"bufio"
	"bytes"
	"testing"
	"time"
)

var (
	benchQuery    = []byte("SELECT id, name FROM users WHERE id = 42\x00")
	benchParse    = []byte("\x00SELECT id, name FROM users WHERE id = $1\x00\x00\x01\x00\x00\x00\x17")
	benchDescribe = []byte("Sstmt\x00")
	benchExecute  = []byte("\x00\x00\x00\x00\x00")
	benchDataRow  = []byte("\x00\x02\x00\x00\x00\x01t\xff\xff\xff\xff")
	benchBind     = func() []byte {
		a := BindArgs{ParamFormats: []int16{1}, Params: [][]byte{{0, 0, 0, 42}, nil, []byte("text")}, ResultFormats: []int16{1}}
		return a.AppendTail(AppendCString(AppendCString(nil, ""), "lp_0123456789abcdef"))
	}()
)

// allocCases are the operations that must not allocate.
func allocCases() []struct {
	name string
	fn   func(buf []byte) []byte
} {
	var args BindArgs
	fields := []Field{{Name: "ok", TypeOID: 16, TypeSize: 1, TypeMod: -1}}
	return []struct {
		name string
		fn   func(buf []byte) []byte
	}{
		{"ParseQuery", func(buf []byte) []byte { q, _ := ParseQuery(benchQuery); return q.SQL }},
		{"ParseParse", func(buf []byte) []byte { p, _ := ParseParse(benchParse); return p.SQL }},
		{"ParseBind", func(buf []byte) []byte { b, _ := ParseBind(benchBind); return b.Stmt }},
		{"Bind.Args", func(buf []byte) []byte {
			b, _ := ParseBind(benchBind)
			_ = b.Args(&args)
			return args.Params[0]
		}},
		{"ParseDescribe", func(buf []byte) []byte { d, _ := ParseDescribe(benchDescribe); return d.Name }},
		{"ParseExecute", func(buf []byte) []byte { e, _ := ParseExecute(benchExecute); return e.Portal }},
		{"ParseDataRow", func(buf []byte) []byte {
			d, _ := ParseDataRow(benchDataRow)
			v, _ := d.Col(0)
			return v
		}},
		{"AppendQuery", func(buf []byte) []byte { return AppendQuery(buf, "SELECT 1") }},
		{"AppendParse", func(buf []byte) []byte { return AppendParse(buf, "lp_1", benchQuery[:20], nil) }},
		{"AppendBind", func(buf []byte) []byte { return AppendBind(buf, "", "lp_1", benchBind[21:]) }},
		{"AppendBindExecute", func(buf []byte) []byte { return AppendBindExecute(buf, "lp_1") }},
		{"AppendDescribe+Close+Sync", func(buf []byte) []byte {
			return AppendSync(AppendClose(AppendDescribe(buf, 'S', "lp_1"), 'S', "lockpool_noop"))
		}},
		{"AppendReadyForQuery", func(buf []byte) []byte { return AppendReadyForQuery(buf, 'I') }},
		{"AppendParameterStatus", func(buf []byte) []byte { return AppendParameterStatus(buf, "TimeZone", "UTC") }},
		{"AppendRowDescription", func(buf []byte) []byte { return AppendRowDescription(buf, fields...) }},
		{"AppendDataRow", func(buf []byte) []byte {
			buf, start := StartDataRow(buf, 2)
			buf, at := StartColumn(buf)
			buf = append(buf, "42"...)
			buf = FinishColumn(buf, at)
			return FinishMsg(AppendNull(buf), start)
		}},
		{"AppendCommandComplete", func(buf []byte) []byte { return AppendCommandComplete(buf, "SELECT 1") }},
	}
}

func TestZeroAllocs(t *testing.T) {
	buf := make([]byte, 0, 1024)
	for _, c := range allocCases() {
		if n := testing.AllocsPerRun(100, func() { _ = c.fn(buf[:0]) }); n != 0 {
			t.Errorf("%s: %v allocs, want 0", c.name, n)
		}
	}
	// Reading a message through a Reader that holds its buffer.
	stream := bytes.Repeat(AppendQuery(nil, "SELECT 1"), 200)
	r := NewReader(noDeadline{bytes.NewReader(stream)}, NewBufferPool(8<<10), nil)
	r.SetReleaseAfter(0)
	var s []byte
	_, _, _ = ReadMessage(r, &s) // takes the buffer
	if n := testing.AllocsPerRun(100, func() { _, _, _ = ReadMessage(r, &s) }); n != 0 {
		t.Errorf("ReadMessage: %v allocs, want 0", n)
	}
}

func BenchmarkWire(b *testing.B) {
	buf := make([]byte, 0, 1024)
	for _, c := range allocCases() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.fn(buf[:0])
			}
		})
	}
}

func BenchmarkReadMessage(b *testing.B) {
	stream := bytes.Repeat(AppendSync(AppendQuery(nil, "SELECT 1")), 64)
	rd := bytes.NewReader(stream)
	br := bufio.NewReaderSize(rd, 16<<10)
	var s []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		rd.Reset(stream)
		br.Reset(rd)
		for {
			if _, _, err := ReadMessage(br, &s); err != nil {
				break
			}
		}
	}
}

// noDeadline is a Conn over a plain reader.
type noDeadline struct{ *bytes.Reader }

func (noDeadline) SetReadDeadline(time.Time) error { return nil }
