package integration

// Helpers for the issue 7 tests (fault_*, limits_*, tls_*): roles and
// databases made on demand, lockpool started from a whole YAML text with a
// logger the test can read, and the processes of a cluster.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// flLong reports whether the full-size acceptance numbers were asked for
// (LOCKPOOL_LONG=1); the default keeps the suite fast.
func flLong() bool { return os.Getenv("LOCKPOOL_LONG") != "" }

// flEnsureRole creates a LOGIN role with appPassword on cluster c unless it
// exists.
func flEnsureRole(t testing.TB, c *pgtest.Cluster, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sql := fmt.Sprintf(`SET password_encryption = 'scram-sha-256';
DO $$BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN
    CREATE ROLE %s LOGIN PASSWORD '%s';
  END IF;
END$$`, name, pgx.Identifier{name}.Sanitize(), appPassword)
	if err := c.Exec(ctx, "postgres", sql); err != nil {
		t.Fatal(err)
	}
}

// flEnsureDB creates database name owned by owner unless it exists.
func flEnsureDB(t testing.TB, c *pgtest.Cluster, name, owner string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.SuperuserDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		if err := c.CreateDatabase(ctx, name, owner); err != nil {
			t.Fatal(err)
		}
	}
}

// flLog is a concurrency-safe buffer for lockpool's log.
type flLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *flLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if os.Getenv("LOCKPOOL_TEST_LOG") != "" {
		_, _ = os.Stderr.Write(p)
	}
	return l.b.Write(p)
}

func (l *flLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// flStart runs lockpool in-process from a complete YAML config (listen and
// admin_listen are ignored: the test listens itself), logging at debug
// level into the returned buffer.
func flStart(t *testing.T, yaml string) (*lp, *flLog) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml", nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	logBuf := &flLog{}
	logger := slog.New(slog.NewTextHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: logger, Registerer: reg})
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	l := &lp{t: t, srv: srv, addr: ln.Addr().String(), port: ln.Addr().(*net.TCPAddr).Port, reg: reg, cfg: cfg}
	l.admin = httptest.NewServer(srv.AdminHandler(reg))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		l.admin.Close()
	})
	return l, logBuf
}

// flYAML is a config for one application of user on cluster c.
func flYAML(c *pgtest.Cluster, top string, serverMax int, serverExtra, user, password, appExtra string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: scram-sha-256
leak_check_interval: 0s
%s
server:
  host: %s
  port: %d
  max_connections: %d
%s
users:
  - name: %s
    password: '%s'
applications:
  - name: %s
    user: %s
%s
`, top, c.Host, c.Port, serverMax, serverExtra, user, password, user, user, appExtra)
}

// flServerConns counts lockpool's server connections for role (its own
// lease connections excluded).
func flServerConns(ctx context.Context, su *pgx.Conn, role string) (int, error) {
	return countBackends(ctx, su, fmt.Sprintf("usename = '%s' AND application_name NOT LIKE 'lockpool%%'", role))
}

// flSettle waits until runtime.NumGoroutine() is at most limit, and returns
// the last count.
func flSettle(limit int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		n := runtime.NumGoroutine()
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// flClusterPIDs returns the postmaster's pid followed by every process
// whose parent it is (the backends and auxiliary processes).
func flClusterPIDs(t testing.TB, c *pgtest.Cluster) []int {
	t.Helper()
	pm, err := c.PostmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{pm}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces: cut at the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 2 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == pm {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
