package integration

// A graphile-worker fleet (node, integration/node/graphile.js) behind
// lockpool under listen: shared: three worker processes, each run() with
// concurrency 5 and a 20 s poll interval, and 300 jobs added with
// graphile_worker.add_job from the test, one every 30 ms. Run directly
// against PostgreSQL first (the baseline), then through lockpool with one
// application of budget 4 server connections and 2 pin slots.
//
// graphile-worker keeps one pool client per process for LISTEN: it takes it
// from its pg pool and sends `LISTEN "jobs:insert"; LISTEN
// "worker:migrate";` (two statements in one simple Query), then only waits
// for notifications (no ping); on release (shutdown or an error on that
// client) it sends `UNLISTEN "jobs:insert"; UNLISTEN "worker:migrate";` and
// gives the client back to the pool, which uses it for jobs from then on.
// add_job notifies inside the function: `perform pg_notify('jobs:insert',
// '{"r":' || random()::text || ',"count":1}')` (random so that PostgreSQL
// does not fold equal notifications of one transaction); the payload's count
// is how many idle workers a notification wakes.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	wkGraphileRole        = "graphw"
	wkGraphileDB          = "graphiledb"
	wkGraphileProcs       = 3
	wkGraphileConcurrency = 5
	wkGraphileJobs        = 300
	wkGraphileEvery       = 30 * time.Millisecond // one add_job per tick: 300 jobs in 9 s
	wkGraphilePoll        = 20 * time.Second      // pollInterval: polling alone is far slower than LISTEN
	wkGraphileDrainWait   = 10 * time.Second      // after the last add_job, every job must have completed within this
	wkGraphileListenWait  = 10 * time.Second      // for every process to receive a probe notification
)

// wkGraphileCommand is node running graphile.js with env; it skips the test
// (fails it under CI) without node, node-postgres or graphile-worker.
func wkGraphileCommand(ctx context.Context, t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := nodeCommand(ctx, t, "graphile.js", env...)
	if _, err := os.Stat(filepath.Join(cmd.Dir, "node_modules", "graphile-worker", "package.json")); err != nil {
		skipOrFail(t, "integration/node/node_modules/graphile-worker is missing (run: npm ci --prefix integration/node)")
	}
	return cmd
}

// wkGraphileMigrate installs graphile-worker's schema directly (not through
// lockpool) and makes the table the workers record their runs in.
func wkGraphileMigrate(t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	ctx := testenv.Context(t, 60*time.Second)
	cmd := wkGraphileCommand(ctx, t, "MODE=migrate", "DATABASE_URL="+wkDirectURL(c, wkGraphileRole, wkGraphileDB))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("graphile.js migrate: %v\n%s", err, out)
	}
	conn, err := pgx.Connect(ctx, c.DSN(wkGraphileRole, appPassword, wkGraphileDB))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS graphile_runs (
		job_id bigint NOT NULL, seq int NOT NULL, proc int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
}

// wkGraphileFleet is what one run observed, from the processes' output.
type wkGraphileFleet struct {
	mu       sync.Mutex
	runs     map[int64]int           // "run" lines per job id
	latency  map[int64]time.Duration // add_job to the first run
	inserted map[int64]bool
	notified []int // notifications each process received
	jobNotes []int // of those, from add_job (payload count 1)
}

func (f *wkGraphileFleet) latencies() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Duration, 0, len(f.latency))
	for _, d := range f.latency {
		out = append(out, d)
	}
	return out
}

// wkGraphileProc is one running graphile.js.
type wkGraphileProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *testenv.LogBuffer
	ready  chan struct{}
	done   chan struct{} // closed when the process has exited and its output is read
	err    error
}

// start runs worker process proc against url, feeding its output into f.
func (f *wkGraphileFleet) start(ctx context.Context, t *testing.T, url string, proc int) *wkGraphileProc {
	t.Helper()
	cmd := wkGraphileCommand(ctx, t, "MODE=work", "DATABASE_URL="+url, fmt.Sprintf("WORKER_ID=%d", proc),
		fmt.Sprintf("CONCURRENCY=%d", wkGraphileConcurrency), fmt.Sprintf("POLL_INTERVAL=%d", wkGraphilePoll.Milliseconds()))
	p := &wkGraphileProc{cmd: cmd, stderr: &testenv.LogBuffer{}, ready: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f.line(p, proc, sc.Text())
		}
		p.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if w := p.stderr.String(); w != "" && t.Failed() {
			if len(w) > 4<<10 {
				w = "…" + w[len(w)-4<<10:]
			}
			t.Logf("worker process %d's stderr:\n%s", proc, w)
		}
	})
	return p
}

// line takes one line of process proc's output.
func (f *wkGraphileFleet) line(p *wkGraphileProc, proc int, line string) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch fields[0] {
	case "ready":
		close(p.ready)
	case "notified":
		f.notified[proc]++
		if len(fields) == 3 && fields[1] == "jobs:insert" && fields[2] == "1" {
			f.jobNotes[proc]++
		}
	case "run":
		if len(fields) != 4 {
			return
		}
		id, err1 := strconv.ParseInt(fields[1], 10, 64)
		us, err2 := strconv.ParseInt(fields[3], 10, 64)
		if err1 != nil || err2 != nil {
			return
		}
		f.runs[id]++
		if _, ok := f.latency[id]; !ok {
			f.latency[id] = time.Duration(us) * time.Microsecond
		}
	}
}

// wkGraphileRun runs the fleet once against url (directly or through
// lockpool): it empties the tables, starts the worker processes, waits
// until each receives a probe notification (so each listens), adds the jobs
// one every [wkGraphileEvery], waits for all of them to complete, stops the
// processes and checks that every job ran exactly once and completed in
// time.
func wkGraphileRun(t *testing.T, url string, hooks wkHooks) *wkGraphileFleet {
	t.Helper()
	ctx := testenv.Context(t, 90*time.Second)
	su := superConn(t, wkGraphileDB)
	if _, err := su.Exec(ctx, "TRUNCATE graphile_worker._private_jobs, graphile_runs"); err != nil {
		t.Fatal(err)
	}
	f := &wkGraphileFleet{runs: map[int64]int{}, latency: map[int64]time.Duration{}, inserted: map[int64]bool{},
		notified: make([]int, wkGraphileProcs), jobNotes: make([]int, wkGraphileProcs)}
	t0 := time.Now()
	procs := make([]*wkGraphileProc, wkGraphileProcs)
	for i := range procs {
		procs[i] = f.start(ctx, t, url, i)
	}
	for i, p := range procs {
		select {
		case <-p.ready:
		case <-p.done:
			t.Fatalf("worker process %d exited: %v\n%s", i, p.err, p.stderr.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("worker process %d not ready after 30 s\n%s", i, p.stderr.String())
		}
	}

	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	adder, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer adder.Close(context.Background())

	// A notification with count 0 wakes no worker: it only shows that every
	// process's LISTEN client receives them.
	listening := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, n := range f.notified {
			if n == 0 {
				return false
			}
		}
		return true
	}
	for !listening() && time.Since(t0) < wkGraphileListenWait {
		if _, err := adder.Exec(ctx, `SELECT pg_notify('jobs:insert', '{"count":0}')`); err != nil {
			t.Fatalf("probe notification: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.mu.Lock()
	probes := append([]int(nil), f.notified...)
	f.mu.Unlock()
	for i, n := range probes {
		if n == 0 {
			t.Errorf("worker process %d received no notification within %v of its start", i, wkGraphileListenWait)
		}
	}
	t.Logf("%d worker processes ready and listening in %v", wkGraphileProcs, time.Since(t0).Round(time.Millisecond))
	if hooks.listening != nil {
		hooks.listening()
	}

	t0 = time.Now()
	tick := time.NewTicker(wkGraphileEvery)
	addErrs := 0
	for seq := range wkGraphileJobs {
		<-tick.C
		if time.Since(t0) > wkInsertCap {
			t.Errorf("only %d of %d add_job calls done within %v", seq, wkGraphileJobs, wkInsertCap)
			break
		}
		var id int64
		err := adder.QueryRow(ctx, `SELECT (graphile_worker.add_job('job', json_build_object('seq', $1::int, 'insertedAtUs', $2::bigint))).id`,
			seq, time.Now().UnixMicro()).Scan(&id)
		if err != nil {
			if addErrs++; addErrs <= 3 {
				t.Errorf("add_job %d: %v", seq, err)
			}
			continue
		}
		f.mu.Lock()
		f.inserted[id] = true
		f.mu.Unlock()
	}
	tick.Stop()
	addsDone := time.Now()

	var left int
	for {
		if err := su.QueryRow(ctx, "SELECT count(*) FROM graphile_worker._private_jobs").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 || time.Since(addsDone) > wkGraphileDrainWait {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	drained := time.Since(addsDone)
	if hooks.drained != nil {
		hooks.drained()
	}
	for i, p := range procs {
		_ = p.stdin.Close()
		select {
		case <-p.done:
			if p.err != nil {
				t.Errorf("worker process %d: %v\n%s", i, p.err, p.stderr.String())
			}
		case <-time.After(15 * time.Second):
			t.Errorf("worker process %d did not stop within 15 s of its stdin closing", i)
		}
	}

	f.mu.Lock()
	t.Logf("%d jobs added in %v (%d add_job errors); %d left %v after the last add_job; add_job notifications received per process: %v",
		len(f.inserted), addsDone.Sub(t0).Round(time.Millisecond), addErrs, left, drained.Round(time.Millisecond), f.jobNotes)
	// Each add_job commits on its own: PostgreSQL delivers its
	// notification once to every listening session.
	for i, n := range f.jobNotes {
		if n != len(f.inserted) {
			t.Errorf("worker process %d received %d add_job notifications for %d jobs added, want each exactly once", i, n, len(f.inserted))
		}
	}
	f.mu.Unlock()
	if left != 0 {
		t.Errorf("%d of %d jobs not completed within %v of the last add_job", left, wkGraphileJobs, wkGraphileDrainWait)
	}
	rows, err := su.Query(ctx, "SELECT job_id, count(*)::int FROM graphile_runs GROUP BY job_id")
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[int64]int{}
	var id int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { recorded[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var never, twice, recordedWrong int
	for id := range f.inserted {
		switch r := f.runs[id]; {
		case r == 0:
			never++
		case r > 1:
			if twice++; twice <= 5 {
				t.Errorf("job %d ran %d times", id, r)
			}
		}
		if recorded[id] != 1 {
			recordedWrong++
		}
	}
	if never > 0 || twice > 0 {
		t.Errorf("of %d jobs, %d never ran and %d ran more than once; want each exactly once", len(f.inserted), never, twice)
	}
	if recordedWrong > 0 {
		t.Errorf("graphile_runs: %d of %d jobs do not have exactly one row", recordedWrong, len(f.inserted))
	}
	return f
}

// TestWorkersGraphile runs a graphile-worker fleet directly and through
// lockpool (listen: shared, budget 4, max_pinned 2) and compares: every job
// runs exactly once and completes in time in both; through lockpool no
// session is pinned for LISTEN, one lockpool listener backend serves the
// database, and the add_job-to-start latency (median, p95) is within twice
// the direct run's.
func TestWorkersGraphile(t *testing.T) {
	c := wkDatabase(t, wkGraphileRole, wkGraphileDB)
	wkGraphileMigrate(t, c)

	var direct []time.Duration
	t.Run("direct", func(t *testing.T) {
		var pids []int
		mark := wkLogMark(c)
		fleet := wkGraphileRun(t, wkDirectURL(c, wkGraphileRole, wkGraphileDB), wkHooks{
			listening: func() { pids = wkListenerPIDs(t, wkGraphileRole, wkGraphileDB, wkGraphileProcs, 5*time.Second) },
		})
		direct = fleet.latencies()
		med, p95 := wkQuantiles(direct)
		t.Logf("direct: add_job-to-start latency median %v p95 %v", med, p95)
		// Polling alone (every 20 s, fifteen workers) would put the median
		// near a second: the notifications are what start the jobs.
		if med > wkGraphilePoll/40 {
			t.Errorf("direct: median add_job-to-start latency %v: the workers are not woken by notifications (poll interval %v)", med, wkGraphilePoll)
		}
		wkLogStatements(t, c, mark, "graphile-worker", wkGraphileRole, wkGraphileDB, pids)
	})

	t.Run("lockpool", func(t *testing.T) {
		app := wkApp("graphilefleet", wkGraphileRole, wkGraphileDB, "shared", "5s")
		l := startLockpool(t, 10, "", app)
		s := wkSample(t, l, app.name, wkGraphileDB)
		var figures wkListenFigures
		fleet := wkGraphileRun(t, l.url(wkGraphileRole, wkGraphileDB), wkHooks{
			listening: s.countListeners,
			drained:   func() { figures = s.result() },
		})
		figures.check(t, app.name, wkGraphileDB)
		if len(direct) > 0 {
			wkCompareLatency(t, "graphile-worker", direct, fleet.latencies())
		}
	})
}
