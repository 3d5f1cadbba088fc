package integration

// A transaction is all or nothing, as on a direct connection. When the
// server connection behind a client dies (pg_terminate_backend, the
// server's idle_in_transaction_session_timeout) while the client is inside
// a transaction block, is owed a reply, or is pinned by a session advisory
// lock, the client gets a FATAL error and its connection is closed: nothing
// it sends afterwards may run. A dead idle server connection of a client
// outside a transaction stays invisible. A BEGIN that fails because no
// server connection could be had leaves the client in a failed transaction.
//
// Every case runs through psql (fed over stdin, so it keeps going after
// errors as a script would) and through pgx in both protocols, directly
// against PostgreSQL (which shows what a client must see) and through
// lockpool (which must show the same).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// txnStep is one statement a test client sends.
type txnStep struct {
	sql       string // {t} stands for the test's table
	args      []any  // parameters ($1, …): extended protocol for pgx in default mode
	wantState string // the SQLSTATE this statement must fail with ("" = must succeed)
	pid       bool   // its one-column result is the backend pid to kill
}

// txnResult is what a client saw for one statement.
type txnResult struct {
	tag      string // command tag ("" when none was seen)
	value    string // first column of the first row, when the statement returned one
	err      error  // any error, from the server or not
	state    string // SQLSTATE when err is an error the server (or lockpool) sent
	severity string // ERROR or FATAL when state is set
	message  string // the error's message when state is set
}

func (r txnResult) String() string {
	switch {
	case r.state != "":
		return fmt.Sprintf("%s %s: %s", r.severity, r.state, r.message)
	case r.err != nil:
		return "client error: " + r.err.Error()
	default:
		return fmt.Sprintf("ok (tag %q, value %q)", r.tag, r.value)
	}
}

// txnClient is one client connection under test.
type txnClient interface {
	// exec runs one statement and reports what the client saw.
	exec(ctx context.Context, sql string, args []any, wantValue bool) txnResult
	// closed reports whether the connection is closed.
	closed(ctx context.Context) bool
	// txStatus is the transaction status of the last ReadyForQuery ('I',
	// 'T', 'E'), or 0 when the client cannot tell.
	txStatus() byte
	// output is the client's transcript, for failure messages.
	output() string
	close()
}

// txnClientKind is how a test client talks to the server.
type txnClientKind string

const (
	txnPsql      txnClientKind = "psql"
	txnPgxSimple txnClientKind = "pgx_simple"
	txnPgxExt    txnClientKind = "pgx_extended"
)

var txnClientKinds = []txnClientKind{txnPsql, txnPgxSimple, txnPgxExt}

// txnEndpoint is where a test client connects: PostgreSQL itself or lockpool.
type txnEndpoint struct {
	port int
}

func (e txnEndpoint) dsn(user, db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", e.port, user, appPassword, db)
}

// txnConnect opens a client of kind to ep.
func txnConnect(ctx context.Context, t testing.TB, kind txnClientKind, ep txnEndpoint, user, db string) txnClient {
	t.Helper()
	switch kind {
	case txnPsql:
		c, err := txnStartPsql(ep, user, db)
		if err != nil {
			t.Fatalf("start psql: %v", err)
		}
		t.Cleanup(c.close)
		return c
	default:
		cfg, err := pgx.ParseConfig(ep.dsn(user, db))
		if err != nil {
			t.Fatal(err)
		}
		if kind == txnPgxSimple {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}
		c := &txnPgx{}
		// pgx closes its side of a connection on a FATAL error by itself,
		// which would hide a proxy that goes on serving after one. Like
		// libpq, this client relies on the server to close the connection,
		// and records every error that arrives (pgx reports a FATAL
		// followed by EOF as the EOF).
		cfg.OnPgError = func(_ *pgconn.PgConn, pe *pgconn.PgError) bool {
			c.seen = append(c.seen, pe)
			return true
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgx.ConnectConfig(cctx, cfg)
		if err != nil {
			t.Fatalf("connect %s to port %d: %v", kind, ep.port, err)
		}
		c.conn = conn
		t.Cleanup(c.close)
		return c
	}
}

// txnPgx is a pgx client. Statements with parameters use the extended
// protocol in pgx's default mode, as an application's would. It keeps its
// connection open after a FATAL error: only the server (or lockpool)
// closing it ends it.
type txnPgx struct {
	conn *pgx.Conn
	seen []*pgconn.PgError // every ErrorResponse received, in order
	log  strings.Builder
}

func (c *txnPgx) exec(ctx context.Context, sql string, args []any, wantValue bool) txnResult {
	var r txnResult
	seen := len(c.seen)
	if wantValue {
		rows, err := c.conn.Query(ctx, sql, args...)
		if err == nil {
			if rows.Next() {
				if vals, verr := rows.Values(); verr == nil && len(vals) > 0 {
					r.value = fmt.Sprint(vals[0])
				}
			}
			rows.Close()
			err = rows.Err()
			r.tag = rows.CommandTag().String()
		}
		r.err = err
	} else {
		tag, err := c.conn.Exec(ctx, sql, args...)
		r.tag, r.err = tag.String(), err
	}
	var pe *pgconn.PgError
	if len(c.seen) > seen {
		pe = c.seen[seen]
	} else if !errors.As(r.err, &pe) {
		pe = nil
	}
	if pe != nil {
		r.state, r.severity, r.message = pe.Code, pe.Severity, pe.Message
		if r.err == nil {
			r.err = pe
		}
	}
	fmt.Fprintf(&c.log, "> %s %v\n< %s\n", sql, args, r)
	return r
}

// closed reports whether the connection is closed: pgx noticed, or a
// statement now fails without reaching a server.
func (c *txnPgx) closed(ctx context.Context) bool {
	if c.conn.IsClosed() {
		return true
	}
	r := c.exec(ctx, "SELECT 1", nil, false)
	return r.err != nil && r.state == ""
}
func (c *txnPgx) txStatus() byte { return c.conn.PgConn().TxStatus() }
func (c *txnPgx) output() string { return c.log.String() }
func (c *txnPgx) close()         { _ = c.conn.Close(context.Background()) }

// txnPsqlClient is a psql process fed over stdin, with ON_ERROR_STOP off, so it
// goes on after errors. After each statement it echoes a marker; its
// stdout and stderr share one pipe, so errors appear in order.
type txnPsqlClient struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // closed when psql's output ends
	n      int
	ended  bool
	code   int // exit code once ended
	script strings.Builder
	out    strings.Builder
}

// txnErrLine matches psql's report of an error with VERBOSITY verbose.
var txnErrLine = regexp.MustCompile(`(ERROR|FATAL):  ([0-9A-Z]{5}): (.*)$`)

// txnTagLine matches the command tags the tests look at.
var txnTagLine = regexp.MustCompile(`^(BEGIN|COMMIT|ROLLBACK|INSERT \d+ \d+|SELECT \d+)$`)

// txnPsqlCommand is psql to ep, reading its script from stdin: unaligned
// tuples only, going on after errors, errors reported with their SQLSTATE.
func txnPsqlCommand(ep txnEndpoint, user, db string) *exec.Cmd {
	cmd := exec.Command("/usr/bin/psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=0", "-v", "VERBOSITY=verbose",
		"-h", "127.0.0.1", "-p", strconv.Itoa(ep.port), "-U", user, "-d", db)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10", "PSQLRC=/dev/null")
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// txnStartPsql starts psql with its stdout and stderr on one pipe.
func txnStartPsql(ep txnEndpoint, user, db string) (*txnPsqlClient, error) {
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		return nil, err
	}
	cmd := txnPsqlCommand(ep, user, db)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close()
	c := &txnPsqlClient{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		defer close(c.lines)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

// txnRender writes args into sql for psql ($1 → the value).
func txnRender(sql string, args []any) string {
	for i := len(args); i >= 1; i-- {
		v := args[i-1]
		lit := fmt.Sprint(v)
		if s, ok := v.(string); ok {
			lit = "'" + strings.ReplaceAll(s, "'", "''") + "'"
		}
		sql = strings.ReplaceAll(sql, "$"+strconv.Itoa(i), lit)
	}
	return sql
}

func (c *txnPsqlClient) exec(ctx context.Context, sql string, args []any, _ bool) txnResult {
	if c.ended {
		return txnResult{err: fmt.Errorf("psql exited (code %d)", c.code)}
	}
	c.n++
	marker := fmt.Sprintf("@@step %d", c.n)
	in := txnRender(sql, args) + ";\n\\echo " + marker + "\n"
	c.script.WriteString(in)
	_, werr := io.WriteString(c.stdin, in)
	var r txnResult
	for {
		var line string
		var ok bool
		select {
		case line, ok = <-c.lines:
		case <-ctx.Done():
			r.err = ctx.Err()
			return r
		}
		if !ok {
			c.end()
			if r.err == nil {
				r.err = fmt.Errorf("psql exited (code %d, write error %v)", c.code, werr)
			}
			return r
		}
		c.out.WriteString(line + "\n")
		if line == marker {
			return r
		}
		if m := txnErrLine.FindStringSubmatch(line); m != nil {
			if r.state == "" {
				r.severity, r.state, r.message = m[1], m[2], m[3]
				r.err = errors.New(line)
			}
			continue
		}
		if txnTagLine.MatchString(line) {
			r.tag = line
			continue
		}
		if _, err := strconv.Atoi(line); err == nil && r.value == "" {
			r.value = line
		}
	}
}

// end waits for the psql process after its output ended.
func (c *txnPsqlClient) end() {
	if c.ended {
		return
	}
	c.ended = true
	_ = c.stdin.Close()
	err := c.cmd.Wait()
	c.code = 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		c.code = ee.ExitCode()
	} else if err != nil {
		c.code = -1
	}
}

// closed reports whether psql ended because its connection was lost: a
// non-interactive psql exits with code 2 then.
func (c *txnPsqlClient) closed(ctx context.Context) bool {
	if !c.ended {
		select {
		case _, ok := <-c.lines:
			if ok {
				return false
			}
			c.end()
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Second):
			return false
		}
	}
	return c.code == 2
}

func (c *txnPsqlClient) txStatus() byte { return 0 }

func (c *txnPsqlClient) output() string {
	return "--- psql input ---\n" + c.script.String() + "--- psql output ---\n" + c.out.String()
}

func (c *txnPsqlClient) close() {
	if c.ended {
		return
	}
	_ = c.stdin.Close()
	for range c.lines {
	}
	c.end()
}

// txnRows returns the values in table's column v, in order.
func txnRows(ctx context.Context, t testing.TB, su *pgx.Conn, table string) []int32 {
	t.Helper()
	var vs []int32
	if err := su.QueryRow(ctx, "SELECT coalesce(array_agg(v ORDER BY v), '{}') FROM "+table).Scan(&vs); err != nil {
		t.Fatalf("read %s: %v", table, err)
	}
	return vs
}

// txnWaitGone waits until backend pid has exited.
func txnWaitGone(ctx context.Context, t testing.TB, su *pgx.Conn, pid int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("backend %d to exit", pid), func() bool {
		var n int
		err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return err == nil && n == 0
	})
}

// txnTerminate terminates backend pid and waits until it has exited.
func txnTerminate(ctx context.Context, t testing.TB, su *pgx.Conn, pid int) {
	t.Helper()
	var ok bool
	if err := su.QueryRow(ctx, "SELECT pg_terminate_backend($1, 10000)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	txnWaitGone(ctx, t, su, pid)
}

// txnFault is how the server connection is lost.
type txnFault int

const (
	txnFaultTerminate     txnFault = iota // pg_terminate_backend on the backend the client uses
	txnFaultIdleTimeout                   // the server's idle_in_transaction_session_timeout ends it
	txnFaultTerminateIdle                 // pg_terminate_backend on the role's idle backends (the client is idle)
)

// txnLossCase is one way of losing the server connection.
type txnLossCase struct {
	name      string
	idleRole  bool      // log in as the role with idle_in_transaction_session_timeout = 300ms
	before    []txnStep // before the loss
	running   *txnStep  // sent before the loss and running while it happens
	fault     txnFault
	after     []txnStep // sent after the loss, carelessly, whatever happened
	wantRows  []int32   // the table's rows at the end
	serverErr string    // SQLSTATE PostgreSQL sends for the loss (a direct client sees it)
	invisible bool      // the loss must not be seen (lockpool only: a direct client sees it)
}

const (
	txnRole     = "txbound"
	txnIdleRole = "txbidle"
	txnDB       = "appdb"
	txnLockKey  = 8_123_456
)

var (
	txnInsert400 = txnStep{sql: "INSERT INTO {t} VALUES ($1)", args: []any{400}}
	txnInsert401 = txnStep{sql: "INSERT INTO {t} VALUES ($1)", args: []any{401}}
	txnBegin     = txnStep{sql: "BEGIN"}
	txnCommit    = txnStep{sql: "COMMIT"}
	txnPid       = txnStep{sql: "SELECT pg_backend_pid()", pid: true}
	txnSleep     = txnStep{sql: "SELECT pg_sleep($1)", args: []any{30}}
	txnLock      = txnStep{sql: "SELECT pg_advisory_lock($1)", args: []any{txnLockKey}}
)

var txnLossCases = []txnLossCase{
	{
		name:   "idle_in_transaction",
		before: []txnStep{txnBegin, txnInsert400, txnPid},
		fault:  txnFaultTerminate, after: []txnStep{txnInsert401, txnCommit},
		serverErr: "57P01",
	},
	{
		name:   "failed_transaction",
		before: []txnStep{txnBegin, txnInsert400, txnPid, {sql: "SELECT 1/0", wantState: "22012"}},
		fault:  txnFaultTerminate, after: []txnStep{txnInsert401, txnCommit},
		serverErr: "57P01",
	},
	{
		name:    "statement_running_in_transaction",
		before:  []txnStep{txnBegin, txnInsert400},
		running: &txnSleep,
		fault:   txnFaultTerminate, after: []txnStep{txnInsert401, txnCommit},
		serverErr: "57P01",
	},
	{
		name:    "statement_running_outside_transaction",
		before:  []txnStep{txnInsert400},
		running: &txnSleep,
		fault:   txnFaultTerminate, after: []txnStep{txnInsert401},
		wantRows: []int32{400}, serverErr: "57P01",
	},
	{
		name:   "pinned_outside_transaction",
		before: []txnStep{txnLock, txnInsert400, txnPid},
		fault:  txnFaultTerminate, after: []txnStep{txnInsert401, {sql: "SELECT pg_advisory_unlock($1)", args: []any{txnLockKey}}},
		wantRows: []int32{400}, serverErr: "57P01",
	},
	{
		name:   "pinned_inside_transaction",
		before: []txnStep{txnLock, txnBegin, txnInsert400, txnPid},
		fault:  txnFaultTerminate, after: []txnStep{txnInsert401, txnCommit},
		serverErr: "57P01",
	},
	{
		name:   "transaction_lock_unpinned",
		before: []txnStep{txnBegin, {sql: "SELECT pg_advisory_xact_lock($1)", args: []any{txnLockKey}}, txnInsert400, txnPid},
		fault:  txnFaultTerminate, after: []txnStep{txnInsert401, txnCommit},
		serverErr: "57P01",
	},
	{
		name:     "idle_in_transaction_session_timeout",
		idleRole: true,
		before:   []txnStep{txnBegin, txnInsert400, txnPid},
		fault:    txnFaultIdleTimeout, after: []txnStep{txnInsert401, txnCommit},
		serverErr: "25P03",
	},
	{
		name:   "idle_outside_transaction",
		before: []txnStep{txnInsert400},
		fault:  txnFaultTerminateIdle, after: []txnStep{txnInsert401, {sql: "SELECT 1"}},
		wantRows: []int32{400, 401}, invisible: true,
	},
}

// txnSetup makes the roles, the idle timeout of txnIdleRole and returns a
// superuser connection to txnDB.
func txnSetup(t *testing.T) (*pgtest.Cluster, *pgx.Conn) {
	t.Helper()
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, txnRole)
	testenv.EnsureRole(t, c, txnIdleRole)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Exec(ctx, "postgres", "ALTER ROLE "+txnIdleRole+" SET idle_in_transaction_session_timeout = '300ms'"); err != nil {
		t.Fatal(err)
	}
	return c, superConn(t, txnDB)
}

// txnTable creates an empty table (v int) any role may write.
func txnTable(ctx context.Context, t *testing.T, su *pgx.Conn, name string) {
	t.Helper()
	if _, err := su.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (v int); GRANT ALL ON %[1]s TO PUBLIC", name)); err != nil {
		t.Fatal(err)
	}
}

// txnLockpool starts a lockpool for txnRole and txnIdleRole (pin policy).
func txnLockpool(t *testing.T) txnEndpoint {
	t.Helper()
	app := func(user string) appYAML {
		return appYAML{name: user, user: user, db: txnDB, max: 4, pinned: 1, advisory: "pin", state: "pin", wait: "5s"}
	}
	l := startLockpool(t, 10, "", app(txnRole), app(txnIdleRole))
	return txnEndpoint{port: l.port}
}

// TestTxnBoundaryServerLoss loses the server connection in every state a
// client can be in and checks what the client sees and what was committed.
func TestTxnBoundaryServerLoss(t *testing.T) {
	c, su := txnSetup(t)
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		skipOrFail(t, "psql not installed")
	}
	for _, target := range []string{"direct", "lockpool"} {
		t.Run(target, func(t *testing.T) {
			for _, kind := range txnClientKinds {
				t.Run(string(kind), func(t *testing.T) {
					for i, tc := range txnLossCases {
						if tc.invisible && target == "direct" {
							continue // a direct client's own connection is the one that dies
						}
						t.Run(tc.name, func(t *testing.T) {
							ep := txnEndpoint{port: c.Port}
							if target == "lockpool" {
								ep = txnLockpool(t)
							}
							table := fmt.Sprintf("txb_%s_%s_%d", target, kind, i)
							txnRunLossCase(t, su, kind, ep, table, tc, target == "lockpool")
						})
					}
				})
			}
		})
	}
}

// txnRunLossCase runs one loss case with one client and checks what the
// client saw, that it was closed, and what the table holds.
func txnRunLossCase(t *testing.T, su *pgx.Conn, kind txnClientKind, ep txnEndpoint, table string, tc txnLossCase, viaLockpool bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	txnTable(ctx, t, su, table)
	role := txnRole
	if tc.idleRole {
		role = txnIdleRole
	}
	cl := txnConnect(ctx, t, kind, ep, role, txnDB)
	run := func(st txnStep) txnResult {
		return cl.exec(ctx, strings.ReplaceAll(st.sql, "{t}", table), st.args, st.pid)
	}

	pid := 0
	for _, st := range tc.before {
		r := run(st)
		if r.state != st.wantState || (st.wantState == "" && r.err != nil) {
			t.Fatalf("before the loss: %s: want SQLSTATE %q, got %v\n%s", st.sql, st.wantState, r, cl.output())
		}
		if st.pid {
			if pid, _ = strconv.Atoi(r.value); pid == 0 {
				t.Fatalf("no backend pid in %v\n%s", r, cl.output())
			}
		}
	}

	var results []txnResult
	var runningDone chan txnResult
	if tc.running != nil {
		runningDone = make(chan txnResult, 1)
		st := *tc.running
		go func() { runningDone <- run(st) }()
		eventually(t, 10*time.Second, "the statement to run on the server", func() bool {
			err := su.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'PgSleep'", role).Scan(&pid)
			return err == nil
		})
	}
	switch tc.fault {
	case txnFaultTerminate:
		txnTerminate(ctx, t, su, pid)
	case txnFaultIdleTimeout:
		txnWaitGone(ctx, t, su, pid)
	case txnFaultTerminateIdle:
		rows, err := su.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND state = 'idle' AND backend_type = 'client backend' AND application_name NOT LIKE 'lockpool%'", role)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 0 {
			t.Fatalf("no idle server connection of %s to terminate", role)
		}
		for _, p := range pids {
			txnTerminate(ctx, t, su, int(p))
		}
	}
	if runningDone != nil {
		select {
		case r := <-runningDone:
			results = append(results, r)
		case <-ctx.Done():
			t.Fatalf("the running statement did not end after the loss\n%s", cl.output())
		}
	}
	for _, st := range tc.after {
		results = append(results, run(st))
	}

	got := txnRows(ctx, t, su, table)
	if !slices.Equal(got, tc.wantRows) {
		t.Errorf("table %s holds %v after the loss, want %v (a statement sent after the loss ran)", table, got, tc.wantRows)
	}

	if tc.invisible {
		for i, r := range results {
			if r.err != nil {
				t.Errorf("statement %d after the idle server connection died: %v (want it to just work)", i+1, r)
			}
		}
		if cl.closed(ctx) {
			t.Errorf("client connection closed after its idle server connection died")
		}
		if t.Failed() {
			t.Logf("client transcript:\n%s", cl.output())
		}
		return
	}

	want := []string{tc.serverErr}
	if viaLockpool {
		want = append(want, "08006")
	}
	first := results[0]
	switch {
	case first.err == nil:
		t.Errorf("the first statement after the loss succeeded (%v): want FATAL %v", first, want)
	case first.state == "":
		t.Errorf("the first statement after the loss failed without an error from the server (%v): want FATAL %v", first, want)
	default:
		if !slices.Contains(want, first.state) || first.severity != "FATAL" {
			t.Errorf("the first statement after the loss got %v: want FATAL %v", first, want)
		}
		if first.state == "08006" && !strings.HasPrefix(first.message, "lockpool:") {
			t.Errorf("08006 message %q does not start with lockpool:", first.message)
		}
	}
	for i, r := range results[1:] {
		if r.err == nil || r.state != "" {
			t.Errorf("statement %d after the loss: %v: want it not sent (the connection is closed)", i+2, r)
		}
	}
	if !cl.closed(ctx) {
		t.Errorf("client connection still open after the loss")
	}
	if t.Failed() {
		t.Logf("client transcript:\n%s", cl.output())
	}
}

// TestTxnBoundaryBeginPoolTimeout: a BEGIN that fails because the
// application's pool stayed exhausted for wait_timeout leaves the client in
// a failed transaction, as a BEGIN that failed on the server would; a
// failed statement outside a transaction leaves it idle and free to retry.
func TestTxnBoundaryBeginPoolTimeout(t *testing.T) {
	_, su := txnSetup(t)
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		skipOrFail(t, "psql not installed")
	}
	type step struct {
		holder     string // a statement for the holder (who keeps the only server connection busy)
		client     txnStep
		wantTag    string // the command tag the client must see ("" = any)
		wantStatus byte   // the client's transaction status after the step (pgx only; 0 = any)
	}
	ins := func(v int, state string) txnStep {
		return txnStep{sql: "INSERT INTO {t} VALUES ($1)", args: []any{v}, wantState: state}
	}
	steps := []step{
		{holder: "BEGIN"},
		{holder: "SELECT 1"},
		{client: txnStep{sql: "BEGIN", wantState: "53300"}, wantStatus: 'E'},
		{holder: "COMMIT"},
		{client: ins(401, "25P02"), wantStatus: 'E'},
		{client: txnStep{sql: "SELECT 1", wantState: "25P02"}, wantStatus: 'E'},
		{client: txnStep{sql: "COMMIT"}, wantTag: "ROLLBACK", wantStatus: 'I'},
		{client: ins(402, ""), wantStatus: 'I'},
		{holder: "BEGIN"},
		{holder: "SELECT 1"},
		{client: ins(403, "53300"), wantStatus: 'I'},
		{holder: "COMMIT"},
		{client: ins(403, ""), wantTag: "INSERT 0 1", wantStatus: 'I'},
		{client: txnBegin, wantTag: "BEGIN", wantStatus: 'T'},
		{client: ins(404, ""), wantStatus: 'T'},
		{client: txnCommit, wantTag: "COMMIT", wantStatus: 'I'},
	}
	wantRows := []int32{402, 403, 404}

	for i, kind := range txnClientKinds {
		t.Run(string(kind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			table := fmt.Sprintf("txb_pooltimeout_%d", i)
			txnTable(ctx, t, su, table)
			l := startLockpool(t, 10, "", appYAML{name: txnRole, user: txnRole, db: txnDB, max: 1, pinned: 0,
				advisory: "pin", state: "pin", wait: "200ms"})
			ep := txnEndpoint{port: l.port}
			holder := l.connect(t, txnRole, txnDB)
			cl := txnConnect(ctx, t, kind, ep, txnRole, txnDB)
			for n, s := range steps {
				if s.holder != "" {
					if _, err := holder.Exec(ctx, s.holder); err != nil {
						t.Fatalf("step %d: holder %s: %v", n, s.holder, err)
					}
					continue
				}
				r := cl.exec(ctx, strings.ReplaceAll(s.client.sql, "{t}", table), s.client.args, false)
				if r.state != s.client.wantState || (s.client.wantState == "" && r.err != nil) {
					t.Errorf("step %d: %s %v: got %v, want SQLSTATE %q", n, s.client.sql, s.client.args, r, s.client.wantState)
				}
				if s.wantTag != "" && r.tag != s.wantTag {
					t.Errorf("step %d: %s: command tag %q, want %q", n, s.client.sql, r.tag, s.wantTag)
				}
				if st := cl.txStatus(); s.wantStatus != 0 && st != 0 && st != s.wantStatus {
					t.Errorf("step %d: %s: transaction status %q, want %q", n, s.client.sql, st, s.wantStatus)
				}
			}
			if got := txnRows(ctx, t, su, table); !slices.Equal(got, wantRows) {
				t.Errorf("table holds %v, want %v", got, wantRows)
			}
			if t.Failed() {
				t.Logf("client transcript:\n%s", cl.output())
			}
		})
	}
}

// TestTxnBoundaryFatalIsLast checks on the wire that after the server
// connection dies inside a transaction, the client's next Query gets a
// FATAL and then the end of the stream: no ReadyForQuery, no other message,
// exactly as from PostgreSQL directly.
func TestTxnBoundaryFatalIsLast(t *testing.T) {
	c, su := txnSetup(t)
	for _, target := range []string{"direct", "lockpool"} {
		t.Run(target, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			port := c.Port
			if target == "lockpool" {
				port = txnLockpool(t).port
			}
			dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", port, txnRole, appPassword, txnDB)
			fe, nc := rawClient(t, ctx, dsn)
			got := wireTrace(t, fe, nc, []wireRound{
				{send: []pgproto3.FrontendMessage{&pgproto3.Query{String: "BEGIN"}}, read: 2},
				{send: []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT pg_backend_pid()"}}, read: 4},
			})
			if len(got) != 2 || got[0] != "C:BEGIN Z:T" || !strings.HasPrefix(got[1], "T D:") {
				t.Fatalf("before the loss: %q", got)
			}
			pid, _ := strconv.Atoi(strings.Fields(got[1])[1][2:])
			txnTerminate(ctx, t, su, pid)
			fe.Send(&pgproto3.Query{String: "SELECT 1"})
			if err := fe.Flush(); err != nil {
				if target == "lockpool" {
					// lockpool closes a client idle in a transaction only
					// when it speaks again: a close before that would have
					// sent nothing at all.
					t.Fatalf("lockpool closed the client before its next query: %v", err)
				}
				t.Logf("PostgreSQL closed the socket before the next query: %v", err)
				return // nothing more can come
			}
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			var tags []string
			for {
				msg, err := fe.Receive()
				if err != nil {
					if len(tags) == 0 || !strings.HasPrefix(tags[len(tags)-1], "FATAL:") {
						t.Fatalf("after the loss: %q then %v; want a FATAL as the last message", tags, err)
					}
					if len(tags) != 1 {
						t.Fatalf("after the loss: %q; want exactly one FATAL before the close", tags)
					}
					t.Logf("after the loss: %q, then %v", tags, err)
					return
				}
				if e, ok := msg.(*pgproto3.ErrorResponse); ok {
					tags = append(tags, e.Severity+":"+e.Code)
				} else {
					tags = append(tags, wireTag(msg))
				}
			}
		})
	}
}
