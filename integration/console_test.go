package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// The admin console: the virtual database lockpool on the client port.

// consoleShows are the SHOW commands; docs/admin-console.md documents each one's
// columns in a table under "#### SHOW <NAME>".
var consoleShows = []string{"POOLS", "APPLICATIONS", "CLIENTS", "SERVERS", "PINS", "LOCKS", "LEASES", "STATS", "CLUSTER", "CONFIG", "VERSION"}

// docColumns returns the columns docs/admin-console.md documents for SHOW name.
func docColumns(t *testing.T, name string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(testenv.ModuleRoot(), "docs", "admin-console.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\|")
	var cols []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			if in {
				break
			}
			in = line == "#### SHOW "+name
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			cols = append(cols, m[1])
		}
	}
	if len(cols) == 0 {
		t.Fatalf("docs/admin-console.md documents no columns for SHOW %s", name)
	}
	return cols
}

// consoleWorkload is what the console test watches: a pgbench run of
// application bench, a session of application api pinned by an advisory
// lock, and a lease held by another api client.
type consoleWorkload struct {
	pinned    *pgx.Conn
	pinnedID  uint32 // lockpool's client id (the backend key it gave)
	pinnedPID uint32 // its PostgreSQL backend
	leaseID   uint32
	lease     int64
	benchDone chan error
}

const consoleLockKey = 4242

func startConsoleWorkload(t *testing.T, l *lp) *consoleWorkload {
	t.Helper()
	if _, err := os.Stat("/usr/bin/pgbench"); err != nil {
		skipOrFail(t, "pgbench not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := &consoleWorkload{benchDone: make(chan error, 1)}

	script := filepath.Join(t.TempDir(), "tx.sql")
	if err := os.WriteFile(script, []byte("BEGIN;\nSELECT pg_sleep(0.02);\nEND;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	benchCtx, stopBench := context.WithCancel(context.Background())
	cmd := exec.CommandContext(benchCtx, "/usr/bin/pgbench", "-n", "-c", "4", "-j", "2", "-T", "120", "-f", script,
		"-h", "127.0.0.1", "-p", strconv.Itoa(l.port), "-U", "bench", "benchdb")
	cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable")
	out := &testenv.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.benchDone <- cmd.Wait() }()
	t.Cleanup(func() {
		stopBench()
		<-w.benchDone
	})

	w.pinned = l.connect(t, "app", "appdb")
	w.pinnedID = w.pinned.PgConn().PID()
	if _, err := w.pinned.Exec(ctx, "SELECT pg_advisory_lock($1)", consoleLockKey); err != nil {
		t.Fatal(err)
	}
	if err := w.pinned.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&w.pinnedPID); err != nil {
		t.Fatal(err)
	}
	holder := l.connect(t, "app", "appdb")
	w.leaseID = holder.PgConn().PID()
	w.lease = mustAcquire(t, holder, "console-lease", 60, 0)
	// A transaction of the holder leaves an idle server connection of api.
	if _, err := holder.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	eventually(t, 20*time.Second, "pgbench clients logged in", func() bool {
		select {
		case err := <-w.benchDone:
			t.Fatalf("pgbench ended early: %v\n%s", err, out.String())
		default:
		}
		return l.metric("lockpool_client_connections", map[string]string{"app": "bench"}) == 4
	})
	return w
}

func startConsoleLockpool(t *testing.T) *lp {
	api := defaultApp().app()
	bench := testenv.App{Name: "bench", User: "bench", DB: "benchdb", Max: 4, Pinned: 0, Advisory: "pin", State: "pin", Wait: "30s"}
	return wrapLockpool(testenv.StartConsole(t, 20, "", api, bench))
}

// TestConsoleShowCommands: every SHOW command, from pgx and from psql,
// answers the columns docs/admin-console.md documents, with live values while pgbench
// runs, a session is pinned by an advisory lock and a lease is held; the
// same data is served as JSON on the admin listener.
func TestConsoleShowCommands(t *testing.T) {
	t.Parallel()
	l := startConsoleLockpool(t)
	w := startConsoleWorkload(t, l)
	admin := l.ConsoleConnect(t, testenv.AdminUser)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	show := func(name string) testenv.ConsoleResult[any] {
		t.Helper()
		res, err := testenv.ConsoleQuery(ctx, admin, "show "+strings.ToLower(name)+";")
		if err != nil {
			t.Fatalf("SHOW %s (pgx): %v", name, err)
		}
		return res
	}
	for _, name := range consoleShows {
		want := docColumns(t, name)
		if got := show(name).Columns; !slices.Equal(got, want) {
			t.Errorf("SHOW %s (pgx) columns %v, README documents %v", name, got, want)
		}
		res, err := l.PsqlConsole(ctx, testenv.AdminUser, "SHOW "+name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Columns, want) {
			t.Errorf("SHOW %s (psql) columns %v, README documents %v", name, res.Columns, want)
		}
	}

	// POOLS: pgbench's clients are active (each is inside a transaction
	// most of the time); the pinned session holds api's pinned server.
	eventually(t, 10*time.Second, "SHOW POOLS: bench cl_active > 0", func() bool {
		row, ok := show("POOLS").Find("application", "bench")
		return ok && row["cl_active"].(int64) > 0 && row["database"] == "benchdb" && row["pool_mode"] == "transaction"
	})
	api, ok := show("POOLS").Find("application", "api")
	if !ok || api["sv_pinned"] != int64(1) || api["database"] != "appdb" || api["paused"] != false {
		t.Errorf("SHOW POOLS api row %v, want database appdb, sv_pinned 1, not paused", api)
	}
	eventually(t, 10*time.Second, "psql SHOW POOLS: bench cl_active > 0", func() bool {
		res, err := l.PsqlConsole(ctx, testenv.AdminUser, "show pools")
		if err != nil {
			t.Fatal(err)
		}
		row, ok := res.Find("application", "bench")
		n, _ := strconv.Atoi(row["cl_active"])
		return ok && n > 0
	})

	// APPLICATIONS: budgets, use and policy.
	apps := show("APPLICATIONS")
	if row, ok := apps.Find("application", "api"); !ok || row["pinned"] != int64(1) || row["max_pinned"] != int64(1) ||
		row["max_connections"] != int64(4) || row["advisory_locks"] != "pin" || row["wait_timeout"] != "5s" || row["clients"] != int64(2) {
		t.Errorf("SHOW APPLICATIONS api = %v", row)
	}
	if row, ok := apps.Find("application", "bench"); !ok || row["clients"] != int64(4) || row["open"].(int64) < 1 || row["user"] != "bench" {
		t.Errorf("SHOW APPLICATIONS bench = %v, want 4 clients and open servers", row)
	}

	// CLIENTS and SERVERS: the pinned session and its backend.
	if row, ok := show("CLIENTS").Find("id", int64(w.pinnedID)); !ok || row["pinned"] != true || row["pin_reason"] != "advisory_lock" ||
		row["backend_pid"] != int64(w.pinnedPID) || row["application"] != "api" || row["state"] != "active" || row["addr"] != "127.0.0.1" {
		t.Errorf("SHOW CLIENTS row of the pinned client %d = %v", w.pinnedID, row)
	}
	if res := show("CLIENTS"); len(res.Rows) != 6 {
		t.Errorf("SHOW CLIENTS lists %d clients, want 6 (4 pgbench, 2 api)", len(res.Rows))
	}
	servers := show("SERVERS")
	if row, ok := servers.Find("remote_pid", int64(w.pinnedPID)); !ok || row["state"] != "pinned" || row["client_id"] != int64(w.pinnedID) || row["database"] != "appdb" {
		t.Errorf("SHOW SERVERS row of backend %d = %v", w.pinnedPID, row)
	}
	if row, ok := servers.Find("state", "idle"); !ok || row["application"] != "api" || row["client_id"] != nil ||
		row["idle_since"] == nil || !strings.HasPrefix(row["client_addr"].(string), "127.0.0.1:") {
		t.Errorf("SHOW SERVERS idle row = %v (all: %v), want api's idle connection", row, servers.Rows)
	}
	if row, _ := show("POOLS").Find("application", "api"); row["sv_idle"] != int64(1) {
		t.Errorf("SHOW POOLS api sv_idle = %v, want 1", row["sv_idle"])
	}

	// PINS and LOCKS: the advisory lock.
	key := lkKey1(consoleLockKey).String()
	pins := show("PINS")
	if row, ok := pins.Find("client_id", int64(w.pinnedID)); !ok || row["reason"] != "advisory_lock" || row["backend_pid"] != int64(w.pinnedPID) ||
		row["keys"] != key || row["pinned_seconds"].(float64) <= 0 || len(pins.Rows) != 1 {
		t.Errorf("SHOW PINS = %v, want the pinned client with reason advisory_lock and key %s", pins.Rows, key)
	}
	if row, ok := show("LOCKS").Find("key", key); !ok || row["type"] != "holder" || row["backend_pid"] != int64(w.pinnedPID) ||
		row["granted"] != true || row["reason"] != "advisory_lock" || row["application"] != "api" {
		t.Errorf("SHOW LOCKS row of key %s = %v", key, row)
	}

	if res, err := l.PsqlConsole(ctx, testenv.AdminUser, "SHOW PINS"); err != nil {
		t.Fatal(err)
	} else if row, ok := res.Find("client_id", strconv.Itoa(int(w.pinnedID))); !ok || row["reason"] != "advisory_lock" || row["keys"] != key {
		t.Errorf("psql SHOW PINS = %v", res.Rows)
	}

	// LEASES: the held lease.
	if row, ok := show("LEASES").Find("name", "console-lease"); !ok || row["token"] != w.lease || row["client_id"] != int64(w.leaseID) ||
		row["application"] != "api" || row["database"] != "appdb" || row["ttl_seconds"] != float64(60) {
		t.Errorf("SHOW LEASES row = %v, want token %d of client %d", row, w.lease, w.leaseID)
	}

	if res, err := l.PsqlConsole(ctx, testenv.AdminUser, "SHOW LEASES"); err != nil {
		t.Fatal(err)
	} else if row, ok := res.Find("name", "console-lease"); !ok || row["token"] != strconv.FormatInt(w.lease, 10) || row["application"] != "api" {
		t.Errorf("psql SHOW LEASES = %v", res.Rows)
	}

	// STATS: pgbench's traffic is counted.
	eventually(t, 10*time.Second, "SHOW STATS counts bench's transactions", func() bool {
		row, ok := show("STATS").Find("application", "bench")
		return ok && row["total_xact_count"].(int64) > 10 && row["total_query_count"].(int64) >= row["total_xact_count"].(int64) &&
			row["total_received"].(int64) > 0 && row["total_sent"].(int64) > 0 && row["avg_xact_count"].(float64) > 0 &&
			row["total_server_assignment_count"].(int64) > 0
	})

	// CONFIG and VERSION.
	cfg := show("CONFIG")
	if row, ok := cfg.Find("key", "admin_users"); !ok || row["value"] != testenv.AdminUser || row["changeable"] != true {
		t.Errorf("SHOW CONFIG admin_users = %v", row)
	}
	if row, ok := cfg.Find("key", "listen"); !ok || row["changeable"] != false || row["default"] != "127.0.0.1:6432" {
		t.Errorf("SHOW CONFIG listen = %v", row)
	}
	if v := show("VERSION"); len(v.Rows) != 1 || !strings.HasPrefix(v.Rows[0]["version"].(string), "lockpool ") {
		t.Errorf("SHOW VERSION = %v", v.Rows)
	}

	// Several commands in one query, each with its result: psql prints
	// both, the second with its header.
	res, err := l.PsqlConsole(ctx, testenv.AdminUser, "SHOW VERSION; SHOW VERSION")
	if err != nil || len(res.Rows) != 3 || !strings.HasPrefix(res.Rows[0]["version"], "lockpool ") ||
		res.Rows[1]["version"] != "version" || res.Rows[2]["version"] != res.Rows[0]["version"] {
		t.Errorf("psql SHOW VERSION; SHOW VERSION = %+v, %v", res, err)
	}

	// The same views as JSON on the admin listener.
	getJSON := func(path string) []map[string]any {
		t.Helper()
		code, body := l.get(path)
		if code != 200 {
			t.Fatalf("GET %s = %d %s", path, code, body)
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(body), &rows); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
		return rows
	}
	find := func(rows []map[string]any, col string, want any) map[string]any {
		for _, r := range rows {
			if r[col] == want {
				return r
			}
		}
		return nil
	}
	if r := find(getJSON("/debug/pools"), "application", "api"); r == nil || r["sv_pinned"] != float64(1) {
		t.Errorf("/debug/pools api = %v", r)
	}
	if r := find(getJSON("/debug/applications"), "application", "bench"); r == nil || r["clients"] != float64(4) {
		t.Errorf("/debug/applications bench = %v", r)
	}
	if r := find(getJSON("/debug/clients"), "id", float64(w.pinnedID)); r == nil || r["pin_reason"] != "advisory_lock" {
		t.Errorf("/debug/clients pinned = %v", r)
	}
	if r := find(getJSON("/debug/servers"), "remote_pid", float64(w.pinnedPID)); r == nil || r["state"] != "pinned" {
		t.Errorf("/debug/servers pinned = %v", r)
	}
	if r := find(getJSON("/debug/pins"), "client_id", float64(w.pinnedID)); r == nil || r["reason"] != "advisory_lock" || !slices.Equal(r["keys"].([]any), []any{key}) {
		t.Errorf("/debug/pins = %v", r)
	}
	if r := find(getJSON("/debug/stats"), "application", "bench"); r == nil || r["total_xact_count"].(float64) <= 0 {
		t.Errorf("/debug/stats bench = %v", r)
	}
	if r := find(getJSON("/debug/leases"), "name", "console-lease"); r == nil || r["token"] != float64(w.lease) {
		t.Errorf("/debug/leases = %v", r)
	}
}

// TestConsolePauseResume: PAUSE api makes a new transaction of api wait
// (the pinned session goes on), RESUME releases it; from pgx and psql.
func TestConsolePauseResume(t *testing.T) {
	t.Parallel()
	l := startConsoleLockpool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := l.ConsoleConnect(t, testenv.AdminUser)
	pinned := l.connect(t, "app", "appdb")
	if _, err := pinned.Exec(ctx, "SELECT pg_advisory_lock($1)", consoleLockKey+1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		pause, resume  func() error
		pausedInConfig string // the PAUSE argument
	}{
		{"pgx", func() error { _, err := admin.Exec(ctx, "PAUSE api"); return err },
			func() error { _, err := admin.Exec(ctx, "resume api;"); return err }, "api"},
		{"psql, all applications", func() error { _, err := l.PsqlConsole(ctx, testenv.AdminUser, "pause"); return err },
			func() error { _, err := l.PsqlConsole(ctx, testenv.AdminUser, "RESUME"); return err }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := l.connect(t, "app", "appdb")
			if err := tc.pause(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				var n int
				err := client.QueryRow(ctx, "SELECT 7").Scan(&n)
				if err == nil && n != 7 {
					err = errSelect7
				}
				done <- err
			}()
			eventually(t, 5*time.Second, "the transaction waits (SHOW POOLS cl_waiting 1)", func() bool {
				res, err := testenv.ConsoleQuery(ctx, admin, "SHOW POOLS")
				if err != nil {
					t.Fatal(err)
				}
				row, _ := res.Find("application", "api")
				return row["cl_waiting"] == int64(1) && row["paused"] == true
			})
			// The pool counts the paused request once the session's wait
			// reached it (it runs off the session's loop): wait for that too.
			eventually(t, 5*time.Second, "SHOW APPLICATIONS api waiting 1 while paused", func() bool {
				res, err := testenv.ConsoleQuery(ctx, admin, "SHOW APPLICATIONS")
				if err != nil {
					t.Fatal(err)
				}
				row, _ := res.Find("application", "api")
				return row["waiting"] == int64(1) && row["paused"] == true
			})
			// The pinned session keeps its connection and is not held up.
			var one int
			if err := pinned.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("pinned session while paused: %v", err)
			}
			select {
			case err := <-done:
				t.Fatalf("a transaction of a paused application ran (err %v)", err)
			case <-time.After(200 * time.Millisecond):
			}
			if res, err := testenv.ConsoleQuery(ctx, admin, "SHOW POOLS"); err != nil {
				t.Fatal(err)
			} else if row, _ := res.Find("application", "api"); row["maxwait"].(int64)*1e6+row["maxwait_us"].(int64) < 200_000 {
				t.Fatalf("SHOW POOLS api maxwait %v s %v us, want >= 200 ms", row["maxwait"], row["maxwait_us"])
			}
			before := apiWaitTime(t, ctx, admin)
			if err := tc.resume(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("after RESUME: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("RESUME did not release the waiting transaction")
			}
			if waited := apiWaitTime(t, ctx, admin) - before; waited < 200_000 {
				t.Errorf("SHOW STATS api total_wait_time grew by %d us, want >= 200 ms", waited)
			}
		})
	}
	// An unknown application is an error.
	_, err := admin.Exec(ctx, "PAUSE nosuchapp")
	pgErr(t, err, "42704")
}

// apiWaitTime is SHOW STATS' total_wait_time of application api.
func apiWaitTime(t *testing.T, ctx context.Context, admin *pgx.Conn) int64 {
	t.Helper()
	res, err := testenv.ConsoleQuery(ctx, admin, "SHOW STATS")
	if err != nil {
		t.Fatal(err)
	}
	row, ok := res.Find("application", "api")
	if !ok {
		t.Fatalf("SHOW STATS has no row of api: %v", res.Rows)
	}
	return row["total_wait_time"].(int64)
}

var errSelect7 = errors.New("SELECT 7 returned another value")

// TestConsoleKillClient: KILL_CLIENT closes that client with 57P01, from
// pgx and psql; an unknown id is an error.
func TestConsoleKillClient(t *testing.T) {
	t.Parallel()
	l := startConsoleLockpool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := l.ConsoleConnect(t, testenv.AdminUser)
	super := superConn(t, "postgres")
	kill := map[string]func(id uint32) error{
		"pgx": func(id uint32) error {
			_, err := admin.Exec(ctx, "KILL_CLIENT "+strconv.Itoa(int(id)))
			return err
		},
		"psql": func(id uint32) error {
			_, err := l.PsqlConsole(ctx, testenv.AdminUser, "kill_client "+strconv.Itoa(int(id)))
			return err
		},
	}
	for _, via := range []string{"pgx", "psql"} {
		t.Run(via, func(t *testing.T) {
			victim := l.connect(t, "app", "appdb")
			other := l.connect(t, "app", "appdb")
			if _, err := victim.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			var backend int
			if err := victim.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
				t.Fatal(err)
			}
			id := victim.PgConn().PID()
			if err := kill[via](id); err != nil {
				t.Fatal(err)
			}
			_, err := victim.Exec(ctx, "SELECT 1")
			if sqlState(err) != "57P01" && !victim.IsClosed() {
				t.Fatalf("killed client's next statement: %v (closed %v), want 57P01", err, victim.IsClosed())
			}
			eventually(t, 5*time.Second, "the killed client leaves SHOW CLIENTS", func() bool {
				res, err := testenv.ConsoleQuery(ctx, admin, "SHOW CLIENTS")
				if err != nil {
					t.Fatal(err)
				}
				_, found := res.Find("id", int64(id))
				_, otherFound := res.Find("id", int64(other.PgConn().PID()))
				return !found && otherFound
			})
			// Its server connection, inside the transaction, is destroyed.
			eventually(t, 5*time.Second, "the killed client's backend ends", func() bool {
				n, err := countBackends(ctx, super, "pid = "+strconv.Itoa(backend))
				return err == nil && n == 0
			})
			var n int
			if err := other.QueryRow(ctx, "SELECT 2").Scan(&n); err != nil || n != 2 {
				t.Fatalf("another client after the kill: %v", err)
			}
		})
	}
	_, err := admin.Exec(ctx, "KILL_CLIENT 1")
	pgErr(t, err, "42704")
}

// TestConsoleRefusals: a user not in admin_users gets 28000, a wrong
// password 28P01, an unknown command 42601 naming the known ones, and the
// extended protocol 0A000; the console stays usable after each error.
func TestConsoleRefusals(t *testing.T) {
	t.Parallel()
	l := wrapLockpool(testenv.StartConsole(t, 10, "admin_token: console-token", defaultApp().app()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Not an admin: 28000, from pgx and psql.
	cfg, err := pgx.ParseConfig(l.dsn("app", "lockpool"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pgx.ConnectConfig(ctx, cfg)
	if pe := pgErr(t, err, "28000"); !strings.Contains(pe.Message, "admin console") || pe.Severity != "FATAL" {
		t.Errorf("non-admin login: %s %q", pe.Severity, pe.Message)
	}
	out, err := l.psqlCmd(ctx, "app", "lockpool", "-c", "SHOW POOLS").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `user "app" may not use the admin console`) {
		t.Errorf("psql as a non-admin: %v\n%s", err, out)
	}
	// A wrong password.
	cfg, _ = pgx.ParseConfig(l.dsn(testenv.AdminUser, "lockpool"))
	cfg.Password = "wrong"
	_, err = pgx.ConnectConfig(ctx, cfg)
	pgErr(t, err, "28P01")

	admin := l.ConsoleConnect(t, testenv.AdminUser)
	for _, tc := range []struct{ cmd, code, msg string }{
		{"FROB", "42601", `unknown admin console command "FROB"`},
		{"SHOW NOPE", "42601", `unknown admin console command "SHOW NOPE"`},
		{"SHOW", "42601", "SHOW takes one name"},
		{"KILL_CLIENT x", "42601", "KILL_CLIENT takes a client id"},
		{"RELOAD now", "42601", "RELOAD takes no argument"},
		{"PAUSE a b", "42601", "PAUSE takes at most one application name"},
	} {
		_, err := admin.Exec(ctx, tc.cmd)
		pe := pgErr(t, err, tc.code)
		if !strings.Contains(pe.Message, tc.msg) {
			t.Errorf("%s: message %q, want %q", tc.cmd, pe.Message, tc.msg)
		}
		if tc.code == "42601" && !strings.Contains(pe.Hint, "SHOW POOLS, SHOW APPLICATIONS") {
			t.Errorf("%s: hint %q does not list the commands", tc.cmd, pe.Hint)
		}
	}
	out, err = l.psqlCmd(ctx, testenv.AdminUser, "lockpool", "-c", "FROB").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown admin console command "FROB"`) || !strings.Contains(string(out), "KILL_CLIENT <id>") {
		t.Errorf("psql FROB: %v\n%s", err, out)
	}
	// The extended protocol (pgx's default mode) gets a clear error.
	_, err = admin.Prepare(ctx, "", "SHOW POOLS") // Parse, Describe, Sync
	if pe := pgErr(t, err, "0A000"); !strings.Contains(pe.Message, "simple query protocol") {
		t.Errorf("extended protocol: %q", pe.Message)
	}
	// SET, which drivers send when they connect, is accepted and ignored.
	if tag, err := admin.Exec(ctx, "SET application_name = 'x'"); err != nil || tag.String() != "SET" {
		t.Errorf("SET: %v %v", tag, err)
	}
	// The JSON views need admin_token like the rest of /debug.
	for _, tok := range []string{"", "wrong", "console-token"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.admin.URL+"/debug/applications", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var rows []map[string]any
		decErr := json.NewDecoder(resp.Body).Decode(&rows)
		resp.Body.Close()
		switch {
		case tok != "console-token" && resp.StatusCode != http.StatusUnauthorized:
			t.Errorf("/debug/applications with token %q: %d, want 401", tok, resp.StatusCode)
		case tok == "console-token" && (resp.StatusCode != http.StatusOK || decErr != nil || len(rows) != 1 || rows[0]["application"] != "api"):
			t.Errorf("/debug/applications with the token: %d %v %v", resp.StatusCode, rows, decErr)
		}
	}
	// Still usable.
	if res, err := testenv.ConsoleQuery(ctx, admin, "SHOW VERSION"); err != nil || len(res.Rows) != 1 {
		t.Fatalf("SHOW VERSION after errors: %v %v", res, err)
	}
}

// TestConsoleReloadShutdown: RELOAD applies the edited file (and keeps the
// old configuration when the file is bad); SHUTDOWN ends client sessions
// with 57P01 and stops accepting; from pgx and from psql.
func TestConsoleReloadShutdown(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"pgx", "psql"} {
		t.Run(via, func(t *testing.T) {
			c := pgtest.Require(t)
			path := filepath.Join(t.TempDir(), "lockpool.yaml")
			yaml := testenv.ConsoleYAML(c, 10, "", defaultApp().app())
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			l := startLockpoolConfig(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			admin := l.ConsoleConnect(t, testenv.AdminUser)
			run := func(cmd string) error {
				if via == "psql" {
					_, err := l.PsqlConsole(ctx, testenv.AdminUser, cmd)
					return err
				}
				_, err := admin.Exec(ctx, cmd)
				return err
			}
			waitTimeout := func() any {
				res, err := testenv.ConsoleQuery(ctx, admin, "SHOW APPLICATIONS")
				if err != nil {
					t.Fatal(err)
				}
				row, _ := res.Find("application", "api")
				return row["wait_timeout"]
			}
			if got := waitTimeout(); got != "5s" {
				t.Fatalf("wait_timeout %v before reload", got)
			}
			if err := os.WriteFile(path, []byte(strings.Replace(yaml, "wait_timeout: 5s", "wait_timeout: 7s", 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := run("RELOAD"); err != nil {
				t.Fatal(err)
			}
			if got := waitTimeout(); got != "7s" {
				t.Fatalf("wait_timeout %v after RELOAD, want 7s", got)
			}
			if err := os.WriteFile(path, []byte("listen: [\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			err = run("RELOAD")
			if via == "psql" {
				if err == nil || !strings.Contains(err.Error(), "keeping the old configuration") {
					t.Errorf("psql RELOAD of a bad file: %v", err)
				}
			} else if pe := pgErr(t, err, "F0000"); !strings.Contains(pe.Message, "keeping the old configuration") {
				t.Errorf("bad RELOAD: %q", pe.Message)
			}
			if got := waitTimeout(); got != "7s" {
				t.Fatalf("wait_timeout %v after a failed RELOAD, want 7s", got)
			}

			client := l.connect(t, "app", "appdb")
			if err := run("SHUTDOWN"); err != nil {
				t.Fatalf("SHUTDOWN: %v", err)
			}
			eventually(t, 10*time.Second, "the idle client is closed with 57P01", func() bool {
				_, err := client.Exec(ctx, "SELECT 1")
				return sqlState(err) == "57P01" || client.IsClosed()
			})
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			defer dcancel()
			if c, err := pgx.Connect(dctx, l.dsn("app", "appdb")); err == nil {
				_ = c.Close(ctx)
				t.Fatal("lockpool still accepts clients after SHUTDOWN")
			}
		})
	}
}

// TestConsoleShutdownBinary: SHUTDOWN on the lockpool binary drains as
// SIGTERM does: a running transaction commits, then the process exits 0.
func TestConsoleShutdownBinary(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	p := testenv.StartLockpoolProcess(t, func(port int) string {
		return testenv.ConsoleYAML(c, 10, fmt.Sprintf("listen: 127.0.0.1:%d\nshutdown_timeout: 20s", port), defaultApp().app())
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.DSN("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	out, err := testenv.PsqlCmd(ctx, p.Port, testenv.AdminUser, "lockpool", "-c", "SHUTDOWN").CombinedOutput()
	if err != nil {
		t.Fatalf("psql SHUTDOWN: %v\n%s", err, out)
	}
	select {
	case <-p.Done():
		t.Fatalf("lockpool exited with a transaction in flight: %v", p.Err())
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("COMMIT after SHUTDOWN: %v", err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lockpool still running 10 s after the last transaction committed")
	}
	if p.Err() != nil {
		t.Fatalf("lockpool exit: %v, want status 0\n%s", p.Err(), p.Log.String())
	}
	for _, want := range []string{"admin console: shutting down", "stopped"} {
		if !strings.Contains(p.Log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, p.Log.String())
		}
	}
}
