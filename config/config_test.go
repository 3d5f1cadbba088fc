package config

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testEnv is the environment the fixtures are parsed with.
var testEnv = map[string]string{
	"APP_PASSWORD": "env-secret-do-not-print",
	"PGPORT":       "5499",
	"LISTEN_HOST":  "0.0.0.0",
	"LISTEN_PORT":  "7000",
	"TIMEOUT":      "3s",
	"EMPTY":        "",
}

func getenv(k string) (string, bool) { v, ok := testEnv[k]; return v, ok }

// secrets must never appear in an error message.
var secrets = []string{"hunter2-do-not-print", "env-secret-do-not-print"}

func parseFile(t testing.TB, path string) (*Config, error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return Parse(data, path, getenv)
}

func fixtures(t testing.TB, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in testdata/%s: %v", dir, err)
	}
	return files
}

func TestDefaults(t *testing.T) {
	c, err := parseFile(t, "testdata/good/minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "lockpool"
	}
	want := &Config{
		Listen:                 "127.0.0.1:6432",
		AdminListen:            "127.0.0.1:9930",
		AuthMethod:             "scram-sha-256",
		InstanceID:             host + "-" + strconv.Itoa(os.Getpid()),
		LeakCheckInterval:      10 * time.Second,
		ShutdownTimeout:        30 * time.Second,
		ClientLoginTimeout:     15 * time.Second,
		IdleTransactionTimeout: 0,
		MaxMessageSize:         64 << 20,
		MaxClientConnections:   10000,
		LogFormat:              "text",
		LogLevel:               "info",
		LogPinsOver:            time.Minute,
		TLS:                    nil,
		Server: Server{
			Host: "127.0.0.1", Port: 5432, MaxConnections: 20,
			IdleTimeout: 10 * time.Minute, MaxLifetime: time.Hour, ConnectTimeout: 5 * time.Second, DialConcurrency: 4, TLS: "prefer", HealthCheckInterval: time.Second, TCPUserTimeout: 15 * time.Second,
		},
		Users: []User{{Name: "app", Password: "pw"}},
		Applications: []Application{{
			Name: "api", User: "app", Database: "", PoolMode: "transaction",
			MaxConnections: 4, MaxPinned: 1, AdvisoryLocks: "hold", SessionState: "pin", Listen: "shared",
			WaitTimeout: 5 * time.Second, MaxPreparedStatements: 200, BudgetScope: "instance", MinShare: 1, Target: "primary", MaxLag: 10 * time.Second,
		}},
		Leases: Leases{Schema: "lockpool", MaxConnections: 2}, Notifications: Notifications{MaxPending: 1 << 20},
		Path: "testdata/good/minimal.yaml",
	}
	diffConfig(t, c, want)
}

func TestFull(t *testing.T) {
	c, err := parseFile(t, "testdata/good/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Listen:                 "0.0.0.0:7432",
		AdminListen:            "",
		AuthMethod:             "md5",
		InstanceID:             "proxy-a",
		LeakCheckInterval:      0,
		ShutdownTimeout:        90 * time.Second,
		ClientLoginTimeout:     250 * time.Millisecond,
		IdleTransactionTimeout: 2 * time.Minute,
		MaxMessageSize:         1 << 20,
		MaxClientConnections:   10000,
		LogFormat:              "json",
		LogLevel:               "debug",
		LogPinsOver:            30 * time.Second,
		AdminUsers:             " worker ,app,",
		TLS:                    &TLS{CertFile: "/etc/lockpool/server.crt", KeyFile: "/etc/lockpool/server.key"},
		Server: Server{
			Host: "/var/run/postgresql", Port: 5433, MaxConnections: 50,
			IdleTimeout: 30 * time.Second, MaxLifetime: 2 * time.Hour, ConnectTimeout: time.Second, DialConcurrency: 4, TLS: "prefer", HealthCheckInterval: time.Second, TCPUserTimeout: 15 * time.Second,
		},
		Users: []User{{Name: "app", Password: "p@ss: w0rd #not-a-comment"}, {Name: "worker", Password: "w"}},
		Applications: []Application{
			{Name: "api", User: "app", Database: "appdb", PoolMode: "session", MaxConnections: 10, MaxPinned: 0,
				AdvisoryLocks: "allow", SessionState: "allow", Listen: "shared", WaitTimeout: 100 * time.Millisecond, MaxPreparedStatements: 50, BudgetScope: "instance", MinShare: 1, Target: "primary", MaxLag: 10 * time.Second},
			{Name: "api-any", User: "app", PoolMode: "transaction", MaxConnections: 8, MaxPinned: 7,
				AdvisoryLocks: "reject", SessionState: "reject", Listen: "shared", WaitTimeout: 5 * time.Second, MaxPreparedStatements: 200, BudgetScope: "instance", MinShare: 1, Target: "primary", MaxLag: 10 * time.Second},
			{Name: "jobs", User: "worker", Database: "jobsdb", PoolMode: "transaction", MaxConnections: 4, MaxPinned: 1,
				AdvisoryLocks: "hold", SessionState: "pin", Listen: "shared", WaitTimeout: 5 * time.Second, MaxPreparedStatements: 200, BudgetScope: "instance", MinShare: 1, Target: "primary", MaxLag: 10 * time.Second},
		},
		Leases: Leases{Schema: "lp_leases", MaxConnections: 5},
		Path:   "testdata/good/full.yaml",
	}
	diffConfig(t, c, want)

	// admin_users is read as a comma-separated list.
	for _, tc := range []struct {
		user  string
		admin bool
	}{{"worker", true}, {"app", true}, {"", false}, {"work", false}, {"nobody", false}} {
		if got := c.IsAdmin(tc.user); got != tc.admin {
			t.Errorf("IsAdmin(%q) = %v, want %v", tc.user, got, tc.admin)
		}
	}

	// Match uses the parsed applications.
	for _, tc := range []struct{ user, db, app string }{
		{"app", "appdb", "api"}, {"app", "other", "api-any"}, {"worker", "jobsdb", "jobs"}, {"worker", "x", ""}, {"nobody", "appdb", ""},
	} {
		a, ok := c.Match(tc.user, tc.db)
		if got := ""; ok {
			got = a.Name
			if got != tc.app {
				t.Errorf("Match(%q, %q) = %q, want %q", tc.user, tc.db, got, tc.app)
			}
		} else if tc.app != "" {
			t.Errorf("Match(%q, %q) = none, want %q", tc.user, tc.db, tc.app)
		}
	}
}

func diffConfig(t *testing.T, got, want *Config) {
	t.Helper()
	g, w := *got, *want
	if (g.TLS == nil) != (w.TLS == nil) || (g.TLS != nil && *g.TLS != *w.TLS) {
		t.Errorf("TLS = %+v, want %+v", g.TLS, w.TLS)
	}
	g.TLS, w.TLS = nil, nil
	if len(g.Users) != len(w.Users) || len(g.Applications) != len(w.Applications) {
		t.Fatalf("got %d users, %d applications; want %d, %d", len(g.Users), len(g.Applications), len(w.Users), len(w.Applications))
	}
	for i := range g.Users {
		if g.Users[i] != w.Users[i] {
			t.Errorf("Users[%d] = %+v, want %+v", i, g.Users[i], w.Users[i])
		}
	}
	for i := range g.Applications {
		if g.Applications[i] != w.Applications[i] {
			t.Errorf("Applications[%d] =\n%+v, want\n%+v", i, g.Applications[i], w.Applications[i])
		}
	}
	g.Users, w.Users, g.Applications, w.Applications = nil, nil, nil, nil
	if g.Listen != w.Listen || g.AdminListen != w.AdminListen || g.AuthMethod != w.AuthMethod || g.InstanceID != w.InstanceID ||
		g.LeakCheckInterval != w.LeakCheckInterval || g.ShutdownTimeout != w.ShutdownTimeout ||
		g.ClientLoginTimeout != w.ClientLoginTimeout || g.IdleTransactionTimeout != w.IdleTransactionTimeout ||
		g.MaxMessageSize != w.MaxMessageSize || g.LogFormat != w.LogFormat || g.LogLevel != w.LogLevel || g.LogPinsOver != w.LogPinsOver ||
		g.AdminToken != w.AdminToken || g.Server != w.Server || g.Leases != w.Leases || g.Path != w.Path {
		t.Errorf("config =\n%+v, want\n%+v", g, w)
	}
}

func TestEnvExpansion(t *testing.T) {
	c, err := parseFile(t, "testdata/good/env.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:7000" {
		t.Errorf("Listen = %q", c.Listen)
	}
	if c.Server.Port != 5499 || c.Server.ConnectTimeout != 3*time.Second {
		t.Errorf("Server = %+v", c.Server)
	}
	if c.Users[0].Password != "env-secret-do-not-print" {
		t.Errorf("password not expanded: %q", c.Users[0].Password)
	}
	if want := "a${LITERAL}b$c$$d"; c.Users[1].Password != want {
		t.Errorf("literal password = %q, want %q", c.Users[1].Password, want)
	}
	if c.Applications[0].Database != "db_7000" {
		t.Errorf("Database = %q", c.Applications[0].Database)
	}
	if !strings.HasSuffix(c.InstanceID, "-"+strconv.Itoa(os.Getpid())) {
		t.Errorf("instance_id from an empty variable should be the default, got %q", c.InstanceID)
	}
}

func TestExpand(t *testing.T) {
	for _, tc := range []struct{ in, out, err string }{
		{"plain $x $ {y}", "plain $x $ {y}", ""},
		{"${PGPORT}", "5499", ""},
		{"x${EMPTY}y", "xy", ""},
		{"$${PGPORT}", "${PGPORT}", ""},
		{"$$${PGPORT}", "$${PGPORT}", ""},
		{"${PGPORT}${LISTEN_PORT}", "54997000", ""},
		{"${NOPE}", "", "environment variable NOPE is not set"},
		{"${NOPE:-6432}", "6432", ""},
		{"127.0.0.1:${NOPE:-}", "127.0.0.1:", ""},
		{"${PGPORT:-5432}", "5499", ""},
		{"${EMPTY:-x y}", "x y", ""},
		{"${NOPE:-a:-b}", "a:-b", ""},
		{"${:-5}", "", "invalid environment variable reference"},
		{"${NOPE-5}", "", "invalid environment variable reference"},
		{"${PGPORT", "", "unterminated ${"},
		{"${}", "", "invalid environment variable reference"},
		{"${9A}", "", "invalid environment variable reference"},
		{"${A B}", "", "invalid environment variable reference"},
	} {
		out, msg := expand(tc.in, getenv)
		if out != tc.out || !strings.Contains(msg, tc.err) || (tc.err == "") != (msg == "") {
			t.Errorf("expand(%q) = %q, %q; want %q, %q", tc.in, out, msg, tc.out, tc.err)
		}
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"1048576", 1 << 20, true}, {"64MB", 64 << 20, true}, {"64 MB", 64 << 20, true}, {"64MiB", 64 << 20, true},
		{"512kB", 512 << 10, true}, {"512KB", 512 << 10, true}, {"1GB", 1 << 30, true}, {"100B", 100, true},
		{"64mb", 0, false}, {"64XB", 0, false}, {"MB", 0, false}, {"-1", 0, false}, {"1.5MB", 0, false},
		{"", 0, false}, {"99999999999999999999", 0, false}, {"1000000000000GB", math.MaxInt, true},
	} {
		got, ok := parseSize(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseSize(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCheckIdentifier(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{"lockpool", ""}, {"_x1", ""}, {"a_b_c", ""}, {strings.Repeat("a", 63), ""},
		{"", "empty"}, {strings.Repeat("a", 64), "63"}, {"Lockpool", "lowercase"}, {"1abc", "lowercase"},
		{"a-b", "lowercase"}, {"a b", "lowercase"}, {`"q"`, "lowercase"}, {"a$b", "lowercase"},
		{"pg_leases", "pg_"}, {"select", "reserved"}, {"user", "reserved"}, {"table", "reserved"},
	} {
		msg := checkIdentifier(tc.in)
		if (tc.err == "") != (msg == "") || !strings.Contains(msg, tc.err) {
			t.Errorf("checkIdentifier(%q) = %q, want %q", tc.in, msg, tc.err)
		}
	}
}

func TestGoodFixtures(t *testing.T) {
	for _, f := range fixtures(t, "good") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, err := parseFile(t, f)
			if err != nil {
				t.Fatalf("unexpected error:\n%v", err)
			}
			if c.InstanceID == "" || len(c.Users) == 0 || len(c.Applications) == 0 {
				t.Errorf("invariants broken: %+v", c)
			}
		})
	}
}

func TestOtherGoodFixtures(t *testing.T) {
	c, err := parseFile(t, "testdata/good/trust_session.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.AuthMethod != "trust" || c.Users[0].Password != "" || c.MaxMessageSize != 64<<20 ||
		c.Applications[0].PoolMode != "session" || c.Applications[0].MaxPinned != 0 {
		t.Errorf("trust_session: %+v", c)
	}
	c, err = parseFile(t, "testdata/good/anchors.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Applications[1].User != "app" || c.Applications[1].WaitTimeout != 2*time.Second || c.MaxMessageSize != 512<<20 {
		t.Errorf("anchors: %+v", c.Applications)
	}
}

var lineRE = regexp.MustCompile(`^\S+:\d+: \S`)

// TestBadFixtures parses every testdata/bad/*.yaml. Each fixture lists its
// expected errors in "# want: file.yaml:LINE: substring" comments; the error
// must contain each of them, one per error line, and nothing else.
func TestBadFixtures(t *testing.T) {
	for _, f := range fixtures(t, "bad") {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var wants []string
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				if w, ok := strings.CutPrefix(sc.Text(), "# want: "); ok {
					wants = append(wants, w)
				}
			}
			if len(wants) == 0 {
				t.Fatal("fixture has no # want: line")
			}
			c, err := Parse(data, f, getenv)
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if c != nil {
				t.Errorf("a non-nil config came with the error")
			}
			text := err.Error()
			lines := strings.Split(text, "\n")
			for _, l := range lines {
				if !lineRE.MatchString(l) || !strings.HasPrefix(l, f+":") {
					t.Errorf("error line not of the form path:line: message: %q", l)
				}
			}
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Errorf("error message leaks a password:\n%s", text)
				}
			}
			for _, w := range wants {
				if !strings.Contains(text, w) {
					t.Errorf("error does not contain %q; got:\n%s", w, text)
				}
			}
			if len(lines) != len(wants) {
				t.Errorf("got %d errors, want %d:\n%s", len(lines), len(wants), text)
			}
			// Every joined error is an *Error with the same text.
			var e *Error
			if !errors.As(err, &e) || e.Path != f || e.Line < 1 {
				t.Errorf("errors.As(*Error) = %+v", e)
			}
		})
	}
}

func TestShippedConfig(t *testing.T) {
	data, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data, "../config.yaml", func(k string) (string, bool) {
		if k == "APP_PASSWORD" {
			return "s3cret", true
		}
		return "", false
	})
	if err != nil {
		t.Fatalf("shipped config.yaml:\n%v", err)
	}
	a, ok := c.Match("app", "appdb")
	if !ok || a.Name != "api" || a.AdvisoryLocks != "hold" || a.SessionState != "pin" || a.MaxPinned != 1 || a.MaxConnections != 4 {
		t.Errorf("api application = %+v, %v", a, ok)
	}
	u, ok := c.UserByName("app")
	if !ok || u.Password != "s3cret" {
		t.Errorf("user app = %+v, %v", u, ok)
	}
	if c.Listen != "127.0.0.1:6432" || c.Server.Host != "127.0.0.1" || c.Server.Port != 5432 || c.TLS != nil {
		t.Errorf("shipped config = %+v", c)
	}

	// Without APP_PASSWORD the error names the variable and its line.
	_, err = Parse(data, "config.yaml", nil)
	if err == nil || !regexp.MustCompile(`^config\.yaml:\d+: users\[0\]\.password: environment variable APP_PASSWORD is not set \(write \$\{APP_PASSWORD:-default\} for a default\)$`).MatchString(err.Error()) {
		t.Errorf("without APP_PASSWORD: %v", err)
	}
}

func TestLoad(t *testing.T) {
	c, err := Load("testdata/good/minimal.yaml")
	if err != nil || c.Path != "testdata/good/minimal.yaml" {
		t.Fatalf("Load = %+v, %v", c, err)
	}
	_, err = Load("testdata/does-not-exist.yaml")
	var e *Error
	if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "testdata/does-not-exist.yaml: ") {
		t.Errorf("Load(missing) = %v", err)
	}
	t.Setenv("LOCKPOOL_TEST_PW", "from-env")
	dir := t.TempDir()
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte("users: [{name: u, password: '${LOCKPOOL_TEST_PW}'}]\napplications: [{name: a, user: u}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load(p)
	if err != nil || c.Users[0].Password != "from-env" {
		t.Fatalf("Load with env = %+v, %v", c, err)
	}
}

func TestParseNoPath(t *testing.T) {
	c, err := Parse([]byte("users: [{name: u, password: p}]\napplications: [{name: a, user: u}]\n"), "", nil)
	if err != nil || c.Path != "" {
		t.Fatalf("Parse = %+v, %v", c, err)
	}
	_, err = Parse([]byte("bogus: 1\n"), "", nil)
	if err == nil || !strings.HasPrefix(err.Error(), "<config>:1: unknown key") {
		t.Errorf("Parse(bogus) = %v", err)
	}
}

// A password that is an invalid value in the wrong place is still not echoed.
func TestPasswordNeverInErrors(t *testing.T) {
	in := `auth_method: md5
listen: ${APP_PASSWORD}
leases: {schema: "${APP_PASSWORD}"}
users:
  - name: app
    password: hunter2-do-not-print
  - name: app
    password: [hunter2-do-not-print]
applications:
  - {name: api, user: nobody, max_pinned: 9, pool_mode: "${APP_PASSWORD}"}
server:
  port: ${APP_PASSWORD}
  connect_timeout: x${APP_PASSWORD}
`
	_, err := Parse([]byte(in), "p.yaml", getenv)
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("leak: %v", err)
		}
	}
	if want := `server.port: "${APP_PASSWORD}" (after ${} expansion) is not an integer`; !strings.Contains(err.Error(), want) {
		t.Errorf("error does not quote the value as written (%s):\n%v", want, err)
	}
}

func FuzzParse(f *testing.F) {
	for _, dir := range []string{"good", "bad"} {
		for _, p := range fixtures(f, dir) {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	if data, err := os.ReadFile("../config.yaml"); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.yaml", getenv)
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c != nil, err)
		}
		if err != nil {
			for _, l := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(l, "fuzz.yaml:") {
					t.Fatalf("error line without path: %q", l)
				}
			}
			return
		}
		// A returned config keeps the invariants.
		if len(c.Users) == 0 || len(c.Applications) == 0 || c.InstanceID == "" {
			t.Fatalf("invariants: %+v", c)
		}
		pinned := c.Leases.MaxConnections
		for _, a := range c.Applications {
			if a.MaxPinned < 0 || a.MaxPinned >= a.MaxConnections {
				t.Fatalf("max_pinned invariant: %+v", a)
			}
			if _, ok := c.UserByName(a.User); !ok {
				t.Fatalf("app user %q undefined", a.User)
			}
			pinned += a.MaxPinned
		}
		if pinned >= c.Server.MaxConnections {
			t.Fatalf("pin invariant: %d >= %d", pinned, c.Server.MaxConnections)
		}
	})
}

func TestLoopbackAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:9930", true},
		{"127.1.2.3:9930", true},
		{"[::1]:9930", true},
		{"localhost:9930", true},
		{"LocalHost:0", true},
		{"0.0.0.0:9930", false},
		{":9930", false},
		{"[::]:9930", false},
		{"10.0.0.5:9930", false},
		{"lockpool.example:9930", false},
		{"no-port", false},
	} {
		if got := loopbackAddr(tc.addr); got != tc.want {
			t.Errorf("loopbackAddr(%q) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// TestSettings: SHOW CONFIG's values, secrets hidden, restart-only keys
// marked.
func TestSettings(t *testing.T) {
	c, err := parseFile(t, "testdata/good/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Setting{}
	for _, s := range c.Settings() {
		got[s.Key] = s
	}
	for _, tc := range []struct {
		key, value string
		reload     bool
	}{
		{"listen", "0.0.0.0:7432", false},
		{"auth_method", "md5", true},
		{"shutdown_timeout", "1m30s", true},
		{"max_message_size", "1MB", true},
		{"admin_users", " worker ,app,", true},
		{"tls.cert_file", "/etc/lockpool/server.crt", false},
		{"server.port", "5433", false},
		{"server.max_connections", "50", true},
		{"server.max_lifetime", "2h0m0s", true},
		{"leases.schema", "lp_leases", false},
		{"handover_socket", "", false},
		{"locks.max_waiters", "16", false},
		{"notifications.max_pending", "1MB", true},
		{"cluster.name", "", false},
	} {
		s, ok := got[tc.key]
		if !ok || s.Value != tc.value || s.Reload != tc.reload {
			t.Errorf("%s: got %+v (listed %v), want value %q changeable %v", tc.key, s, ok, tc.value, tc.reload)
		}
	}
	if _, ok := got["users[].password"]; ok {
		t.Error("list items must not be listed")
	}
	c.AdminToken = "tok-secret"
	for _, s := range c.Settings() {
		if strings.Contains(s.Value, "tok-secret") {
			t.Fatalf("%s shows the secret", s.Key)
		}
		if s.Key == "admin_token" && s.Value != "(set)" {
			t.Fatalf("admin_token = %q, want (set)", s.Value)
		}
	}
}
