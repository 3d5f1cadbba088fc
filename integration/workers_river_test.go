package integration

// A River worker fleet (github.com/riverqueue/river with riverpgxv5) behind
// lockpool under listen: shared: three "processes" (each its own pgxpool
// and river.Client with 10 workers, whose producers are woken by LISTEN on
// River's insert topic), one inserter, 300 jobs spread over 9 seconds. Run
// directly against PostgreSQL first (the baseline), then through lockpool
// with one application of budget 4 server connections and 2 pin slots.
//
// River's notifier keeps one connection per client for LISTEN: it takes a
// connection from the client's pgxpool and hijacks it (so it leaves the
// pool), asks `SELECT coalesce(current_schema(), '')` when Config.Schema
// is empty, then sends `LISTEN "<schema>.river_leadership"`, `LISTEN
// "<schema>.river_insert"`, `LISTEN "<schema>.river_control"` (simple
// protocol, one statement each), waits for notifications and sends `--
// ping` after 5 s without one (10 s timeout; on error it closes the
// connection and connects again). Inserts notify with pg_notify() in the
// inserting transaction (`PGNotifyMany`), at most once per FetchCooldown per
// queue and inserting client. The producers also poll every
// FetchPollInterval; the test sets it to 10 s, so polling alone would start
// a job after seconds, not milliseconds.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const (
	wkRiverRole      = "riverw"
	wkRiverDB        = "riverdb"
	wkRiverProcs     = 3
	wkRiverWorkers   = 10
	wkRiverMaxConns  = 4 // each process's pgxpool
	wkRiverJobs      = 300
	wkRiverEvery     = 30 * time.Millisecond // one insert per tick: 300 jobs in 9 s
	wkRiverPoll      = 10 * time.Second      // FetchPollInterval: polling alone is far slower than LISTEN
	wkRiverCooldown  = 5 * time.Millisecond  // FetchCooldown, and the inserter's notify limiter: below wkRiverEvery, so every insert notifies
	wkRiverDrainWait = 10 * time.Second      // after the last insert, every job must have completed within this
)

// wkRiverArgs is the fleet's job: its number and when it was inserted.
type wkRiverArgs struct {
	Seq        int   `json:"seq"`
	InsertedAt int64 `json:"inserted_at"` // Unix ns, just before Insert
}

func (wkRiverArgs) Kind() string { return "lockpool_fleet" }

// wkRiverWorker records each run: in the fleet's memory first (so a run
// whose recording fails is still counted), then as a row of river_runs
// through its process's pool.
type wkRiverWorker struct {
	river.WorkerDefaults[wkRiverArgs]
	fleet *wkRiverFleet
	proc  int
	pool  *pgxpool.Pool
}

func (w *wkRiverWorker) Work(ctx context.Context, job *river.Job[wkRiverArgs]) error {
	w.fleet.started(job.ID, time.Since(time.Unix(0, job.Args.InsertedAt)))
	_, err := w.pool.Exec(ctx, "INSERT INTO river_runs (job_id, seq, proc) VALUES ($1, $2, $3)", job.ID, job.Args.Seq, w.proc)
	return err
}

// wkRiverFleet is what one run observed.
type wkRiverFleet struct {
	mu       sync.Mutex
	runs     map[int64]int           // Work calls per job id
	latency  map[int64]time.Duration // insert to the first Work call
	inserted map[int64]bool
	log      *testenv.LogBuffer // River's warnings and errors
}

func (f *wkRiverFleet) started(id int64, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs[id]++
	if _, ok := f.latency[id]; !ok {
		f.latency[id] = d
	}
}

func (f *wkRiverFleet) latencies() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Duration, 0, len(f.latency))
	for _, d := range f.latency {
		out = append(out, d)
	}
	return out
}

// wkRiverPool is a pgxpool of at most maxConns connections to url.
func wkRiverPool(t *testing.T, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// wkRiverMigrate migrates River's schema in db directly (not through
// lockpool) and makes the table the workers record their runs in.
func wkRiverMigrate(t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := wkRiverPool(t, wkDirectURL(c, wkRiverRole, wkRiverDB), 2)
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatalf("rivermigrate: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS river_runs (
		job_id bigint NOT NULL, seq int NOT NULL, proc int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
}

// wkRiverClient is one worker process: its pool and River client.
func wkRiverClient(t *testing.T, url string, proc int, fleet *wkRiverFleet, logger *slog.Logger) (*river.Client[pgx.Tx], *pgxpool.Pool) {
	t.Helper()
	pool := wkRiverPool(t, url, wkRiverMaxConns)
	workers := river.NewWorkers()
	river.AddWorker(workers, &wkRiverWorker{fleet: fleet, proc: proc, pool: pool})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:                fmt.Sprintf("fleet-%d", proc),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: wkRiverWorkers}},
		Workers:           workers,
		FetchCooldown:     wkRiverCooldown,
		FetchPollInterval: wkRiverPoll,
		Logger:            logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	return client, pool
}

// wkRiverRun runs the fleet once against url (directly or through
// lockpool): it empties the tables, starts the worker clients, inserts the
// jobs one every [wkRiverEvery] from an insert-only client, waits for all
// of them to complete, stops the clients and checks that every job ran
// exactly once and completed in time.
func wkRiverRun(t *testing.T, c *pgtest.Cluster, url string, hooks wkHooks) *wkRiverFleet {
	t.Helper()
	ctx := testenv.Context(t, 90*time.Second)
	su := superConn(t, wkRiverDB)
	if _, err := su.Exec(ctx, "TRUNCATE river_job, river_runs, river_leader"); err != nil {
		t.Fatal(err)
	}
	fleet := &wkRiverFleet{runs: map[int64]int{}, latency: map[int64]time.Duration{}, inserted: map[int64]bool{},
		log: &testenv.LogBuffer{}}
	logger := slog.New(slog.NewTextHandler(fleet.log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	t.Cleanup(func() {
		if w := fleet.log.String(); t.Failed() && w != "" {
			if len(w) > 8<<10 {
				w = "…" + w[len(w)-8<<10:]
			}
			t.Logf("River's warnings and errors:\n%s", w)
		}
	})

	// The worker processes start at once: each Start returns when its
	// producer and elector listen.
	clients := make([]*river.Client[pgx.Tx], wkRiverProcs)
	errs := make([]error, wkRiverProcs)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range clients {
		clients[i], _ = wkRiverClient(t, url, i, fleet, logger)
		wg.Go(func() { errs[i] = clients[i].Start(ctx) })
	}
	wg.Wait()
	started := 0
	for i, err := range errs {
		if err != nil {
			t.Errorf("worker process %d: Start: %v", i, err)
			continue
		}
		started++
	}
	t.Logf("%d of %d worker processes started in %v", started, wkRiverProcs, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if hooks.listening != nil {
		hooks.listening()
	}

	inserter, err := river.NewClient(riverpgxv5.New(wkRiverPool(t, url, 2)), &river.Config{FetchCooldown: wkRiverCooldown, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(wkRiverEvery)
	insertErrs := 0
	for seq := range wkRiverJobs {
		<-tick.C
		if time.Since(t0) > wkInsertCap {
			t.Errorf("only %d of %d inserts done within %v", seq, wkRiverJobs, wkInsertCap)
			break
		}
		res, err := inserter.Insert(ctx, wkRiverArgs{Seq: seq, InsertedAt: time.Now().UnixNano()}, nil)
		if err != nil {
			if insertErrs++; insertErrs <= 3 {
				t.Errorf("insert %d: %v", seq, err)
			}
			continue
		}
		fleet.mu.Lock()
		fleet.inserted[res.Job.ID] = true
		fleet.mu.Unlock()
	}
	tick.Stop()
	insertsDone := time.Now()

	var completed, total int
	for {
		if err := su.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM river_job").Scan(&completed, &total); err != nil {
			t.Fatal(err)
		}
		if completed == wkRiverJobs || time.Since(insertsDone) > wkRiverDrainWait {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	drained := time.Since(insertsDone)
	if hooks.drained != nil {
		hooks.drained()
	}
	for i, cl := range clients {
		if errs[i] != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := cl.StopAndCancel(sctx); err != nil {
			t.Errorf("worker process %d: StopAndCancel: %v", i, err)
		}
		cancel()
	}

	t.Logf("%d jobs inserted in %v (%d insert errors); %d of %d completed %v after the last insert",
		len(fleet.inserted), insertsDone.Sub(t0).Round(time.Millisecond), insertErrs, completed, total, drained.Round(time.Millisecond))
	if completed != wkRiverJobs {
		t.Errorf("%d of %d jobs completed within %v of the last insert", completed, wkRiverJobs, wkRiverDrainWait)
	}
	rows, err := su.Query(ctx, "SELECT job_id, count(*)::int FROM river_runs GROUP BY job_id")
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[int64]int{}
	var id int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { recorded[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	fleet.mu.Lock()
	defer fleet.mu.Unlock()
	var never, twice, recordedWrong int
	for id := range fleet.inserted {
		switch r := fleet.runs[id]; {
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
		t.Errorf("of %d jobs, %d never ran and %d ran more than once; want each exactly once", len(fleet.inserted), never, twice)
	}
	if recordedWrong > 0 {
		t.Errorf("river_runs: %d of %d jobs do not have exactly one row", recordedWrong, len(fleet.inserted))
	}
	return fleet
}

// TestWorkersRiver runs a River worker fleet directly and through lockpool
// (listen: shared, budget 4, max_pinned 2) and compares: every job runs
// exactly once and completes in time in both; through lockpool no session
// is pinned for LISTEN, one lockpool listener backend serves the database,
// and the insert-to-start latency (median, p95) is within twice the
// direct run's.
func TestWorkersRiver(t *testing.T) {
	c := wkDatabase(t, wkRiverRole, wkRiverDB)
	wkRiverMigrate(t, c)

	var direct []time.Duration
	t.Run("direct", func(t *testing.T) {
		var pids []int
		mark := wkLogMark(c)
		fleet := wkRiverRun(t, c, wkDirectURL(c, wkRiverRole, wkRiverDB), wkHooks{
			listening: func() { pids = wkListenerPIDs(t, wkRiverRole, wkRiverDB, wkRiverProcs, 5*time.Second) },
		})
		direct = fleet.latencies()
		med, p95 := wkQuantiles(direct)
		t.Logf("direct: insert-to-start latency median %v p95 %v", med, p95)
		// Polling alone (every 10 s, three producers) would put the
		// median in seconds: the notifications are what start the jobs.
		if med > wkRiverPoll/20 {
			t.Errorf("direct: median insert-to-start latency %v: the producers are not woken by notifications (poll interval %v)", med, wkRiverPoll)
		}
		wkLogStatements(t, c, mark, "River", wkRiverRole, wkRiverDB, pids)
	})

	t.Run("lockpool", func(t *testing.T) {
		app := wkApp("riverfleet", wkRiverRole, wkRiverDB, "shared", "5s")
		l := startLockpool(t, 10, "", app)
		s := wkSample(t, l, app.name, wkRiverDB)
		var figures wkListenFigures
		fleet := wkRiverRun(t, c, l.url(wkRiverRole, wkRiverDB), wkHooks{
			listening: s.countListeners,
			drained:   func() { figures = s.result() },
		})
		figures.check(t, app.name, wkRiverDB)
		if len(direct) > 0 {
			wkCompareLatency(t, "River", direct, fleet.latencies())
		}
	})
}

// TestWorkersRiverListenPin is the contrast: under listen: pin each River
// client's LISTEN connection pins a server connection and a pin slot for as
// long as it listens, so on max_pinned 2 the third of three clients cannot
// start: its LISTEN waits wait_timeout for a pin slot and fails with 53300.
func TestWorkersRiverListenPin(t *testing.T) {
	c := wkDatabase(t, wkRiverRole, wkRiverDB)
	wkRiverMigrate(t, c)
	app := wkApp("riverpin", wkRiverRole, wkRiverDB, "pin", "2s")
	l := startLockpool(t, 10, "", app)
	ctx := testenv.Context(t, 30*time.Second)
	fleet := &wkRiverFleet{runs: map[int64]int{}, latency: map[int64]time.Duration{}, inserted: map[int64]bool{}, log: &testenv.LogBuffer{}}
	logger := slog.New(slog.NewTextHandler(fleet.log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	clients := make([]*river.Client[pgx.Tx], wkRiverProcs)
	errs := make([]error, wkRiverProcs)
	var wg sync.WaitGroup
	for i := range clients {
		clients[i], _ = wkRiverClient(t, l.url(wkRiverRole, wkRiverDB), i, fleet, logger)
		wg.Go(func() { errs[i] = clients[i].Start(ctx) })
	}
	wg.Wait()
	var failed []int
	for i, err := range errs {
		if err != nil {
			t.Logf("worker process %d: Start: %v", i, err)
			if code := sqlState(err); code != "53300" {
				t.Errorf("worker process %d: Start failed with SQLSTATE %q, want 53300 (no pin slot within wait_timeout): %v", i, code, err)
			}
			failed = append(failed, i)
			continue
		}
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = clients[i].StopAndCancel(sctx)
		})
	}
	if len(failed) != 1 {
		t.Errorf("%d of %d clients failed to start (%v), want exactly 1: two listeners take both pin slots", len(failed), wkRiverProcs, failed)
	}
	if p := l.Pinned(app.name, "listen"); p != 2 {
		t.Errorf("lockpool_pinned_sessions{app=%q,reason=\"listen\"} = %v, want 2", app.name, p)
	}
	t.Logf("listen: pin, budget 4, max_pinned 2: %d River clients listening hold both pin slots and two of the four server connections; the third cannot start", wkRiverProcs-len(failed))
}
