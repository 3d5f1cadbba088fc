package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
)

func TestReadHeader(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		typ      byte
		n        int
		err      error
		consumed int
	}{
		{"query", "Q\x00\x00\x00\x09SELECT", 'Q', 5, nil, 5},
		{"empty body", "S\x00\x00\x00\x04", 'S', 0, nil, 5},
		{"length below 4", "Q\x00\x00\x00\x03", 0, 0, ErrProtocol, 0},
		{"length above 1 GB", "Q\x40\x00\x00\x01", 0, 0, ErrProtocol, 0},
		{"largest length", "d\x40\x00\x00\x00", 'd', MaxMessageLen - 4, nil, 5},
		{"nothing", "", 0, 0, io.EOF, 0},
		{"partial header", "Q\x00\x00", 0, 0, io.ErrUnexpectedEOF, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(bytes.NewReader([]byte(tt.in)))
			typ, n, err := ReadHeader(br)
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if typ != tt.typ || n != tt.n {
				t.Errorf("ReadHeader = %q, %d; want %q, %d", typ, n, tt.typ, tt.n)
			}
			if tt.err == ErrProtocol && (br.Buffered() != len(tt.in)) {
				t.Errorf("a bad header was consumed: %d bytes left of %d", br.Buffered(), len(tt.in))
			}
		})
	}
}

func TestReadBody(t *testing.T) {
	msgs := AppendQuery(nil, "SELECT 1")
	big := bytes.Repeat([]byte("x"), 100)
	msgs = AppendQuery(msgs, big)
	msgs = AppendQuery(msgs, "SELECT 2")
	br := bufio.NewReaderSize(bytes.NewReader(msgs), 16) // 16 is bufio's minimum
	var scratch []byte
	want := []string{"SELECT 1", string(big), "SELECT 2"}
	for i, w := range want {
		typ, body, err := ReadMessage(br, &scratch)
		if err != nil || typ != 'Q' {
			t.Fatalf("message %d: %q, %v", i, typ, err)
		}
		q, err := ParseQuery(body)
		if err != nil || string(q.SQL) != w {
			t.Fatalf("message %d: %q, %v; want %q", i, q.SQL, err, w)
		}
		if cap(body) != len(body) {
			t.Errorf("message %d: body cap %d > len %d (appending would overwrite the buffer)", i, cap(body), len(body))
		}
	}
	if cap(scratch) < 101 {
		t.Errorf("scratch not kept: cap %d", cap(scratch))
	}
	if _, _, err := ReadMessage(br, &scratch); err != io.EOF {
		t.Errorf("after the last message: %v, want io.EOF", err)
	}

	// A body cut short is io.ErrUnexpectedEOF, small or large.
	for _, n := range []int{8, 100} {
		cut := AppendFrame(nil, 'd', make([]byte, n))
		br := bufio.NewReaderSize(bytes.NewReader(cut[:len(cut)-1]), 16)
		if _, _, err := ReadMessage(br, nil); err != io.ErrUnexpectedEOF {
			t.Errorf("body of %d cut short: %v, want io.ErrUnexpectedEOF", n, err)
		}
	}
}

func TestFrame(t *testing.T) {
	two := AppendSync(AppendQuery(nil, "x"))
	tests := []struct {
		name string
		in   []byte
		typ  byte
		body string
		rest int
		err  error
	}{
		{"two messages", two, 'Q', "x\x00", 5, nil},
		{"empty", nil, 0, "", 0, io.EOF},
		{"partial header", two[:3], 0, "", 0, io.ErrUnexpectedEOF},
		{"partial body", two[:6], 0, "", 0, io.ErrUnexpectedEOF},
		{"bad length", []byte("Q\x00\x00\x00\x02"), 0, "", 0, ErrProtocol},
		{"huge length", []byte("Q\xff\xff\xff\xff"), 0, "", 0, ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ, body, rest, err := Frame(tt.in)
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if typ != tt.typ || string(body) != tt.body || len(rest) != tt.rest {
				t.Errorf("Frame = %q, %q, rest %d; want %q, %q, %d", typ, body, len(rest), tt.typ, tt.body, tt.rest)
			}
		})
	}
}

func TestCString(t *testing.T) {
	s, rest, ok := CString([]byte("ab\x00cd"))
	if !ok || string(s) != "ab" || string(rest) != "cd" || cap(s) != 2 {
		t.Errorf("CString = %q, %q, %v (cap %d)", s, rest, ok, cap(s))
	}
	if _, _, ok := CString([]byte("ab")); ok {
		t.Error("CString without NUL succeeded")
	}
}

func TestProtocolErrorf(t *testing.T) {
	err := ProtocolErrorf("invalid %s", "thing")
	if !errors.Is(err, ErrProtocol) || err.Error() != "protocol violation: invalid thing" {
		t.Errorf("ProtocolErrorf = %q (Is ErrProtocol: %v)", err, errors.Is(err, ErrProtocol))
	}
}

func TestReadBodyAllocatesWhatArrives(t *testing.T) {
	// A length word of 1 GB followed by a few bytes costs a few bytes.
	msg := append([]byte("d\x40\x00\x00\x00"), "short"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := ReadMessage(bufio.NewReaderSize(bytes.NewReader(msg), 16), nil)
	runtime.ReadMemStats(&after)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("ReadMessage = %v, want io.ErrUnexpectedEOF", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("allocated %d bytes for a 5-byte body", got)
	}
}
