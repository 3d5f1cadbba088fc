package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
)

// frameSeeds are message streams for the framing fuzz targets.
func frameSeeds(f *testing.F) {
	f.Add(AppendSync(AppendQuery(nil, "SELECT 1")), uint8(3))
	f.Add(AppendBindExecute(AppendParse(nil, "", "SELECT $1", []uint32{23}), ""), uint8(1))
	f.Add(AppendQuery(nil, bytes.Repeat([]byte("x"), 70)), uint8(0))
	f.Add([]byte("Q\x00\x00\x00\x03"), uint8(2))
	f.Add([]byte("Q\x7f\xff\xff\xff"), uint8(5))
	f.Add([]byte("S\x00\x00"), uint8(1))
	f.Add([]byte("S\x00\x00\x00\x04d\x00\x00\x00\x06xy"), uint8(11)) // the second message buffered but for its last byte
}

// FuzzReadHeader reads headers over arbitrary bytes through bufio and
// through a Reader: it never panics, the two agree, and no length comes
// out of a malformed header.
func FuzzReadHeader(f *testing.F) {
	frameSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		r := NewReader(chunkConn(data, int(chunk)), NewBufferPool(16), nil)
		typ1, n1, err1 := ReadHeader(br)
		typ2, n2, err2 := ReadHeader(r)
		if typ1 != typ2 || n1 != n2 || !sameErr(err1, err2) {
			t.Fatalf("bufio: %q %d %v; Reader: %q %d %v", typ1, n1, err1, typ2, n2, err2)
		}
		if err1 == nil && (len(data) < 5 || n1 < 0 || n1 > MaxMessageLen-4) {
			t.Fatalf("length %d from %d bytes", n1, len(data))
		}
		if err1 != nil && n1 != 0 {
			t.Fatalf("length %d with error %v", n1, err1)
		}
	})
}

// FuzzFrame splits arbitrary bytes into messages five ways (Frame on the
// slice; ReadMessage through bufio; ReadMessage through a Reader fed in
// chunks; a Reader's own Header and Body, which cut buffered messages in
// place; Next and Fill on a Reader fed in chunks, falling back to
// ReadMessage as the session's relay does): it never panics, never returns
// a body longer than what is left of the input, and all agree message by
// message.
func FuzzFrame(f *testing.F) {
	frameSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		r := NewReader(chunkConn(data, int(chunk)), NewBufferPool(16), nil)
		r3 := NewReader(chunkConn(data, int(chunk)), NewBufferPool(16), nil)
		r4 := NewReader(chunkConn(data, int(chunk)), NewBufferPool(16), nil)
		r4.SetReleaseAfter(0) // as a server connection's
		r4.Borrow()
		var s1, s2, s4 []byte
		rest := data
		for {
			typ, body, next, err := Frame(rest)
			var got [4]struct {
				typ  byte
				body []byte
				err  error
			}
			got[0].typ, got[0].body, got[0].err = ReadMessage(br, &s1)
			got[1].typ, got[1].body, got[1].err = ReadMessage(r, &s2)
			typ3, n3, err3 := r3.Header()
			if err3 == nil {
				got[2].body, err3 = r3.Body(n3)
			}
			got[2].typ, got[2].err = typ3, err3
			typ4, body4, ok := r4.Next()
			if !ok {
				if filled, err := r4.Fill(); filled {
					typ4, body4, ok = r4.Next()
				} else if err != nil {
					got[3].err, ok = err, true // reported: the input ends in this message
				}
			}
			if ok {
				if got[3].err == nil {
					got[3].typ, got[3].body = typ4, body4
				}
			} else {
				got[3].typ, got[3].body, got[3].err = ReadMessage(r4, &s4)
			}
			if err != nil {
				for i, g := range got {
					if g.err == nil || errors.Is(err, ErrProtocol) != errors.Is(g.err, ErrProtocol) {
						t.Fatalf("Frame: %v; way %d: %v", err, i+1, g.err)
					}
				}
				return
			}
			if len(body) > len(rest)-5 || len(next) != len(rest)-5-len(body) {
				t.Fatalf("body of %d and rest %d from %d bytes", len(body), len(next), len(rest))
			}
			for i, g := range got {
				if g.err != nil || g.typ != typ || !bytes.Equal(g.body, body) || (g.body == nil) != (len(body) == 0) { // readers give no body as nil
					t.Fatalf("Frame: %q %q; way %d: %q %q %v", typ, body, i+1, g.typ, g.body, g.err)
				}
			}
			rest = next
		}
	})
}

func sameErr(a, b error) bool {
	return (a == nil) == (b == nil) && errors.Is(a, ErrProtocol) == errors.Is(b, ErrProtocol) &&
		errors.Is(a, io.ErrUnexpectedEOF) == errors.Is(b, io.ErrUnexpectedEOF)
}

// chunkConn is a connection that delivers data in chunks of size chunk (0:
// all at once), then EOF.
func chunkConn(data []byte, chunk int) *scriptConn {
	if chunk == 0 {
		chunk = len(data) + 1
	}
	c := &scriptConn{data: make(chan []byte, len(data)/chunk+2), reads: make(chan int, 1)}
	for b := data; len(b) > 0; {
		k := min(chunk, len(b))
		c.data <- b[:k]
		b = b[k:]
	}
	close(c.data)
	return c
}

// FuzzParseMessages runs every parser on arbitrary bytes: none panics, and
// whatever one accepts its view writes back byte for byte. It also builds
// messages from arbitrary fields and checks that parsing them gives the
// fields back.
func FuzzParseMessages(f *testing.F) {
	f.Add([]byte("SELECT 1\x00"), "s1", "SELECT $1", uint32(7))
	f.Add([]byte("\x00SELECT 1\x00\x00\x01\x00\x00\x00\x17"), "", "", uint32(0))
	f.Add(AppendCString(AppendCString(nil, "p"), "s"), "p", "s", uint32(1<<31))
	f.Add([]byte("\x00\x02\x00\x00\x00\x01t\xff\xff\xff\xff"), "x", "y", uint32(2))
	f.Add([]byte("SERROR\x00C0A000\x00Mno\x00\x00"), "TimeZone", "UTC", uint32('T'))
	f.Fuzz(func(t *testing.T, body []byte, a, b string, n uint32) {
		roundTrip(t, body)
		fieldsRoundTrip(t, body, a, b, n)
	})
}

// roundTrip: an accepted body is exactly what its view writes back.
func roundTrip(t *testing.T, body []byte) {
	check := func(name string, typ byte, ok bool, appended []byte) {
		if ok && !bytes.Equal(appended, AppendFrame(nil, typ, body)) {
			t.Fatalf("%s(%q) writes back %q", name, body, appended)
		}
	}
	if q, err := ParseQuery(body); err == nil {
		check("Query", 'Q', true, q.AppendTo(nil))
	}
	if p, err := ParseParse(body); err == nil {
		check("Parse", 'P', true, p.AppendTo(nil))
		check("Parse.Clone", 'P', true, p.Clone().AppendTo(nil))
	}
	if bd, err := ParseBind(body); err == nil {
		check("Bind", 'B', true, bd.AppendTo(nil))
		var args BindArgs
		if err := bd.Args(&args); err != nil {
			t.Fatalf("Args of an accepted Bind: %v", err)
		}
		if len(args.Params) != bd.NumParams() {
			t.Fatalf("NumParams %d, Args %d", bd.NumParams(), len(args.Params))
		}
		check("Bind args", 'B', true, AppendBind(nil, bd.Portal, bd.Stmt, args.AppendTail(nil)))
	}
	if d, err := ParseDescribe(body); err == nil {
		check("Describe", 'D', true, d.AppendTo(nil))
	}
	if c, err := ParseClose(body); err == nil {
		check("Close", 'C', true, c.AppendTo(nil))
	}
	if e, err := ParseExecute(body); err == nil {
		check("Execute", 'E', true, e.AppendTo(nil))
	}
	if s, err := ParseReadyForQuery(body); err == nil {
		check("ReadyForQuery", 'Z', true, AppendReadyForQuery(nil, s))
	}
	if name, value, err := ParseParameterStatus(body); err == nil {
		check("ParameterStatus", 'S', true, AppendParameterStatus(nil, name, value))
	}
	if tag, err := ParseCommandComplete(body); err == nil {
		check("CommandComplete", 'C', true, AppendCommandComplete(nil, tag))
	}
	if d, err := ParseDataRow(body); err == nil {
		var cols [][]byte
		for _, v := range d.All() {
			cols = append(cols, v)
		}
		if len(cols) != d.Len() {
			t.Fatalf("DataRow.All yields %d of %d columns", len(cols), d.Len())
		}
		check("DataRow", 'D', true, AppendDataRow(nil, cols...))
	}
	if fs, err := ParseFields(body); err == nil {
		var out []byte
		for c, v := range fs.All() {
			out = AppendCString(append(out, c), v)
		}
		check("Fields", 'E', true, AppendFrame(nil, 'E', append(out, 0)))
	}
}

// fieldsRoundTrip builds messages from fields and parses them back.
func fieldsRoundTrip(t *testing.T, data []byte, a, b string, n uint32) {
	a, b = noNUL(a), noNUL(b)
	body := func(msg []byte) []byte {
		_, bd, _, err := Frame(msg)
		if err != nil {
			t.Fatalf("Frame(%q): %v", msg, err)
		}
		return bd
	}
	if q, err := ParseQuery(body(AppendQuery(nil, b))); err != nil || string(q.SQL) != b {
		t.Fatalf("Query %q: %q %v", b, q.SQL, err)
	}
	oids := make([]uint32, len(data)/4)
	for i := range oids {
		oids[i] = uint32(data[4*i])<<24 | uint32(data[4*i+1])<<16 | uint32(data[4*i+2])<<8 | uint32(data[4*i+3])
	}
	p, err := ParseParse(body(AppendParse(nil, a, b, oids)))
	if err != nil || string(p.Name) != a || string(p.SQL) != b || !equalOIDs(p.ParamOIDs, oids) {
		t.Fatalf("Parse %q %q %v: %q %q %v", a, b, oids, p.Name, p.SQL, err)
	}
	args := argsFrom(data)
	bd, err := ParseBind(body(AppendBind(nil, a, b, args.AppendTail(nil))))
	if err != nil || string(bd.Portal) != a || string(bd.Stmt) != b {
		t.Fatalf("Bind %q %q: %q %q %v", a, b, bd.Portal, bd.Stmt, err)
	}
	var got BindArgs
	if err := bd.Args(&got); err != nil || !equalArgs(&got, &args) {
		t.Fatalf("Bind args %#v: %#v %v", args, got, err)
	}
	kind := byte(n)
	if d, err := ParseDescribe(body(AppendDescribe(nil, kind, a))); err != nil || d.Kind != kind || string(d.Name) != a {
		t.Fatalf("Describe %c %q: %+v %v", kind, a, d, err)
	}
	if c, err := ParseClose(body(AppendClose(nil, kind, b))); err != nil || c.Kind != kind || string(c.Name) != b {
		t.Fatalf("Close %c %q: %+v %v", kind, b, c, err)
	}
	if e, err := ParseExecute(body(AppendExecute(nil, a, n))); err != nil || string(e.Portal) != a || e.MaxRows != n {
		t.Fatalf("Execute %q %d: %+v %v", a, n, e, err)
	}
	if name, value, err := ParseParameterStatus(body(AppendParameterStatus(nil, a, b))); err != nil || string(name) != a || string(value) != b {
		t.Fatalf("ParameterStatus %q %q: %q %q %v", a, b, name, value, err)
	}
	if tag, err := ParseCommandComplete(body(AppendCommandComplete(nil, a))); err != nil || string(tag) != a {
		t.Fatalf("CommandComplete %q: %q %v", a, tag, err)
	}
	d, err := ParseDataRow(body(AppendDataRow(nil, args.Params...)))
	if err != nil || d.Len() != len(args.Params) {
		t.Fatalf("DataRow of %d: %d %v", len(args.Params), d.Len(), err)
	}
	for i, v := range d.All() {
		if (v == nil) != (args.Params[i] == nil) || !bytes.Equal(v, args.Params[i]) {
			t.Fatalf("DataRow column %d: %q, want %q", i, v, args.Params[i])
		}
	}
	status := "ITE"[n%3]
	if s, err := ParseReadyForQuery(body(AppendReadyForQuery(nil, status))); err != nil || s != status {
		t.Fatalf("ReadyForQuery %c: %c %v", status, s, err)
	}
}

// equalArgs compares decoded Bind arguments: nil and empty lists are the
// same, a NULL parameter and an empty one are not.
func equalArgs(a, b *BindArgs) bool {
	if !slices.Equal(a.ParamFormats, b.ParamFormats) || !slices.Equal(a.ResultFormats, b.ResultFormats) || len(a.Params) != len(b.Params) {
		return false
	}
	for i := range a.Params {
		if (a.Params[i] == nil) != (b.Params[i] == nil) || !bytes.Equal(a.Params[i], b.Params[i]) {
			return false
		}
	}
	return true
}

func noNUL(s string) string { return string(bytes.ReplaceAll([]byte(s), []byte{0}, nil)) }

func equalOIDs(o OIDs, want []uint32) bool {
	if o.Len() != len(want) {
		return false
	}
	for i, w := range want {
		if o.At(i) != w {
			return false
		}
	}
	return true
}

// argsFrom derives Bind arguments from arbitrary bytes: each byte starts
// a parameter of that many following bytes (mod 8), 0xff a NULL, and the
// low bits of the first bytes give format codes.
func argsFrom(data []byte) BindArgs {
	var a BindArgs
	for i, c := range data {
		if i < 3 {
			a.ParamFormats = append(a.ParamFormats, int16(c&1))
			a.ResultFormats = append(a.ResultFormats, int16(c>>7))
		}
	}
	for len(data) > 0 {
		c := data[0]
		data = data[1:]
		if c == 0xff {
			a.Params = append(a.Params, nil)
			continue
		}
		k := min(int(c%8), len(data))
		a.Params = append(a.Params, data[:k:k])
		data = data[k:]
	}
	return a
}
