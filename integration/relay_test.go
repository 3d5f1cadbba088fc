package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/lockpool/lockpool/internal/testenv"
)

// Server messages larger than lockpool's read buffer reach the client whole
// and in order, in both protocols: a wide RowDescription, a long error and
// a large DataRow.
func TestLargeServerMessages(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "")
	ctx := testenv.Context(t, time.Minute)
	var cols []string
	for i := 0; i < 300; i++ {
		cols = append(cols, fmt.Sprintf("%d AS %s_%03d", i, strings.Repeat("c", 60), i))
	}
	wide := "SELECT " + strings.Join(cols, ", ")
	long := strings.Repeat("x", 20000)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			c := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = mode })
			for round := 0; round < 2; round++ {
				rows, err := c.Query(ctx, wide)
				if err != nil {
					t.Fatal(err)
				}
				if n := len(rows.FieldDescriptions()); n != 300 {
					t.Fatalf("%d columns, want 300", n)
				}
				vals, err := pgx.CollectOneRow(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(vals[299]) != "299" {
					t.Fatalf("last column = %v, want 299", vals[299])
				}
				_, err = c.Exec(ctx, "DO $$BEGIN RAISE EXCEPTION '%', repeat('x', 20000); END$$")
				if pe := pgErr(t, err, "P0001"); pe.Message != long {
					t.Fatalf("error message of %d bytes, want 20000", len(pe.Message))
				}
				var big string
				if err := c.QueryRow(ctx, "SELECT repeat('y', 1000000)").Scan(&big); err != nil || len(big) != 1000000 {
					t.Fatalf("large row: %d bytes, %v", len(big), err)
				}
				var one int
				if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
					t.Fatalf("after: %d, %v", one, err)
				}
			}
		})
	}
}

// A client that sends its COPY data right behind the COPY statement,
// without waiting for CopyInResponse, loses nothing.
func TestCopyDataBehindStatement(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "")
	ctx := testenv.Context(t, time.Minute)
	table := uniqueName(t, "cp")
	su := superConn(t, "appdb")
	if _, err := su.Exec(ctx, fmt.Sprintf("CREATE TABLE %[1]s (v int); GRANT ALL ON %[1]s TO PUBLIC", table)); err != nil {
		t.Fatal(err)
	}
	fe, nc := rawClient(t, ctx, l.dsn("app", "appdb"))
	got := wireTrace(t, fe, nc, []wireRound{{send: []pgproto3.FrontendMessage{
		&pgproto3.Query{String: "COPY " + table + " FROM STDIN"},
		&pgproto3.CopyData{Data: []byte("1\n2\n3\n")},
		&pgproto3.CopyDone{},
	}, read: 3}})
	if len(got) != 1 || got[0] != "*pgproto3.CopyInResponse C:COPY 3 Z:I" {
		t.Fatalf("COPY with its data in one write: %q", got)
	}
	var n int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 3 {
		t.Fatalf("rows copied: %d, %v", n, err)
	}
}

// TestHugePipelinedBatch: a batch of 50,000 extended-protocol queries and
// one Sync, written by the client while it reads the replies, is answered
// whole and in order: lockpool relays the server's replies while its own
// writes to the server wait, and never waits for the rest of a reply the
// server keeps in its buffer until it gets more input.
func TestHugePipelinedBatch(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "")
	ctx := testenv.Context(t, time.Minute)
	pc, err := pgconn.Connect(ctx, l.dsn("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(context.Background())
	const n = 50000
	b := &pgconn.Batch{}
	for i := 0; i < n; i++ {
		b.ExecParams("SELECT $1::text", [][]byte{[]byte(strconv.Itoa(i))}, nil, nil, nil)
	}
	res, err := pc.ExecBatch(ctx, b).ReadAll()
	if err != nil {
		t.Fatalf("after %d results: %v", len(res), err)
	}
	if len(res) != n {
		t.Fatalf("%d results, want %d", len(res), n)
	}
	for i, r := range res {
		if len(r.Rows) != 1 || string(r.Rows[0][0]) != strconv.Itoa(i) {
			t.Fatalf("result %d: %q", i, r.Rows)
		}
	}
}
