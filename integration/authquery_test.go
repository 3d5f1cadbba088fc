package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// TestAuthQuery: with auth_query, lockpool needs no password list. It looks
// up the SCRAM verifier through a low-privilege role and a SECURITY DEFINER
// function over pg_authid, authenticates the client against it, and logs in
// to PostgreSQL with that client's SCRAM proof (pass-through).
func TestAuthQuery(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	ctx := context.Background()
	const lookupRole = "lpauthq"
	if err := c.Exec(ctx, "postgres", fmt.Sprintf(`DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%[1]s') THEN CREATE ROLE %[1]s LOGIN PASSWORD '%[2]s'; END IF;
END$$;
CREATE SCHEMA IF NOT EXISTS lockpool;
CREATE OR REPLACE FUNCTION lockpool.user_lookup(i_username text, OUT usename name, OUT passwd text)
  RETURNS record LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS
  $f$ SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = i_username $f$;
REVOKE ALL ON FUNCTION lockpool.user_lookup(text) FROM PUBLIC;
GRANT USAGE ON SCHEMA lockpool TO %[1]s;
GRANT EXECUTE ON FUNCTION lockpool.user_lookup(text) TO %[1]s;`, lookupRole, appPassword)); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: ""
leak_check_interval: 0s
server:
  host: %s
  port: %d
  max_connections: 10
auth_query:
  user: %s
  password: %s
applications:
  - name: aq
    user: other
    database: appdb
    max_connections: 2
    max_pinned: 1
`, c.Host, c.Port, lookupRole, appPassword)
	cfg, err := config.Parse([]byte(yaml), "authquery.yaml", nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	l := startLockpoolConfig(t, cfg)
	conn := l.connect(t, "other", "appdb")
	for i := 0; i < 20; i++ {
		var who string
		if err := conn.QueryRow(ctx, "SELECT current_user || ':' || $1::text", fmt.Sprint(i)).Scan(&who); err != nil || who != fmt.Sprintf("other:%d", i) {
			t.Fatalf("query %d through auth_query login: %q, %v", i, who, err)
		}
	}
	// A second client of the same user on another server connection.
	conn2 := l.connect(t, "other", "appdb")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var p1, p2 int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p1); err != nil {
		t.Fatal(err)
	}
	if err := conn2.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p2); err != nil || p1 == p2 {
		t.Fatalf("second server connection: pid %d (first %d), %v", p2, p1, err)
	}
	_ = tx.Rollback(ctx)

	// psql too.
	out, err := l.psqlCmd(ctx, "other", "appdb", "-tA", "-c", "SELECT current_user").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "other" {
		t.Errorf("psql through auth_query login: %q, %v", out, err)
	}
	if code, body := l.get("/health/ready"); code != 200 {
		t.Errorf("/health/ready with only auth_query credentials: %d %s", code, body)
	}
	for _, tc := range []struct{ user, pw string }{{"other", "wrong-password"}, {"no_such_role", appPassword}} {
		_, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=appdb sslmode=disable", l.port, tc.user, tc.pw))
		if code := sqlState(err); code != "28P01" {
			t.Errorf("login %s with a wrong password: %v (SQLSTATE %q), want 28P01", tc.user, err, code)
		}
	}
}
