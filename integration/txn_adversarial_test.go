package integration

// A transaction is all or nothing, under faults, with an oracle. Clients
// (pgx in its default mode, pgx with the simple protocol, and psql
// processes fed over stdin) run transactions of three inserts, carelessly:
// after an error they send the rest of the transaction anyway, as an
// application that does not check would. Meanwhile backends are
// terminated every 50 ms, PostgreSQL is restarted, and the server's
// idle_in_transaction_session_timeout (50 ms) ends transactions whose
// client thinks too long. The table is the truth: every transaction left
// either no row or exactly its three rows, written by one server
// transaction; every COMMIT a client saw succeed left its rows; every
// transaction rolled back on purpose left none.
//
// The same workload runs directly against PostgreSQL as the control
// (it must find no violation either, or the oracle is wrong), then
// through lockpool.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	advRole = "txadv"
	advDB   = "txadvdb"
)

// advTxn is one transaction a client attempted.
type advTxn struct {
	id        int64
	client    string // e.g. "pgx_simple#3", for violation reports
	rollback  bool   // ends with ROLLBACK on purpose
	committed bool   // the client saw its COMMIT succeed (command tag COMMIT)
}

// advRecorder collects the attempted transactions of all clients.
type advRecorder struct {
	mu      sync.Mutex
	txns    []advTxn
	started atomic.Int64 // transactions begun: BEGIN sent (pgx) or its start marker echoed (psql)
	target  int64
}

func (r *advRecorder) add(tx advTxn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.txns = append(r.txns, tx)
}

// more reports whether clients should start another transaction.
func (r *advRecorder) more() bool { return r.started.Load() < r.target }

// advThink is a client's pause between statements of a transaction: mostly
// 0-20 ms, sometimes longer than the server's 50 ms idle-in-transaction
// timeout.
func advThink(rng *rand.Rand) time.Duration {
	if rng.Intn(20) == 0 {
		return time.Duration(60+rng.Intn(20)) * time.Millisecond
	}
	return time.Duration(rng.Intn(21)) * time.Millisecond
}

// advPgxClient runs transactions on one pgx connection at a time: it
// ignores errors and sends the next statements on the same connection until
// pgx reports it closed, then reconnects.
func advPgxClient(ctx context.Context, rec *advRecorder, name string, idx int, cfg *pgx.ConnConfig, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	var conn *pgx.Conn
	var err error
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for n := int64(1); ctx.Err() == nil && rec.more(); n++ {
		if conn == nil || conn.IsClosed() {
			if conn != nil {
				_ = conn.Close(ctx)
			}
			conn, err = pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				conn = nil
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
		}
		tx := advTxn{id: int64(idx)*1_000_000 + n, client: name, rollback: rng.Intn(10) == 0}
		end := "COMMIT"
		if tx.rollback {
			end = "ROLLBACK"
		}
		rec.started.Add(1)
		stmts := []struct {
			sql  string
			args []any
		}{
			{"BEGIN", nil},
			{"INSERT INTO t (id, step) VALUES ($1, $2)", []any{tx.id, 1}},
			{"", nil},
			{"INSERT INTO t (id, step) VALUES ($1, $2)", []any{tx.id, 2}},
			{"", nil},
			{"INSERT INTO t (id, step) VALUES ($1, $2)", []any{tx.id, 3}},
			{end, nil},
		}
		for _, st := range stmts {
			if st.sql == "" {
				time.Sleep(advThink(rng))
				continue
			}
			if conn.IsClosed() {
				break
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			tag, err := conn.Exec(sctx, st.sql, st.args...)
			cancel()
			if st.sql == "COMMIT" && err == nil && tag.String() == "COMMIT" {
				tx.committed = true
			}
		}
		rec.add(tx)
	}
}

// advPsqlClient runs batches of transactions, one psql process per batch,
// with ON_ERROR_STOP off: the script goes on after errors. Markers echoed
// around each transaction tell which COMMITs psql reported as COMMIT.
func advPsqlClient(ctx context.Context, rec *advRecorder, name string, idx int, ep txnEndpoint, seed int64) {
	const batch = 20
	rng := rand.New(rand.NewSource(seed))
	n := int64(0)
	for ctx.Err() == nil && rec.more() {
		var planned []advTxn
		for i := 0; i < batch; i++ {
			n++
			planned = append(planned, advTxn{id: int64(idx)*1_000_000 + n, client: name, rollback: rng.Intn(10) == 0})
		}
		seen, committed := advPsqlBatch(ctx, rec, ep, planned, rng)
		for _, tx := range planned {
			if seen[tx.id] {
				tx.committed = committed[tx.id]
				rec.add(tx)
			}
		}
		if len(seen) == 0 {
			// psql could not even start a transaction (PostgreSQL or the
			// proxy refused the login): back off a little.
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// advPsqlBatch feeds one psql process the planned transactions, pausing
// between statements, and returns which transactions psql began (their
// start marker appeared) and which it reported committed.
func advPsqlBatch(ctx context.Context, rec *advRecorder, ep txnEndpoint, planned []advTxn, rng *rand.Rand) (seen, committed map[int64]bool) {
	seen, committed = map[int64]bool{}, map[int64]bool{}
	cmd := txnPsqlCommand(ep, advRole, advDB)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return seen, committed
	}
	r, w, err := os.Pipe()
	if err != nil {
		return seen, committed
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return seen, committed
	}
	w.Close()
	exited := make(chan struct{})
	var lines []string
	go func() {
		defer close(exited)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "@@begin ") {
				rec.started.Add(1)
			}
			lines = append(lines, sc.Text())
		}
	}()
	write := func(s string) bool {
		select {
		case <-exited:
			return false
		default:
		}
		_, err := io.WriteString(stdin, s)
		return err == nil
	}
	ins := func(id int64, step int) string {
		return fmt.Sprintf("INSERT INTO t (id, step) VALUES (%d, %d);\n", id, step)
	}
feed:
	for _, tx := range planned {
		if ctx.Err() != nil || !rec.more() {
			break
		}
		end := "COMMIT"
		if tx.rollback {
			end = "ROLLBACK"
		}
		parts := []string{
			fmt.Sprintf("\\echo @@begin %d\nBEGIN;\n%s", tx.id, ins(tx.id, 1)),
			ins(tx.id, 2),
			ins(tx.id, 3) + end + ";\n" + fmt.Sprintf("\\echo @@end %d\n", tx.id),
		}
		for i, p := range parts {
			if i > 0 {
				time.Sleep(advThink(rng))
			}
			if !write(p) {
				break feed
			}
		}
	}
	_ = stdin.Close()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	_ = cmd.Wait()

	cur, last := int64(-1), ""
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "@@begin "):
			cur, _ = strconv.ParseInt(strings.TrimPrefix(line, "@@begin "), 10, 64)
			seen[cur] = true
			last = ""
		case strings.HasPrefix(line, "@@end "):
			id, _ := strconv.ParseInt(strings.TrimPrefix(line, "@@end "), 10, 64)
			if id == cur && last == "COMMIT" {
				committed[id] = true
			}
			cur = -1
		case txnTagLine.MatchString(line) || txnErrLine.MatchString(line):
			last = line
		}
	}
	return seen, committed
}

// advFaults terminates a random backend of advRole every 50 ms and
// restarts PostgreSQL when the clients have started a third and two thirds
// of their transactions. It returns when ctx ends, with PostgreSQL up.
func advFaults(ctx context.Context, t *testing.T, c *pgtest.Cluster, rec *advRecorder) (kills, restarts int) {
	var su *pgx.Conn
	defer func() {
		if su != nil {
			_ = su.Close(context.Background())
		}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	nextRestart := []int64{rec.target / 3, 2 * rec.target / 3}
	for {
		select {
		case <-ctx.Done():
			return kills, restarts
		case <-tick.C:
		}
		if len(nextRestart) > 0 && rec.started.Load() >= nextRestart[0] {
			nextRestart = nextRestart[1:]
			if su != nil {
				_ = su.Close(ctx)
				su = nil
			}
			if err := c.Restart(); err != nil {
				t.Errorf("restart PostgreSQL: %v", err)
				return kills, restarts
			}
			restarts++
			continue
		}
		if su == nil || su.IsClosed() {
			var err error
			if su, err = pgx.Connect(ctx, c.SuperuserDSN(advDB)); err != nil {
				su = nil
				continue
			}
		}
		var pid *int32
		err := su.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
WHERE usename = $1 AND backend_type = 'client backend' AND application_name NOT LIKE 'lockpool%'
ORDER BY random() LIMIT 1`, advRole).Scan(&pid)
		if err != nil || pid == nil {
			continue
		}
		if _, err := su.Exec(ctx, "SELECT pg_terminate_backend($1)", *pid); err == nil {
			kills++
		}
	}
}

// advCheck reads table t and counts the violations of the oracle.
func advCheck(ctx context.Context, t *testing.T, c *pgtest.Cluster, txns []advTxn) (violations int, kinds map[string]int, committed, present int) {
	kinds = map[string]int{}
	su, err := pgx.Connect(ctx, c.SuperuserDSN(advDB))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	type found struct {
		steps []int32
		xmins int
	}
	rows, err := su.Query(ctx, "SELECT id, array_agg(step ORDER BY step), count(DISTINCT xmin::text) FROM t GROUP BY id")
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]found{}
	for rows.Next() {
		var id int64
		var f found
		if err := rows.Scan(&id, &f.steps, &f.xmins); err != nil {
			t.Fatal(err)
		}
		got[id] = f
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	report := func(kind, format string, args ...any) {
		violations++
		kinds[kind]++
		if violations <= 20 {
			t.Errorf("violation: "+format, args...)
		}
	}
	attempted := map[int64]bool{}
	for _, tx := range txns {
		attempted[tx.id] = true
		f, ok := got[tx.id]
		if tx.committed {
			committed++
		}
		if ok {
			present++
		}
		switch {
		case ok && !slices.Equal(f.steps, []int32{1, 2, 3}):
			report("partial", "transaction %d (%s) left steps %v: want none or [1 2 3]", tx.id, tx.client, f.steps)
		case ok && f.xmins != 1:
			report("split", "transaction %d (%s) was written by %d server transactions", tx.id, tx.client, f.xmins)
		case ok && tx.rollback:
			report("rolled back but present", "transaction %d (%s) was rolled back on purpose, yet its rows exist", tx.id, tx.client)
		case !ok && tx.committed:
			report("commit lost", "transaction %d (%s): the client saw COMMIT succeed, yet no row exists", tx.id, tx.client)
		}
	}
	for id, f := range got {
		if !attempted[id] {
			report("unknown", "rows %v of id %d that no client reported attempting", f.steps, id)
		}
	}
	return violations, kinds, committed, present
}

// TestTxnAdversarialAllOrNothing is the randomized fault test with an
// oracle (see the file comment). It runs on a cluster of its own, since it
// restarts PostgreSQL.
func TestTxnAdversarialAllOrNothing(t *testing.T) {
	pgtest.Require(t) // skips (or fails under CI) when PostgreSQL is missing
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		skipOrFail(t, "psql not installed")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := pgtest.Start(sctx)
	cancel()
	if err != nil {
		t.Fatalf("start a private cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Destroy(); err != nil {
			t.Errorf("destroy cluster: %v", err)
		}
	})
	testenv.EnsureRole(t, c, advRole)
	testenv.EnsureDatabase(t, c, advDB, advRole)
	// Clients reconnect after every lost connection, dozens of times a
	// second: trust the test role, so that logins (SCRAM costs milliseconds
	// of CPU on both sides) do not starve the transactions on 2 cores.
	hba := filepath.Join(c.Dir, "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hba, append([]byte("host all "+advRole+" 127.0.0.1/32 trust\n"), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(context.Background(), "postgres",
		"ALTER ROLE "+advRole+" SET idle_in_transaction_session_timeout = '50ms'; SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}

	// The run ends when the clients have begun target transactions; limit
	// only stops a run that cannot get there (a hung proxy, or a machine so
	// loaded that the numbers mean little), which then fails.
	target, control, limit := int64(2000), int64(500), 150*time.Second
	if testing.Short() {
		target, control, limit = 300, 300, 60*time.Second
	}
	for _, tc := range []struct {
		name   string
		target int64
	}{
		// The control: PostgreSQL itself keeps every transaction whole;
		// a violation here is a bug in this test.
		{"direct", control},
		{"lockpool", target},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := txnEndpoint{port: c.Port}
			if tc.name == "lockpool" {
				l, _ := startYAML(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: trust
leak_check_interval: 0s
server:
  host: %s
  port: %d
  max_connections: 40
  connect_timeout: 5s
users:
  - name: %s
applications:
  - name: %[3]s
    user: %[3]s
    database: %s
    max_connections: 16
    max_pinned: 1
    advisory_locks: pin
    wait_timeout: 2s
`, c.Host, c.Port, advRole, advDB))
				ep = txnEndpoint{port: l.port}
			}
			advRun(t, c, ep, tc.target, limit)
		})
	}
}

// advRun runs the workload against ep under faults until the clients have
// begun target transactions (or limit passes), then applies the oracle.
func advRun(t *testing.T, c *pgtest.Cluster, ep txnEndpoint, target int64, limit time.Duration) {
	ctx := context.Background()
	pgxConfig := func(simple bool) *pgx.ConnConfig {
		cfg, err := pgx.ParseConfig(ep.dsn(advRole, advDB))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnectTimeout = 5 * time.Second
		if simple {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}
		return cfg
	}
	if err := c.Exec(ctx, advDB, "DROP TABLE IF EXISTS t; CREATE TABLE t (id bigint NOT NULL, step int NOT NULL); GRANT ALL ON t TO "+advRole); err != nil {
		t.Fatal(err)
	}
	const pgxDefault, pgxSimple, psqls = 7, 7, 4
	rec := &advRecorder{target: target}
	runCtx, stopRun := context.WithTimeout(ctx, limit)
	defer stopRun()
	faultCtx, stopFaults := context.WithCancel(ctx)
	var kills, restarts int
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		kills, restarts = advFaults(faultCtx, t, c, rec)
	}()

	t0 := time.Now()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	var wg sync.WaitGroup
	for i := 0; i < pgxDefault+pgxSimple+psqls; i++ {
		var run func()
		s := seed + int64(i)
		switch {
		case i < pgxDefault:
			cfg := pgxConfig(false)
			run = func() { advPgxClient(runCtx, rec, fmt.Sprintf("pgx_extended#%d", i), i+1, cfg, s) }
		case i < pgxDefault+pgxSimple:
			cfg := pgxConfig(true)
			run = func() { advPgxClient(runCtx, rec, fmt.Sprintf("pgx_simple#%d", i), i+1, cfg, s) }
		default:
			run = func() { advPsqlClient(runCtx, rec, fmt.Sprintf("psql#%d", i), i+1, ep, s) }
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run()
		}()
	}
	wg.Wait()
	stopFaults()
	<-faultsDone
	elapsed := time.Since(t0)

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	violations, kinds, committed, present := advCheck(cctx, t, c, rec.txns)
	rolledBack := 0
	for _, tx := range rec.txns {
		if tx.rollback {
			rolledBack++
		}
	}
	t.Logf("%d transactions in %v (%d clients): %d saw COMMIT, %d left their rows, %d rolled back on purpose; faults: %d terminations, %d restarts, idle_in_transaction_session_timeout 50ms; %d violations %v",
		len(rec.txns), elapsed.Round(time.Millisecond), pgxDefault+pgxSimple+psqls, committed, present, rolledBack, kills, restarts, violations, kinds)
	if violations > 0 {
		t.Errorf("%d of %d transactions were not all or nothing", violations, len(rec.txns))
	}
	if int64(len(rec.txns)) < target {
		t.Errorf("only %d transactions ran within %v, want at least %d", len(rec.txns), limit, target)
	}
	if restarts < 2 {
		t.Errorf("PostgreSQL was restarted %d times, want 2", restarts)
	}
	if committed == 0 || kills == 0 {
		t.Errorf("no load or no faults: %d commits, %d terminations", committed, kills)
	}
}
