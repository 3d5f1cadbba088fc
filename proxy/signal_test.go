package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/rewrite"
)

// signalShape takes the calls PostgreSQL runs as pg_cancel_backend(integer)
// or pg_terminate_backend(integer [, bigint]) and leaves the others to the
// server.
func TestSignalShape(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want bool
	}{
		{"SELECT pg_terminate_backend($1)", true},
		{"SELECT pg_terminate_backend($1, $2)", true},
		{"SELECT pg_terminate_backend(4194305)", true},
		{"SELECT pg_terminate_backend(-1)", true},
		{"SELECT pg_terminate_backend('4194305')", true},
		{"SELECT pg_terminate_backend(' 4194305 ', '5000')", true},
		{"SELECT pg_terminate_backend(4194305, 5000000000)", true},
		{"SELECT pg_terminate_backend($1::int, $2::int8)", true},
		{"SELECT pg_terminate_backend($1::smallint)", true},
		{"SELECT pg_cancel_backend($1)", true},
		{"SELECT pg_terminate_backend(5000000000)", false}, // a bigint constant: no function
		{"SELECT pg_terminate_backend(4194305.0)", false},  // numeric
		{"SELECT pg_terminate_backend($1::bigint)", false},
		{"SELECT pg_terminate_backend($1::numeric)", false},
		{"SELECT pg_terminate_backend('x')", false},
		{"SELECT pg_terminate_backend(NULL)", false},
		{"SELECT pg_terminate_backend($1, NULL)", false},
		{"SELECT pg_terminate_backend()", false},
		{"SELECT pg_terminate_backend($1, $2, $3)", false},
		{"SELECT pg_cancel_backend($1, 5)", false},
		{"SELECT pg_terminate_backend(4194305::int2)", false}, // out of range
	} {
		f := rewrite.Analyze(tc.sql)
		if f.Signal == nil {
			t.Fatalf("%s: no signal call found", tc.sql)
		}
		if got := signalShape(f.Signal); got != tc.want {
			t.Errorf("%s: signalShape = %v, want %v", tc.sql, got, tc.want)
		}
	}
}

// Parameters are read as PostgreSQL reads them, with its errors.
func TestDecodeIntParam(t *testing.T) {
	i4 := binary.BigEndian.AppendUint32(nil, 4194305)
	i8 := binary.BigEndian.AppendUint64(nil, 1<<40)
	for _, tc := range []struct {
		name      string
		raw       []byte
		format    int16
		ptyp, typ uint32
		want      int64
		code      string
	}{
		{"text int4", []byte(" 4194305 "), 0, oidInt4, oidInt4, 4194305, ""},
		{"text plus", []byte("+12"), 0, oidInt4, oidInt4, 12, ""},
		{"text bad", []byte("12x"), 0, oidInt4, oidInt4, 0, "22P02"},
		{"text double sign", []byte("--1"), 0, oidInt4, oidInt4, 0, "22P02"},
		{"text out of range", []byte("5000000000"), 0, oidInt4, oidInt4, 0, "22003"},
		{"text bigint", []byte("5000000000"), 0, oidInt8, oidInt8, 5000000000, ""},
		{"text declared, cast to int", []byte("77"), 0, oidText, oidInt4, 77, ""},
		{"binary int4", i4, 1, oidInt4, oidInt4, 4194305, ""},
		{"binary int2", []byte{0, 7}, 1, oidInt2, oidInt4, 7, ""},
		{"binary int8 as timeout", i8, 1, oidInt8, oidInt8, 1 << 40, ""},
		{"binary int8 cast to int, too large", i8, 1, oidInt8, oidInt4, 0, "22003"},
		{"binary too short", i4, 1, oidInt8, oidInt8, 0, "08P01"},
		{"binary too long", i8, 1, oidInt4, oidInt4, 0, "22P03"},
		{"binary text", []byte("9"), 1, oidText, oidInt4, 9, ""},
	} {
		v, pe := decodeIntParam(tc.raw, tc.format, tc.ptyp, tc.typ, 1)
		switch {
		case tc.code != "" && (pe == nil || pe.Code != tc.code):
			t.Errorf("%s: got %d, %v; want SQLSTATE %s", tc.name, v, pe, tc.code)
		case tc.code == "" && (pe != nil || v != tc.want):
			t.Errorf("%s: got %d, %v; want %d", tc.name, v, pe, tc.want)
		}
	}
}

// A forwarded signal request reads back as it was written, and a MAC
// depends on the key, the challenge and every byte of the request.
func TestSignalRequestWire(t *testing.T) {
	for _, r := range []signalRequest{
		{pid: keyPIDOf(7, 42), terminate: true, timeout: 1500 * time.Millisecond, user: "app", admin: false},
		{pid: keyPIDOf(255, 1), user: "admin user", admin: true},
		{pid: keyPIDOf(1, 0), terminate: true, user: ""},
	} {
		b := appendSignalRequest(nil, r)
		got, err := parseSignalRequest(b)
		if err != nil || got != r {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
		if _, err := parseSignalRequest(append(b, 'x')); err == nil {
			t.Errorf("%+v with a trailing byte parsed", r)
		}
		if _, err := parseSignalRequest(b[:len(b)-1]); err == nil {
			t.Errorf("%+v without its user's NUL parsed", r)
		}
	}
	if _, err := parseSignalRequest(appendSignalRequest(nil, signalRequest{pid: 1, timeout: 48 * time.Hour})); err == nil {
		t.Error("a timeout of 48 h parsed")
	}
	key, challenge := newSignalKey(), newSignalKey()
	body := appendSignalRequest(nil, signalRequest{pid: keyPIDOf(2, 9), terminate: true, user: "app"})
	mac := signalMAC(key, challenge, body)
	other := append([]byte(nil), body...)
	other[len(other)-2] ^= 1
	for name, m := range map[string][]byte{
		"other key":       signalMAC(newSignalKey(), challenge, body),
		"other challenge": signalMAC(key, newSignalKey(), body),
		"other request":   signalMAC(key, challenge, other),
	} {
		if string(m) == string(mac) {
			t.Errorf("the MAC with %s is the same", name)
		}
	}
}

// signalClient: another user is refused, a cancel of a client with nothing
// running is sent, a terminate kills the session (its FATAL is written)
// and, with a timeout, waits for the session's end: false when it did not
// come in time, true when it does.
func TestSignalClient(t *testing.T) {
	srv := &Server{log: slog.New(slog.DiscardHandler), sessions: map[uint32]*session{}, baseCtx: context.Background()}
	client, peer := net.Pipe()
	defer peer.Close()
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		read <- string(b)
	}()
	ss := &session{srv: srv, user: "app", app: &appState{cfg: config.Application{Name: "api"}}, pid: keyPIDOf(0, 7), secret: 9}
	ss.out.conn = client
	srv.sessions[ss.pid] = ss
	ctx := context.Background()
	req := func(user string, admin, terminate bool, timeout time.Duration) signalRequest {
		return signalRequest{pid: ss.pid, user: user, admin: admin, terminate: terminate, timeout: timeout}
	}
	for _, tc := range []struct {
		name string
		r    signalRequest
		want signalResult
	}{
		{"other user, terminate", req("other", false, true, 0), signalDenied},
		{"other user, cancel", req("other", false, false, 0), signalDenied},
		{"same user, cancel", req("app", false, false, 0), signalSent},
		{"admin, cancel", req("root", true, false, 0), signalSent},
		{"no such client", signalRequest{pid: keyPIDOf(0, 8), user: "app", terminate: true}, signalNoClient},
		{"terminate, session does not end within 20 ms", req("app", false, true, 20*time.Millisecond), signalStillRunning},
	} {
		if got := srv.signalClient(ctx, tc.r); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := <-read; !strings.Contains(got, "57P01") || !strings.Contains(got, "terminating connection due to administrator command") {
		t.Errorf("the client read %q, want the FATAL 57P01", got)
	}
	srv.sessionEnded(ss) // the watch the timed-out call left
	done := make(chan signalResult, 1)
	go func() { done <- srv.signalClient(ctx, req("root", true, true, 10*time.Second)) }()
	waited := func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.ends[ss] != nil
	}
	for !waited() {
		runtime.Gosched()
	}
	srv.unregister(ss)
	srv.sessionEnded(ss)
	if got := <-done; got != signalSent {
		t.Errorf("terminate with a timeout, session ended: %d, want %d", got, signalSent)
	}
	if len(srv.ends) != 0 {
		t.Errorf("%d end watches left", len(srv.ends))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	srv.sessions[ss.pid] = ss
	if got := srv.signalClient(cctx, req("app", false, true, 10*time.Second)); got != signalCanceled {
		t.Errorf("terminate with a timeout, caller cancelled: %d, want %d", got, signalCanceled)
	}
}

func TestSignalWarningPID(t *testing.T) {
	notice := func(fields ...string) []byte {
		var b []byte
		for _, f := range fields {
			b = append(append(b, f...), 0)
		}
		return append(b, 0)
	}
	ours := []string{"SWARNING", "VWARNING", "C01000", "MPID 4194305 is not a PostgreSQL backend process", "Fsignalfuncs.c", "L71", "Rpg_signal_backend"}
	cases := []struct {
		name string
		body []byte
		pid  uint32
		ok   bool
	}{
		{"the warning", notice(ours...), 4194305, true},
		{"localized", notice("SWARNUNG", "VWARNING", "C01000", "MPID 4194306 ist kein PostgreSQL-Serverprozess", "Rpg_signal_backend"), 4194306, true},
		{"a backend's pid", notice("VWARNING", "C01000", "MPID 4000 is not a PostgreSQL backend process", "Rpg_signal_backend"), 0, false},
		{"another routine", notice("VWARNING", "C01000", "MPID 4194305 is not a PostgreSQL backend process", "Rexec_stmt_raise"), 0, false},
		{"another code", notice("VWARNING", "C42501", "MPID 4194305 is not a PostgreSQL backend process", "Rpg_signal_backend"), 0, false},
		{"a notice", notice("VNOTICE", "C01000", "MPID 4194305 is not a PostgreSQL backend process", "Rpg_signal_backend"), 0, false},
		{"two numbers", notice("VWARNING", "C01000", "MPID 4194305 is not 4194306", "Rpg_signal_backend"), 0, false},
		{"truncated", []byte("VWARNING\x00C01000"), 0, false},
	}
	for _, c := range cases {
		pid, ok := signalWarningPID(c.body)
		if pid != c.pid || ok != c.ok {
			t.Errorf("%s: signalWarningPID = %d, %v; want %d, %v", c.name, pid, ok, c.pid, c.ok)
		}
	}
}
