package integration

// The log lines operators rely on, with log_format json: a failed login, a
// pin held longer than log_pins_over, PostgreSQL becoming unreachable and
// reachable again (pool and lockpool's own connections, the lease LISTEN
// connection, the leak sweep), each once, and every line a JSON object.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// logLine is one JSON log line.
type logLine map[string]any

func (l logLine) str(k string) string { s, _ := l[k].(string); return s }

// jsonLines parses every line of log as a JSON object with time, level and
// msg, failing the test on any other line.
func jsonLines(t *testing.T, log string) []logLine {
	t.Helper()
	var out []logLine
	for i, s := range strings.Split(strings.TrimSuffix(log, "\n"), "\n") {
		if s == "" {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("log line %d is not JSON (%v): %s", i+1, err, s)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if l.str(k) == "" {
				t.Fatalf("log line %d has no %q: %s", i+1, k, s)
			}
		}
		out = append(out, l)
	}
	return out
}

// waitLine waits until a line with message msg that match accepts was
// logged, and returns it.
func waitLine(t *testing.T, log *testenv.LogBuffer, msg string, match func(logLine) bool) logLine {
	t.Helper()
	var found logLine
	testenv.Eventually(t, 15*time.Second, "log line "+strconv.Quote(msg), func() bool {
		for _, l := range jsonLines(t, log.String()) {
			if l.str("msg") == msg && (match == nil || match(l)) {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

func countLines(t *testing.T, log *testenv.LogBuffer, msg string) int {
	n := 0
	for _, l := range jsonLines(t, log.String()) {
		if l.str("msg") == msg {
			n++
		}
	}
	return n
}

func TestLogLinesJSON(t *testing.T) {
	c := pgtest.Require(t)
	fw := testenv.NewForwarder(t, net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	app := testenv.DefaultApp()
	app.Pinned = 2 // two long pins at once (long pin)
	yaml := testenv.AppsYAML(c, 10, "log_format: json\nlog_level: debug\nlog_pins_over: 300ms\nleak_check_interval: 200ms", app)
	yaml = strings.Replace(yaml, fmt.Sprintf("  port: %d\n", c.Port), fmt.Sprintf("  port: %d\n", fw.Port), 1)
	l, log := startYAML(t, yaml)
	ctx := testenv.Context(t, time.Minute)

	t.Run("failed login", func(t *testing.T) {
		_, err := pgx.Connect(ctx, fmt.Sprintf("postgres://app:wrong-password@%s/appdb?sslmode=disable", l.addr))
		testenv.RequireCode(t, err, "28P01")
		line := waitLine(t, log, "login failed", func(l logLine) bool { return l.str("user") == "app" })
		if line.str("level") != "INFO" || line.str("database") != "appdb" || line.str("sqlstate") != "28P01" ||
			!strings.HasPrefix(line.str("client"), "127.0.0.1:") || !strings.Contains(line.str("reason"), "password authentication failed") {
			t.Fatalf("login failed line: %v", line)
		}
		if strings.Contains(log.String(), "wrong-password") {
			t.Fatal("the log shows the password a client sent")
		}
	})

	t.Run("long pin", func(t *testing.T) {
		conn := l.connect(t, "app", "appdb")
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(470013)"); err != nil {
			t.Fatal(err)
		}
		pid := testenv.BackendPID(t, conn)
		line := waitLine(t, log, "session pinned longer than log_pins_over", nil)
		if line.str("level") != "INFO" || line.str("reason") != "advisory_lock" || line.str("app") != "api" || line.str("user") != "app" ||
			uint32(line["backend_pid"].(float64)) != pid || line.str("log_pins_over") != "300ms" {
			t.Fatalf("long pin line: %v (backend pid %d)", line, pid)
		}
		if d, err := time.ParseDuration(line.str("pinned_for")); err != nil || d < 300*time.Millisecond {
			t.Fatalf("pinned_for %q", line.str("pinned_for"))
		}
		// Once per pin: still one line after several more looks. The pin
		// log looks every 75 ms; a second pin taken now is logged once it
		// is 300 ms old, so by its line the pin log has looked at the first
		// pin about four more times.
		second := l.connect(t, "app", "appdb")
		if _, err := second.Exec(ctx, "SELECT pg_advisory_lock(470014)"); err != nil {
			t.Fatal(err)
		}
		pid2 := testenv.BackendPID(t, second)
		waitLine(t, log, "session pinned longer than log_pins_over", func(l logLine) bool {
			return uint32(l["backend_pid"].(float64)) == pid2
		})
		n := 0
		for _, l := range jsonLines(t, log.String()) {
			if l.str("msg") == "session pinned longer than log_pins_over" && uint32(l["backend_pid"].(float64)) == pid {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d long-pin lines for one pin, want 1", n)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock(470013)"); err != nil {
			t.Fatal(err)
		}
		if _, err := second.Exec(ctx, "SELECT pg_advisory_unlock(470014)"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("PostgreSQL down and back", func(t *testing.T) {
		lease := testenv.UniqueName(t, "logs")
		holder := l.connect(t, "app", "appdb")
		var token int64
		if err := holder.QueryRow(ctx, "SELECT lease_acquire($1, 60)", lease).Scan(&token); err != nil {
			t.Fatal(err)
		}
		// A waiter makes lockpool LISTEN in appdb.
		waiter := l.connect(t, "app", "appdb")
		waited := make(chan error, 1)
		go func() {
			var got *int64
			waited <- waiter.QueryRow(ctx, "SELECT lease_acquire($1, 60, 1.5)", lease).Scan(&got)
		}()
		su := testenv.SuperConn(t, "appdb")
		testenv.Eventually(t, 10*time.Second, "lockpool's LISTEN connection", func() bool {
			n, err := testenv.CountBackends(ctx, su, "query LIKE 'LISTEN %'")
			return err == nil && n > 0
		})

		fw.Down()
		down := waitLine(t, log, "PostgreSQL unreachable", nil)
		if down.str("level") != "WARN" || down.str("err") == "" || down.str("server") != fw.Addr() {
			t.Fatalf("unreachable line: %v", down)
		}
		if v := l.Metric("lockpool_server_unreachable", nil); v != 1 {
			t.Fatalf("lockpool_server_unreachable = %v while down, want 1", v)
		}
		lost := waitLine(t, log, "lockpool: lease LISTEN connection lost; waiters poll until it is back", nil)
		if lost.str("database") != "appdb" || lost.str("err") == "" {
			t.Fatalf("LISTEN lost line: %v", lost)
		}
		sweep := waitLine(t, log, "leak sweep failed", nil)
		if !strings.Contains(sweep.str("err"), "querying pg_locks") {
			t.Fatalf("leak sweep line names no cause: %v", sweep)
		}
		<-waited // the waiter gives up after 1.5 s; nothing waits any more
		// The outage goes on a while with nothing waiting (its LISTEN
		// goroutine ends then, without a log line, so this is a stretch of
		// time, not a signal): the next waiter must bring LISTEN back.
		time.Sleep(time.Second)
		fw.Up(t)

		back := waitLine(t, log, "PostgreSQL reachable again", nil)
		if back.str("level") != "INFO" || back.str("down_for") == "" {
			t.Fatalf("reachable line: %v", back)
		}
		waitLine(t, log, "leak sweep works again", nil)
		if v := l.Metric("lockpool_server_unreachable", nil); v != 0 {
			t.Fatalf("lockpool_server_unreachable = %v after recovery, want 0", v)
		}
		// The next waiter brings the LISTEN connection back, said once.
		var got *int64
		if err := waiter.QueryRow(ctx, "SELECT lease_acquire($1, 60, 0.5)", lease).Scan(&got); err != nil {
			t.Fatal(err)
		}
		waitLine(t, log, "lockpool: lease LISTEN connection back", nil)
		for msg, want := range map[string]int{
			"PostgreSQL unreachable":     1,
			"PostgreSQL reachable again": 1,
			"lockpool: lease LISTEN connection lost; waiters poll until it is back": 1,
			"lockpool: lease LISTEN connection back":                                1,
			"leak sweep failed":                                                     1,
		} {
			if n := countLines(t, log, msg); n != want {
				t.Errorf("%d lines %q, want %d", n, msg, want)
			}
		}
		if _, err := holder.Exec(context.Background(), "SELECT lease_release($1)", lease); err != nil {
			t.Logf("release after the outage: %v", err)
		}
	})
	jsonLines(t, log.String())
}
