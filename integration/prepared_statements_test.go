package integration

// Prepared statements through lockpool behave as on PostgreSQL. Every test
// here runs one scenario directly against PostgreSQL (role app on appdb)
// and through lockpool (application budget 3), and requires both to give
// the same observable results: values, SQLSTATEs, and the message an error
// arrives at. A scenario whose direct run does not give the expected
// results is a mistake in the test, not in lockpool; the failure message
// says which side differed.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/lib/pq"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// prepBudget is the application budget of the lockpool targets: several
// server connections, so a client's statements live on more than one.
const prepBudget = 3

// prepDSNs is where one run of a scenario connects: clients to client, and
// the DDL that changes tables behind the clients' statements to ddl.
type prepDSNs struct {
	client, ddl string
}

// prepTarget is one place a scenario runs: directly on PostgreSQL or
// through a lockpool that open starts for the (sub)test.
type prepTarget struct {
	name     string
	lockpool bool
	open     func(t *testing.T) prepDSNs
}

// startPrepLockpool starts a lockpool whose application api (role app,
// appdb) has budget prepBudget.
func startPrepLockpool(t *testing.T) *lp {
	t.Helper()
	app := defaultApp()
	app.max, app.wait = prepBudget, "30s"
	return startLockpool(t, 10, "", app)
}

// prepTargets are PostgreSQL directly and lockpool.
func prepTargets() []prepTarget {
	return []prepTarget{
		{name: "direct", open: func(t *testing.T) prepDSNs {
			d := directDSN(t, "app", "appdb")
			return prepDSNs{client: d, ddl: d}
		}},
		{name: "lockpool", lockpool: true, open: func(t *testing.T) prepDSNs {
			l := startPrepLockpool(t)
			return prepDSNs{client: l.dsn("app", "appdb"), ddl: l.dsn("app", "appdb")}
		}},
	}
}

// prepDDLTargets are PostgreSQL directly, lockpool with the DDL sent
// through it, and lockpool with the DDL sent to PostgreSQL directly (so
// lockpool does not see it).
func prepDDLTargets() []prepTarget {
	return []prepTarget{
		prepTargets()[0],
		{name: "lockpool_ddl_through", lockpool: true, open: func(t *testing.T) prepDSNs {
			l := startPrepLockpool(t)
			return prepDSNs{client: l.dsn("app", "appdb"), ddl: l.dsn("app", "appdb")}
		}},
		{name: "lockpool_ddl_direct", lockpool: true, open: func(t *testing.T) prepDSNs {
			l := startPrepLockpool(t)
			return prepDSNs{client: l.dsn("app", "appdb"), ddl: directDSN(t, "app", "appdb")}
		}},
	}
}

// prepOpen opens tg for a (sub)test with the per-test objects, under a
// minute's deadline.
func prepOpen(t *testing.T, tg prepTarget) (context.Context, prepObjects, prepDSNs) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	o := setupPrepObjects(t, ctx)
	return ctx, o, tg.open(t)
}

// prepTypeTableSQL creates the table (%s) whose column c the result-type
// tests change with prepTypeChangeSQL: int 7, then bigint 5000000000.
const (
	prepTypeTableSQL  = "CREATE TABLE %s (id int PRIMARY KEY, c int); INSERT INTO %[1]s VALUES (1, 7)"
	prepTypeChangeSQL = "ALTER TABLE %s ALTER COLUMN c TYPE bigint; UPDATE %[1]s SET c = 5000000000 WHERE id = 1"
)

// prepName is an SQL identifier unique to the running (sub)test: uniqueName
// cut short enough to end in a hash of the whole test name, so long subtest
// names never collide after truncation.
func prepName(t testing.TB, prefix string) string {
	n := uniqueName(t, prefix)
	if len(n) > 54 {
		n = n[:54]
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(t.Name()))
	return fmt.Sprintf("%s_%08x", n, h.Sum32())
}

// prepObjects are the per-test names scripts use: {t} a table of app's,
// {s} a schema app may not use, {p} a table app may not read.
type prepObjects struct {
	table, schema, private string
}

// setupPrepObjects creates {s} (with table {s}.t) and {p} as the
// superuser, owned by postgres with no grants, and drops all three
// objects when t ends.
func setupPrepObjects(t *testing.T, ctx context.Context) prepObjects {
	t.Helper()
	o := prepObjects{table: prepName(t, "pt"), schema: prepName(t, "ps"), private: prepName(t, "pp")}
	c := pgtest.Require(t)
	if err := c.Exec(ctx, "appdb", fmt.Sprintf(
		"CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.t (v int); CREATE TABLE public.%[2]s (v int); INSERT INTO public.%[2]s VALUES (1)",
		o.schema, o.private)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Exec(ctx, "appdb", fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; DROP TABLE IF EXISTS public.%s, public.%s",
			o.schema, o.private, o.table))
	})
	return o
}

// expand replaces {t}, {s} and {p} in sql.
func (o prepObjects) expand(sql string) string {
	return strings.NewReplacer("{t}", o.table, "{s}", o.schema, "{p}", o.private).Replace(sql)
}

// prepStep is one step of a prepared-statement script. Ops:
//
//	prepare     protocol Parse+Describe+Sync of name (pgconn.Prepare; lib/pq: db.Prepare, name is a label)
//	pgxprepare  pgx's Conn.Prepare (lib/pq: as prepare)
//	run         Bind+Execute+Sync of name with args (lib/pq: Stmt.QueryRow)
//	close       protocol Close of statement name + Sync (pgx only)
//	query       a simple Query; the outcome carries the first value of the last result
//	unnamed     sql with args through the unnamed statement
//	ddl         a simple Query on the DDL connection
//
// conn picks the client connection (0 or 1). want is the outcome: "ok",
// "ok:<first value>" for run, query and unnamed when there is a row, or
// "error:<SQLSTATE>".
type prepStep struct {
	conn      int
	op        string
	name, sql string
	args      []string
	want      string
}

// prepScript is a scenario as steps; pgxOnly when it needs a statement
// name of its own choosing (lib/pq names its statements itself).
type prepScript struct {
	name    string
	pgxOnly bool
	steps   []prepStep
}

func outcomeErr(err error) string {
	if c := sqlState(err); c != "" {
		return "error:" + c
	}
	var pe *pq.Error
	if errors.As(err, &pe) {
		return "error:" + string(pe.Code)
	}
	return "error:other:" + err.Error()
}

func outcomeValue(v []byte, ok bool) string {
	if !ok {
		return "ok"
	}
	return "ok:" + string(v)
}

// outcomeOf is "ok", or the outcome of err.
func outcomeOf(err error) string {
	if err != nil {
		return outcomeErr(err)
	}
	return "ok"
}

// outcomeResult is the outcome of one extended-protocol result: its
// error, or its first value.
func outcomeResult(r *pgconn.Result) string {
	if r.Err != nil {
		return outcomeErr(r.Err)
	}
	return outcomeValue(lastFirstValue([]*pgconn.Result{r}))
}

// prepConnect connects pgx to dsn until t ends.
func prepConnect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// prepOpenPQ opens a lib/pq database at dsn until t ends.
func prepOpenPQ(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	connector, err := pq.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// prepTable is a table name unique to t, dropped (if it exists) when t
// ends.
func prepTable(t *testing.T, prefix string) string {
	t.Helper()
	tbl := prepName(t, prefix)
	t.Cleanup(func() {
		_ = pgtest.Require(t).Exec(context.Background(), "appdb", "DROP TABLE IF EXISTS "+tbl)
	})
	return tbl
}

// prepSide says which side a failure on tg is on: lockpool's, or the
// test's when PostgreSQL itself gives another result than what.
func prepSide(tg prepTarget, what string) string {
	if tg.lockpool {
		return "lockpool differs from PostgreSQL"
	}
	return "PostgreSQL itself differs: " + what + " is wrong"
}

// checkTrace compares a wire trace with want.
func checkTrace(t *testing.T, tg prepTarget, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", prepSide(tg, "the expectation"), got, want)
	}
}

// prepInBatches runs clients clients prepBudget at a time, each inside a
// transaction that begin opens and whose commit it returns, committing a
// batch once all of it has run: each client of a batch holds its own
// server connection, so what they run is on every one of them.
func prepInBatches(t *testing.T, clients int, begin func(i int) (commit func() error)) {
	t.Helper()
	for i := 0; i < clients; i += prepBudget {
		var commits []func() error
		for j := i; j < i+prepBudget; j++ {
			commits = append(commits, begin(j))
		}
		for _, commit := range commits {
			if err := commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func byteArgs(args []string) [][]byte {
	out := make([][]byte, len(args))
	for i, a := range args {
		out[i] = []byte(a)
	}
	return out
}

func anyArgs(args []string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// lastFirstValue is the first value of the first row of the last result
// in rs that has rows.
func lastFirstValue(rs []*pgconn.Result) ([]byte, bool) {
	for i := len(rs) - 1; i >= 0; i-- {
		if len(rs[i].Rows) > 0 && len(rs[i].Rows[0]) > 0 {
			return rs[i].Rows[0][0], true
		}
	}
	return nil, false
}

// runPgxScript runs s with pgx connections to d and returns each step's
// outcome.
func runPgxScript(t *testing.T, ctx context.Context, d prepDSNs, o prepObjects, s prepScript) []string {
	t.Helper()
	conns := map[int]*pgx.Conn{}
	conn := func(i int, dsn string) *pgx.Conn {
		if c, ok := conns[i]; ok {
			return c
		}
		c := prepConnect(t, ctx, dsn)
		conns[i] = c
		return c
	}
	var out []string
	for _, st := range s.steps {
		sqlText := o.expand(st.sql)
		var res string
		switch st.op {
		case "prepare":
			_, err := conn(st.conn, d.client).PgConn().Prepare(ctx, st.name, sqlText, nil)
			res = outcomeOf(err)
		case "pgxprepare":
			_, err := conn(st.conn, d.client).Prepare(ctx, st.name, sqlText)
			res = outcomeOf(err)
		case "run":
			res = outcomeResult(conn(st.conn, d.client).PgConn().ExecPrepared(ctx, st.name, byteArgs(st.args), nil, nil).Read())
		case "close":
			res = outcomeOf(conn(st.conn, d.client).PgConn().Deallocate(ctx, st.name))
		case "query", "ddl":
			c := conn(st.conn, d.client)
			if st.op == "ddl" {
				c = conn(100, d.ddl)
			}
			rs, err := c.PgConn().Exec(ctx, sqlText).ReadAll()
			res = outcomeValue(lastFirstValue(rs))
			if err != nil {
				res = outcomeErr(err)
			}
		case "unnamed":
			res = outcomeResult(conn(st.conn, d.client).PgConn().ExecParams(ctx, sqlText, byteArgs(st.args), nil, nil, nil).Read())
		default:
			t.Fatalf("unknown op %q", st.op)
		}
		out = append(out, res)
	}
	return out
}

// runPQScript runs s with lib/pq: each client connection is a dedicated
// *sql.Conn, statement names are labels for lib/pq's own statements.
func runPQScript(t *testing.T, ctx context.Context, d prepDSNs, o prepObjects, s prepScript) []string {
	t.Helper()
	db, ddlDB := prepOpenPQ(t, d.client), prepOpenPQ(t, d.ddl)
	conns := map[int]*sql.Conn{}
	conn := func(i int) *sql.Conn {
		if c, ok := conns[i]; ok {
			return c
		}
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
		return c
	}
	stmts := map[string]*sql.Stmt{}
	scan := func(row *sql.Row) string {
		var v sql.NullString
		err := row.Scan(&v)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return "ok"
		case err != nil:
			return outcomeErr(err)
		}
		return "ok:" + v.String
	}
	var out []string
	for _, st := range s.steps {
		out = append(out, pqStep(t, ctx, st, o.expand(st.sql), conn, ddlDB, stmts, scan))
	}
	return out
}

// pqStep runs one step of a lib/pq script. lib/pq panics when a row does
// not match the description its statement was prepared with (binary int4
// of the wrong length): the panic is the step's outcome, "panic:...".
func pqStep(t *testing.T, ctx context.Context, st prepStep, sqlText string, conn func(int) *sql.Conn, ddlDB *sql.DB,
	stmts map[string]*sql.Stmt, scan func(*sql.Row) string) (res string) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			res = fmt.Sprintf("panic:%v", p)
		}
	}()
	switch st.op {
	case "prepare", "pgxprepare":
		stmt, err := conn(st.conn).PrepareContext(ctx, sqlText)
		res = outcomeOf(err)
		if err == nil {
			stmts[st.name] = stmt
			t.Cleanup(func() { _ = stmt.Close() })
		}
	case "run":
		stmt, ok := stmts[st.name]
		if !ok {
			return "error:no statement " + st.name + " (its prepare failed)"
		}
		res = scan(stmt.QueryRowContext(ctx, anyArgs(st.args)...))
	case "query":
		res = scan(conn(st.conn).QueryRowContext(ctx, sqlText))
	case "unnamed":
		res = scan(conn(st.conn).QueryRowContext(ctx, sqlText, anyArgs(st.args)...))
	case "ddl":
		_, err := ddlDB.ExecContext(ctx, sqlText)
		res = outcomeOf(err)
	default:
		t.Fatalf("op %q is not for lib/pq", st.op)
	}
	return res
}

// checkScript compares a run's outcomes with the script's wants, naming the
// target in the failure so a direct mismatch reads as a test mistake.
func checkScript(t *testing.T, tg prepTarget, s prepScript, got []string) {
	t.Helper()
	for i, st := range s.steps {
		if got[i] != st.want {
			t.Errorf("%s: step %d (conn %d %s %s %q): got %s, want %s", prepSide(tg, "the script's expectation"), i, st.conn, st.op, st.name, st.sql, got[i], st.want)
		}
	}
	if t.Failed() {
		t.Logf("all outcomes: %v", got)
	}
}

// runScripts runs every script on every target with pgx and, unless the
// script is pgxOnly, with lib/pq.
func runScripts(t *testing.T, targets []prepTarget, scripts []prepScript) {
	for _, s := range scripts {
		for _, driver := range []string{"pgx", "pq"} {
			if driver == "pq" && s.pgxOnly {
				continue
			}
			for _, tg := range targets {
				t.Run(s.name+"/"+driver+"/"+tg.name, func(t *testing.T) {
					ctx, o, d := prepOpen(t, tg)
					var got []string
					if driver == "pgx" {
						got = runPgxScript(t, ctx, d, o, s)
					} else {
						got = runPQScript(t, ctx, d, o, s)
					}
					checkScript(t, tg, s, got)
				})
			}
		}
	}
}

// TestPreparedDeallocate: SQL DEALLOCATE acts on protocol-level statement
// names (one namespace on PostgreSQL), DEALLOCATE ALL and DISCARD ALL
// forget every protocol-level statement, and a later Bind gets 26000.
func TestPreparedDeallocate(t *testing.T) {
	t.Parallel()
	runScripts(t, prepTargets(), []prepScript{
		{name: "deallocate_frees_name", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "prepare", name: "s1", sql: "SELECT 2", want: "error:42P05"},
			{op: "query", sql: "DEALLOCATE s1", want: "ok"},
			{op: "run", name: "s1", want: "error:26000"},
			{op: "prepare", name: "s1", sql: "SELECT 2", want: "ok"},
			{op: "run", name: "s1", want: "ok:2"},
		}},
		{name: "deallocate_prepare_keyword", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "query", sql: "DEALLOCATE PREPARE s1", want: "ok"},
			{op: "prepare", name: "s1", sql: "SELECT 3", want: "ok"},
			{op: "run", name: "s1", want: "ok:3"},
		}},
		{name: "deallocate_quoted_name", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "Mixed", sql: "SELECT 1", want: "ok"},
			{op: "query", sql: "DEALLOCATE Mixed", want: "error:26000"},
			{op: "run", name: "Mixed", want: "ok:1"},
			{op: "query", sql: `DEALLOCATE "Mixed"`, want: "ok"},
			{op: "run", name: "Mixed", want: "error:26000"},
		}},
		{name: "deallocate_unknown", pgxOnly: true, steps: []prepStep{
			{op: "query", sql: "DEALLOCATE nosuch", want: "error:26000"},
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "run", name: "s1", want: "ok:1"},
		}},
		{name: "deallocate_other_connection", pgxOnly: true, steps: []prepStep{
			{conn: 0, op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{conn: 1, op: "query", sql: "DEALLOCATE s1", want: "error:26000"},
			{conn: 0, op: "run", name: "s1", want: "ok:1"},
		}},
		{name: "deallocate_in_rolled_back_transaction", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "query", sql: "BEGIN", want: "ok"},
			{op: "query", sql: "DEALLOCATE s1", want: "ok"},
			{op: "query", sql: "ROLLBACK", want: "ok"},
			{op: "run", name: "s1", want: "error:26000"},
			{op: "prepare", name: "s1", sql: "SELECT 4", want: "ok"},
			{op: "run", name: "s1", want: "ok:4"},
		}},
		{name: "close_then_deallocate", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "close", name: "s1", want: "ok"},
			{op: "query", sql: "DEALLOCATE s1", want: "error:26000"},
			{op: "close", name: "s1", want: "ok"},
		}},
		{name: "deallocate_all", steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "prepare", name: "s2", sql: "SELECT $1::int + 1", want: "ok"},
			{op: "run", name: "s2", args: []string{"4"}, want: "ok:5"},
			{op: "query", sql: "DEALLOCATE ALL", want: "ok"},
			{op: "run", name: "s1", want: "error:26000"},
			{op: "run", name: "s2", args: []string{"4"}, want: "error:26000"},
			{op: "prepare", name: "s3", sql: "SELECT 5", want: "ok"},
			{op: "run", name: "s3", want: "ok:5"},
		}},
		{name: "discard_all", steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "prepare", name: "s2", sql: "SELECT $1::int + 1", want: "ok"},
			{op: "query", sql: "DISCARD ALL", want: "ok"},
			{op: "run", name: "s1", want: "error:26000"},
			{op: "run", name: "s2", args: []string{"4"}, want: "error:26000"},
			{op: "prepare", name: "s3", sql: "SELECT 6", want: "ok"},
			{op: "run", name: "s3", want: "ok:6"},
		}},
		{name: "deallocate_all_then_same_names", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "query", sql: "DEALLOCATE ALL", want: "ok"},
			{op: "prepare", name: "s1", sql: "SELECT 1", want: "ok"},
			{op: "run", name: "s1", want: "ok:1"},
		}},
	})
}

// TestPreparedParseError: a Parse's error comes back for that Parse (pgx's
// Prepare returns it), the failed name is not registered, and errors that
// PostgreSQL raises only at execution (table privileges) come at
// execution.
func TestPreparedParseError(t *testing.T) {
	t.Parallel()
	runScripts(t, prepTargets(), []prepScript{
		{name: "unknown_relation", steps: []prepStep{
			{op: "pgxprepare", name: "bad", sql: "SELECT * FROM nosuchtable_prep", want: "error:42P01"},
			{op: "pgxprepare", name: "bad", sql: "SELECT 1", want: "ok"},
			{op: "run", name: "bad", want: "ok:1"},
		}},
		{name: "syntax_error", steps: []prepStep{
			{op: "pgxprepare", name: "bad", sql: "SELEC 1", want: "error:42601"},
			{op: "pgxprepare", name: "bad", sql: "SELECT 1", want: "ok"},
			{op: "run", name: "bad", want: "ok:1"},
		}},
		{name: "schema_permission", steps: []prepStep{
			{op: "pgxprepare", name: "bad", sql: "SELECT v FROM {s}.t", want: "error:42501"},
			{op: "pgxprepare", name: "bad", sql: "SELECT 1", want: "ok"},
			{op: "run", name: "bad", want: "ok:1"},
		}},
		{name: "table_permission_at_execution", steps: []prepStep{
			{op: "pgxprepare", name: "priv", sql: "SELECT v FROM {p}", want: "ok"},
			{op: "run", name: "priv", want: "error:42501"},
			{op: "run", name: "priv", want: "error:42501"},
		}},
		{name: "bind_of_failed_name", pgxOnly: true, steps: []prepStep{
			{op: "prepare", name: "bad", sql: "SELECT * FROM nosuchtable_prep", want: "error:42P01"},
			{op: "run", name: "bad", want: "error:26000"},
			{op: "prepare", name: "bad", sql: "SELECT 2", want: "ok"},
			{op: "run", name: "bad", want: "ok:2"},
		}},
		{name: "unnamed_error", steps: []prepStep{
			{op: "unnamed", sql: "SELECT v FROM nosuchtable_prep WHERE v = $1", args: []string{"1"}, want: "error:42P01"},
			{op: "unnamed", sql: "SELECT $1::int * 2", args: []string{"21"}, want: "ok:42"},
		}},
	})
}

// TestPreparedParseErrorAfterDDL: a statement text that prepared fine
// fails at its Parse once DDL made it invalid, whether or not lockpool saw
// the DDL.
func TestPreparedParseErrorAfterDDL(t *testing.T) {
	t.Parallel()
	runScripts(t, prepDDLTargets(), []prepScript{
		{name: "relation_dropped", steps: []prepStep{
			{op: "ddl", sql: "CREATE TABLE {t} (v int); INSERT INTO {t} VALUES (1)", want: "ok"},
			{conn: 0, op: "prepare", name: "a", sql: "SELECT v FROM {t}", want: "ok"},
			{conn: 0, op: "run", name: "a", want: "ok:1"},
			{op: "ddl", sql: "DROP TABLE {t}", want: "ok"},
			{conn: 1, op: "prepare", name: "b", sql: "SELECT v FROM {t}", want: "error:42P01"},
			{conn: 0, op: "run", name: "a", want: "error:42P01"},
			{conn: 1, op: "prepare", name: "b", sql: "SELECT 3", want: "ok"},
			{conn: 1, op: "run", name: "b", want: "ok:3"},
		}},
	})
}

// TestPreparedDropCreate: a table dropped and created again with another
// column type; the same text prepared under a new name returns the new
// type (no "cached plan must not change result type"), and the statement
// prepared before keeps failing with 0A000, as on PostgreSQL. The DDL goes
// through lockpool in one variant and past it in the other.
func TestPreparedDropCreate(t *testing.T) {
	t.Parallel()
	runScripts(t, prepDDLTargets(), []prepScript{
		{name: "drop_create", steps: []prepStep{
			{op: "ddl", sql: "CREATE TABLE {t} (v int); INSERT INTO {t} VALUES (1)", want: "ok"},
			{conn: 0, op: "prepare", name: "a", sql: "SELECT v FROM {t}", want: "ok"},
			{conn: 0, op: "run", name: "a", want: "ok:1"},
			{conn: 1, op: "prepare", name: "a", sql: "SELECT v FROM {t}", want: "ok"},
			{conn: 1, op: "run", name: "a", want: "ok:1"},
			{op: "ddl", sql: "DROP TABLE {t}; CREATE TABLE {t} (v text); INSERT INTO {t} VALUES ('x')", want: "ok"},
			{conn: 0, op: "prepare", name: "b", sql: "SELECT v FROM {t}", want: "ok"},
			{conn: 0, op: "run", name: "b", want: "ok:x"},
			{conn: 0, op: "run", name: "a", want: "error:0A000"},
			{conn: 0, op: "run", name: "b", want: "ok:x"},
			{conn: 1, op: "run", name: "a", want: "error:0A000"},
			{conn: 1, op: "prepare", name: "c", sql: "SELECT v FROM {t}", want: "ok"},
			{conn: 1, op: "run", name: "c", want: "ok:x"},
			{conn: 0, op: "unnamed", sql: "SELECT v || $1 FROM {t}", args: []string{"y"}, want: "ok:xy"},
		}},
		{name: "alter_type_named_statement", steps: []prepStep{
			{op: "ddl", sql: "CREATE TABLE {t} (id int, c int); INSERT INTO {t} VALUES (1, 7)", want: "ok"},
			{op: "prepare", name: "a", sql: "SELECT c FROM {t} WHERE id = $1", want: "ok"},
			{op: "run", name: "a", args: []string{"1"}, want: "ok:7"},
			{op: "ddl", sql: "ALTER TABLE {t} ALTER COLUMN c TYPE bigint; UPDATE {t} SET c = 5000000000", want: "ok"},
			{op: "run", name: "a", args: []string{"1"}, want: "error:0A000"},
			{op: "run", name: "a", args: []string{"1"}, want: "error:0A000"},
			{op: "unnamed", sql: "SELECT c FROM {t} WHERE id = $1", args: []string{"1"}, want: "ok:5000000000"},
			{op: "prepare", name: "b", sql: "SELECT c FROM {t} WHERE id = $1", want: "ok"},
			{op: "run", name: "b", args: []string{"1"}, want: "ok:5000000000"},
			{op: "run", name: "a", args: []string{"1"}, want: "error:0A000"},
		}},
		{name: "alter_type_prepared_again_first", steps: []prepStep{
			// The same text prepared anew after the DDL, before anything
			// ran the old statement (whose 0A000 would start a new
			// statement epoch by itself): it must not be served from the
			// server statement prepared before the DDL.
			{op: "ddl", sql: "CREATE TABLE {t} (id int, c int); INSERT INTO {t} VALUES (1, 7)", want: "ok"},
			{conn: 0, op: "prepare", name: "a", sql: "SELECT c FROM {t} WHERE id = $1", want: "ok"},
			{conn: 0, op: "run", name: "a", args: []string{"1"}, want: "ok:7"},
			{op: "ddl", sql: "ALTER TABLE {t} ALTER COLUMN c TYPE bigint; UPDATE {t} SET c = 5000000000", want: "ok"},
			{conn: 1, op: "prepare", name: "b", sql: "SELECT c FROM {t} WHERE id = $1", want: "ok"},
			{conn: 1, op: "run", name: "b", args: []string{"1"}, want: "ok:5000000000"},
			{conn: 0, op: "prepare", name: "c", sql: "SELECT c FROM {t} WHERE id = $1", want: "ok"},
			{conn: 0, op: "run", name: "c", args: []string{"1"}, want: "ok:5000000000"},
			{conn: 0, op: "run", name: "a", args: []string{"1"}, want: "error:0A000"},
		}},
	})
}

// TestPreparedResultTypeChange: after ALTER COLUMN c TYPE bigint, pgx
// clients (default exec mode, statement cached) each get PostgreSQL's
// 0A000 "cached plan must not change result type" at most once, on their
// first query, and from then on the right bigint on every server
// connection lockpool gives them.
func TestPreparedResultTypeChange(t *testing.T) {
	t.Parallel()
	for _, tg := range prepDDLTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx := testenv.Context(t, 2*time.Minute)
			d := tg.open(t)
			tbl := prepTable(t, "prt")
			ddl := prepConnect(t, ctx, d.ddl)
			if _, err := ddl.Exec(ctx, fmt.Sprintf(prepTypeTableSQL, tbl)); err != nil {
				t.Fatal(err)
			}
			query := fmt.Sprintf("SELECT c, pg_backend_pid() FROM %s WHERE id = $1", tbl)

			const clients = 2 * prepBudget
			conns := make([]*pgx.Conn, clients)
			for i := range conns {
				conns[i] = prepConnect(t, ctx, d.client)
			}

			// Before the change: prepBudget clients at a time inside
			// transactions, so each holds its own server connection and
			// the statement is prepared on every one of them.
			servers := map[uint32]bool{}
			prepInBatches(t, clients, func(i int) func() error {
				tx, err := conns[i].Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var v int64
				var pid uint32
				if err := tx.QueryRow(ctx, query, 1).Scan(&v, &pid); err != nil {
					t.Fatal(err)
				}
				if v != 7 {
					t.Fatalf("before the change: c = %d, want 7", v)
				}
				servers[pid] = true
				return func() error { return tx.Commit(ctx) }
			})
			if tg.lockpool && len(servers) != prepBudget {
				t.Fatalf("statement prepared on %d server connections, want %d", len(servers), prepBudget)
			}

			if _, err := ddl.Exec(ctx, fmt.Sprintf(prepTypeChangeSQL, tbl)); err != nil {
				t.Fatal(err)
			}

			// After: every client queries until all of them have run on
			// every server connection (directly: each on its own one). They
			// all keep going until then, so they contend for the server
			// connections and each gets all of them in turn.
			want := len(servers)
			if !tg.lockpool {
				want = 1
			}
			var pending atomic.Int32
			pending.Store(clients)
			type clientResult struct {
				queries int
				errs    []string // "query #n: SQLSTATE message"
				bad     []string // wrong values or types
				seen    map[uint32]bool
			}
			results := make([]clientResult, clients)
			var wg sync.WaitGroup
			for i, c := range conns {
				wg.Add(1)
				go func(i int, c *pgx.Conn) {
					defer wg.Done()
					r := &results[i]
					r.seen = map[uint32]bool{}
					done := false
					for n := 0; n < 1000 && ctx.Err() == nil; n++ {
						if !done && n >= 10 && len(r.seen) >= want {
							done = true
							pending.Add(-1)
						}
						if done && pending.Load() == 0 {
							break
						}
						r.queries++
						v, pid, oid, err := queryBigint(ctx, c, query)
						if err != nil {
							pe := testenv.PgError(err)
							if pe != nil {
								r.errs = append(r.errs, fmt.Sprintf("query #%d: %s %s", n, pe.Code, pe.Message))
							} else {
								r.errs = append(r.errs, fmt.Sprintf("query #%d: %v", n, err))
							}
							continue
						}
						if v != 5000000000 || oid != pgtype.Int8OID {
							r.bad = append(r.bad, fmt.Sprintf("query #%d: c = %d (type oid %d), want 5000000000 (int8)", n, v, oid))
						}
						r.seen[pid] = true
					}
				}(i, c)
			}
			wg.Wait()

			for i, r := range results {
				for _, b := range r.bad {
					t.Errorf("client %d: %s", i, b)
				}
				switch {
				case len(r.errs) > 1:
					t.Errorf("client %d: %d errors in %d queries, want at most 1: %v", i, len(r.errs), r.queries, r.errs)
				case len(r.errs) == 1 && !strings.HasPrefix(r.errs[0], "query #0: 0A000 cached plan must not change result type"):
					t.Errorf("client %d: error %q, want 0A000 cached plan must not change result type on query #0", i, r.errs[0])
				case len(r.errs) == 0 && !tg.lockpool:
					t.Errorf("client %d: no error directly on PostgreSQL: the scenario does not invalidate the cached plan", i)
				}
				if len(r.seen) < want {
					t.Errorf("client %d ran on %d server connections in %d queries, want %d", i, len(r.seen), r.queries, want)
				}
				t.Logf("client %d: %d queries, errors %v, server connections %v (before the change: %v)", i, r.queries, r.errs, slices.Sorted(maps.Keys(r.seen)), slices.Sorted(maps.Keys(servers)))
			}
		})
	}
}

// queryBigint runs query with id 1 and returns c, the backend pid and the
// type oid of c.
func queryBigint(ctx context.Context, c *pgx.Conn, query string) (v int64, pid uint32, oid uint32, err error) {
	rows, err := c.Query(ctx, query, 1)
	if err != nil {
		return 0, 0, 0, err
	}
	defer rows.Close()
	if len(rows.FieldDescriptions()) > 0 {
		oid = rows.FieldDescriptions()[0].DataTypeOID
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, 0, oid, err
		}
		return 0, 0, oid, errors.New("no row")
	}
	if err := rows.Scan(&v, &pid); err != nil {
		return 0, 0, oid, err
	}
	rows.Close()
	return v, pid, oid, rows.Err()
}

// wireRound is what a raw client sends at once, and how many messages it
// then reads: read 0 reads until one ReadyForQuery per Sync sent.
type wireRound struct {
	send []pgproto3.FrontendMessage
	read int
}

// wireTag is msg as it appears in a trace: its type byte, the SQLSTATE of
// an error, and the first value of a data row.
func wireTag(msg pgproto3.BackendMessage) string {
	switch m := msg.(type) {
	case *pgproto3.ParseComplete:
		return "1"
	case *pgproto3.BindComplete:
		return "2"
	case *pgproto3.CloseComplete:
		return "3"
	case *pgproto3.NoData:
		return "n"
	case *pgproto3.ParameterDescription:
		return "t"
	case *pgproto3.RowDescription:
		return "T"
	case *pgproto3.DataRow:
		if len(m.Values) > 0 {
			return "D:" + string(m.Values[0])
		}
		return "D"
	case *pgproto3.CommandComplete:
		return "C:" + string(m.CommandTag)
	case *pgproto3.ReadyForQuery:
		return "Z:" + string(m.TxStatus)
	case *pgproto3.ErrorResponse:
		return "E:" + m.Code
	case *pgproto3.NoticeResponse:
		return "N:" + m.Code
	default:
		return fmt.Sprintf("%T", msg)
	}
}

// rawClient logs in with pgconn at dsn and hijacks the connection, so the
// test speaks the protocol itself.
func rawClient(t *testing.T, ctx context.Context, dsn string) (*pgproto3.Frontend, net.Conn) {
	t.Helper()
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hc.Conn.Close() })
	return hc.Frontend, hc.Conn
}

// wireTrace sends each round and returns the tags of what came back, one
// string per round.
func wireTrace(t *testing.T, fe *pgproto3.Frontend, nc net.Conn, rounds []wireRound) []string {
	t.Helper()
	var out []string
	for i, r := range rounds {
		syncs := 0
		for _, m := range r.send {
			if _, ok := m.(*pgproto3.Sync); ok {
				syncs++
			}
			fe.Send(m)
		}
		if err := fe.Flush(); err != nil {
			t.Fatalf("round %d: send: %v", i, err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		var tags []string
		for (r.read > 0 && len(tags) < r.read) || (r.read == 0 && syncs > 0) {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatalf("round %d: after %v: %v", i, tags, err)
			}
			if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
				syncs--
			}
			tags = append(tags, wireTag(msg))
		}
		out = append(out, strings.Join(tags, " "))
	}
	return out
}

// TestPreparedWireErrorAtSync: on the wire, a Parse's error comes in the
// reply to the batch that sent it, before that batch's ReadyForQuery (and
// at a Flush, before any Sync), the rest of the batch is skipped, and a
// failed name stays free.
func TestPreparedWireErrorAtSync(t *testing.T) {
	t.Parallel()
	parse := func(name, q string) *pgproto3.Parse { return &pgproto3.Parse{Name: name, Query: q} }
	bind := func(stmt string, args ...string) *pgproto3.Bind {
		return &pgproto3.Bind{PreparedStatement: stmt, Parameters: byteArgs(args)}
	}
	exec := &pgproto3.Execute{}
	sync := &pgproto3.Sync{}
	cases := []struct {
		name   string
		rounds func(o prepObjects) []wireRound
		want   []string
	}{
		{"unknown_relation", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("bad", "SELECT * FROM nosuchtable_prep"), sync}}}
		}, []string{"E:42P01 Z:I"}},
		{"syntax_error", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("bad", "SELEC 1"), sync}}}
		}, []string{"E:42601 Z:I"}},
		{"schema_permission", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("bad", o.expand("SELECT v FROM {s}.t")), sync}}}
		}, []string{"E:42501 Z:I"}},
		{"rest_of_batch_skipped", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("bad", "SELECT * FROM nosuchtable_prep"),
				&pgproto3.Describe{ObjectType: 'S', Name: "bad"}, bind("bad"), exec, sync}}}
		}, []string{"E:42P01 Z:I"}},
		{"error_after_earlier_messages", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("g1", "SELECT 1"), bind("g1"), exec,
				parse("bad", "SELECT * FROM nosuchtable_prep"), bind("bad"), exec, sync}}}
		}, []string{"1 2 D:1 C:SELECT 1 E:42P01 Z:I"}},
		{"pipelined_batches", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("g1", "SELECT 1"), sync,
				parse("bad", "SELECT * FROM nosuchtable_prep"), sync, parse("g2", "SELECT 2"), bind("g2"), exec, sync}}}
		}, []string{"1 Z:I E:42P01 Z:I 1 2 D:2 C:SELECT 1 Z:I"}},
		{"failed_name_is_free", func(o prepObjects) []wireRound {
			return []wireRound{
				{send: []pgproto3.FrontendMessage{parse("bad", "SELECT * FROM nosuchtable_prep"), sync}},
				{send: []pgproto3.FrontendMessage{bind("bad"), exec, sync}},
				{send: []pgproto3.FrontendMessage{parse("bad", "SELECT $1::int + 1"), bind("bad", "1"), exec, sync}},
			}
		}, []string{"E:42P01 Z:I", "E:26000 Z:I", "1 2 D:2 C:SELECT 1 Z:I"}},
		{"duplicate_name", func(o prepObjects) []wireRound {
			return []wireRound{{send: []pgproto3.FrontendMessage{parse("s", "SELECT 1"), sync, parse("s", "SELECT 2"), sync, bind("s"), exec, sync}}}
		}, []string{"1 Z:I E:42P05 Z:I 2 D:1 C:SELECT 1 Z:I"}},
		{"parse_again_after_skipped_close", func(o prepObjects) []wireRound {
			// The second Parse of "a" closes lockpool's server statement
			// first; both are skipped after the error, and the server
			// statement is still there for the third.
			return []wireRound{
				{send: []pgproto3.FrontendMessage{parse("a", "SELECT 7"), sync}},
				{send: []pgproto3.FrontendMessage{&pgproto3.Close{ObjectType: 'S', Name: "a"}, sync}},
				{send: []pgproto3.FrontendMessage{parse("bad", "SELEC 1"), parse("a", "SELECT 7"), sync}},
				{send: []pgproto3.FrontendMessage{parse("a", "SELECT 7"), bind("a"), exec, sync}},
			}
		}, []string{"1 Z:I", "3 Z:I", "E:42601 Z:I", "1 2 D:7 C:SELECT 1 Z:I"}},
		{"error_at_flush", func(o prepObjects) []wireRound {
			return []wireRound{
				{send: []pgproto3.FrontendMessage{parse("bad", "SELECT * FROM nosuchtable_prep"), &pgproto3.Flush{}}, read: 1},
				{send: []pgproto3.FrontendMessage{sync}},
			}
		}, []string{"E:42P01", "Z:I"}},
		{"error_in_transaction_block", func(o prepObjects) []wireRound {
			return []wireRound{
				{send: []pgproto3.FrontendMessage{&pgproto3.Query{String: "BEGIN"}}, read: 2},
				{send: []pgproto3.FrontendMessage{parse("bad", "SELECT * FROM nosuchtable_prep"), sync}},
				{send: []pgproto3.FrontendMessage{parse("g", "SELECT 1"), sync}},
				{send: []pgproto3.FrontendMessage{&pgproto3.Query{String: "ROLLBACK"}}, read: 2},
				{send: []pgproto3.FrontendMessage{parse("bad", "SELECT 3"), bind("bad"), exec, sync}},
			}
		}, []string{"C:BEGIN Z:T", "E:42P01 Z:E", "E:25P02 Z:E", "C:ROLLBACK Z:I", "1 2 D:3 C:SELECT 1 Z:I"}},
	}
	for _, tc := range cases {
		for _, tg := range prepTargets() {
			t.Run(tc.name+"/"+tg.name, func(t *testing.T) {
				ctx, o, d := prepOpen(t, tg)
				fe, nc := rawClient(t, ctx, d.client)
				checkTrace(t, tg, wireTrace(t, fe, nc, tc.rounds(o)), tc.want)
			})
		}
	}
}

// TestPreparedLibPQResultTypeChange: lib/pq statements from db.Prepare on
// several pooled connections after ALTER COLUMN c TYPE bigint: the old
// statements fail with 0A000 every time (lib/pq does not re-prepare; nor
// does PostgreSQL), unnamed queries and new statements return the bigint
// on every connection.
func TestPreparedLibPQResultTypeChange(t *testing.T) {
	t.Parallel()
	for _, tg := range prepDDLTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx := testenv.Context(t, 2*time.Minute)
			d := tg.open(t)
			tbl := prepTable(t, "plt")
			db, ddl := prepOpenPQ(t, d.client), prepOpenPQ(t, d.ddl)
			if _, err := ddl.ExecContext(ctx, fmt.Sprintf(prepTypeTableSQL, tbl)); err != nil {
				t.Fatal(err)
			}
			query := fmt.Sprintf("SELECT c FROM %s WHERE id = $1", tbl)
			const clients = 2 * prepBudget
			conns := make([]*sql.Conn, clients)
			stmts := make([]*sql.Stmt, clients)
			for i := range conns {
				c, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				conns[i] = c
				if stmts[i], err = c.PrepareContext(ctx, query); err != nil {
					t.Fatal(err)
				}
				defer stmts[i].Close()
			}
			run := func(i int, stmt *sql.Stmt, unnamed bool) string {
				var v int64
				var err error
				if unnamed {
					err = conns[i].QueryRowContext(ctx, query, 1).Scan(&v)
				} else {
					err = stmt.QueryRowContext(ctx, 1).Scan(&v)
				}
				if err != nil {
					return outcomeErr(err)
				}
				return "ok:" + strconv.FormatInt(v, 10)
			}
			// Before: each statement runs inside a transaction held by
			// prepBudget clients at once, so it is on every server connection.
			prepInBatches(t, clients, func(j int) func() error {
				tx, err := conns[j].BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				var v int64
				if err := tx.StmtContext(ctx, stmts[j]).QueryRowContext(ctx, 1).Scan(&v); err != nil || v != 7 {
					t.Fatalf("before the change: c = %d, %v; want 7", v, err)
				}
				return tx.Commit
			})
			if _, err := ddl.ExecContext(ctx, fmt.Sprintf(prepTypeChangeSQL, tbl)); err != nil {
				t.Fatal(err)
			}
			for i := range conns {
				var got []string
				for range 3 {
					got = append(got, run(i, stmts[i], false))
				}
				for range 5 {
					got = append(got, run(i, nil, true))
				}
				fresh, err := conns[i].PrepareContext(ctx, query)
				if err != nil {
					t.Fatalf("client %d: prepare after the change: %v", i, err)
				}
				for range 3 {
					got = append(got, run(i, fresh, false))
				}
				_ = fresh.Close()
				want := []string{"error:0A000", "error:0A000", "error:0A000",
					"ok:5000000000", "ok:5000000000", "ok:5000000000", "ok:5000000000", "ok:5000000000",
					"ok:5000000000", "ok:5000000000", "ok:5000000000"}
				if !slices.Equal(got, want) {
					t.Errorf("client %d:\n got  %v\n want %v", i, got, want)
				}
			}
		})
	}
}

// TestPreparedWireParseAfterDrop: once the table a statement text reads is
// dropped, a Parse of that text (prepared before by another client) gets
// 42P01 at that Parse, before its Sync's ReadyForQuery, and the name stays
// free, whether or not lockpool saw the DROP.
func TestPreparedWireParseAfterDrop(t *testing.T) {
	t.Parallel()
	for _, tg := range prepDDLTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx, o, d := prepOpen(t, tg)
			ddl := prepConnect(t, ctx, d.ddl)
			if _, err := ddl.Exec(ctx, o.expand("CREATE TABLE {t} (v int); INSERT INTO {t} VALUES (1)")); err != nil {
				t.Fatal(err)
			}
			q := o.expand("SELECT v FROM {t}")
			other := prepConnect(t, ctx, d.client)
			if _, err := other.PgConn().Prepare(ctx, "a", q, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ddl.Exec(ctx, o.expand("DROP TABLE {t}")); err != nil {
				t.Fatal(err)
			}
			fe, nc := rawClient(t, ctx, d.client)
			rounds := []wireRound{
				{send: []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "b", Query: q}, &pgproto3.Sync{}}},
				{send: []pgproto3.FrontendMessage{&pgproto3.Parse{Name: "b", Query: "SELECT 2"},
					&pgproto3.Bind{PreparedStatement: "b"}, &pgproto3.Execute{}, &pgproto3.Sync{}}},
			}
			want := []string{"E:42P01 Z:I", "1 2 D:2 C:SELECT 1 Z:I"}
			if tg.name == "lockpool_ddl_direct" {
				// The documented difference: lockpool answers the Parse of a
				// statement PostgreSQL accepted for this database and user
				// without a server (so a Parse never waits for a
				// connection); after a DROP it did not see, the error comes
				// with the first message that needs the server, and the
				// name is free again after it.
				rounds = []wireRound{rounds[0],
					{send: []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'S', Name: "b"}, &pgproto3.Sync{}}},
					rounds[1]}
				want = []string{"1 Z:I", "E:42P01 Z:I", "1 2 D:2 C:SELECT 1 Z:I"}
			}
			checkTrace(t, tg, wireTrace(t, fe, nc, rounds), want)
		})
	}
}

// TestPreparedTimeoutBetweenParseAndDescribe: a client with a
// statement_timeout that is slow between its Parse and its Describe gets
// 57014 from PostgreSQL, with the statement prepared (the extended-protocol
// messages up to the Sync are one statement to the server's timer), even
// when lockpool knows the statement's text from before.
func TestPreparedTimeoutBetweenParseAndDescribe(t *testing.T) {
	t.Parallel()
	parse := func(name string) *pgproto3.Parse { return &pgproto3.Parse{Name: name, Query: "SELECT $1::varchar"} }
	sync := &pgproto3.Sync{}
	for _, tg := range prepTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx, _, d := prepOpen(t, tg)
			fe, nc := rawClient(t, ctx, d.client)
			var got []string
			got = append(got, wireTrace(t, fe, nc, []wireRound{
				{send: []pgproto3.FrontendMessage{parse("warm"), sync}},
				{send: []pgproto3.FrontendMessage{&pgproto3.Query{String: "SET statement_timeout = '100ms'"}}, read: 2},
				{send: []pgproto3.FrontendMessage{parse("slow"), &pgproto3.Flush{}}, read: 1},
			})...)
			time.Sleep(300 * time.Millisecond) // the client being slow is the case under test
			got = append(got, wireTrace(t, fe, nc, []wireRound{
				{send: []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'S', Name: "slow"}, sync}},
				{send: []pgproto3.FrontendMessage{parse("slow"), sync}},
				{send: []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: "slow", Parameters: byteArgs([]string{"x"})}, &pgproto3.Execute{}, sync}},
			})...)
			checkTrace(t, tg, got, []string{"1 Z:I", "C:SET Z:I", "1", "E:57014 Z:I", "E:42P05 Z:I", "2 D:x C:SELECT 1 Z:I"})
		})
	}
}

// TestPreparedStatementsView: pg_prepared_statements lists the client's
// own protocol-level statements by the client's names, as directly (never
// lockpool's server statements), in the shapes queries use it.
func TestPreparedStatementsView(t *testing.T) {
	t.Parallel()
	queries := []string{
		"SELECT name, statement, parameter_types::text, from_sql FROM pg_prepared_statements ORDER BY name",
		"SELECT p.name FROM pg_catalog.pg_prepared_statements p WHERE p.name LIKE 'view%' ORDER BY 1",
		"SELECT count(*) FROM pg_prepared_statements AS x JOIN (SELECT 'view_a' AS n) y ON x.name = y.n",
		"SELECT exists(SELECT 1 FROM pg_prepared_statements WHERE name = 'view_b')",
	}
	for _, tg := range prepTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx, _, d := prepOpen(t, tg)
			c, err := pgx.Connect(ctx, d.client)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			var seen []string
			for _, q := range queries {
				rows, err := c.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
				if err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				vals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
				if err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				seen = append(seen, fmt.Sprint(vals))
				if len(seen) == 1 {
					if _, err := c.Prepare(ctx, "view_a", "SELECT $1::int + 1"); err != nil {
						t.Fatal(err)
					}
					if _, err := c.Prepare(ctx, "view_b", "SELECT $1::text, $2::varchar"); err != nil {
						t.Fatal(err)
					}
					rows, err := c.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
					if err != nil {
						t.Fatal(err)
					}
					vals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
					if err != nil {
						t.Fatal(err)
					}
					seen = append(seen, fmt.Sprint(vals))
				}
			}
			checkTrace(t, tg, seen, []string{
				"[]",
				"[[view_a SELECT $1::int + 1 {integer} false] [view_b SELECT $1::text, $2::varchar {text,\"character varying\"} false]]",
				"[[view_a] [view_b]]", "[[1]]", "[[true]]",
			})
		})
	}
}

// TestPreparedStatementsViewWhenRun: a named statement that reads
// pg_prepared_statements or pg_listening_channels() sees them as they are
// each time it runs, as directly, not as they were when it was prepared
// (the statement itself included).
func TestPreparedStatementsViewWhenRun(t *testing.T) {
	t.Parallel()
	for _, tg := range prepTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx, _, d := prepOpen(t, tg)
			c := prepConnect(t, ctx, d.client)
			if _, err := c.Prepare(ctx, "run_view", "SELECT coalesce(string_agg(name || '=' || statement, ', ' ORDER BY name), '') FROM pg_prepared_statements"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Prepare(ctx, "run_chan", "SELECT coalesce(string_agg(c, ',' ORDER BY c), '') FROM pg_listening_channels() c"); err != nil {
				t.Fatal(err)
			}
			var seen []string
			look := func(name string) {
				t.Helper()
				var v string
				if err := c.QueryRow(ctx, name).Scan(&v); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				seen = append(seen, v)
			}
			look("run_view")
			if _, err := c.Prepare(ctx, "run_a", "SELECT 42"); err != nil {
				t.Fatal(err)
			}
			look("run_view")
			if err := c.Deallocate(ctx, "run_a"); err != nil {
				t.Fatal(err)
			}
			look("run_view")
			look("run_chan")
			if _, err := c.Exec(ctx, "LISTEN run_x"); err != nil {
				t.Fatal(err)
			}
			look("run_chan")
			if _, err := c.Exec(ctx, "UNLISTEN run_x"); err != nil {
				t.Fatal(err)
			}
			look("run_chan")
			const chanQ = "run_chan=SELECT coalesce(string_agg(c, ',' ORDER BY c), '') FROM pg_listening_channels() c"
			const viewQ = "run_view=SELECT coalesce(string_agg(name || '=' || statement, ', ' ORDER BY name), '') FROM pg_prepared_statements"
			checkTrace(t, tg, seen, []string{
				chanQ + ", " + viewQ,
				"run_a=SELECT 42, " + chanQ + ", " + viewQ,
				chanQ + ", " + viewQ,
				"", "run_x", "",
			})
		})
	}
}

// TestPreparedFetchDescribedBeforeCursor: a FETCH prepared before its
// cursor exists (described as returning no rows) runs inside the block
// that declares the cursor and returns the cursor's rows, as directly:
// PostgreSQL never refuses a FETCH for a changed result type, also when
// lockpool prepares it afresh on another server connection. Each round
// runs while other clients hold server connections, so the block runs on
// another connection than the Prepare did in some of them.
func TestPreparedFetchDescribedBeforeCursor(t *testing.T) {
	t.Parallel()
	for _, tg := range prepTargets() {
		t.Run(tg.name, func(t *testing.T) {
			ctx, _, d := prepOpen(t, tg)
			c := prepConnect(t, ctx, d.client)
			others := []*pgx.Conn{prepConnect(t, ctx, d.client), prepConnect(t, ctx, d.client)}
			var seen []string
			for i := range 12 {
				name := fmt.Sprintf("fetch_%d", i)
				if _, err := c.Prepare(ctx, name, fmt.Sprintf(`FETCH ALL IN "cur_%d"`, i)); err != nil {
					t.Fatal(err)
				}
				held := others[:i%3]
				for _, o := range held {
					if _, err := o.Exec(ctx, "BEGIN; SELECT 1"); err != nil {
						t.Fatal(err)
					}
				}
				tx, err := c.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, fmt.Sprintf(`DECLARE "cur_%d" CURSOR FOR SELECT n, n::text FROM generate_series(1, 3) n`, i)); err != nil {
					t.Fatal(err)
				}
				rows, err := tx.Query(ctx, name)
				var got string
				if err == nil {
					var vals [][]any
					vals, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
					got = fmt.Sprint(vals)
				}
				seen = append(seen, got+" "+errText(err))
				_ = tx.Rollback(ctx)
				for _, o := range held {
					if _, err := o.Exec(ctx, "COMMIT"); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := make([]string, len(seen))
			for i := range want {
				want[i] = "[[1 1] [2 2] [3 3]] " + "ok"
			}
			checkTrace(t, tg, seen, want)
		})
	}
}
