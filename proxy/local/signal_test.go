package local

import (
	"encoding/binary"
	"testing"

	"github.com/lockpool/lockpool/internal/wire"
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
		{"text int4", []byte(" 4194305 "), 0, wire.OIDInt4, wire.OIDInt4, 4194305, ""},
		{"text plus", []byte("+12"), 0, wire.OIDInt4, wire.OIDInt4, 12, ""},
		{"text bad", []byte("12x"), 0, wire.OIDInt4, wire.OIDInt4, 0, "22P02"},
		{"text double sign", []byte("--1"), 0, wire.OIDInt4, wire.OIDInt4, 0, "22P02"},
		{"text out of range", []byte("5000000000"), 0, wire.OIDInt4, wire.OIDInt4, 0, "22003"},
		{"text bigint", []byte("5000000000"), 0, wire.OIDInt8, wire.OIDInt8, 5000000000, ""},
		{"text declared, cast to int", []byte("77"), 0, wire.OIDText, wire.OIDInt4, 77, ""},
		{"binary int4", i4, 1, wire.OIDInt4, wire.OIDInt4, 4194305, ""},
		{"binary int2", []byte{0, 7}, 1, wire.OIDInt2, wire.OIDInt4, 7, ""},
		{"binary int8 as timeout", i8, 1, wire.OIDInt8, wire.OIDInt8, 1 << 40, ""},
		{"binary int8 cast to int, too large", i8, 1, wire.OIDInt8, wire.OIDInt4, 0, "22003"},
		{"binary too short", i4, 1, wire.OIDInt8, wire.OIDInt8, 0, "08P01"},
		{"binary too long", i8, 1, wire.OIDInt4, wire.OIDInt4, 0, "22P03"},
		{"binary text", []byte("9"), 1, wire.OIDText, wire.OIDInt4, 9, ""},
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

// SignalWarningPID finds pg_signal_backend's warning in any language, and
// nothing else; a backend's pid is found too (the core keeps key pids).
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
		pid  int64
		ok   bool
	}{
		{"the warning", notice(ours...), 4194305, true},
		{"localized", notice("SWARNUNG", "VWARNING", "C01000", "MPID 4194306 ist kein PostgreSQL-Serverprozess", "Rpg_signal_backend"), 4194306, true},
		{"a backend's pid", notice("VWARNING", "C01000", "MPID 4000 is not a PostgreSQL backend process", "Rpg_signal_backend"), 4000, true},
		{"another routine", notice("VWARNING", "C01000", "MPID 4194305 is not a PostgreSQL backend process", "Rexec_stmt_raise"), 0, false},
		{"another code", notice("VWARNING", "C42501", "MPID 4194305 is not a PostgreSQL backend process", "Rpg_signal_backend"), 0, false},
		{"a notice", notice("VNOTICE", "C01000", "MPID 4194305 is not a PostgreSQL backend process", "Rpg_signal_backend"), 0, false},
		{"two numbers", notice("VWARNING", "C01000", "MPID 4194305 is not 4194306", "Rpg_signal_backend"), 0, false},
		{"truncated", []byte("VWARNING\x00C01000"), 0, false},
	}
	for _, c := range cases {
		pid, ok := SignalWarningPID(c.body)
		if pid != c.pid || ok != c.ok {
			t.Errorf("%s: SignalWarningPID = %d, %v; want %d, %v", c.name, pid, ok, c.pid, c.ok)
		}
	}
}
