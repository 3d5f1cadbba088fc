package integration

// SCRAM verifiers in the config instead of
// passwords, and no secret in logs, /debug output, /metrics or errors.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// secretVerifier creates role with password on c and returns the SCRAM
// verifier PostgreSQL stored for it (pg_authid.rolpassword).
func secretVerifier(t *testing.T, c *pgtest.Cluster, role, password string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Exec(ctx, "postgres", fmt.Sprintf(`SET password_encryption = 'scram-sha-256';
DO $$BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN CREATE ROLE %s LOGIN; END IF;
END$$;
ALTER ROLE %s PASSWORD '%s'`, role, role, role, password)); err != nil {
		t.Fatal(err)
	}
	su := superConn(t, "postgres")
	var v string
	if err := su.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "SCRAM-SHA-256$4096:") {
		t.Fatalf("unexpected verifier %q", v)
	}
	return v
}

// secretYAML: users are name, password pairs; the first one's application
// is applications[0] (lockpool's admin connection logs in as it).
func secretYAML(c *pgtest.Cluster, top string, users ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nadmin_listen: \"\"\nauth_method: scram-sha-256\nleak_check_interval: 1s\n%s\n", top)
	fmt.Fprintf(&b, "server:\n  host: %s\n  port: %d\n  max_connections: 10\nusers:\n", c.Host, c.Port)
	for i := 0; i+1 < len(users); i += 2 {
		fmt.Fprintf(&b, "  - name: %s\n    password: '%s'\n", users[i], users[i+1])
	}
	b.WriteString("applications:\n")
	for i := 0; i < len(users); i += 2 {
		fmt.Fprintf(&b, "  - name: %s\n    user: %s\n    database: postgres\n    max_connections: 3\n    max_pinned: 1\n    wait_timeout: 5s\n", users[i], users[i])
	}
	return b.String()
}

// TestSecretSCRAMVerifierPassThrough: a user configured only by its SCRAM
// verifier logs in through lockpool from psql and pgx, and lockpool logs in
// to the server with the client's proof (SCRAM pass-through).
func TestSecretSCRAMVerifierPassThrough(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	const role, pw = "secpass", "pass-through-pw-81x"
	v := secretVerifier(t, c, role, pw)
	l, _ := startYAML(t, secretYAML(c, "", role, v))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=postgres sslmode=disable", l.port, role, pw))
	if err != nil {
		t.Fatalf("pgx with a verifier-only user: %v", err)
	}
	var who string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != role {
		t.Fatalf("current_user %q, %v", who, err)
	}
	conn.Close(ctx)
	cmd := exec.CommandContext(ctx, "/usr/bin/psql", "-X", "-At", "-h", "127.0.0.1", "-p", strconv.Itoa(l.port), "-U", role, "-d", "postgres", "-c", "SELECT current_user")
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pw, "PGSSLMODE=disable", "PSQLRC=/dev/null")
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != role {
		t.Fatalf("psql with a verifier-only user: %v\n%s", err, out)
	}
}

// TestSecretSCRAMVerifierClientAuth: with only a verifier in the config the
// client side of authentication works (the right password passes lockpool's
// check; a wrong one gets 28P01 from lockpool itself).
func TestSecretSCRAMVerifierClientAuth(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	const role, pw = "secverif", "verifier-pw-77q"
	v := secretVerifier(t, c, role, pw)
	l, _ := startYAML(t, secretYAML(c, "", role, v))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := func(p string) string {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=postgres sslmode=disable", l.port, role, p)
	}
	_, err := pgx.Connect(ctx, dsn("not-the-password"))
	pe := pgErr(t, err, "28P01")
	if !strings.HasPrefix(pe.Message, "lockpool:") || strings.Contains(pe.Hint, "could not log in to PostgreSQL") {
		t.Errorf("wrong password: %q (hint %q): want lockpool's own client-auth failure", pe.Message, pe.Hint)
	}
	conn, err := pgx.Connect(ctx, dsn(pw))
	if err != nil {
		t.Fatalf("the right password: %v", err)
	}
	conn.Close(ctx)
}

// TestSecretSCRAMVerifierOwnConnections: with a user configured by its
// SCRAM verifier only, lockpool's own connections log in with what a
// client's login proved: the host checks of server.hosts, the leak sweep
// (it finds a lock taken where the lexer cannot see it), the lock
// connections of advisory_locks: hold, the lease store and LISTEN. None of
// them fails once a client has logged in (lockpool_background_task_failing
// stays 0).
func TestSecretSCRAMVerifierOwnConnections(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	const role, pw = "secown", "own-conns-pw-52k"
	v := secretVerifier(t, c, role, pw)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	su := superConn(t, "postgres")
	if _, err := su.Exec(ctx, `GRANT CREATE ON DATABASE postgres TO `+role+`;
CREATE OR REPLACE FUNCTION public.secown_take(k bigint) RETURNS int
  LANGUAGE plpgsql AS $f$BEGIN PERFORM pg_advisory_lock(k); RETURN pg_backend_pid(); END$f$`); err != nil {
		t.Fatal(err)
	}
	// Its own lease schema: the shared one belongs to another test's role.
	yaml := secretYAML(c, "leases: {schema: secown_leases}", role, v)
	yaml = strings.Replace(yaml, fmt.Sprintf("  host: %s\n  port: %d\n", c.Host, c.Port),
		fmt.Sprintf("  hosts: ['%s:%d']\n  health_check_interval: 200ms\n", c.Host, c.Port), 1)
	l, log := startYAML(t, yaml)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lockpool log:\n%s", log.String())
		}
	})
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=postgres sslmode=disable", l.port, role, pw)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	defer conn.Close(context.Background())

	// A server connection needs the primary, which the host checks find
	// once they log in with the client's proof.
	var pid int32
	if err := conn.QueryRow(ctx, "SELECT secown_take(7700001)").Scan(&pid); err != nil {
		t.Fatalf("through lockpool: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "the leak sweep to close the connection with the hidden lock", func() bool {
		var n int
		if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0 && l.metric("lockpool_leaked_locks_total", map[string]string{"app": role}) == 1
	})

	// advisory_locks: hold — the lock lives on a lock connection.
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(7700002)").Scan(&got); err != nil || !got {
		t.Fatalf("pg_try_advisory_lock through lockpool: %v, %v", got, err)
	}
	var holder string
	if err := su.QueryRow(ctx, `SELECT a.usename FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.objid = 7700002`).Scan(&holder); err != nil || holder != role {
		t.Fatalf("the held lock's backend logs in as %q (%v), want %q", holder, err, role)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock(7700002)"); err != nil {
		t.Fatal(err)
	}

	// Leases.
	var token *int64
	if err := conn.QueryRow(ctx, "SELECT lease_acquire('secown', 30)").Scan(&token); err != nil || token == nil || *token <= 0 {
		t.Fatalf("lease_acquire: %v, %v", token, err)
	}
	if _, err := conn.Exec(ctx, "SELECT lease_release('secown')"); err != nil {
		t.Fatal(err)
	}

	// LISTEN, served by lockpool's listener connection.
	if _, err := conn.Exec(ctx, "LISTEN secown_ch"); err != nil {
		t.Fatal(err)
	}
	if _, err := su.Exec(ctx, "NOTIFY secown_ch, 'hello'"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := conn.WaitForNotification(wctx)
	wcancel()
	if err != nil || n.Channel != "secown_ch" || n.Payload != "hello" {
		t.Fatalf("notification: %+v, %v", n, err)
	}

	if v := l.metric("lockpool_background_task_failing", map[string]string{"task": "leak_sweep"}); v != 0 {
		t.Errorf("lockpool_background_task_failing{leak_sweep} = %v, want 0", v)
	}
	if v := l.metric("lockpool_host_role", map[string]string{"host": fmt.Sprintf("%s:%d", c.Host, c.Port), "role": "primary"}); v != 1 {
		t.Errorf("lockpool_host_role{primary} = %v, want 1: the host checks never logged in", v)
	}
}

// TestSecretNotInLogsDebugMetrics: passwords, verifier parts and the admin
// token appear nowhere in lockpool's debug log, /debug/locks, /metrics or
// the errors clients get.
func TestSecretNotInLogsDebugMetrics(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	const plainRole, plainPW = "secplain", "Plain-Secret-pw-3141"
	const verRole, verPW = "secver2", "Verifier-Secret-pw-2718"
	const wrongPW = "Wrong-Secret-pw-1618"
	const token = "Admin-Token-Secret-4669"
	if err := c.Exec(context.Background(), "postgres", fmt.Sprintf(`SET password_encryption = 'scram-sha-256';
DO $$BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN CREATE ROLE %s LOGIN PASSWORD '%s'; END IF;
END$$`, plainRole, plainRole, plainPW)); err != nil {
		t.Fatal(err)
	}
	v := secretVerifier(t, c, verRole, verPW)
	l, logs := startYAML(t, secretYAML(c, "admin_token: "+token, plainRole, plainPW, verRole, v))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := func(u, p, db string) string {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", l.port, u, p, db)
	}
	var clientErrs []string
	// Logins that work, fail on the client side, and fail on the server side.
	conn, err := pgx.Connect(ctx, dsn(plainRole, plainPW, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, p := range []struct{ u, pw, db string }{
		{plainRole, wrongPW, "postgres"}, {verRole, wrongPW, "postgres"}, {verRole, verPW, "postgres"},
		{plainRole, plainPW, "no_such_db"}, {"nobody", wrongPW, "postgres"},
	} {
		if c2, err := pgx.Connect(ctx, dsn(p.u, p.pw, p.db)); err == nil {
			c2.Close(ctx)
		} else {
			clientErrs = append(clientErrs, err.Error())
		}
	}
	// A pinned lock, so /debug/locks has something to show; an error.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(99)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1/0"); err != nil {
		clientErrs = append(clientErrs, err.Error())
	}
	// One leak sweep: it logs in as lockpool's own user (the plaintext
	// password) and asks pg_locks about the idle server connections.
	su := superConn(t, "postgres")
	eventually(t, 10*time.Second, "a leak sweep's pg_locks query on lockpool's own connection", func() bool {
		n, err := countBackends(ctx, su, fmt.Sprintf("usename = '%s' AND application_name = 'lockpool-admin' AND query LIKE 'SELECT DISTINCT pid FROM pg_catalog.pg_locks %%'", plainRole))
		return err == nil && n > 0
	})
	req, _ := http.NewRequest("GET", l.admin.URL+"/debug/locks", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	debugLocks := httpBody(t, req)
	if !strings.Contains(debugLocks, plainRole) {
		t.Errorf("/debug/locks does not show the pinned session: %s", debugLocks)
	}
	req, _ = http.NewRequest("GET", l.admin.URL+"/metrics", nil)
	metrics := httpBody(t, req)
	_, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	conn.Close(ctx)
	// The session's end is logged before it stops counting as a client.
	eventually(t, 5*time.Second, "lockpool to end every client session", func() bool {
		return l.metric("lockpool_client_connections", nil) == 0
	})

	// The secrets: passwords, the verifier and each of its parts, the token.
	secrets := []string{plainPW, verPW, wrongPW, token, v}
	rest := strings.TrimPrefix(v, "SCRAM-SHA-256$4096:")
	salt, keys, _ := strings.Cut(rest, "$")
	stored, server, _ := strings.Cut(keys, ":")
	secrets = append(secrets, salt, stored, server)
	places := map[string]string{"log": logs.String(), "/debug/locks": debugLocks, "/metrics": metrics, "client errors": strings.Join(clientErrs, "\n")}
	if len(places["log"]) < 100 {
		t.Fatalf("the log is nearly empty: %q", places["log"])
	}
	for where, text := range places {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("secret %q found in %s", s, where)
			}
		}
	}
}

func httpBody(t *testing.T, req *http.Request) string {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", req.URL.Path, resp.StatusCode, b)
	}
	return string(b)
}

// TestSecretSCRAMVerifierCluster: cluster coordination (budget_scope:
// cluster) logs in as a user configured by its SCRAM verifier only once a
// client of it has logged in, and the application's budget then works:
// before that it fails and says so (lockpool_background_task_failing is 1),
// after it the instance holds slots and serves the client.
func TestSecretSCRAMVerifierCluster(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	const role, pw = "secclu", "cluster-pw-19t"
	v := secretVerifier(t, c, role, pw)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	su := superConn(t, "postgres")
	if _, err := su.Exec(ctx, "GRANT CREATE ON DATABASE appdb TO "+role); err != nil {
		t.Fatal(err)
	}
	yaml := clusterYAML(c, role, uniqueName(t, "cl"), "hold", "")
	old := fmt.Sprintf("  - name: %s\n    password: %s\n", role, testenv.Password)
	if !strings.Contains(yaml, old) {
		t.Fatalf("no password line for %s in:\n%s", role, yaml)
	}
	yaml = strings.Replace(yaml, old, fmt.Sprintf("  - name: %s\n    password: '%s'\n", role, v), 1)
	l, _ := startYAML(t, yaml)
	failing := func() float64 {
		return l.metric("lockpool_background_task_failing", map[string]string{"task": "cluster"})
	}
	eventually(t, 10*time.Second, "the coordination to fail before any client logged in", func() bool { return failing() == 1 })

	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=appdb sslmode=disable", l.port, role, pw))
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	defer conn.Close(context.Background())
	var who string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != role {
		t.Fatalf("a query under the cluster budget: %q, %v", who, err)
	}
	eventually(t, 10*time.Second, "the coordination to work", func() bool { return failing() == 0 })
	clusterSelf(t, l)
}
