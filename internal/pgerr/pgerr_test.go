package pgerr

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lockpool/lockpool/internal/wire"
)

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		typ  byte
		in   *Error
		want Error
	}{
		{"default severity", 'E', &Error{Code: "08P01", Message: "lockpool: bad"}, Error{Severity: "ERROR", Code: "08P01", Message: "lockpool: bad"}},
		{"all fields", 'E', &Error{Severity: "FATAL", Code: "57P01", Message: "lockpool: bye", Detail: "d", Hint: "h"},
			Error{Severity: "FATAL", Code: "57P01", Message: "lockpool: bye", Detail: "d", Hint: "h"}},
		{"notice", 'N', NoticeWarning("lease lost", "again"), Error{Severity: "WARNING", Code: "01000", Message: "lease lost", Hint: "again"}},
		{"empty message", 'E', &Error{Code: "XX000"}, Error{Severity: "ERROR", Code: "XX000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := tt.in.AppendTo([]byte("prefix"), tt.typ)
			if string(msg[:6]) != "prefix" {
				t.Fatalf("AppendTo overwrote dst: %q", msg[:6])
			}
			typ, body, rest, err := wire.Frame(msg[6:])
			if err != nil || typ != tt.typ || len(rest) != 0 {
				t.Fatalf("Frame = %q, %v, rest %d", typ, err, len(rest))
			}
			fields, err := wire.ParseFields(body)
			if err != nil {
				t.Fatalf("ParseFields: %v", err)
			}
			if s, v := string(fields.Get('S')), string(fields.Get('V')); s != tt.want.Severity || v != tt.want.Severity {
				t.Errorf("S = %q, V = %q, want %q", s, v, tt.want.Severity)
			}
			if got := FromBody(body); *got != tt.want {
				t.Errorf("FromBody = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestFromBody(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Error
	}{
		{"server error with extra fields", "SERROR\x00VERROR\x00C42P01\x00Mrelation \"x\" does not exist\x00P15\x00Fparse_relation.c\x00L1449\x00\x00",
			Error{Severity: "ERROR", Code: "42P01", Message: `relation "x" does not exist`}},
		{"localized S, V wins", "SFEHLER\x00VERROR\x00C22012\x00Mdivision by zero\x00\x00", Error{Severity: "ERROR", Code: "22012", Message: "division by zero"}},
		{"only S", "SNOTICE\x00C00000\x00Mhi\x00Hhint\x00Ddetail\x00\x00", Error{Severity: "NOTICE", Code: "00000", Message: "hi", Hint: "hint", Detail: "detail"}},
		{"truncated field keeps the earlier ones", "C08P01\x00Mcut", Error{Code: "08P01"}},
		{"empty", "", Error{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromBody([]byte(tt.body)); *got != tt.want {
				t.Errorf("FromBody = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestConstructors(t *testing.T) {
	tests := []struct {
		name     string
		make     func() *Error
		code     string
		severity string
		contains string
	}{
		{"Protocol", func() *Error { return Protocol("invalid %s message", "Bind") }, ProtocolViolation, SeverityFatal, "invalid Bind message"},
		{"UnknownMessage", func() *Error { return UnknownMessage('x') }, ProtocolViolation, SeverityFatal, "message type 120"},
		{"MessageTooLarge", func() *Error { return MessageTooLarge(100, 10) }, ProtocolViolation, SeverityFatal, "max_message_size (10)"},
		{"Shutdown", Shutdown, AdminShutdown, SeverityFatal, "shutting down"},
		{"Canceled", Canceled, QueryCanceled, "", "user request"},
		{"IdleInTransaction", IdleInTransaction, IdleInTransactionTimeout, SeverityFatal, "idle-in-transaction"},
		{"ConnectionLost", func() *Error { return ConnectionLost(false) }, ConnectionFailure, "", "current transaction is gone"},
		{"ConnectionLost pinned", func() *Error { return ConnectionLost(true) }, ConnectionFailure, "", "advisory locks"},
		{"NoStatement", func() *Error { return NoStatement("s1") }, InvalidSQLStatementName, "", `"s1" does not exist`},
		{"NoStatement unnamed", func() *Error { return NoStatement("") }, InvalidSQLStatementName, "", "unnamed prepared statement"},
		{"DuplicateStatement", func() *Error { return DuplicateStatement("s1") }, DuplicatePreparedStatement, "", `"s1" already exists`},
		{"Newf", func() *Error { return Newf(TooManyConnections, "Retry.", "no slot for %q", "api") }, TooManyConnections, "", `no slot for "api"`},
		{"New", func() *Error { return New(FeatureNotSupported, "lockpool: no", "Don't.") }, FeatureNotSupported, "", "lockpool: no"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := tt.make()
			if e.Code != tt.code || e.Severity != tt.severity {
				t.Errorf("code %q severity %q, want %q %q", e.Code, e.Severity, tt.code, tt.severity)
			}
			if !strings.HasPrefix(e.Message, "lockpool: ") || !strings.Contains(e.Message, tt.contains) {
				t.Errorf("message %q: want lockpool: prefix and %q", e.Message, tt.contains)
			}
			if e.Hint == "" {
				t.Error("no hint")
			}
			if e.Error() != tt.code+": "+e.Message {
				t.Errorf("Error() = %q", e.Error())
			}
			if e.SQLState() != tt.code {
				t.Errorf("SQLState() = %q", e.SQLState())
			}
			if e.IsFatal() != (tt.severity == SeverityFatal) {
				t.Errorf("IsFatal() = %v", e.IsFatal())
			}
			// Fresh values: changing one does not change the next.
			e.Message, e.Severity, e.Hint = "changed", "changed", "changed"
			if f := tt.make(); f == e || f.Message == "changed" || f.Severity == "changed" || f.Hint == "changed" {
				t.Errorf("%s returned a shared value", tt.name)
			}
		})
	}
	if got := InFailedTransaction(); got.Code != InFailedSQLTransaction || got.Message != "current transaction is aborted, commands ignored until end of transaction block" {
		t.Errorf("InFailedTransaction() = %+v (PostgreSQL's own message)", got)
	}
}

func TestCopies(t *testing.T) {
	e := New(TooManyConnections, "lockpool: busy", "Retry.")
	f := e.Fatal()
	h := e.WithHint("Wait.")
	d := e.WithDetail("3 waiting")
	if e.Severity != "" || e.Hint != "Retry." || e.Detail != "" {
		t.Errorf("original changed: %+v", *e)
	}
	if *f != (Error{Severity: SeverityFatal, Code: e.Code, Message: e.Message, Hint: e.Hint}) {
		t.Errorf("Fatal() = %+v", *f)
	}
	if h.Hint != "Wait." || h.Code != e.Code || h == e {
		t.Errorf("WithHint = %+v", *h)
	}
	if d.Detail != "3 waiting" || d.Hint != e.Hint || d == e {
		t.Errorf("WithDetail = %+v", *d)
	}
}

func TestAs(t *testing.T) {
	wrapped := fmt.Errorf("attach: %w", Shutdown())
	e, ok := As(wrapped)
	if !ok || e.Code != AdminShutdown {
		t.Fatalf("As(wrapped) = %v, %v", e, ok)
	}
	if _, ok := As(errors.New("plain")); ok {
		t.Error("As(plain) found an *Error")
	}
	protocolErr := wire.ProtocolErrorf("invalid message length %d", 2)
	if p := Protocol("%v", protocolErr); p.Message != "lockpool: protocol violation: invalid message length 2" {
		t.Errorf("Protocol(wire error) message = %q", p.Message)
	}
}

func FuzzFromBody(f *testing.F) {
	f.Add([]byte("SERROR\x00VERROR\x00C42P01\x00Mx\x00\x00"), "08P01", "lockpool: m", "h")
	f.Add([]byte("C"), "", "", "")
	f.Fuzz(func(t *testing.T, body []byte, code, msg, hint string) {
		_ = FromBody(body) // never panics
		if strings.ContainsRune(code+msg+hint, 0) {
			return
		}
		in := &Error{Severity: SeverityError, Code: code, Message: msg, Hint: hint}
		typ, b, rest, err := wire.Frame(in.AppendTo(nil, 'E'))
		if err != nil || typ != 'E' || len(rest) != 0 {
			t.Fatalf("Frame: %q %v %d", typ, err, len(rest))
		}
		if _, err := wire.ParseFields(b); err != nil {
			t.Fatalf("ParseFields(AppendTo) = %v", err)
		}
		if got := FromBody(b); *got != *in {
			t.Fatalf("FromBody(AppendTo(%+v)) = %+v", *in, *got)
		}
	})
}

func BenchmarkAppendTo(b *testing.B) {
	e := ConnectionLost(false)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = e.AppendTo(buf[:0], 'E')
	}
}
