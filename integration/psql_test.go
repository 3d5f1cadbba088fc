package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

// psql through lockpool.

func TestPsqlDescribeAndMultiStatement(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.user = "psql", "psqlr"
	l := startLockpool(t, 10, "", app)
	tbl := uniqueName(t, "t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A multi-statement simple query in one -c (one Query message).
	out, err := l.psqlCmd(ctx, "psqlr", "appdb", "-At", "-c",
		fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, note text); INSERT INTO %[1]s VALUES (1, 'one'), (2, 'two'); SELECT count(*) FROM %[1]s", tbl)).CombinedOutput()
	if err != nil {
		t.Fatalf("psql multi-statement: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "2" {
		t.Fatalf("multi-statement query printed %q, want 2", got)
	}

	// \d lists the table; \d table describes its columns and index.
	out, err = l.psqlCmd(ctx, "psqlr", "appdb", "-c", `\d`).CombinedOutput()
	if err != nil || !strings.Contains(string(out), tbl) {
		t.Fatalf(`\d: %v, output lacks %s:\n%s`, err, tbl, out)
	}
	out, err = l.psqlCmd(ctx, "psqlr", "appdb", "-c", `\d `+tbl).CombinedOutput()
	if err != nil {
		t.Fatalf(`\d %s: %v\n%s`, tbl, err, out)
	}
	for _, want := range []string{"note", "text", tbl + "_pkey", "PRIMARY KEY, btree (id)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf(`\d %s output lacks %q:\n%s`, tbl, want, out)
		}
	}

	// A script of several statements and meta-commands on one connection.
	script := fmt.Sprintf(`SELECT 1 AS a \; SELECT 2 AS b \; SELECT 3 AS c;
\dt %[1]s
SELECT note FROM %[1]s WHERE id = 2;
`, tbl)
	cmd := l.psqlCmd(ctx, "psqlr", "appdb", "-At")
	cmd.Stdin = strings.NewReader(script)
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql script: %v\n%s", err, out)
	}
	for _, want := range []string{"1\n", "2\n", "3\n", "two"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("script output lacks %q:\n%s", want, out)
		}
	}
}

func TestPsqlErrorsMidTransaction(t *testing.T) {
	t.Parallel()
	// max_connections 1: every statement of every client uses the same
	// server connection, so a transaction state that leaked would show.
	app := defaultApp()
	app.max, app.pinned = 2, 1
	l := startLockpool(t, 10, "", app)
	tbl := uniqueName(t, "t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id int); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`BEGIN;
INSERT INTO %[1]s VALUES (1);
SELECT 1/0;
INSERT INTO %[1]s VALUES (2);
ROLLBACK;
SELECT 'after-rollback', count(*) FROM %[1]s;
BEGIN;
INSERT INTO %[1]s VALUES (3);
SAVEPOINT s;
SELECT no_such_column FROM %[1]s;
ROLLBACK TO SAVEPOINT s;
INSERT INTO %[1]s VALUES (4);
COMMIT;
SELECT 'final', string_agg(id::text, ',' ORDER BY id) FROM %[1]s;
`, tbl)
	cmd := l.psqlCmd(ctx, "app", "appdb", "-At", "-v", "ON_ERROR_STOP=0")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{
		"ERROR:  division by zero",
		"ERROR:  current transaction is aborted, commands ignored until end of transaction block",
		"after-rollback|0",
		`ERROR:  column "no_such_column" does not exist`,
		"final|3,4",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("psql output lacks %q:\n%s", want, s)
		}
	}
	if n, err := countBackends(ctx, super, "usename = 'app' AND datname = 'appdb' AND state LIKE 'idle in transaction%' AND query LIKE '%"+tbl+"%'"); err != nil || n != 0 {
		t.Errorf("open transactions left on the server: %d, %v", n, err)
	}
}

func TestPsqlCopy100k(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.max = 2
	l := startLockpool(t, 10, "", app)
	tbl := uniqueName(t, "t")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id int, payload text); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}
	const rows = 100000
	var in bytes.Buffer
	want := 0
	for i := 1; i <= rows; i++ {
		fmt.Fprintf(&in, "%d\tpayload-%d-\\\\-tab\\tx\n", i, i)
		want += i
	}

	// COPY … FROM STDIN with the data piped to psql's stdin.
	cmd := l.psqlCmd(ctx, "app", "appdb", "-c", "COPY "+tbl+" FROM STDIN")
	cmd.Stdin = bytes.NewReader(in.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("COPY FROM STDIN: %v\n%s", err, out)
	}
	var n, sum int
	if err := super.QueryRow(ctx, "SELECT count(*), sum(id) FROM "+tbl).Scan(&n, &sum); err != nil || n != rows || sum != want {
		t.Fatalf("after COPY FROM STDIN: count %d sum %d (%v), want %d rows sum %d", n, sum, err, rows, want)
	}

	// COPY … TO STDOUT returns exactly what went in.
	cmd = l.psqlCmd(ctx, "app", "appdb", "-c", "COPY (SELECT * FROM "+tbl+" ORDER BY id) TO STDOUT")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("COPY TO STDOUT: %v\n%s", err, stderr.String())
	}
	if !bytes.Equal(stdout.Bytes(), in.Bytes()) {
		t.Fatalf("COPY TO STDOUT returned %d bytes (%d lines), want the %d bytes sent", stdout.Len(), bytes.Count(stdout.Bytes(), []byte("\n")), in.Len())
	}

	// \copy (client-side, COPY FROM STDIN underneath) inside a transaction
	// followed by more statements on the same connection.
	dataFile := t.TempDir() + "/data.tsv"
	if err := os.WriteFile(dataFile, in.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = l.psqlCmd(ctx, "app", "appdb", "-At")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("BEGIN;\n\\copy %s FROM '%s'\nCOMMIT;\nSELECT count(*) FROM %[1]s;\n", tbl, dataFile))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf(`\copy: %v\n%s`, err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasSuffix(got, strconv.Itoa(2*rows)) {
		t.Fatalf(`after \copy: %q, want count %d`, got, 2*rows)
	}

	// A COPY that fails mid-stream (bad row) rolls back and the connection
	// stays usable.
	cut := 0
	for i := 0; i < 1000; i++ {
		cut += bytes.IndexByte(in.Bytes()[cut:], '\n') + 1
	}
	bad := append(append([]byte{}, in.Bytes()[:cut]...), []byte("notanumber\tx\n")...)
	cmd = l.psqlCmd(ctx, "app", "appdb", "-c", "COPY "+tbl+" FROM STDIN")
	cmd.Stdin = bytes.NewReader(bad)
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "invalid input syntax for type integer") {
		t.Fatalf("bad COPY: err %v, output:\n%s", err, out)
	}
	if err := super.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil || n != 2*rows {
		t.Fatalf("after failed COPY: %d rows, %v", n, err)
	}
	c := l.connect(t, "app", "appdb")
	if err := c.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil || n != 2*rows {
		t.Fatalf("through lockpool after failed COPY: %d rows, %v", n, err)
	}
}

// Cancel: SELECT pg_sleep(30) is cancelled within 1 s through lockpool's
// BackendKeyData, while another client's pg_sleep(2) on the same application
// completes normally.
func TestCancelRequest(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "")
	a := l.connect(t, "app", "appdb")
	b := l.connect(t, "app", "appdb")
	ctx := context.Background()

	var wg sync.WaitGroup
	var bErr error
	var bDur time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		_, bErr = b.Exec(ctx, "SELECT pg_sleep(2)")
		bDur = time.Since(t0)
	}()

	errc := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "SELECT pg_sleep(30)")
		errc <- err
	}()
	// Wait until both sleeps run on the server.
	super := superConn(t, "postgres")
	eventually(t, 5*time.Second, "both sleeps running", func() bool {
		n, err := countBackends(ctx, super, "usename = 'app' AND state = 'active' AND query LIKE 'SELECT pg_sleep(%'")
		return err == nil && n == 2
	})
	t0 := time.Now()
	if err := a.PgConn().CancelRequest(ctx); err != nil {
		t.Fatalf("CancelRequest: %v", err)
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(5 * time.Second):
		t.Fatal("pg_sleep(30) not cancelled after 5 s")
	}
	el := time.Since(t0)
	pe := pgErr(t, err, "57014")
	if el > time.Second {
		t.Errorf("cancel took %v, want < 1 s", el)
	}
	t.Logf("cancelled in %v: %s", el, pe.Message)

	wg.Wait()
	if bErr != nil {
		t.Fatalf("the other client's pg_sleep(2) failed: %v", bErr)
	}
	if bDur < 1900*time.Millisecond {
		t.Errorf("the other client's pg_sleep(2) returned after %v", bDur)
	}
	// The cancelled client is still usable.
	var one int
	if err := a.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after cancel: %d, %v", one, err)
	}
	// A cancel with a wrong secret cancels nothing.
	go func() {
		_, err := a.Exec(ctx, "SELECT pg_sleep(1.5)")
		errc <- err
	}()
	eventually(t, 5*time.Second, "sleep running", func() bool {
		n, err := countBackends(ctx, super, "usename = 'app' AND state = 'active' AND query LIKE 'SELECT pg_sleep(%'")
		return err == nil && n == 1
	})
	key := a.PgConn().SecretKey()
	if len(key) != 4 {
		t.Fatalf("secret key of %d bytes, want 4 (protocol 3.0)", len(key))
	}
	testenv.SendCancel(t, l.addr, a.PgConn().PID(), binary.BigEndian.Uint32(key)+1)
	if err := <-errc; err != nil {
		t.Fatalf("a CancelRequest with a wrong secret cancelled the query: %v", err)
	}
}

// TestPsqlCancel: psql sends a CancelRequest on SIGINT.
func TestPsqlCancel(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.user = "psqlc", "app2"
	l := startLockpool(t, 10, "", app)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := l.psqlCmd(ctx, "app2", "appdb", "-c", "SELECT pg_sleep(30)")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	super := superConn(t, "postgres")
	eventually(t, 10*time.Second, "psql's sleep running", func() bool {
		n, err := countBackends(ctx, super, "usename = 'app2' AND state = 'active' AND query LIKE 'SELECT pg_sleep(%'")
		return err == nil && n == 1
	})
	t0 := time.Now()
	_ = cmd.Process.Signal(syscall.SIGINT)
	werr := cmd.Wait()
	el := time.Since(t0)
	if !strings.Contains(out.String(), "canceling statement due to user request") {
		t.Fatalf("psql after SIGINT (%v, %v):\n%s", werr, el, out.String())
	}
	if el > 1500*time.Millisecond {
		t.Errorf("psql cancel took %v", el)
	}
}
