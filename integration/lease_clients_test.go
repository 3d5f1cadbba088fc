package integration

// The lease scenario from psql, pgx (every exec
// mode, the default first) and node-postgres; the token arrives as an int8.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestLeaseClientsPgx(t *testing.T) {
	t.Parallel()
	a, b, _ := startLeasePair(t, "pgx")
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, // pgx's default
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			name := fmt.Sprintf("pgx-%s-%d", mode, time.Now().UnixNano())
			ca := a.connect(t, "app", "appdb")
			cb := b.connect(t, "app", "appdb")

			// Token as int8: the column's type and a Scan into int64.
			rows, err := ca.Query(ctx, "SELECT lease_acquire($1, $2) AS tok", mode, name, 30)
			if err != nil {
				t.Fatal(err)
			}
			fds := rows.FieldDescriptions()
			if len(fds) != 1 || fds[0].DataTypeOID != 20 || fds[0].Name != "tok" {
				rows.Close()
				t.Fatalf("lease_acquire columns %+v, want one int8 column tok", fds)
			}
			var tok int64
			for rows.Next() {
				if err := rows.Scan(&tok); err != nil {
					t.Fatal(err)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if tok <= 0 {
				t.Fatalf("token %d", tok)
			}
			// Fractional ttl, float wait, qualified name: re-acquire keeps the token.
			var again int64
			if err := ca.QueryRow(ctx, "SELECT lockpool.lease_acquire($1, $2, $3)", mode, name, 30.5, 0.0).Scan(&again); err != nil || again != tok {
				t.Fatalf("re-acquire = %d, %v; want %d", again, err, tok)
			}
			var ok bool
			if err := ca.QueryRow(ctx, "SELECT lease_renew($1)", mode, name).Scan(&ok); err != nil || !ok {
				t.Fatalf("lease_renew = %v, %v", ok, err)
			}
			tx, err := ca.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var fenced int64
			if err := tx.QueryRow(ctx, "SELECT lease_fence($1, $2)", mode, name, tok).Scan(&fenced); err != nil || fenced != tok {
				t.Fatalf("lease_fence = %d, %v", fenced, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var other *int64
			if err := cb.QueryRow(ctx, "SELECT lease_acquire($1, $2, $3)", mode, name, 30, 0).Scan(&other); err != nil || other != nil {
				t.Fatalf("acquire by another holder = %v, %v; want NULL", other, err)
			}
			lrows, err := ca.Query(ctx, "SELECT * FROM lease_list()", mode)
			if err != nil {
				t.Fatal(err)
			}
			var found bool
			for lrows.Next() {
				var r leaseListRow
				if err := lrows.Scan(&r.Name, &r.Holder, &r.Token, &r.TakenAt, &r.ExpiresAt, &r.Mine); err != nil {
					t.Fatal(err)
				}
				if r.Name == name {
					found = true
					if r.Token != tok || !r.Mine || !strings.HasPrefix(r.Holder, "pgx-a:") || !r.ExpiresAt.After(r.TakenAt) {
						t.Errorf("lease_list row %+v", r)
					}
				}
			}
			if err := lrows.Err(); err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Fatal("lease_list lacks the lease")
			}
			if err := ca.QueryRow(ctx, "SELECT lease_release($1)", mode, name).Scan(&ok); err != nil || !ok {
				t.Fatalf("lease_release = %v, %v", ok, err)
			}
			var t2 int64
			if err := cb.QueryRow(ctx, "SELECT lease_acquire($1, $2, $3)", mode, name, 30, 5).Scan(&t2); err != nil || t2 <= tok {
				t.Fatalf("takeover = %d, %v; want > %d", t2, err, tok)
			}
			tx, err = ca.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, "SELECT lease_fence($1, $2)", mode, name, tok)
			pgErr(t, err, "LP001")
			_ = tx.Rollback(ctx)
			if err := ca.QueryRow(ctx, "SELECT lease_renew($1)", mode, name).Scan(&ok); err != nil || ok {
				t.Fatalf("stale lease_renew = %v, %v", ok, err)
			}
			if err := ca.QueryRow(ctx, "SELECT lease_release($1)", mode, name).Scan(&ok); err != nil || ok {
				t.Fatalf("stale lease_release = %v, %v", ok, err)
			}
		})
	}
}

func TestLeaseClientsPsql(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		skipOrFail(t, "psql is not installed")
	}
	a, b, name := startLeasePair(t, "psql")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The other instance holds a second lease so psql can watch a takeover.
	cb := b.connect(t, "app", "appdb")
	script := strings.ReplaceAll(`\set VERBOSITY verbose
SELECT lease_acquire('NAME', 30) AS tok \gset
\echo token :tok
SELECT lease_acquire('NAME', 30) AS tok \gdesc
\echo again
SELECT lockpool.lease_acquire('NAME', 30, 0);
\echo renew
SELECT lease_renew('NAME');
BEGIN;
\echo fence
SELECT lease_fence('NAME', :tok);
COMMIT;
\echo list
SELECT * FROM lease_list();
\echo release
SELECT lease_release('NAME');
\echo reacquire
SELECT lease_acquire('NAME', 30) AS tok2 \gset
SELECT :tok2 > :tok AS larger;
\set ON_ERROR_STOP 0
BEGIN;
\echo stale
SELECT lease_fence('NAME', :tok);
ROLLBACK;
\echo done
`, "NAME", name)
	cmd := a.psqlCmd(ctx, "app", "appdb", "-A", "-t", "-F", "|")
	cmd.Stdin = strings.NewReader(script)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("psql stdout:\n%s\npsql stderr:\n%s", out, stderr.String())
	if err != nil {
		t.Fatalf("psql: %v", err)
	}
	want := regexp.MustCompile(`^token (\d+)
tok\|bigint
again
(\d+)
renew
t
fence
(\d+)
list
(?s:.*)` + regexp.QuoteMeta(name) + `\|psql-a:[^|]+\|(\d+)\|[^|]+\|[^|]+\|t
(?s:.*)release
t
reacquire
t
stale
done
$`)
	m := want.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("psql output does not match %s", want)
	}
	if m[1] != m[2] || m[1] != m[3] || m[1] != m[4] {
		t.Fatalf("tokens differ: %v", m[1:])
	}
	if !regexp.MustCompile(`ERROR:  LP001: lockpool: lease`).MatchString(stderr.String()) {
		t.Fatalf("stale lease_fence: want ERROR LP001 on stderr, got %q", stderr.String())
	}
	// psql exited: its leases are released at once.
	tok, _ := strconv.ParseInt(m[1], 10, 64)
	if t2 := mustAcquire(t, cb, name, 30, 5); t2 <= tok {
		t.Fatalf("after psql exited: token %d <= %d", t2, tok)
	}
}

func TestLeaseClientsNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := startLockpool(t, 10, "instance_id: node-a")
	b := startLockpool(t, 10, "instance_id: node-b")
	cmd := nodeCommand(ctx, t, "lease.js", "DATABASE_URL="+a.url("app", "appdb"), "DATABASE_URL2="+b.url("app", "appdb"),
		fmt.Sprintf("LEASE_NAME=node-%d", time.Now().UnixNano()))
	out, err := cmd.CombinedOutput()
	t.Logf("node lease.js: %s", strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("node lease.js failed: %v", err)
	}
}
