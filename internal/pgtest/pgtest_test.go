package pgtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	os.Exit(RunMain(m, func(c *Cluster) error {
		ctx := context.Background()
		if err := c.CreateRole(ctx, "app", "s3cr'et pw"); err != nil {
			return err
		}
		return c.CreateDatabase(ctx, "appdb", "app")
	}))
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %q: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestSelect1(t *testing.T) {
	c := Require(t)
	t.Logf("Start took %v", c.StartupTime)
	conn := connect(t, c.SuperuserDSN("postgres"))
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("SELECT 1 = %d, %v", n, err)
	}
}

func TestSettings(t *testing.T) {
	c := Require(t)
	conn := connect(t, c.SuperuserDSN("postgres"))
	want := map[string]string{
		"max_connections":     "300",
		"fsync":               "off",
		"synchronous_commit":  "off",
		"full_page_writes":    "on",
		"shared_buffers":      "32MB",
		"password_encryption": "scram-sha-256",
		"listen_addresses":    "127.0.0.1",
		"wal_level":           "replica",
		"max_wal_senders":     "10",
		"wal_log_hints":       "on",
		"hot_standby":         "on",
		"wal_keep_size":       "256MB",
	}
	for name, v := range want {
		var got string
		if err := conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != v {
			t.Errorf("%s = %q, want %q", name, got, v)
		}
	}
}

func TestRoleAndDatabase(t *testing.T) {
	c := Require(t)
	ctx := context.Background()
	conn := connect(t, c.DSN("app", "s3cr'et pw", "appdb"))
	var user, db string
	if err := conn.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&user, &db); err != nil {
		t.Fatal(err)
	}
	if user != "app" || db != "appdb" {
		t.Fatalf("got %s@%s", user, db)
	}

	su := connect(t, c.SuperuserDSN("postgres"))
	var pw string
	if err := su.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = 'app'").Scan(&pw); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pw, "SCRAM-SHA-256$") {
		t.Fatalf("password not stored as SCRAM: %.20q", pw)
	}

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if bad, err := pgx.Connect(cctx, c.DSN("app", "wrong", "appdb")); err == nil {
		bad.Close(ctx)
		t.Fatal("wrong password accepted")
	}

	// Exec: several statements without args, and one with args.
	if err := c.Exec(ctx, "appdb", "CREATE TABLE t(x int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx, "appdb", "INSERT INTO t VALUES ($1)", 2); err != nil {
		t.Fatal(err)
	}
}

func TestStopStartAgain(t *testing.T) {
	c := Require(t)
	ctx := context.Background()
	pid1, err := c.PostmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx, "postgres", "SELECT 1"); err == nil {
		t.Fatal("Exec succeeded on a stopped cluster")
	}
	if err := c.StartAgain(); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx, "postgres", "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	pid2, err := c.PostmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	if pid1 == pid2 {
		t.Fatalf("postmaster pid unchanged after restart: %d", pid1)
	}
	if err := c.Exec(ctx, "appdb", "SELECT count(*) FROM pg_class"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(c.Log(), "database system is ready to accept connections") {
		t.Fatalf("unexpected server log:\n%s", c.Log())
	}
}

func TestDestroyAndWatchdog(t *testing.T) {
	Require(t)
	ctx := context.Background()

	c, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second Start took %v", c.StartupTime)
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.base); !os.IsNotExist(err) {
		t.Fatalf("base dir still there: %v", err)
	}
	if err := c.Destroy(); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}

	// Simulate the test process dying: the watchdog sees EOF and cleans up.
	c, err = Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.watch.w.Close()
	_ = c.watch.cmd.Wait()
	if _, err := os.Stat(c.base); !os.IsNotExist(err) {
		t.Fatalf("watchdog left base dir: %v", err)
	}
	if err := c.Exec(ctx, "postgres", "SELECT 1"); err == nil {
		t.Fatal("server still up after watchdog cleanup")
	}
	c.watch.w, c.watch.cmd = nil, nil
	_ = c.Destroy()
}
