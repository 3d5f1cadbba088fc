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

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/pgerr"
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
	gauge := func() float64 { return unreachableGauge(t, reg) }
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

// TestNoStandbyIsNotUnreachable: an application of target standby that
// finds no standby gets the monitor's 53300 after its wait_timeout, without
// a dial; that is no outage of PostgreSQL (the primary may answer): the
// gauge lockpool_server_unreachable stays 0 and "PostgreSQL unreachable" is
// not logged. An application of target primary that finds no primary is
// one.
func TestNoStandbyIsNotUnreachable(t *testing.T) {
	addr := config.HostAddr{Host: "127.0.0.1", Port: 5999}
	mon, err := hosts.New(hosts.Options{
		Hosts:    []config.HostAddr{addr},
		Interval: 10 * time.Millisecond,
		Connect: func(context.Context, config.HostAddr) (*pgconn.PgConn, error) {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mon.Start()
	defer mon.Close()
	f := newFakeServer()
	var log syncBuffer
	reg := prometheus.NewRegistry()
	reads := app("reads", 2, 1, 100*time.Millisecond)
	reads.Target = hosts.Target{Kind: config.TargetStandby, MaxLag: time.Second}
	api := app("api", 2, 1, 100*time.Millisecond)
	api.Target = hosts.Target{Kind: config.TargetPrimary}
	m, err := New(Options{Server: srv(10), Apps: []AppConfig{reads, api}, Dial: f.dial, Hosts: mon, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	gauge := func() float64 { return unreachableGauge(t, reg) }
	acquire := func(name string) *pgerr.Error {
		t.Helper()
		c, err := m.Acquire(context.Background(), name, "db")
		if err == nil {
			m.Release(c)
			t.Fatalf("%s: Acquire with no host succeeded", name)
		}
		var pe *pgerr.Error
		if !errors.As(err, &pe) || pe.Code != pgerr.TooManyConnections {
			t.Fatalf("%s: Acquire: %v, want the monitor's 53300", name, err)
		}
		return pe
	}
	for range 2 {
		if pe := acquire("reads"); !strings.Contains(pe.Message, "no standby") {
			t.Fatalf("reads: %v, want no standby", pe)
		}
	}
	if gauge() != 0 || strings.Contains(log.String(), "PostgreSQL unreachable") {
		t.Fatalf("target standby with no standby: lockpool_server_unreachable = %v, log:\n%s", gauge(), log.String())
	}
	if pe := acquire("api"); !strings.Contains(pe.Message, "no primary") {
		t.Fatalf("api: %v, want no primary", pe)
	}
	if gauge() != 1 || !strings.Contains(log.String(), "PostgreSQL unreachable") {
		t.Fatalf("target primary with no primary: lockpool_server_unreachable = %v, log:\n%s", gauge(), log.String())
	}
	f.mu.Lock()
	n := f.dials
	f.mu.Unlock()
	if n != 0 {
		t.Errorf("%d dials with no host to dial", n)
	}
}

// unreachableGauge reads lockpool_server_unreachable from reg.
func unreachableGauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
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
