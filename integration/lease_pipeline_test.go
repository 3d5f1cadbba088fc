package integration

// Pipelined lease calls. lockpool answers lease_acquire, lease_renew,
// lease_release and lease_list itself, and its replies share one ordered
// queue with the server's, so every result must reach the query that asked
// for it in every pipeline shape: pgx batches in each exec mode (statements
// cached and not), inside a transaction, after an error that makes
// PostgreSQL skip the rest of the batch, node-postgres queries issued at
// once (pipeline mode and queued), and simple queries written back to back.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// pipelineModes are pgx's exec modes that send a batch as one extended-
// protocol pipeline (CacheStatement is pgx's default).
var pipelineModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
}

// pipeLeaseName is a lease name unique to this test and run.
func pipeLeaseName(t *testing.T, base string, run int) string {
	return fmt.Sprintf("%s-%s-r%d", uniqueName(t, "pipe"), base, run)
}

// batchCursor reads a pgx batch's results in order, labelling each by its
// position and what it is.
type batchCursor struct {
	t   *testing.T
	br  pgx.BatchResults
	pos int
}

func (c *batchCursor) label(what string) string {
	c.pos++
	return fmt.Sprintf("batch result %d (%s)", c.pos-1, what)
}

func (c *batchCursor) int(want int32) {
	c.t.Helper()
	what := c.label(fmt.Sprintf("SELECT $1::int + 0 = %d", want))
	var got int32
	if err := c.br.QueryRow().Scan(&got); err != nil || got != want {
		c.t.Fatalf("%s: got %d, %v", what, got, err)
	}
}

func (c *batchCursor) text(want string) {
	c.t.Helper()
	what := c.label(fmt.Sprintf("text %q", want))
	var got string
	if err := c.br.QueryRow().Scan(&got); err != nil || got != want {
		c.t.Fatalf("%s: got %q, %v", what, got, err)
	}
}

// token reads a lease_acquire result: a non-NULL token larger than after.
func (c *batchCursor) token(name string, after int64) int64 {
	c.t.Helper()
	what := c.label("lease_acquire " + name)
	var got *int64
	if err := c.br.QueryRow().Scan(&got); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	if got == nil {
		c.t.Fatalf("%s: NULL, want a token", what)
	}
	if *got <= after {
		c.t.Fatalf("%s: token %d, want > %d", what, *got, after)
	}
	return *got
}

func (c *batchCursor) boolean(fn string, want bool) {
	c.t.Helper()
	what := c.label(fn)
	var got bool
	if err := c.br.QueryRow().Scan(&got); err != nil || got != want {
		c.t.Fatalf("%s: got %v, %v; want %v", what, got, err, want)
	}
}

// list reads a lease_list result and checks that held (name -> token) are
// listed as this session's and gone are not listed.
func (c *batchCursor) list(held map[string]int64, gone ...string) {
	c.t.Helper()
	what := c.label("lease_list")
	rows, err := c.br.Query()
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	var got []leaseListRow
	for rows.Next() {
		var r leaseListRow
		if err := rows.Scan(&r.Name, &r.Holder, &r.Token, &r.TakenAt, &r.ExpiresAt, &r.Mine); err != nil {
			rows.Close()
			c.t.Fatalf("%s: scan: %v", what, err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	checkLeaseRows(c.t, what, got, held, true, gone...)
}

// fails reads a result that must be an error with SQLSTATE code ("" for
// any error: a statement PostgreSQL skipped after an earlier error).
func (c *batchCursor) fails(what, code string) {
	c.t.Helper()
	what = c.label(what)
	_, err := c.br.Exec()
	if err == nil {
		c.t.Fatalf("%s: succeeded, want an error", what)
	}
	if code != "" && sqlState(err) != code {
		c.t.Fatalf("%s: %v, want SQLSTATE %s", what, err, code)
	}
}

// checkLeaseRows checks lease_list rows: each of held is listed with its
// token and mine, and none of gone is listed.
func checkLeaseRows(t *testing.T, what string, rows []leaseListRow, held map[string]int64, mine bool, gone ...string) {
	t.Helper()
	for name, tok := range held {
		r, ok := findLease(rows, name)
		if !ok {
			t.Fatalf("%s: %s not listed in %+v", what, name, rows)
		}
		if r.Token != tok || r.Mine != mine || !r.ExpiresAt.After(r.TakenAt) {
			t.Fatalf("%s: row %+v, want token %d mine %v", what, r, tok, mine)
		}
	}
	for _, name := range gone {
		if r, ok := findLease(rows, name); ok {
			t.Fatalf("%s: %s listed (%+v), want it gone", what, name, r)
		}
	}
}

// TestLeasePipelinePgxBatch runs one batch mixing lease calls with ordinary
// statements in every position, twice on one connection (the first run
// prepares or describes, the second uses pgx's caches), in each exec mode.
func TestLeasePipelinePgxBatch(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: pipe-batch")
	for _, mode := range pipelineModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			conn := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = mode })
			var last int64
			for run := 1; run <= 2; run++ {
				a, b, c := pipeLeaseName(t, "a", run), pipeLeaseName(t, "b", run), pipeLeaseName(t, "c", run)
				batch := &pgx.Batch{}
				batch.Queue("SELECT lease_acquire($1, $2)", a, 30)        // first
				batch.Queue("SELECT $1::int + 0", 40+run)                 // int4
				batch.Queue("SELECT lease_acquire($1, $2, $3)", b, 30, 0) // between int4 and text
				batch.Queue("SELECT $1::text || 'x'", fmt.Sprintf("run%d", run))
				batch.Queue("SELECT lease_renew($1)", a) // three lease calls in a row
				batch.Queue("SELECT lease_renew($1)", b)
				batch.Queue("SELECT * FROM lease_list()")
				batch.Queue("SELECT $1::int + 0", 100+run)
				batch.Queue("SELECT lease_release($1)", a) // between int4 and text
				batch.Queue("SELECT $1::text || 'x'", "mid")
				batch.Queue("SELECT lease_release($1)", a) // already released
				batch.Queue("SELECT lease_renew($1)", a)
				batch.Queue("SELECT * FROM lease_list()")
				batch.Queue("SELECT lease_acquire($1, $2)", c, 30) // last

				br := conn.SendBatch(ctx, batch)
				cur := &batchCursor{t: t, br: br}
				ta := cur.token(a, last)
				cur.int(int32(40 + run))
				tb := cur.token(b, ta)
				cur.text(fmt.Sprintf("run%dx", run))
				cur.boolean("lease_renew "+a, true)
				cur.boolean("lease_renew "+b, true)
				cur.list(map[string]int64{a: ta, b: tb})
				cur.int(int32(100 + run))
				cur.boolean("lease_release "+a, true)
				cur.text("midx")
				cur.boolean("lease_release "+a+" again", false)
				cur.boolean("lease_renew "+a+" released", false)
				cur.list(map[string]int64{b: tb}, a)
				last = cur.token(c, tb)
				if err := br.Close(); err != nil {
					t.Fatalf("run %d: batch close: %v", run, err)
				}
				if st := conn.PgConn().TxStatus(); st != 'I' {
					t.Fatalf("run %d: transaction status %c after the batch, want I", run, st)
				}
			}
			// The connection still answers in order after the batches.
			var n int32
			if err := conn.QueryRow(ctx, "SELECT $1::int + 0", 5).Scan(&n); err != nil || n != 5 {
				t.Fatalf("after the batches: %d, %v", n, err)
			}
		})
	}
}

// TestLeasePipelinePgxBatchSimpleProtocol: pgx's simple-protocol batch is
// one multi-statement query string, and a lease call must be the whole
// statement (README, Leases), so the whole string is refused with 0A000 and
// none of it runs.
func TestLeasePipelinePgxBatchSimpleProtocol(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: pipe-simple-batch")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	})
	a := pipeLeaseName(t, "a", 1)
	batch := &pgx.Batch{}
	batch.Queue("SELECT $1::int + 0", 41)
	batch.Queue("SELECT lease_acquire($1, $2)", a, 30)
	batch.Queue("SELECT $1::text || 'x'", "abc")
	br := conn.SendBatch(ctx, batch)
	cur := &batchCursor{t: t, br: br}
	cur.fails("multi-statement string with a lease call", "0A000")
	_ = br.Close()
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("transaction status %c after the refused batch, want I", st)
	}
	if _, ok := findLease(listLeases(t, conn), a); ok {
		t.Fatalf("%s held after a refused batch", a)
	}
	var s string
	if err := conn.QueryRow(ctx, "SELECT $1::text || 'x'", "after").Scan(&s); err != nil || s != "afterx" {
		t.Fatalf("after the refused batch: %q, %v", s, err)
	}
}

// TestLeasePipelinePgxBatchTx runs lease calls inside BEGIN ... COMMIT (or
// ROLLBACK: lease calls are not transactional) in one batch, twice per
// connection, in each exec mode.
func TestLeasePipelinePgxBatchTx(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: pipe-tx")
	other := l.connect(t, "app", "appdb")
	for _, mode := range pipelineModes {
		for _, end := range []string{"COMMIT", "ROLLBACK"} {
			t.Run(mode.String()+"/"+end, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				conn := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = mode })
				var last int64
				for run := 1; run <= 2; run++ {
					a, b := pipeLeaseName(t, "a", run), pipeLeaseName(t, "b", run)
					batch := &pgx.Batch{}
					batch.Queue("BEGIN")
					batch.Queue("SELECT lease_acquire($1, $2)", a, 30) // first in the transaction
					batch.Queue("SELECT $1::int + 0", 40+run)
					batch.Queue("SELECT lease_acquire($1, $2)", b, 30)
					batch.Queue("SELECT $1::text || 'x'", "tx")
					batch.Queue("SELECT * FROM lease_list()")
					batch.Queue("SELECT $1::int + 0", 7)
					batch.Queue("SELECT lease_renew($1)", a) // last in the transaction
					batch.Queue(end)

					br := conn.SendBatch(ctx, batch)
					cur := &batchCursor{t: t, br: br}
					if _, err := br.Exec(); err != nil {
						t.Fatalf("run %d: BEGIN: %v", run, err)
					}
					cur.pos++
					ta := cur.token(a, last)
					cur.int(int32(40 + run))
					tb := cur.token(b, ta)
					last = tb
					cur.text("txx")
					cur.list(map[string]int64{a: ta, b: tb})
					cur.int(7)
					cur.boolean("lease_renew "+a, true)
					if ct, err := br.Exec(); err != nil || ct.String() != end {
						t.Fatalf("run %d: %s: %q, %v", run, end, ct.String(), err)
					}
					if err := br.Close(); err != nil {
						t.Fatalf("run %d: batch close: %v", run, err)
					}
					if st := conn.PgConn().TxStatus(); st != 'I' {
						t.Fatalf("run %d: transaction status %c after %s, want I", run, st, end)
					}
					// Held after the transaction ended either way, seen from
					// another session.
					checkLeaseRows(t, "lease_list from another session", listLeases(t, other),
						map[string]int64{a: ta, b: tb}, false)
				}
			})
		}
	}
}

// TestLeasePipelinePgxBatchError: an ordinary statement fails before a
// lease_acquire in one batch (one Sync). PostgreSQL skips the rest of the
// batch, so the lease_acquire must not run: the lease is not held
// afterwards and another session takes it. A lease call before the error
// did run (lease calls are not transactional).
func TestLeasePipelinePgxBatchError(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: pipe-err")
	other := l.connect(t, "app", "appdb")
	for _, mode := range pipelineModes {
		for _, inTx := range []bool{false, true} {
			name := mode.String() + "/autocommit"
			if inTx {
				name = mode.String() + "/transaction"
			}
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				conn := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = mode })
				var last int64
				for run := 1; run <= 2; run++ {
					pre, post := pipeLeaseName(t, "pre", run), pipeLeaseName(t, "post", run)
					batch := &pgx.Batch{}
					if inTx {
						batch.Queue("BEGIN")
					}
					batch.Queue("SELECT lease_acquire($1, $2)", pre, 30)
					batch.Queue("SELECT $1::int + 0", 40+run)
					batch.Queue("SELECT 1 / $1::int", 0)
					batch.Queue("SELECT lease_acquire($1, $2)", post, 30)
					batch.Queue("SELECT $1::text || 'x'", "skipped")
					if inTx {
						batch.Queue("COMMIT")
					}

					br := conn.SendBatch(ctx, batch)
					cur := &batchCursor{t: t, br: br}
					if inTx {
						if _, err := br.Exec(); err != nil {
							t.Fatalf("run %d: BEGIN: %v", run, err)
						}
						cur.pos++
					}
					tpre := cur.token(pre, last)
					last = tpre
					cur.int(int32(40 + run))
					cur.fails("SELECT 1 / 0", "22012")
					cur.fails("lease_acquire "+post+" after the error", "")
					cur.fails("text after the error", "")
					if inTx {
						cur.fails("COMMIT after the error", "")
					}
					_ = br.Close()
					if st := conn.PgConn().TxStatus(); inTx && st == 'E' {
						if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
							t.Fatalf("run %d: ROLLBACK: %v", run, err)
						}
					}
					if st := conn.PgConn().TxStatus(); st != 'I' {
						t.Fatalf("run %d: transaction status %c, want I", run, st)
					}
					// This session holds pre and not post.
					checkLeaseRows(t, "lease_list from this session", listLeases(t, conn),
						map[string]int64{pre: tpre}, true, post)
					// Another session: pre is held, post is free.
					checkLeaseRows(t, "lease_list from another session", listLeases(t, other),
						map[string]int64{pre: tpre}, false, post)
					if tok, ok, err := acquireLease(ctx, other, pre, 30, 0); err != nil || ok {
						t.Fatalf("run %d: another session took %s: %d, %v, %v; want NULL", run, pre, tok, ok, err)
					}
					tpost := mustAcquire(t, other, post, 30, 0)
					if tpost <= tpre {
						t.Fatalf("run %d: another session's token for %s is %d, want > %d", run, post, tpost, tpre)
					}
					last = tpost
					if !leaseBool(t, other, "lease_release", post) {
						t.Fatalf("run %d: another session could not release %s", run, post)
					}
				}
			})
		}
	}
}

// nodePipelineResult is one query's outcome as pipeline.js prints it.
type nodePipelineResult struct {
	Label   string `json:"label"`
	OK      bool   `json:"ok"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Fields  []struct {
		Name       string `json:"name"`
		DataTypeID uint32 `json:"dataTypeID"`
	} `json:"fields"`
	Rows []map[string]any `json:"rows"`
}

// one returns the single value of a one-row, one-column result of type oid.
func (r nodePipelineResult) one(t *testing.T, oid uint32) any {
	t.Helper()
	if !r.OK {
		t.Fatalf("%s: error %s %s", r.Label, r.Code, r.Message)
	}
	if len(r.Fields) != 1 || r.Fields[0].DataTypeID != oid || len(r.Rows) != 1 {
		t.Fatalf("%s: fields %+v rows %v, want one row of one column of type %d", r.Label, r.Fields, r.Rows, oid)
	}
	return r.Rows[0][r.Fields[0].Name]
}

// token is a lease_acquire result (int8, a decimal string in node-postgres)
// larger than after.
func (r nodePipelineResult) token(t *testing.T, after int64) int64 {
	t.Helper()
	v, ok := r.one(t, 20).(string)
	tok, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil || tok <= after {
		t.Fatalf("%s: token %v, want a decimal > %d", r.Label, r.Rows[0], after)
	}
	return tok
}

// leases are the lease_list rows as name -> (token, mine).
func (r nodePipelineResult) leases(t *testing.T) map[string][2]any {
	t.Helper()
	if !r.OK {
		t.Fatalf("%s: error %s %s", r.Label, r.Code, r.Message)
	}
	var cols []string
	for _, f := range r.Fields {
		cols = append(cols, fmt.Sprintf("%s:%d", f.Name, f.DataTypeID))
	}
	if got := strings.Join(cols, ","); got != "name:25,holder:25,token:20,taken_at:1184,expires_at:1184,mine:16" {
		t.Fatalf("%s: columns %s", r.Label, got)
	}
	out := map[string][2]any{}
	for _, row := range r.Rows {
		out[fmt.Sprint(row["name"])] = [2]any{row["token"], row["mine"]}
	}
	return out
}

// TestLeasePipelineNode issues node-postgres queries at once (lease calls
// and ordinary queries, named, unnamed, simple) and checks each promise
// resolved with its own value, in pipeline mode and queued.
func TestLeasePipelineNode(t *testing.T) {
	t.Parallel()
	nodeDir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	node, nodeErr := exec.LookPath("node")
	_, modErr := os.Stat(filepath.Join(nodeDir, "node_modules", "pg", "package.json"))
	if nodeErr != nil || modErr != nil {
		skipOrFail(t, "node or integration/node/node_modules/pg is missing (run: npm ci --prefix integration/node)")
	}
	l := startLockpool(t, 10, "instance_id: pipe-node")
	for _, pipeline := range []bool{true, false} {
		name := "queued"
		if pipeline {
			name = "pipeline"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			prefix := pipeLeaseName(t, "node", 1)
			cmd := exec.CommandContext(ctx, node, "pipeline.js")
			cmd.Dir = nodeDir
			cmd.Env = append(os.Environ(), "DATABASE_URL="+l.url("app", "appdb"), "LEASE_PREFIX="+prefix,
				"PIPELINE="+map[bool]string{true: "1", false: "0"}[pipeline])
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			t.Logf("node pipeline.js: %s%s", out, stderr.String())
			if err != nil {
				t.Fatalf("node pipeline.js: %v", err)
			}
			var doc struct {
				Pipeline bool                 `json:"pipeline"`
				Results  []nodePipelineResult `json:"results"`
			}
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("pipeline.js output: %v", err)
			}
			if doc.Pipeline != pipeline {
				t.Fatalf("pipeline.js ran with pipeline=%v", doc.Pipeline)
			}
			res := map[string]nodePipelineResult{}
			var labels []string
			for _, r := range doc.Results {
				res[r.Label] = r
				labels = append(labels, r.Label)
			}
			if len(labels) != 16 {
				t.Fatalf("%d results (%v), want 16", len(labels), labels)
			}
			n := func(i int) string { return fmt.Sprintf("%s-n%d", prefix, i) }

			t1 := res["acquire-n1-named"].token(t, 0)
			if v := res["int-41"].one(t, 23); v != float64(41) {
				t.Fatalf("int-41: %v", v)
			}
			t2 := res["acquire-n2-unnamed"].token(t, t1)
			if v := res["text-abcx-named"].one(t, 25); v != "abcx" {
				t.Fatalf("text-abcx-named: %v", v)
			}
			t3 := res["acquire-n3-named-again"].token(t, t2)
			if v := res["renew-n1"].one(t, 16); v != true {
				t.Fatalf("renew-n1: %v", v)
			}
			if v := res["release-n2"].one(t, 16); v != true {
				t.Fatalf("release-n2: %v", v)
			}
			list := res["list-simple"].leases(t)
			for i, tok := range map[int]int64{1: t1, 3: t3} {
				if got := list[n(i)]; got != [2]any{strconv.FormatInt(tok, 10), true} {
					t.Fatalf("list-simple: %s = %v, want token %d mine", n(i), got, tok)
				}
			}
			if got, ok := list[n(2)]; ok {
				t.Fatalf("list-simple: released %s listed: %v", n(2), got)
			}
			if v := res["int-7-named"].one(t, 23); v != float64(7) {
				t.Fatalf("int-7-named: %v", v)
			}
			t4 := res["acquire-n4-simple"].token(t, t3)
			if v := res["text-plain-simple"].one(t, 25); v != "plain" {
				t.Fatalf("text-plain-simple: %v", v)
			}
			if r := res["div-zero"]; r.OK || r.Code != "22012" {
				t.Fatalf("div-zero: %+v, want error 22012", r)
			}
			// Each node-postgres query has its own Sync: the error does not
			// skip the next one.
			t5 := res["acquire-n5-named-after-error"].token(t, t4)
			if v := res["renew-n2-released"].one(t, 16); v != false {
				t.Fatalf("renew-n2-released: %v", v)
			}
			list = res["list-extended"].leases(t)
			for i, tok := range map[int]int64{1: t1, 3: t3, 4: t4, 5: t5} {
				if got := list[n(i)]; got != [2]any{strconv.FormatInt(tok, 10), true} {
					t.Fatalf("list-extended: %s = %v, want token %d mine", n(i), got, tok)
				}
			}
			if v := res["text-endx-named"].one(t, 25); v != "endx" {
				t.Fatalf("text-endx-named: %v", v)
			}
		})
	}
}

// simpleReply is what a simple Query got back: its rows (text), command
// tags, error SQLSTATE and the ReadyForQuery status.
type simpleReply struct {
	rows   [][]string
	tags   []string
	code   string
	status byte
}

// readSimpleReply reads one simple query's replies up to its ReadyForQuery.
func readSimpleReply(fe *pgproto3.Frontend) (simpleReply, error) {
	var r simpleReply
	for {
		msg, err := fe.Receive()
		if err != nil {
			return r, err
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			row := make([]string, len(m.Values))
			for i, v := range m.Values {
				row[i] = string(v)
			}
			r.rows = append(r.rows, row)
		case *pgproto3.CommandComplete:
			r.tags = append(r.tags, string(m.CommandTag))
		case *pgproto3.ErrorResponse:
			r.code = m.Code
		case *pgproto3.ReadyForQuery:
			r.status = m.TxStatus
			return r, nil
		}
	}
}

// TestLeasePipelineSimple sends simple queries one after another without
// waiting (lease calls, ordinary queries, errors, a failed transaction) and
// reads the replies in order; and runs psql with one -c per query.
func TestLeasePipelineSimple(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: pipe-simple")
	other := l.connect(t, "app", "appdb")

	t.Run("written-at-once", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		pc, err := pgconn.Connect(ctx, l.dsn("app", "appdb"))
		if err != nil {
			t.Fatal(err)
		}
		hc, err := pc.Hijack()
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Conn.Close()
		if err := hc.Conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		x, y, z, w := pipeLeaseName(t, "x", 1), pipeLeaseName(t, "y", 1), pipeLeaseName(t, "z", 1), pipeLeaseName(t, "w", 1)
		lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
		queries := []string{
			"SELECT 1; ",
			"SELECT lease_acquire(" + lit(x) + ", 30)",
			"SELECT 'two'::text",
			"SELECT lease_acquire(" + lit(y) + ", 30, 0);",
			"SELECT lease_renew(" + lit(x) + ")",
			"SELECT 3 AS three",
			"SELECT * FROM lease_list()",
			"SELECT lease_release(" + lit(x) + ")",
			"SELECT 1/0",
			"SELECT lease_acquire(" + lit(z) + ", 30)", // its own query: runs after the error
			"BEGIN",
			"SELECT 1/0",
			"SELECT lease_acquire(" + lit(w) + ", 30)", // in a failed transaction: 25P02, not run
			"ROLLBACK",
			"SELECT lease_renew(" + lit(y) + ")",
		}
		for _, q := range queries {
			hc.Frontend.Send(&pgproto3.Query{String: q})
		}
		if err := hc.Frontend.Flush(); err != nil {
			t.Fatal(err)
		}
		replies := make([]simpleReply, len(queries))
		for i := range queries {
			if replies[i], err = readSimpleReply(hc.Frontend); err != nil {
				t.Fatalf("reply %d (%s): %v", i, queries[i], err)
			}
		}
		hc.Frontend.Send(&pgproto3.Terminate{})
		_ = hc.Frontend.Flush()

		value := func(i int, status byte) string {
			t.Helper()
			r := replies[i]
			if r.code != "" || len(r.rows) != 1 || len(r.rows[0]) != 1 || len(r.tags) != 1 || r.tags[0] != "SELECT 1" || r.status != status {
				t.Fatalf("reply %d (%s): %+v, want one value, status %c", i, queries[i], r, status)
			}
			return r.rows[0][0]
		}
		tokenAt := func(i int, after int64) int64 {
			t.Helper()
			tok, err := strconv.ParseInt(value(i, 'I'), 10, 64)
			if err != nil || tok <= after {
				t.Fatalf("reply %d (%s): %+v, want a token > %d", i, queries[i], replies[i], after)
			}
			return tok
		}
		failed := func(i int, code string, status byte) {
			t.Helper()
			if r := replies[i]; r.code != code || len(r.rows) != 0 || r.status != status {
				t.Fatalf("reply %d (%s): %+v, want error %s, status %c", i, queries[i], r, code, status)
			}
		}
		if v := value(0, 'I'); v != "1" {
			t.Fatalf("SELECT 1: %q", v)
		}
		tx := tokenAt(1, 0)
		if v := value(2, 'I'); v != "two" {
			t.Fatalf("SELECT 'two': %q", v)
		}
		ty := tokenAt(3, tx)
		if v := value(4, 'I'); v != "t" {
			t.Fatalf("lease_renew x: %q", v)
		}
		if v := value(5, 'I'); v != "3" {
			t.Fatalf("SELECT 3: %q", v)
		}
		list := replies[6]
		if list.code != "" || list.status != 'I' || len(list.tags) != 1 {
			t.Fatalf("lease_list: %+v", list)
		}
		mine := map[string]string{}
		for _, row := range list.rows {
			if len(row) != 6 {
				t.Fatalf("lease_list row %v", row)
			}
			if row[5] == "t" {
				mine[row[0]] = row[2]
			}
		}
		if mine[x] != strconv.FormatInt(tx, 10) || mine[y] != strconv.FormatInt(ty, 10) {
			t.Fatalf("lease_list: mine %v, want %s=%d %s=%d", mine, x, tx, y, ty)
		}
		if v := value(7, 'I'); v != "t" {
			t.Fatalf("lease_release x: %q", v)
		}
		failed(8, "22012", 'I')
		tz := tokenAt(9, ty)
		if r := replies[10]; r.code != "" || r.status != 'T' {
			t.Fatalf("BEGIN: %+v", r)
		}
		failed(11, "22012", 'E')
		failed(12, "25P02", 'E')
		if r := replies[13]; r.code != "" || r.status != 'I' || len(r.tags) != 1 || r.tags[0] != "ROLLBACK" {
			t.Fatalf("ROLLBACK: %+v", r)
		}
		if v := value(14, 'I'); v != "t" {
			t.Fatalf("lease_renew y: %q", v)
		}
		// The session has ended: its leases are released. w was never taken.
		eventually(t, 10*time.Second, "the ended session's leases released", func() bool {
			rows := listLeases(t, other)
			_, hx := findLease(rows, x)
			_, hy := findLease(rows, y)
			_, hz := findLease(rows, z)
			return !hx && !hy && !hz
		})
		if tok := mustAcquire(t, other, w, 30, 0); tok <= tz {
			t.Fatalf("another session's token for %s: %d, want > %d", w, tok, tz)
		}
	})

	t.Run("psql", func(t *testing.T) {
		if _, err := exec.LookPath("psql"); err != nil {
			skipOrFail(t, "psql is not installed")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		x := pipeLeaseName(t, "x", 1)
		cmd := l.psqlCmd(ctx, "app", "appdb", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
			"-c", "SELECT 1; ",
			"-c", "SELECT lease_acquire('"+x+"', 30)",
			"-c", "SELECT 'two'::text",
			"-c", "SELECT lease_acquire('"+x+"', 30)",
			"-c", "SELECT lease_renew('"+x+"')",
			"-c", "SELECT 3",
			"-c", "SELECT lease_release('"+x+"')",
			"-c", "SELECT lease_renew('"+x+"')")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		t.Logf("psql stdout:\n%s\npsql stderr:\n%s", out, stderr.String())
		if err != nil {
			t.Fatalf("psql: %v", err)
		}
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		if len(lines) != 8 {
			t.Fatalf("psql printed %d lines, want 8: %q", len(lines), lines)
		}
		tok, err := strconv.ParseInt(lines[1], 10, 64)
		if err != nil || tok <= 0 {
			t.Fatalf("lease_acquire: %q", lines[1])
		}
		want := []string{"1", lines[1], "two", lines[1], "t", "3", "t", "f"}
		for i := range want {
			if lines[i] != want[i] {
				t.Fatalf("psql line %d: %q, want %q (all: %q)", i, lines[i], want[i], lines)
			}
		}
	})
}
