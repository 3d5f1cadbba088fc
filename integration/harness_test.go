package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

const appPassword = "app-secret-pw"

func TestMain(m *testing.M) {
	os.Exit(pgtest.RunMain(m, func(c *pgtest.Cluster) error {
		ctx := context.Background()
		for _, u := range []string{"app", "app2", "jobs", "rejecter", "other",
			// issue 2 acceptance tests: one role per test that counts backends in pg_stat_activity.
			"bench", "hup", "dier", "params", "pooler", "psqlr",
			// issue 3 lock tests.
			"lkrand"} {
			if err := c.CreateRole(ctx, u, appPassword); err != nil {
				return err
			}
		}
		if err := c.CreateDatabase(ctx, "appdb", "app"); err != nil {
			return err
		}
		if err := c.CreateDatabase(ctx, "benchdb", "bench"); err != nil {
			return err
		}
		return c.Exec(ctx, "appdb", "GRANT ALL ON SCHEMA public TO PUBLIC; GRANT CREATE ON DATABASE appdb TO PUBLIC")
	}))
}

// lp is one in-process lockpool.
type lp struct {
	t     *testing.T
	srv   *proxy.Server
	addr  string
	port  int
	reg   *prometheus.Registry
	admin *httptest.Server
	cfg   *config.Config
}

// appYAML describes one application for startLockpool.
type appYAML struct {
	name, user, db  string
	max, pinned     int
	advisory, state string
	wait            string
	mode            string
	extra           string
}

func defaultApp() appYAML {
	return appYAML{name: "api", user: "app", db: "appdb", max: 4, pinned: 1, advisory: "pin", state: "pin", wait: "5s"}
}

// startLockpool runs lockpool in-process against the shared cluster.
func startLockpool(t *testing.T, serverMax int, extra string, apps ...appYAML) *lp {
	t.Helper()
	c := pgtest.Require(t)
	if len(apps) == 0 {
		apps = []appYAML{defaultApp()}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nadmin_listen: \"\"\nauth_method: scram-sha-256\nleak_check_interval: 0s\n%s\n", extra)
	fmt.Fprintf(&b, "server:\n  host: %s\n  port: %d\n  max_connections: %d\n", c.Host, c.Port, serverMax)
	b.WriteString("users:\n")
	seen := map[string]bool{}
	for _, a := range apps {
		if !seen[a.user] {
			seen[a.user] = true
			fmt.Fprintf(&b, "  - name: %s\n    password: %s\n", a.user, appPassword)
		}
	}
	b.WriteString("applications:\n")
	for _, a := range apps {
		fmt.Fprintf(&b, "  - name: %s\n    user: %s\n", a.name, a.user)
		if a.db != "" {
			fmt.Fprintf(&b, "    database: %s\n", a.db)
		}
		if a.mode == "" {
			a.mode = "transaction"
		}
		fmt.Fprintf(&b, "    pool_mode: %s\n    max_connections: %d\n    max_pinned: %d\n    advisory_locks: %s\n    session_state: %s\n    wait_timeout: %s\n%s",
			a.mode, a.max, a.pinned, a.advisory, a.state, a.wait, a.extra)
	}
	cfg, err := config.Parse([]byte(b.String()), "test.yaml", nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, b.String())
	}
	return startLockpoolConfig(t, cfg)
}

func startLockpoolConfig(t *testing.T, cfg *config.Config) *lp {
	t.Helper()
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("LOCKPOOL_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
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
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		l.admin.Close()
	})
	return l
}

// dsn is a libpq-style connection string through lockpool.
func (l *lp) dsn(user, db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", l.port, user, appPassword, db)
}

func (l *lp) url(user, db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", user, appPassword, l.port, db)
}

// connect opens a pgx connection (default exec mode) through lockpool.
func (l *lp) connect(t testing.TB, user, db string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, l.dsn(user, db))
	if err != nil {
		t.Fatalf("connect through lockpool: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// metric returns the value of one series from the registry (0 if absent).
func (l *lp) metric(name string, labels map[string]string) float64 {
	mfs, err := l.reg.Gather()
	if err != nil {
		l.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func (l *lp) get(path string) (int, string) {
	resp, err := http.Get(l.admin.URL + path)
	if err != nil {
		l.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// superConn connects to the cluster directly as the superuser.
func superConn(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	c := pgtest.Require(t)
	conn, err := pgx.Connect(context.Background(), c.SuperuserDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
