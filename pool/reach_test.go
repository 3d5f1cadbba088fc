package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

func TestUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"eof", io.ErrUnexpectedEOF, true},
		{"wrapped refused", fmt.Errorf("connect: %w", syscall.ECONNREFUSED), true},
		{"canceled", context.Canceled, false},
		{"starting up", &pgconn.PgError{Code: "57P03"}, true},
		{"shutting down", &pgconn.PgError{Code: "57P01"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"wrong password", &pgconn.PgError{Code: "28P01"}, false},
		{"no database", fmt.Errorf("login: %w", &pgconn.PgError{Code: "3D000"}), false},
	} {
		if got := Unreachable(tc.err); got != tc.want {
			t.Errorf("%s: Unreachable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An outage is logged once when it starts and once when it ends, however
// many dials fail in between; a refused login is no outage.
func TestServerReachedLogsOutageOnce(t *testing.T) {
	f := newFakeServer()
	var log syncBuffer
	reg := prometheus.NewRegistry()
	m, err := New(Options{Server: srv(10), Apps: []AppConfig{app("a", 4, 1, 50*time.Millisecond)}, Dial: f.dial, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "lockpool_server_unreachable" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no lockpool_server_unreachable")
		return 0
	}
	if gauge() != 0 {
		t.Fatalf("lockpool_server_unreachable = %v at start, want 0", gauge())
	}
	acquire := func() error {
		c, err := m.Acquire(context.Background(), "a", "db")
		if err == nil {
			m.Release(c)
		}
		return err
	}
	f.failDials(&pgconn.PgError{Code: "28P01", Message: "password authentication failed"})
	if err := acquire(); err == nil {
		t.Fatal("acquire with a refused login succeeded")
	}
	f.failDials(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	for range 3 {
		if err := acquire(); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("acquire while down: %v", err)
		}
	}
	if gauge() != 1 {
		t.Fatalf("lockpool_server_unreachable = %v while down, want 1", gauge())
	}
	f.failDials(nil)
	for range 2 {
		if err := acquire(); err != nil {
			t.Fatal(err)
		}
	}
	if gauge() != 0 {
		t.Fatalf("lockpool_server_unreachable = %v after recovery, want 0", gauge())
	}
	out := log.String()
	for msg, want := range map[string]int{`msg="PostgreSQL unreachable"`: 1, `msg="PostgreSQL reachable again"`: 1} {
		if n := strings.Count(out, msg); n != want {
			t.Errorf("%d lines %s, want %d:\n%s", n, msg, want, out)
		}
	}
	if !strings.Contains(out, "failed_attempts=3") || !strings.Contains(out, "connection refused") {
		t.Errorf("the lines name no cause or count:\n%s", out)
	}
}
