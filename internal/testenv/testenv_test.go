package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
)

func TestAppsYAMLParses(t *testing.T) {
	c := &pgtest.Cluster{Host: "127.0.0.1", Port: 5999}
	session := App{Name: "s", User: "other", DB: "appdb", Max: 2, Pinned: 1, Advisory: "reject", State: "reject", Wait: "1s", Mode: "session", Extra: "    max_clients: 10"}
	for _, tc := range []struct {
		name       string
		top        string
		apps       []App
		wantApps   []string
		wantUsers  int
		wantLeak   time.Duration
		wantListen string
	}{
		{name: "listen set by top", top: "listen: 127.0.0.1:7000\nadmin_listen: 127.0.0.1:7001", wantApps: []string{"api"}, wantUsers: 1, wantListen: "127.0.0.1:7000"},
		{name: "default app", wantApps: []string{"api"}, wantUsers: 1},
		{name: "leak interval set by top", top: "leak_check_interval: 3s", wantApps: []string{"api"}, wantUsers: 1, wantLeak: 3 * time.Second},
		{name: "two apps, one user each", apps: []App{DefaultApp(), session}, wantApps: []string{"api", "s"}, wantUsers: 2},
		{name: "two apps of one user", apps: []App{DefaultApp(), {Name: "b", User: "app", DB: "postgres", Max: 2, Pinned: 1, Advisory: "pin", State: "pin", Wait: "2s"}}, wantApps: []string{"api", "b"}, wantUsers: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := AppsYAML(c, 7, tc.top, tc.apps...)
			cfg, err := config.Parse([]byte(yaml), "test.yaml", nil)
			if err != nil {
				t.Fatalf("config.Parse: %v\n%s", err, yaml)
			}
			var names []string
			for _, a := range cfg.Applications {
				names = append(names, a.Name)
			}
			if fmt.Sprint(names) != fmt.Sprint(tc.wantApps) {
				t.Errorf("applications %v, want %v", names, tc.wantApps)
			}
			if len(cfg.Users) != tc.wantUsers {
				t.Errorf("%d users, want %d", len(cfg.Users), tc.wantUsers)
			}
			if cfg.Server.Port != 5999 || cfg.Server.MaxConnections != 7 {
				t.Errorf("server port %d max %d, want 5999 and 7", cfg.Server.Port, cfg.Server.MaxConnections)
			}
			if tc.wantListen == "" {
				tc.wantListen = "127.0.0.1:0"
			}
			if cfg.Listen != tc.wantListen {
				t.Errorf("listen %q, want %q", cfg.Listen, tc.wantListen)
			}
			if got := cfg.LeakCheckInterval; got != tc.wantLeak {
				t.Errorf("leak_check_interval %v, want %v", got, tc.wantLeak)
			}
		})
	}
}

// TestAppsYAMLTarget: an App's Target and MaxLag become the application's
// target and max_lag, beside its Extra lines.
func TestAppsYAMLTarget(t *testing.T) {
	c := &pgtest.Cluster{Host: "127.0.0.1", Port: 5999}
	reads := App{Name: "reads", User: "reader", DB: "appdb", Max: 2, Pinned: 1, Advisory: "pin", State: "pin", Wait: "1s",
		Target: "standby", MaxLag: "2s", Extra: "    max_clients: 10"}
	yaml := AppsYAML(c, 7, "", DefaultApp(), reads)
	cfg, err := config.Parse([]byte(yaml), "test.yaml", nil)
	if err != nil {
		t.Fatalf("config.Parse: %v\n%s", err, yaml)
	}
	api, r := cfg.Applications[0], cfg.Applications[1]
	if api.Target != config.TargetPrimary || r.Target != config.TargetStandby || r.MaxLag != 2*time.Second || r.MaxClients != 10 {
		t.Errorf("api target %q; reads target %q max_lag %v max_clients %d, want primary; standby 2s 10\n%s",
			api.Target, r.Target, r.MaxLag, r.MaxClients, yaml)
	}
}

func TestUniqueName(t *testing.T) {
	for _, tc := range []struct{ sub, prefix, want string }{
		{"a-b.c#d", "t", "t_testuniquename_a_b_c_d"},
		{"Mixed", "Tbl", "tbl_testuniquename_mixed"},
		{strings.Repeat("x", 80), "t", ("t_testuniquename_" + strings.Repeat("x", 80))[:63]},
	} {
		t.Run(tc.sub, func(t *testing.T) {
			if got := UniqueName(t, tc.prefix); got != tc.want {
				t.Errorf("UniqueName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCode(t *testing.T) {
	pe := &pgconn.PgError{Code: "0A000", Message: "no"}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"other error", context.Canceled, ""},
		{"PostgreSQL error", pe, "0A000"},
		{"wrapped", fmt.Errorf("query: %w", pe), "0A000"},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("%s: Code = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestLogBufferWaitFor(t *testing.T) {
	var l LogBuffer
	found := make(chan bool)
	go func() { found <- l.WaitFor(context.Background(), "ready", nil) }()
	_, _ = l.Write([]byte("starting\n"))
	_, _ = l.Write([]byte("re"))
	_, _ = l.Write([]byte("ady\n"))
	if !<-found {
		t.Fatal("WaitFor did not see a string written in two pieces")
	}
	if got := l.String(); got != "starting\nready\n" {
		t.Errorf("String = %q", got)
	}

	stop := make(chan struct{})
	close(stop)
	if l.WaitFor(context.Background(), "never", stop) {
		t.Error("WaitFor found a string never written")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if l.WaitFor(ctx, "never", nil) {
		t.Error("WaitFor found a string never written (cancelled context)")
	}
}

func TestProcess(t *testing.T) {
	t.Run("exit status and output", func(t *testing.T) {
		var out LogBuffer
		cmd := exec.Command("/bin/sh", "-c", "echo hello; exit 3")
		cmd.Stdout = &out
		p, err := StartProcess(cmd)
		if err != nil {
			t.Fatal(err)
		}
		<-p.Done()
		if p.Alive() {
			t.Error("Alive after Done")
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 3 {
			t.Errorf("Err = %v, want exit status 3", p.Err())
		}
		if out.String() != "hello\n" {
			t.Errorf("output %q", out.String())
		}
	})
	t.Run("Stop ends with SIGTERM", func(t *testing.T) {
		p, err := StartLogged(t.TempDir(), "sleeper", nil, "/bin/sh", "-c", "echo started; exec sleep 30")
		if err != nil {
			t.Fatal(err)
		}
		Eventually(t, 10*time.Second, "\"started\" in the log file", func() bool { return p.LogTail(100) == "started\n" })
		err = p.Stop(10 * time.Second)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Errorf("Stop = %v, want killed by SIGTERM", err)
		}
		if err := p.Stop(time.Second); err == nil {
			t.Error("Stop of an exited process: nil error")
		}
	})
}

func TestLockLogExplains(t *testing.T) {
	g := NewLockLog()
	open := g.Open(1, 10) // open, backend unknown
	closed := g.Open(2, 20)
	g.SetPID(closed, 200)
	end := time.Now()
	g.Close(closed, end)
	g.Close(closed, end.Add(time.Hour)) // the first end stays
	after := end.Add(time.Second)

	for _, tc := range []struct {
		name   string
		pid    uint32
		key    int64
		qs, qe time.Time
		want   bool
	}{
		{"open hold, any backend", 999, 10, after, after, true},
		{"closed hold, its backend, before the end", 200, 20, end.Add(-time.Millisecond), end, true},
		{"closed hold, other backend", 201, 20, end.Add(-time.Millisecond), end, false},
		{"closed hold, query after the end", 200, 20, after, after, false},
		{"no hold of the key", 200, 30, after, after, false},
		{"query before the hold opened", 999, 10, end.Add(-time.Hour), end.Add(-time.Hour), false},
	} {
		if got := g.Explains(tc.pid, tc.key, tc.qs, tc.qe); got != tc.want {
			t.Errorf("%s: Explains = %v, want %v", tc.name, got, tc.want)
		}
	}
	g.Prune(after)
	if g.Explains(200, 20, end.Add(-time.Millisecond), end) {
		t.Error("a hold that ended before Prune's time still explains")
	}
	if !g.Explains(999, 10, after, after) {
		t.Error("Prune dropped an open hold")
	}
	g.Close(open, after)
}

// ServedBy finds which process holds the other end of a connection.
func TestServedBy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ac, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	for _, tc := range []struct {
		name string
		pid  int
		want bool
	}{
		{"the accepting process", os.Getpid(), true},
		{"another process", other.Process.Pid, false},
	} {
		got, err := ServedBy(tc.pid, c)
		if err != nil || got != tc.want {
			t.Errorf("%s: ServedBy = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestLockLogConflicts(t *testing.T) {
	g := NewLockLog()
	base := time.Now()
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(client int, key int64, from, to int) {
		h := g.Open(client, key)
		g.mu.Lock()
		h.from = at(from)
		g.mu.Unlock()
		if to >= 0 {
			g.Close(h, at(to))
		}
	}
	hold(1, 7, 0, 10)
	hold(2, 7, 10, 20)  // begins as 1's ends: no conflict
	hold(3, 7, 30, 100) // a long hold
	hold(4, 7, 40, 50)  // inside 3's
	hold(3, 8, 0, 10)
	hold(3, 8, 5, 15) // the same client: no conflict
	hold(5, 9, 0, -1) // open
	hold(6, 9, 60, 70)
	got := g.Conflicts()
	if len(got) != 2 {
		t.Fatalf("conflicts %+v, want 2", got)
	}
	if c := got[0]; c.Key != 7 || c.A != 3 || c.B != 4 {
		t.Errorf("first conflict %+v, want key 7 clients 3 and 4", c)
	}
	if c := got[1]; c.Key != 9 || c.A != 5 || c.B != 6 || !c.ATo.IsZero() {
		t.Errorf("second conflict %+v, want key 9 clients 5 (open) and 6", c)
	}
}
