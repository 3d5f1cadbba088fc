package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// Restarts without refusing anyone, on the real binary, done as README.md
// documents them: start a new lockpool with the same configuration beside
// the running one (it takes the listening sockets over handover_socket),
// then SIGTERM the old one. Two restarts in a row (the second one proves
// the new process took the handover socket over too), under pgbench -C (a
// connection per transaction) and under a steady set of pgx clients
// running transactions in a loop.

// steadyClients counts what the steady pgx clients saw.
type steadyClients struct {
	commits   atomic.Int64 // transactions whose COMMIT succeeded
	atBound   atomic.Int64 // closed with 57P01 at a transaction boundary (on BEGIN), then reconnected
	refused   atomic.Int64 // connection attempts that failed
	mu        sync.Mutex
	failures  []string // every other error
	perClient []atomic.Int64
}

func (s *steadyClients) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, fmt.Sprintf(format, args...))
}

// run is one steady client: BEGIN, INSERT, COMMIT in a loop until stop,
// reconnecting after a 57P01 (or any failure, which is counted).
func (s *steadyClients) run(ctx context.Context, dsn, table string, id int, stop <-chan struct{}) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := pgx.Connect(cctx, dsn)
			cancel()
			if err != nil {
				s.refused.Add(1)
				s.fail("client %d: connect: %v", id, err)
				continue
			}
			conn = c
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			if sqlState(err) == "57P01" {
				s.atBound.Add(1)
			} else {
				s.fail("client %d: BEGIN: %v", id, err)
			}
			_ = conn.Close(ctx)
			conn = nil
			continue
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (client, seq) VALUES ($1, $2)", id, seq); err != nil {
			s.fail("client %d: INSERT inside the transaction: %v", id, err)
			_ = conn.Close(ctx)
			conn = nil
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			s.fail("client %d: COMMIT: %v", id, err)
			_ = conn.Close(ctx)
			conn = nil
			continue
		}
		s.commits.Add(1)
		s.perClient[id].Add(1)
	}
}

func TestRollingRestartRefusesNoOne(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/pgbench"); err != nil {
		skipOrFail(t, "pgbench not installed")
	}
	c := pgtest.Require(t)
	ctx := context.Background()
	dir := t.TempDir()
	sock := filepath.Join(dir, "handover.sock")
	adminPort := freePort(t)
	p0 := testenv.StartLockpoolProcess(t, func(port int) string {
		return testenv.AppsYAML(c, 16, fmt.Sprintf("listen: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:%d\nhandover_socket: %s\nshutdown_timeout: 20s\nauth_method: trust", port, adminPort, sock),
			testenv.App{Name: "roll", User: "app", DB: "appdb", Max: 8, Pinned: 1, Advisory: "pin", State: "pin", Wait: "30s"})
	})

	benchTable, steadyTable := uniqueName(t, "bench"), uniqueName(t, "steady")
	super := superConn(t, "appdb")
	for _, tbl := range []string{benchTable, steadyTable} {
		if _, err := super.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %[1]s (client int, seq int); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(tbl string) int64 {
		var n int64
		if err := super.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// pgbench -C: a new connection for every transaction, the whole time.
	script := filepath.Join(dir, "insert.sql")
	if err := os.WriteFile(script, []byte(fmt.Sprintf("BEGIN;\nINSERT INTO %s (client, seq) VALUES (:client_id, 0);\nEND;\n", benchTable)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Long enough for two restarts on a loaded machine; rate-limited so the
	// connection churn does not starve everything else.
	const benchSeconds, benchRate = 30, 300
	bctx, bcancel := context.WithTimeout(ctx, 90*time.Second)
	defer bcancel()
	bench := exec.CommandContext(bctx, "/usr/bin/pgbench", "-h", "127.0.0.1", "-p", strconv.Itoa(p0.Port), "-U", "app",
		"-C", "-c", "4", "-j", "2", "-T", strconv.Itoa(benchSeconds), "-R", strconv.Itoa(benchRate), "-n", "-f", script, "appdb")
	bench.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable")
	var benchOut strings.Builder
	bench.Stdout, bench.Stderr = &benchOut, &benchOut
	if err := bench.Start(); err != nil {
		t.Fatal(err)
	}
	var benchErr error
	benchDone := make(chan struct{}) // closed once benchErr is set
	go func() { benchErr = bench.Wait(); close(benchDone) }()
	defer func() {
		_ = bench.Process.Kill() // if still running
		<-benchDone
	}()

	// The steady clients.
	const clients = 4
	steady := &steadyClients{perClient: make([]atomic.Int64, clients)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			steady.run(ctx, p0.DSN("app", "appdb"), steadyTable, i, stop)
		}()
	}
	stopSteady := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopSteady()

	// progress waits until every steady client committed more (it is
	// connected and served).
	progress := func(what string) {
		t.Helper()
		before := make([]int64, clients)
		for i := range before {
			before[i] = steady.perClient[i].Load()
		}
		eventually(t, 15*time.Second, what, func() bool {
			for i := range before {
				if steady.perClient[i].Load() < before[i]+5 {
					return false
				}
			}
			return true
		})
	}
	progress("every steady client to commit through the first lockpool")

	old := p0
	for restart := 1; restart <= 2; restart++ {
		// The new process, beside the old one.
		started := time.Now()
		next := testenv.StartLockpoolBeside(t, old)
		logged := time.Since(started)
		// Listening: the new process confirms to the old one once it holds
		// the sockets and its accept loop runs; the old one logs it.
		confirmed := fmt.Sprintf("successor_pid=%d", next.PID())
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		ok := old.Log.WaitFor(wctx, "listeners handed over; the successor accepts. Send SIGTERM to this process to finish the restart\" "+confirmed, old.Done())
		wcancel()
		accepting := time.Since(started)
		if !ok {
			t.Fatalf("restart %d: the old process did not log the new one's confirmation:\n%s", restart, old.Log.String())
		}
		// Both accept from the same queue now; a query answered by the new one.
		servedAfter := firstServedBy(t, next, started)
		t.Logf("restart %d: new pid %d logged that it listens %v after its start, accepted (confirmed) %v and answered a query %v after its start",
			restart, next.PID(), logged.Round(time.Millisecond), accepting.Round(time.Millisecond), servedAfter.Round(time.Millisecond))
		if accepting > time.Second {
			t.Errorf("restart %d: the new process accepted on the listeners %v after its start, want within 1 s", restart, accepting)
		}
		// Its first answer (firstServedBy fails after 10 s) is not bounded
		// by 1 s: it waits for the new process's first dial to PostgreSQL (a
		// backend start and SCRAM: over a second on an overloaded machine)
		// and for a probe to win the race for a connection against the old
		// process, which answers meanwhile.
		if !strings.Contains(next.Log.String(), fmt.Sprintf(`took the listening sockets from the running lockpool" from_pid=%d`, old.PID())) {
			t.Fatalf("restart %d: the new process did not take the listeners from pid %d:\n%s", restart, old.PID(), next.Log.String())
		}

		// Then SIGTERM to the old one: it exits 0.
		if err := old.Stop(30 * time.Second); err != nil {
			t.Fatalf("restart %d: old lockpool pid %d: %v, want exit status 0\n%s", restart, old.PID(), err, old.Log.String())
		}
		if !strings.Contains(old.Log.String(), `shutting down" signal=terminated timeout=20s `+confirmed) {
			t.Errorf("restart %d: the old process did not shut down as handed over:\n%s", restart, old.Log.String())
		}
		select {
		case <-benchDone:
			t.Fatalf("restart %d: pgbench ended before the restarts were done (raise -T): %v\n%s", restart, benchErr, benchOut.String())
		default:
		}
		progress(fmt.Sprintf("every steady client to commit through the new lockpool after restart %d", restart))
		old = next
	}
	if code, body := getAdmin(t, adminPort, "/up"); code != 200 {
		t.Errorf("admin /up through the handed-over admin listener: %d %s", code, body)
	}

	stopSteady()
	select {
	case <-benchDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("pgbench still running 60 s after the restarts")
	}
	out := benchOut.String()
	t.Logf("pgbench -C:\n%s", out)
	if benchErr != nil {
		t.Errorf("pgbench -C exited with %v (a refused connection aborts its client)", benchErr)
	}
	// pgbench's own connections that the old process accepted before it
	// stopped accepting ran their transaction and were then closed with
	// 57P01; libpq prints that FATAL, read after the transaction ended.
	atBound := 0
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "FATAL:  lockpool: terminating connection because lockpool is shutting down"):
			atBound++
		case strings.HasPrefix(line, "HINT:  Reconnect"):
		case strings.Contains(line, "FATAL") || strings.Contains(line, "ERROR") || strings.Contains(line, "abort") || strings.Contains(line, "error"):
			t.Errorf("pgbench -C printed %q", line)
		}
	}
	t.Logf("pgbench -C: %d connections closed with 57P01 after their transaction", atBound)
	failed := regexp.MustCompile(`number of failed transactions: (\d+)`).FindStringSubmatch(out)
	processed := regexp.MustCompile(`number of transactions actually processed: (\d+)`).FindStringSubmatch(out)
	if failed == nil || processed == nil {
		t.Fatalf("pgbench output has no failed/processed counts")
	}
	if failed[1] != "0" || strings.Contains(out, "aborted") {
		t.Errorf("pgbench -C: %s failed transactions (or aborted clients), want 0", failed[1])
	}
	if n, _ := strconv.ParseInt(processed[1], 10, 64); n == 0 || rows(benchTable) != n {
		t.Errorf("pgbench -C processed %s transactions, %d rows in %s", processed[1], rows(benchTable), benchTable)
	}

	t.Logf("steady clients: %d commits, %d closed with 57P01 at a boundary and reconnected, %d refused connections, %d other failures",
		steady.commits.Load(), steady.atBound.Load(), steady.refused.Load(), len(steady.failures))
	if steady.refused.Load() != 0 || len(steady.failures) != 0 {
		t.Errorf("steady clients: %d refused connections and these failures, want none:\n%s", steady.refused.Load(), strings.Join(steady.failures, "\n"))
	}
	if got := steady.atBound.Load(); got != 2*clients {
		t.Errorf("steady clients were closed with 57P01 %d times, want %d (each client once per restart)", got, 2*clients)
	}
	if n := rows(steadyTable); n != steady.commits.Load() {
		t.Errorf("steady clients counted %d commits, %s has %d rows", steady.commits.Load(), steadyTable, n)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("the handover socket after the restarts: %v (the last process must serve it)", err)
	}
}

// Handoff, the SIGTERM of a process whose listeners a successor holds:
// an idle client that ran a statement gets 57P01 at once; a client inside a
// transaction finishes it and gets 57P01 after it; a client that logged in
// but ran nothing yet runs its first statement (extended protocol: the
// prepare round trip does not count) or the transaction it opens, then
// gets 57P01. Handoff returns once they are all gone.
func TestHandoffClosesClientsAtBoundaries(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", appYAML{name: "handoff", user: "app", db: "appdb", max: 4, pinned: 1, advisory: "pin", state: "pin", wait: "5s"})
	ctx := context.Background()
	tbl := uniqueName(t, "t")
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %[1]s (id int); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}
	insert := "INSERT INTO " + tbl + " VALUES ($1)"
	used, freshExt, freshSimple, inTx := l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")
	if _, err := used.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	tx, err := inTx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insert, 1); err != nil {
		t.Fatal(err)
	}
	clients := func() float64 { return l.metric("lockpool_client_connections", map[string]string{"app": "handoff"}) }
	if n := clients(); n != 4 {
		t.Fatalf("lockpool_client_connections = %v before the handoff, want 4", n)
	}

	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	handedOff := make(chan error, 1)
	go func() { handedOff <- l.srv.Handoff(hctx) }()
	eventually(t, 10*time.Second, "the idle client that ran a statement to be closed", func() bool { return clients() == 3 })
	pgErr(t, func() error { _, err := used.Exec(ctx, "SELECT 1"); return err }(), "57P01")

	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"the fresh client's first statement (extended protocol)", func() error { _, err := freshExt.Exec(ctx, insert, 2); return err }},
		{"the other fresh client's BEGIN", func() error {
			_, err := freshSimple.Exec(ctx, "BEGIN", pgx.QueryExecModeSimpleProtocol)
			return err
		}},
		{"its INSERT", func() error { _, err := freshSimple.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, 3); return err }},
		{"its COMMIT", func() error { _, err := freshSimple.Exec(ctx, "COMMIT", pgx.QueryExecModeSimpleProtocol); return err }},
		{"the running transaction's next statement", func() error { _, err := tx.Exec(ctx, insert, 4); return err }},
		{"its COMMIT", func() error { return tx.Commit(ctx) }},
	} {
		if err := step.run(); err != nil {
			t.Fatalf("%s during the handoff: %v", step.name, err)
		}
	}
	for name, c := range map[string]*pgx.Conn{"fresh (extended)": freshExt, "fresh (simple)": freshSimple, "in a transaction": inTx} {
		_, err := c.Exec(ctx, "SELECT 1")
		if sqlState(err) != "57P01" {
			t.Errorf("client %s: the statement after its transaction: %v, want 57P01", name, err)
		}
	}
	select {
	case err := <-handedOff:
		if err != nil {
			t.Fatalf("Handoff: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("Handoff still running 15 s after its last client was closed")
	}
	var ids []int
	rows, err := super.Query(ctx, "SELECT id FROM "+tbl+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil || fmt.Sprint(ids) != "[1 2 3 4]" {
		t.Fatalf("rows after the handoff: %v %v, want [1 2 3 4]", ids, rows.Err())
	}
}

// A new process that finds no running lockpool to take over from binds
// its listeners as without a handover, and serves the handover socket for
// the next restart: after the running one was killed (a stale socket file
// is left), and when the running one refuses because the new process's
// configuration asks for another listen address (the running one keeps the
// handover socket then).
func TestHandoverFallsBackToBinding(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// start starts the second process beside (or after) first.
		start func(t *testing.T, first *testenv.LockpoolProcess, config func(int) string) *testenv.LockpoolProcess
		says  string // in the second process's log
		// next is the process a third one, with first's configuration,
		// takes the listeners from: 1 first, 2 the second.
		next int
	}{
		{"the running process was killed", func(t *testing.T, first *testenv.LockpoolProcess, _ func(int) string) *testenv.LockpoolProcess {
			first.Kill()
			return testenv.StartLockpoolBeside(t, first)
		}, "no running lockpool answers on the handover socket; binding the listeners", 2},
		{"listen differs", func(t *testing.T, _ *testenv.LockpoolProcess, config func(int) string) *testenv.LockpoolProcess {
			return testenv.StartLockpoolProcess(t, config) // another free port
		}, `handover refused by the running lockpool; binding the listeners as without a handover, and leaving it the handover socket"`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "handover.sock")
			config := func(port int) string {
				return testenv.AppsYAML(c, 4, fmt.Sprintf("listen: 127.0.0.1:%d\nhandover_socket: %s\nauth_method: trust", port, sock),
					testenv.App{Name: "fallback", User: "app", DB: "appdb", Max: 2, Pinned: 1, Advisory: "pin", State: "pin", Wait: "5s"})
			}
			first := testenv.StartLockpoolProcess(t, config)
			second := tc.start(t, first, config)
			if !strings.Contains(second.Log.String(), tc.says) {
				t.Fatalf("the second process's log does not say %q:\n%s", tc.says, second.Log.String())
			}
			conn, err := pgx.Connect(ctx, second.DSN("app", "appdb"))
			if err != nil {
				t.Fatalf("connecting to the second process: %v", err)
			}
			var one int
			err = conn.QueryRow(ctx, "SELECT 1").Scan(&one)
			by, perr := testenv.ServedBy(second.PID(), conn.PgConn().Conn())
			_ = conn.Close(ctx)
			if err != nil || perr != nil || !by || one != 1 {
				t.Fatalf("a query through the second process's port: %d, %v; served by it: %v %v", one, err, by, perr)
			}
			owners := map[int]*testenv.LockpoolProcess{1: first, 2: second}
			third := testenv.StartLockpoolBeside(t, first)
			want := fmt.Sprintf(`took the listening sockets from the running lockpool" from_pid=%d`, owners[tc.next].PID())
			if !strings.Contains(third.Log.String(), want) {
				t.Fatalf("a third process with the first one's configuration did not take the listeners from process %d (pid %d):\n%s",
					tc.next, owners[tc.next].PID(), third.Log.String())
			}
		})
	}
}

// firstServedBy is how long after started a query through the shared
// port was first answered by the process next rather than the old one
// (both accept on the same socket until the old one gets SIGTERM). Four
// probes connect at once, again and again; it fails t after 10 s.
func firstServedBy(t *testing.T, next *testenv.LockpoolProcess, started time.Time) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found := make(chan time.Duration, 4)
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() {
			for ctx.Err() == nil {
				conn, err := pgx.Connect(ctx, next.DSN("app", "appdb"))
				if err != nil {
					errs <- err
					return
				}
				var one int
				err = conn.QueryRow(ctx, "SELECT 1").Scan(&one)
				at := time.Since(started)
				by, perr := testenv.ServedBy(next.PID(), conn.PgConn().Conn())
				_ = conn.Close(context.Background())
				switch {
				case err != nil || perr != nil:
					errs <- fmt.Errorf("query %v, finding its process %v", err, perr)
					return
				case by:
					found <- at
					return
				}
			}
		}()
	}
	select {
	case d := <-found:
		return d
	case err := <-errs:
		if ctx.Err() == nil {
			t.Fatalf("a probe while both processes accept: %v", err)
		}
	case <-ctx.Done():
	}
	t.Fatalf("the new process answered no query within 10 s of its start")
	return 0
}

// getAdmin is a GET of path on the admin port: its status and body.
func getAdmin(t *testing.T, port int, path string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
