package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/internal/testenv"
	"github.com/lockpool/lockpool/lease"
)

// sample is one 10 s reading of the lockpool process.
type sample struct {
	T          time.Duration
	Goroutines int
	FDs        int
	RSSKB      int64
	Pinned     float64
	Clients    float64
	ServerConn float64
	TPS        float64
	LockOps    int64 // in the interval
	LeaseOps   int64
	Kills      int64
	Violations int64 // so far
}

// metrics maps a series (name plus labels, as exposed) to its value.
type metrics map[string]float64

// sum adds every series of metric name.
func (m metrics) sum(name string) float64 {
	var t float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

var metricsClient = &http.Client{Timeout: 5 * time.Second}

func scrapeMetrics(adminURL string) (metrics, error) {
	resp, err := metricsClient.Get(adminURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

func countFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// runSampler reads the lockpool process and its metrics every sampleEvery
// and runs the lease-table check, until the load stops.
func (s *soak) runSampler(su *pgx.Conn) {
	t := time.NewTicker(s.o.sampleEvery)
	defer t.Stop()
	var lastLock, lastLease, lastKills int64
	var lastLeaked float64
	for {
		select {
		case <-s.stopCh:
			return
		case <-t.C:
		}
		if !s.e.Lockpool.Alive() {
			return
		}
		pid := s.e.Lockpool.PID()
		smp := sample{T: time.Since(s.start), FDs: countFDs(pid), RSSKB: testenv.ProcRSSKB(pid)}
		m, err := scrapeMetrics(s.e.AdminURL)
		if err != nil {
			s.unexpectedf("sampler: %v", err)
			continue
		}
		smp.Goroutines = int(m.sum("go_goroutines"))
		smp.Pinned = m.sum("lockpool_pinned_sessions")
		smp.Clients = m.sum("lockpool_client_connections")
		smp.ServerConn = m.sum("lockpool_server_connections")
		if int64(smp.Pinned) > s.maxPinned.Load() {
			s.maxPinned.Store(int64(smp.Pinned))
		}
		if smp.Pinned > appPinned {
			s.violatef("pins", "lockpool_pinned_sessions = %v > max_pinned %d", smp.Pinned, appPinned)
		}
		if leaked := m.sum("lockpool_leaked_locks_total"); leaked > lastLeaked {
			s.violatef("lock", "lockpool_leaked_locks_total rose from %v to %v: the sweep found idle server connections holding advisory locks", lastLeaked, leaked)
			lastLeaked = leaked
		}
		s.pgb.mu.Lock()
		smp.TPS = s.pgb.lastTPS
		s.pgb.mu.Unlock()
		lo, le, k := s.lockOps.Load(), s.leaseOps.Load(), s.kills.Load()
		smp.LockOps, smp.LeaseOps, smp.Kills = lo-lastLock, le-lastLease, k-lastKills
		lastLock, lastLease, lastKills = lo, le, k

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, _, _, err := s.checkLeases(ctx, su); err != nil {
			s.unexpectedf("lease check: %v", err)
		} else {
			s.leaseChecks.Add(1)
		}
		cancel()

		s.mu.Lock()
		smp.Violations = s.nViol
		s.samples = append(s.samples, smp)
		s.mu.Unlock()
		logf("%s", formatSample(smp))
	}
}

func formatSample(x sample) string {
	return fmt.Sprintf("%5.0fs %10d %5d %7.1f %6.0f %7.0f %9.0f %11.0f %8d %9d %5d %10d",
		x.T.Seconds(), x.Goroutines, x.FDs, float64(x.RSSKB)/1024, x.Pinned, x.Clients, x.ServerConn,
		x.TPS, x.LockOps, x.LeaseOps, x.Kills, x.Violations)
}

const sampleHeader = "    t goroutines   fds  rss_MB pinned clients srv_conns pgbench_tps lock_ops lease_ops kills violations"

// runLockChecker compares pg_locks with the lock clients' models every
// checkEvery until done is closed.
func (s *soak) runLockChecker(su *pgx.Conn, done chan struct{}) {
	t := time.NewTicker(s.o.checkEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if err := s.checkLocks(su); err != nil {
			s.unexpectedf("lock check: %v", err)
		} else {
			s.lockChecks.Add(1)
		}
		s.locks.Prune(time.Now().Add(-30 * time.Second))
	}
}

const pgLocksSQL = `SELECT l.pid, ` + lockKeyExpr + `, l.objsubid::int, l.mode, coalesce(a.application_name, '')
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// checkLocks: every granted advisory lock in the soak database belongs to a
// backend on which some client may hold that key right now (or held it
// within the kill grace). The only other advisory lock allowed is lockpool's
// own transaction-level lease-migration lock.
func (s *soak) checkLocks(su *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	qs := time.Now()
	rows, err := su.Query(ctx, pgLocksSQL)
	if err != nil {
		return err
	}
	type row struct {
		pid    int32
		key    int64
		sub    int32
		mode   string
		appNam string
	}
	var got []row
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.pid, &x.key, &x.sub, &x.mode, &x.appNam); err != nil {
			rows.Close()
			return err
		}
		got = append(got, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	qe := time.Now()
	for _, x := range got {
		if x.sub == 1 && x.key == lease.MigrationLockKey {
			continue
		}
		soakKey := x.sub == 1 && x.key >= lockKeyBase && x.key < lockKeyBase+lockKeyN
		if soakKey && s.o.advisory == "hold" && x.appNam != advisory.ApplicationName {
			s.violateOnce("lock", fmt.Sprintf("lock %d %d %d", x.pid, x.key, x.sub),
				"backend %d (application_name %q) holds advisory lock %d under advisory_locks: hold, where only lockpool's lock connections may",
				x.pid, x.appNam, x.key)
			continue
		}
		if soakKey && s.locks.Explains(uint32(x.pid), x.key, qs, qe) {
			continue
		}
		s.violateOnce("lock", fmt.Sprintf("lock %d %d %d", x.pid, x.key, x.sub),
			"backend %d (application_name %q) holds advisory lock %d (objsubid %d, %s), but no client holds that key there (a lock outlived its session or went to another client)",
			x.pid, x.appNam, x.key, x.sub, x.mode)
	}
	return nil
}

// ---- trend and report ----

type trendRow struct {
	name               string
	first, last, limit float64
	unit               string
	ok                 bool
}

func mean(xs []float64) float64 {
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// trend compares the mean of the last third of the samples after the
// warm-up with the mean of the first third.
func trend(samples []sample, warmup time.Duration) (rows []trendRow, used, third int) {
	var use []sample
	for _, x := range samples {
		if x.T >= warmup {
			use = append(use, x)
		}
	}
	n := len(use)
	k := n / 3
	if k == 0 {
		return nil, n, 0
	}
	series := []struct {
		name  string
		unit  string
		slack float64
		get   func(sample) float64
	}{
		{"goroutines", "", 20, func(x sample) float64 { return float64(x.Goroutines) }},
		{"open fds", "", 20, func(x sample) float64 { return float64(x.FDs) }},
		{"RSS", " MB", 20, func(x sample) float64 { return float64(x.RSSKB) / 1024 }},
	}
	for _, sr := range series {
		var a, b []float64
		for _, x := range use[:k] {
			a = append(a, sr.get(x))
		}
		for _, x := range use[n-k:] {
			b = append(b, sr.get(x))
		}
		f, l := mean(a), mean(b)
		lim := f*1.5 + sr.slack
		rows = append(rows, trendRow{name: sr.name, first: f, last: l, limit: lim, unit: sr.unit, ok: l <= lim})
	}
	return rows, n, k
}

type report struct {
	text string
	pass bool
}

var reMsg = regexp.MustCompile(`level=(ERROR|WARN) msg=("(?:[^"\\]|\\.)*"|\S+)`)

// lockpoolLog summarises lockpool's own log: errors and warnings by message.
func lockpoolLog(path string) (errs, warns int, top []string, panics int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1, -1, nil, 0
	}
	byMsg := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
			panics++
		}
		m := reMsg.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[1] == "ERROR" {
			errs++
		} else {
			warns++
		}
		msg, err := strconv.Unquote(m[2])
		if err != nil {
			msg = m[2]
		}
		byMsg[m[1]+" "+msg]++
	}
	for k, v := range byMsg {
		top = append(top, fmt.Sprintf("%6d × %s", v, k))
	}
	sort.Slice(top, func(i, j int) bool { return top[i] > top[j] })
	if len(top) > 8 {
		top = top[:8]
	}
	return errs, warns, top, panics
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func (s *soak) report(began time.Time, interrupted bool, stopNote string) report {
	var b strings.Builder
	o := s.o
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	s.mu.Lock()
	samples := append([]sample(nil), s.samples...)
	nViol, nUnexp := s.nViol, s.nUnexpected
	viol := append([]string(nil), s.violations...)
	unexp := append([]string(nil), s.unexpected...)
	byKind := map[string]int64{}
	for k, v := range s.violByKind {
		byKind[k] = v
	}
	s.mu.Unlock()

	p("")
	p("== lockpool soak, %s UTC: go run ./tools/soak -minutes %g (seed %d) ==", began.UTC().Format("2006-01-02 15:04"), o.minutes, o.seed)
	p("machine: %d CPUs, load average at the end %s; %s", runtime.NumCPU(), loadAvg(), runtime.Version())
	p("lockpool: transaction mode, max_connections 8, max_pinned 3, wait_timeout 5s, leak_check_interval 5s, server.max_connections 20, leases.max_connections 2")
	p("load: pgbench -S -c 8 -j 2 (restarted on exit); %d lock clients (keys %d..%d, lock_timeout %s); %d lease clients (%d names, ttl %d s); %d transaction clients; a kill every %v-%v%s",
		o.lockClients, lockKeyBase, lockKeyBase+lockKeyN-1, lockTimeout, o.leaseClients, len(leaseNames), leaseTTL, o.txnClients, o.killMin, o.killMax, o.lockConnKillNote())
	if interrupted {
		p("INTERRUPTED: the load stopped early")
	}
	p("")
	p("samples (every %v; ops and kills per interval):", o.sampleEvery)
	p("%s", sampleHeader)
	for _, x := range samples {
		p("%s", formatSample(x))
	}
	p("")

	s.pgb.mu.Lock()
	p("pgbench: %d runs, %d exited non-zero and were restarted; %d transactions, %d failed", s.pgb.runs, s.pgb.failed, s.pgb.txns, s.pgb.failedTx)
	var errs []string
	for k, v := range s.pgb.errCounts {
		errs = append(errs, fmt.Sprintf("%6d × %s", v, k))
	}
	s.pgb.mu.Unlock()
	sort.Sort(sort.Reverse(sort.StringSlice(errs)))
	for i, e := range errs {
		if i == 5 {
			break
		}
		p("  %s", e)
	}
	p("lock churn: %d operations", s.lockOps.Load())
	for _, c := range s.sortedCounts("lock: ") {
		p("  %s", c)
	}
	p("lease churn: %d calls", s.leaseOps.Load())
	for _, c := range s.sortedCounts("lease: ") {
		p("  %s", c)
	}
	for _, c := range s.sortedCounts("lease log: ") {
		p("  lease log (final check): %s", c)
	}
	p("transaction clients:")
	for _, c := range s.sortedCounts("txn: ") {
		p("  %s", c)
	}
	p("kills: %d", s.kills.Load())
	for _, c := range s.sortedCounts("kill: ") {
		p("  %s", c)
	}
	p("checks: %d pg_locks checks, %d lease-table checks; highest lockpool_pinned_sessions sampled %d (max_pinned %d)",
		s.lockChecks.Load(), s.leaseChecks.Load(), s.maxPinned.Load(), appPinned)
	for _, c := range s.sortedCounts("final: ") {
		p("final: %s", strings.TrimSuffix(c, ": 1"))
	}
	e, w, top, panics := lockpoolLog(s.e.Lockpool.LogPath)
	p("lockpool log: %d errors, %d warnings, %d panics", e, w, panics)
	for _, t := range top {
		p("  %s", t)
	}
	if stopNote != "" {
		p("lockpool shutdown: %s", stopNote)
	}
	p("")

	pass := true
	rows, used, k := trend(samples, o.warmup)
	if k == 0 {
		p("trend: only %d samples after the %v warm-up; too few to judge a trend", used, o.warmup)
	} else {
		p("trend (%d samples from %v on: mean of the first %d vs the last %d; limit = first × 1.5 + 20):", used, o.warmup, k, k)
		for _, r := range rows {
			verdict := "ok"
			if !r.ok {
				verdict = "GROWTH"
				pass = false
			}
			p("  %-10s first %8.1f%s  last %8.1f%s  (%+5.1f%%)  limit %8.1f%s  %s", r.name, r.first, r.unit, r.last, r.unit,
				pct(r.first, r.last), r.limit, r.unit, verdict)
		}
	}
	var kinds []string
	for k, v := range byKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(kinds)
	p("invariant violations: %d %v", nViol, kinds)
	for _, v := range viol {
		p("  %s", v)
	}
	p("unexpected client errors: %d", nUnexp)
	for _, u := range unexp {
		p("  %s", u)
	}
	if nViol > 0 || nUnexp > 0 {
		pass = false
	}
	if interrupted {
		pass = false
	}
	result := "PASS"
	if !pass {
		result = "FAIL"
	}
	p("RESULT: %s (load %v, total %v)", result, time.Duration(o.minutes*float64(time.Minute)), time.Since(began).Round(time.Second))
	return report{text: b.String(), pass: pass}
}

func pct(a, b float64) float64 {
	if a == 0 {
		return math.NaN()
	}
	return (b - a) / a * 100
}
