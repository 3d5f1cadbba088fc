package testenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// Password is the password of every role the tests make and of every user
// in the configurations written here.
const Password = "app-secret-pw"

// App is one entry of applications: in the YAML [AppsYAML] writes.
type App struct {
	Name, User, DB  string
	Max, Pinned     int    // max_connections, max_pinned
	Advisory, State string // advisory_locks, session_state
	Wait            string // wait_timeout
	Mode            string // pool_mode ("" is transaction)
	Target          string // target ("" leaves it out: primary)
	MaxLag          string // max_lag ("" leaves it out: 10s)
	Extra           string // more lines of the application, indented four spaces
}

// DefaultApp is application "api" of role app on database appdb: budget 4,
// one pinned session, advisory locks and session state pin, a 5 s wait.
func DefaultApp() App {
	return App{Name: "api", User: "app", DB: "appdb", Max: 4, Pinned: 1, Advisory: "pin", State: "pin", Wait: "5s"}
}

// AppsYAML is a lockpool configuration for cluster c: server budget
// serverMax, the top-level lines top, one user per distinct App.User with
// [Password], and apps ([DefaultApp] if none). Unless top sets them, listen
// is 127.0.0.1:0, admin_listen is off, auth_method is scram-sha-256 and
// leak_check_interval is 0s.
func AppsYAML(c *pgtest.Cluster, serverMax int, top string, apps ...App) string {
	if len(apps) == 0 {
		apps = []App{DefaultApp()}
	}
	var b strings.Builder
	for _, d := range [][2]string{{"listen", "127.0.0.1:0"}, {"admin_listen", `""`}, {"auth_method", "scram-sha-256"}, {"leak_check_interval", "0s"}} {
		if !regexp.MustCompile(`(?m)^` + d[0] + `:`).MatchString(top) {
			fmt.Fprintf(&b, "%s: %s\n", d[0], d[1])
		}
	}
	fmt.Fprintf(&b, "%s\n", top)
	fmt.Fprintf(&b, "server:\n  host: %s\n  port: %d\n  max_connections: %d\n", c.Host, c.Port, serverMax)
	b.WriteString("users:\n")
	seen := map[string]bool{}
	for _, a := range apps {
		if !seen[a.User] {
			seen[a.User] = true
			fmt.Fprintf(&b, "  - name: %s\n    password: %s\n", a.User, Password)
		}
	}
	b.WriteString("applications:\n")
	for _, a := range apps {
		fmt.Fprintf(&b, "  - name: %s\n    user: %s\n", a.Name, a.User)
		if a.DB != "" {
			fmt.Fprintf(&b, "    database: %s\n", a.DB)
		}
		if a.Mode == "" {
			a.Mode = "transaction"
		}
		fmt.Fprintf(&b, "    pool_mode: %s\n    max_connections: %d\n    max_pinned: %d\n    advisory_locks: %s\n    session_state: %s\n    wait_timeout: %s\n%s",
			a.Mode, a.Max, a.Pinned, a.Advisory, a.State, a.Wait, routeYAML(a)+a.Extra)
		if a.Extra != "" && !strings.HasSuffix(a.Extra, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// routeYAML is the target and max_lag lines of a, those it sets.
func routeYAML(a App) string {
	var s string
	if a.Target != "" {
		s += "    target: " + a.Target + "\n"
	}
	if a.MaxLag != "" {
		s += "    max_lag: " + a.MaxLag + "\n"
	}
	return s
}

// UserYAML is a lockpool configuration for cluster c with one user and one
// application both named user: top-level lines top, server budget serverMax
// and more server: lines serverExtra, the user's password, and the
// application's further lines appExtra (indented four spaces).
func UserYAML(c *pgtest.Cluster, top string, serverMax int, serverExtra, user, password, appExtra string) string {
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

// Lockpool is a lockpool server running in the test process, listening on
// 127.0.0.1 with its admin handler on an httptest server. It stops when the
// test that started it ends.
type Lockpool struct {
	t        testing.TB
	Server   *proxy.Server
	Addr     string // host:port of the client listener
	Port     int
	Registry *prometheus.Registry
	Admin    *httptest.Server
	Config   *config.Config
	// Warnings is what lockpool logged at WARN and above (not for
	// [StartYAML], whose buffer has the whole log). A test that fails
	// prints it.
	Warnings *LogBuffer
}

// Start runs lockpool in-process against the shared cluster with the
// configuration [AppsYAML] writes.
func Start(t *testing.T, serverMax int, top string, apps ...App) *Lockpool {
	t.Helper()
	yaml := AppsYAML(pgtest.Require(t), serverMax, top, apps...)
	cfg, err := config.Parse([]byte(yaml), "test.yaml", nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return StartConfig(t, cfg)
}

// StartConfig runs lockpool in-process from cfg (its listen and
// admin_listen are not used: the test listens itself). Its warnings and
// errors are kept in [Lockpool.Warnings] and printed when the test fails;
// the whole log goes to stderr at debug level when LOCKPOOL_TEST_LOG is set.
func StartConfig(t *testing.T, cfg *config.Config) *Lockpool {
	t.Helper()
	warnings := &LogBuffer{}
	h := slog.Handler(slog.NewTextHandler(warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if os.Getenv("LOCKPOOL_TEST_LOG") != "" {
		h = slog.NewMultiHandler(h, slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	l := startServer(t, cfg, slog.New(h))
	l.Warnings = warnings
	t.Cleanup(func() {
		if t.Failed() {
			if w := warnings.String(); w != "" {
				const max = 16 << 10
				if len(w) > max {
					w = "…" + w[len(w)-max:]
				}
				t.Logf("lockpool's warnings and errors:\n%s", w)
			}
		}
	})
	return l
}

// StartYAML runs lockpool in-process from a whole YAML configuration,
// logging at debug level in its log_format into the returned buffer (and to
// stderr when LOCKPOOL_TEST_LOG is set).
func StartYAML(t *testing.T, yaml string) (*Lockpool, *LogBuffer) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml", nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	log := &LogBuffer{Echo: os.Getenv("LOCKPOOL_TEST_LOG") != ""}
	return startServer(t, cfg, proxy.NewLogger(log, cfg.LogFormat, slog.LevelDebug)), log
}

func startServer(t *testing.T, cfg *config.Config, logger *slog.Logger) *Lockpool {
	t.Helper()
	loopOverrides(t, cfg)
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
	l := &Lockpool{
		t: t, Server: srv, Addr: ln.Addr().String(), Port: ln.Addr().(*net.TCPAddr).Port,
		Registry: reg, Admin: httptest.NewServer(srv.AdminHandler(reg)), Config: cfg,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		l.Admin.Close()
	})
	return l
}

// DSN is a libpq-style connection string for user and db through lockpool.
func (l *Lockpool) DSN(user, db string) string { return DSN(l.Port, user, db) }

// URL is a postgres:// URL for user and db through lockpool.
func (l *Lockpool) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", user, Password, l.Port, db)
}

// Connect opens a pgx connection (default exec mode) through lockpool,
// closed when t ends.
func (l *Lockpool) Connect(t testing.TB, user, db string) *pgx.Conn {
	t.Helper()
	return l.ConnectConfig(t, user, db, nil)
}

// ConnectConfig is [Lockpool.Connect] with edit applied to the parsed
// configuration first (edit may be nil).
func (l *Lockpool) ConnectConfig(t testing.TB, user, db string, edit func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(l.DSN(user, db))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through lockpool: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// PsqlCmd is a psql command through lockpool (see [PsqlCmd]).
func (l *Lockpool) PsqlCmd(ctx context.Context, user, db string, args ...string) *exec.Cmd {
	return PsqlCmd(ctx, l.Port, user, db, args...)
}

// Metric is the value of the series name whose labels include labels,
// summed over the series that match (0 if none). A histogram counts its
// samples.
func (l *Lockpool) Metric(name string, labels map[string]string) float64 {
	mfs, err := l.Registry.Gather()
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

// Pinned is the lockpool_pinned_sessions gauge of app, for one reason or
// summed over all (reason "").
func (l *Lockpool) Pinned(app, reason string) float64 {
	labels := map[string]string{"app": app}
	if reason != "" {
		labels["reason"] = reason
	}
	return l.Metric("lockpool_pinned_sessions", labels)
}

// Get fetches path from the admin handler and returns the status code and
// body.
func (l *Lockpool) Get(path string) (int, string) {
	resp, err := http.Get(l.Admin.URL + path)
	if err != nil {
		l.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		l.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// DSN is a libpq-style connection string for user (password [Password]) and
// db to a server on 127.0.0.1:port, without TLS.
func DSN(port int, user, db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", port, user, Password, db)
}

// PsqlCmd is a psql command to 127.0.0.1:port as user (password
// [Password]) on db, with -X -q and ON_ERROR_STOP, no password prompt, no
// TLS and no psqlrc, and args after those.
func PsqlCmd(ctx context.Context, port int, user, db string, args ...string) *exec.Cmd {
	base := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", user, "-d", db}
	cmd := exec.CommandContext(ctx, "/usr/bin/psql", append(base, args...)...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+Password, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10", "PSQLRC=/dev/null")
	return cmd
}

// loopOverrides applies LOCKPOOL_TEST_IO_URING (true or false) and
// LOCKPOOL_TEST_EVENT_LOOPS (a number) to cfg, so that a run of the
// integration tests can take the paths only some machines take: sends and
// receives one by one, and sessions spread over several loops (.ci/run runs
// part of the suite so).
func loopOverrides(t *testing.T, cfg *config.Config) {
	t.Helper()
	if v := os.Getenv("LOCKPOOL_TEST_IO_URING"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			t.Fatalf("LOCKPOOL_TEST_IO_URING=%q: %v", v, err)
		}
		cfg.IOURing = b
	}
	if v := os.Getenv("LOCKPOOL_TEST_EVENT_LOOPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("LOCKPOOL_TEST_EVENT_LOOPS=%q: want a number", v)
		}
		cfg.EventLoops = n
	}
}
