package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
