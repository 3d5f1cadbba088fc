package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// A client that dies after BEGIN; INSERT … leaves no
// row and no open transaction on the server.
func TestClientDiesMidTransaction(t *testing.T) {
	t.Parallel()
	// max_connections 1: the next client necessarily gets the same server
	// connection (unless lockpool closed it), so it would see a leftover
	// transaction.
	app := defaultApp()
	app.name, app.user, app.max, app.pinned = "dier", "dier", 1, 0
	l := startLockpool(t, 10, "", app)
	tbl := uniqueName(t, "t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id int, how text); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}
	openTx := func() int {
		n, err := countBackends(ctx, super, "usename = 'dier' AND (state LIKE 'idle in transaction%' OR xact_start IS NOT NULL)")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	check := func(how string) {
		t.Helper()
		eventually(t, 2*time.Second, "no open transaction of role dier after "+how, func() bool { return openTx() == 0 })
		var n int
		if err := super.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s: %d rows left (%v)", how, n, err)
		}
		// The next client on the (single) server connection is outside
		// any transaction and sees no row.
		c := l.connect(t, "dier", "appdb")
		// In a simple query outside a transaction block now() is the
		// statement's own start, and no xid is assigned yet.
		var inTx bool
		if err := c.QueryRow(ctx, "SELECT count(*), now() <> statement_timestamp() OR txid_current_if_assigned() IS NOT NULL FROM "+tbl, pgx.QueryExecModeSimpleProtocol).Scan(&n, &inTx); err != nil || n != 0 || inTx {
			t.Fatalf("%s: next client sees %d rows, inside an old transaction: %v (%v)", how, n, inTx, err)
		}
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err) // a leftover transaction would make this a warning, not an error
		}
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
	}

	// 1. pgx client whose socket is closed under it.
	var raw net.Conn
	c := l.connectCfg(t, "dier", "appdb", func(cfg *pgx.ConnConfig) {
		d := cfg.DialFunc
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := d(ctx, network, addr)
			raw = nc
			return nc, err
		}
	})
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "INSERT INTO "+tbl+" VALUES (1, 'socket closed')"); err != nil {
		t.Fatal(err)
	}
	if openTx() != 1 {
		t.Fatalf("expected the open transaction on the server before the client dies")
	}
	_ = raw.Close()
	check("socket close")

	// 2. Client sends BEGIN; INSERT in one Query and vanishes before reading
	// the answer (the server may still be executing when the client goes).
	nc := l.connect(t, "dier", "appdb")
	hj, err := nc.PgConn().Hijack()
	if err != nil {
		t.Fatal(err)
	}
	q := appendQueryMsg(nil, "BEGIN; INSERT INTO "+tbl+" VALUES (2, 'gone before answer'); SELECT pg_sleep(0.3)")
	if _, err := hj.Conn.Write(q); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the server to run the dying client's pg_sleep", func() bool {
		n, err := countBackends(ctx, super, "usename = 'dier' AND state = 'active' AND query LIKE '%pg_sleep%'")
		return err == nil && n == 1
	})
	_ = hj.Conn.Close()
	check("close while the server runs")

	// 3. A psql process killed mid-transaction.
	cmd := l.psqlCmd(ctx, "dier", "appdb")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "BEGIN;\nINSERT INTO "+tbl+" VALUES (3, 'psql killed');\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "psql's INSERT on the server", func() bool {
		n, err := countBackends(ctx, super, "usename = 'dier' AND state LIKE 'idle in transaction%' AND query LIKE 'INSERT INTO%'")
		return err == nil && n == 1
	})
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	check("psql killed")

	eventually(t, 2*time.Second, "lockpool_client_connections{app=dier} back to 0", func() bool {
		return l.metric("lockpool_client_connections", map[string]string{"app": "dier"}) == 0
	})
}

// appendQueryMsg appends a simple Query message.
func appendQueryMsg(dst []byte, sql string) []byte {
	n := len(sql) + 5
	dst = append(dst, 'Q', byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	dst = append(dst, sql...)
	return append(dst, 0)
}

// TestServerLossReachesIdleTransaction: a client idle inside a transaction
// block learns at once that its server connection died (terminated here;
// in a failover the old primary stops), as on a direct connection: the
// FATAL arrives while it waits on its socket, not only with its next
// statement. Its transaction-level advisory lock went with the backend, so
// another client may take it now, and the client must not go on believing
// it holds it. Also in a failed transaction block.
func TestServerLossReachesIdleTransaction(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", defaultApp())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	su := superConn(t, "appdb")
	for i, failed := range []bool{false, true} {
		key := int64(9500001 + i)
		c := l.connect(t, "app", "appdb")
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		var pid int32
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1), pg_backend_pid()", key).Scan(&ok, &pid); err != nil || !ok {
			t.Fatalf("xact lock: %v %v", ok, err)
		}
		if failed {
			if _, err := tx.Exec(ctx, "SELECT 1/0"); sqlState(err) != "22012" {
				t.Fatalf("division by zero: %v", err)
			}
		}
		at := time.Now()
		if _, err := su.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		err = c.PgConn().WaitForNotification(wctx)
		wcancel()
		took := time.Since(at)
		if pe := testenv.PgError(err); pe == nil || pe.Severity != "FATAL" {
			t.Fatalf("failed transaction %v: waiting on its socket, the client got %v after %v; want the FATAL of its lost server connection at once", failed, err, took.Round(time.Millisecond))
		}
		if !c.IsClosed() {
			t.Errorf("failed transaction %v: the client's connection is open after the FATAL", failed)
		}
		other := l.connect(t, "app", "appdb")
		if err := other.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&ok); err != nil || !ok {
			t.Errorf("failed transaction %v: another client's xact lock of the key: %v %v", failed, ok, err)
		}
		_ = other.Close(ctx)
	}
}
