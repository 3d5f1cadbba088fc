package integration

// What the worker-fleet tests (workers_river_test.go,
// workers_graphile_test.go) share: the application they run on, a role and
// a database of their own, a sampler of the LISTEN pins and of lockpool's
// listener backends during a run, latency quantiles, and the statements a
// library sends on its LISTEN connection, read back from the server log
// (log_statement = 'all' for the test's role).
//
// Each fleet runs twice in one test: directly against PostgreSQL (the
// baseline) and through lockpool with budget max_connections 4, max_pinned 2
// and listen: shared. Under listen: shared lockpool answers LISTEN and
// UNLISTEN itself and delivers the notifications from one listener
// connection per database (application_name "lockpool listener"), so a
// listening worker pins nothing.

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// wkInsertCap bounds a run's insert phase (planned: 9 s): a fleet whose
// inserts wait for connections stops inserting then, and fails.
const wkInsertCap = 20 * time.Second

// wkListenerApp is the application_name of lockpool's listener connection
// under listen: shared (one per database).
const wkListenerApp = "lockpool listener"

// wkApp is the worker fleet's application: budget 4 server connections, 2
// of them pinnable, LISTEN handled as listen says (shared, pin or reject).
func wkApp(name, user, db, listen, wait string) appYAML {
	return appYAML{name: name, user: user, db: db, max: 4, pinned: 2,
		advisory: "pin", state: "pin", wait: wait, extra: "    listen: " + listen}
}

// wkDatabase makes role (password [appPassword]) and database db owned by
// it on the shared cluster, unless they exist, and has the role log every
// statement (log_statement = 'all', for [wkStatements]) until t ends.
func wkDatabase(t *testing.T, role, db string) *pgtest.Cluster {
	t.Helper()
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, role)
	testenv.EnsureDatabase(t, c, db, role)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Exec(ctx, "postgres", fmt.Sprintf("ALTER ROLE %s SET log_statement = 'all'", role)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Exec(ctx, "postgres", fmt.Sprintf("ALTER ROLE %s RESET log_statement", role))
	})
	return c
}

// wkDirectURL is a postgres:// URL for role on db straight to the cluster.
func wkDirectURL(c *pgtest.Cluster, role, db string) string {
	return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", role, appPassword, c.Host, c.Port, db)
}

// wkHooks are called during a run: listening once every worker process
// listens, drained once every job completed or the wait for that ended,
// before the processes stop.
type wkHooks struct {
	listening, drained func()
}

// wkSampler samples, every 50 ms from start to stop, lockpool's
// lockpool_pinned_sessions{app,reason="listen"} (when it watches a
// lockpool) and the number of lockpool listener backends on its database.
type wkSampler struct {
	l       *lp // nil for a direct run: only the backends are counted
	app, db string
	su      *pgx.Conn
	stop    chan struct{}
	done    chan struct{}

	mu sync.Mutex
	// maxPinned is the highest listen pin gauge seen, over the whole run.
	maxPinned float64
	// listeners counts the listener backends seen while counting was on
	// (between [wkSampler.countListeners] and stop): min, max, samples.
	counting                   bool
	minListen, maxListen, nObs int
	err                        error
}

// wkSample starts sampling.
func wkSample(t *testing.T, l *lp, app, db string) *wkSampler {
	t.Helper()
	s := &wkSampler{l: l, app: app, db: db, su: superConn(t, "postgres"),
		stop: make(chan struct{}), done: make(chan struct{}), minListen: -1}
	go s.run()
	t.Cleanup(s.end)
	return s
}

func (s *wkSampler) run() {
	defer close(s.done)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s.once()
		select {
		case <-s.stop:
			s.once()
			return
		case <-tick.C:
		}
	}
}

func (s *wkSampler) once() {
	var pinned float64
	if s.l != nil {
		pinned = s.l.Pinned(s.app, "listen")
	}
	s.mu.Lock()
	counting := s.counting
	s.mu.Unlock()
	n := -1
	if counting {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		n, err = countBackends(ctx, s.su, fmt.Sprintf("datname = '%s' AND application_name = '%s'", s.db, wkListenerApp))
		cancel()
		if err != nil {
			s.mu.Lock()
			if s.err == nil {
				s.err = err
			}
			s.mu.Unlock()
			n = -1
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxPinned = max(s.maxPinned, pinned)
	if n >= 0 && s.counting {
		if s.minListen < 0 || n < s.minListen {
			s.minListen = n
		}
		s.maxListen = max(s.maxListen, n)
		s.nObs++
	}
}

// countListeners starts counting listener backends: call it once every
// worker listens.
func (s *wkSampler) countListeners() {
	s.mu.Lock()
	s.counting = true
	s.mu.Unlock()
}

// end stops sampling (once).
func (s *wkSampler) end() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// wkListenFigures is what a sampler saw.
type wkListenFigures struct {
	maxPinned            float64
	minListen, maxListen int
	samples              int
	err                  error
}

// result stops the sampler and returns what it saw.
func (s *wkSampler) result() wkListenFigures {
	s.end()
	s.mu.Lock()
	defer s.mu.Unlock()
	return wkListenFigures{maxPinned: s.maxPinned, minListen: s.minListen, maxListen: s.maxListen, samples: s.nObs, err: s.err}
}

// check fails t unless no session was pinned for LISTEN during the run and
// exactly one lockpool listener backend served the database all along.
func (f wkListenFigures) check(t *testing.T, app, db string) {
	t.Helper()
	if f.err != nil {
		t.Errorf("sampling pg_stat_activity: %v", f.err)
	}
	t.Logf("during the run: lockpool_pinned_sessions{app=%q,reason=\"listen\"} max %v; %q backends on %s: min %d max %d (%d samples)",
		app, f.maxPinned, wkListenerApp, db, f.minListen, f.maxListen, f.samples)
	if f.maxPinned != 0 {
		t.Errorf("LISTEN pinned sessions: lockpool_pinned_sessions{app=%q,reason=\"listen\"} reached %v, want 0 all along (listen: shared)", app, f.maxPinned)
	}
	if f.samples == 0 || f.minListen != 1 || f.maxListen != 1 {
		t.Errorf("pg_stat_activity: %q backends on %s ranged %d..%d over %d samples, want exactly 1 all along (listen: shared)",
			wkListenerApp, db, f.minListen, f.maxListen, f.samples)
	}
}

// wkQuantiles is the median and the 95th percentile of ds (nearest rank),
// zero for none.
func wkQuantiles(ds []time.Duration) (median, p95 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return rank(0.5), rank(0.95)
}

// wkLatencySlack is added to twice the direct figure before comparing: at a
// few milliseconds, twice the direct median is within the noise of one
// scheduling delay on a 2-core machine.
const wkLatencySlack = 10 * time.Millisecond

// wkTailSlack is the slack of the p95 comparison: the tail of a few
// hundred jobs on a loaded 2-core machine moves by scheduling delays of
// tens of milliseconds between runs, while a job whose notification was
// lost waits for the next poll, seconds later.
const wkTailSlack = 250 * time.Millisecond

// wkCompareLatency fails t unless the median and p95 of via (through
// lockpool) are within twice those of direct (plus [wkLatencySlack] and
// [wkTailSlack]), and logs both.
func wkCompareLatency(t *testing.T, what string, direct, via []time.Duration) {
	t.Helper()
	dm, dp := wkQuantiles(direct)
	lm, lp := wkQuantiles(via)
	t.Logf("%s insert-to-start latency: direct median %v p95 %v (%d jobs); through lockpool median %v p95 %v (%d jobs)",
		what, dm.Round(10*time.Microsecond), dp.Round(10*time.Microsecond), len(direct),
		lm.Round(10*time.Microsecond), lp.Round(10*time.Microsecond), len(via))
	if len(via) == 0 {
		t.Errorf("%s: no job started through lockpool", what)
		return
	}
	if lm > 2*dm+wkLatencySlack {
		t.Errorf("%s: median insert-to-start latency through lockpool %v > 2 × direct %v + %v", what, lm, dm, wkLatencySlack)
	}
	if lp > 2*dp+wkTailSlack {
		t.Errorf("%s: p95 insert-to-start latency through lockpool %v > 2 × direct %v + %v", what, lp, dp, wkTailSlack)
	}
}

// wkListenerPIDs waits up to d for want backends of role on db whose last
// statement starts with LISTEN (a direct run's listening connections) and
// returns their pids.
func wkListenerPIDs(t *testing.T, role, db string, want int, d time.Duration) []int {
	t.Helper()
	su := superConn(t, "postgres")
	var pids []int
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := su.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE usename = $1 AND datname = $2
			AND query ILIKE 'listen%' ORDER BY pid`, role, db)
		if err == nil {
			pids, err = pgx.CollectRows(rows, pgx.RowTo[int])
		}
		cancel()
		if err != nil {
			t.Fatalf("pg_stat_activity: %v", err)
		}
		if len(pids) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(pids) != want {
		t.Errorf("direct run: %d backends of %s on %s had LISTEN as their last statement, want %d (one per worker process)", len(pids), role, db, want)
	}
	return pids
}

// wkLogLine is a server log line: its time, pid, user@db and message.
var wkLogLine = regexp.MustCompile(`^\S+ \S+ \S+ \[(\d+)\] (\S*)@(\S*) (\w+):  (.*)$`)

// wkStatements is what backends of role on db logged as statements in the
// cluster log (log_statement = 'all', see [wkDatabase]) that keep accepts
// (given the backend's pid and the statement): for each distinct statement
// in the order first seen, its text (continuation lines joined with
// newlines), how it was sent ("simple" for a Query message, "extended" for
// Parse/Bind/Execute) and how many times.
func wkStatements(log, role, db string, keep func(pid int, text string) bool) []string {
	type stmt struct {
		text string
		n    int
	}
	var order []string
	seen := map[string]*stmt{}
	var cur *strings.Builder
	var curPID int
	flush := func() {
		if cur == nil {
			return
		}
		k := cur.String()
		cur = nil
		if _, text, _ := strings.Cut(k, "\x00"); !keep(curPID, text) {
			return
		}
		if s, ok := seen[k]; ok {
			s.n++
			return
		}
		seen[k] = &stmt{text: k, n: 1}
		order = append(order, k)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "\t") {
			if cur != nil {
				cur.WriteString("\n" + strings.TrimPrefix(line, "\t"))
			}
			continue
		}
		flush()
		m := wkLogLine.FindStringSubmatch(line)
		if m == nil || m[2] != role || m[3] != db || m[4] != "LOG" {
			continue
		}
		curPID, _ = strconv.Atoi(m[1])
		msg := m[5]
		var kind string
		switch {
		case strings.HasPrefix(msg, "statement: "):
			kind, msg = "simple", strings.TrimPrefix(msg, "statement: ")
		case strings.HasPrefix(msg, "execute "):
			kind = "extended"
			if i := strings.Index(msg, ": "); i >= 0 {
				msg = msg[i+2:]
			}
		default:
			continue
		}
		cur = &strings.Builder{}
		cur.WriteString(kind + "\x00" + msg)
	}
	flush()
	out := make([]string, 0, len(order))
	for _, k := range order {
		kind, text, _ := strings.Cut(k, "\x00")
		out = append(out, fmt.Sprintf("[%s ×%d] %s", kind, seen[k].n, text))
	}
	return out
}

// wkLogMark is where the cluster's log ends now, for [wkLogStatements].
func wkLogMark(c *pgtest.Cluster) int { return len(c.Log()) }

// wkLogStatements logs the statements the listening backends pids sent,
// and the statements of any backend of role on db that send notifications,
// as [wkStatements] finds them in the cluster's log after mark.
func wkLogStatements(t *testing.T, c *pgtest.Cluster, mark int, what, role, db string, pids []int) {
	t.Helper()
	log := c.Log()
	if mark <= len(log) {
		log = log[mark:]
	}
	if len(pids) > 0 {
		st := wkStatements(log, role, db, func(pid int, _ string) bool { return slices.Contains(pids, pid) })
		t.Logf("%s: what its LISTEN connections (backends %v) sent, from the server log (log_statement = 'all'):\n  %s",
			what, pids, strings.Join(st, "\n  "))
	}
	notify := regexp.MustCompile(`(?i)\bnotify\b|pg_notify|add_job`)
	st := wkStatements(log, role, db, func(_ int, text string) bool { return notify.MatchString(text) })
	t.Logf("%s: statements that send notifications (any connection):\n  %s", what, strings.Join(st, "\n  "))
}
