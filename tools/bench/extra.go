package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/testenv"
)

// IdleResult is the memory test of one pooler.
type IdleResult struct {
	Target      string  `json:"target"`
	Clients     int     `json:"clients"`
	Connected   int     `json:"connected"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	RSSBeforeKB int64   `json:"rss_before_kb"`
	RSSWithKB   int64   `json:"rss_with_clients_kb"`
	KBPerClient float64 `json:"kb_per_idle_client"`
	// RSSHalfKB is VmRSS with the first half of the clients connected, and
	// MarginalKB the RSS each client of the second half added, which leaves
	// out what the first logins cost once (code pages first run, the heap
	// grown for 64 logins at a time, GC metadata). A step of the garbage
	// collector's heap goal inside the second half lands in it too, so with
	// few clients it is no measure of one client.
	RSSHalfKB     int64   `json:"rss_with_half_kb"`
	MarginalKB    float64 `json:"marginal_kb_per_idle_client"`
	ConnectSecond float64 `json:"connect_seconds"`
	AllConnected  bool    `json:"all_connected"`
}

// idleTest opens n authenticated clients to the pooler, leaves them idle,
// and reads the pooler's VmRSS before them, with the first half of them and
// with all of them.
func idleTest(t *target, e *env, n int) *IdleResult {
	r := &IdleResult{Target: t.Name, Clients: n}
	logf("idle clients: %s: opening %d authenticated idle connections", t.Name, n)
	time.Sleep(time.Second)
	r.RSSBeforeKB = testenv.ProcRSSKB(t.Proc.PID())
	cfg, err := pgconn.ParseConfig(t.dsn())
	if err != nil {
		r.FirstError = err.Error()
		return r
	}
	cfg.ConnectTimeout = 60 * time.Second
	conns := make([]*pgconn.PgConn, n)
	var (
		errs     atomic.Int64
		firstErr atomic.Value
	)
	// connect opens clients from up to to, 64 at a time.
	connect := func(from, to int) {
		var next atomic.Int64
		next.Store(int64(from))
		var wg sync.WaitGroup
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= to {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
					c, err := pgconn.ConnectConfig(ctx, cfg)
					cancel()
					if err != nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					conns[i] = c
				}
			}()
		}
		wg.Wait()
	}
	half := n / 2
	start := time.Now()
	connect(0, half)
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	r.RSSHalfKB = testenv.ProcRSSKB(t.Proc.PID())
	start = time.Now()
	connect(half, n)
	r.ConnectSecond = (took + time.Since(start)).Seconds()
	time.Sleep(2 * time.Second)
	r.RSSWithKB = testenv.ProcRSSKB(t.Proc.PID())
	r.Errors = int(errs.Load())
	if v := firstErr.Load(); v != nil {
		r.FirstError = v.(string)
	}
	for _, c := range conns {
		if c != nil {
			r.Connected++
		}
	}
	r.AllConnected = r.Connected == n
	if r.Connected > 0 {
		r.KBPerClient = float64(r.RSSWithKB-r.RSSBeforeKB) / float64(r.Connected)
	}
	if n > half && r.AllConnected {
		r.MarginalKB = float64(r.RSSWithKB-r.RSSHalfKB) / float64(n-half)
	}
	logf("idle clients: %s: %d/%d connected in %.1fs, RSS %d → %d → %d kB (%.2f kB/client; %.2f kB each of the second half)%s",
		t.Name, r.Connected, n, r.ConnectSecond, r.RSSBeforeKB, r.RSSHalfKB, r.RSSWithKB, r.KBPerClient, r.MarginalKB, errSuffix(r.FirstError))
	// Close them all (Terminate), a few at a time.
	var cw sync.WaitGroup
	ch := make(chan *pgconn.PgConn)
	for w := 0; w < 64; w++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for c := range ch {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = c.Close(ctx)
				cancel()
			}
		}()
	}
	for _, c := range conns {
		if c != nil {
			ch <- c
		}
	}
	close(ch)
	cw.Wait()
	time.Sleep(2 * time.Second)
	return r
}

func errSuffix(s string) string {
	if s == "" {
		return ""
	}
	return "; first error: " + s
}

// LeaseResult is the lease throughput test.
type LeaseResult struct {
	PairRun
	NullTokens int64 `json:"null_tokens"`
}

// leaseTest runs lease_acquire + lease_release pairs on distinct names from
// many pgx sessions (default extended protocol with statement cache) through
// lockpool.
func leaseTest(o *options, e *env) *LeaseResult {
	t := e.lockpool
	r := &LeaseResult{PairRun: PairRun{Sessions: o.leaseSess}}
	logf("lease throughput: %d sessions for %ds", o.leaseSess, o.duration)
	conns, err := openSessions(t.dsn(), o.leaseSess)
	if err != nil {
		r.FirstError = err.Error()
		return r
	}
	defer closeSessions(conns)
	// Warm up: the first lease call creates the lease table. (Parameters
	// only: lockpool ignores literal lease arguments in the extended
	// protocol, see the notes.)
	var tok *int64
	if err := conns[0].QueryRow(context.Background(), "SELECT lease_acquire($1, $2)", "bench-warm", 60).Scan(&tok); err != nil {
		r.FirstError = err.Error()
		return r
	}
	_, _ = conns[0].Exec(context.Background(), "SELECT lease_release($1)", "bench-warm")

	names := make([]string, len(conns))
	for i := range names {
		names[i] = fmt.Sprintf("bench-lease-%d", i)
	}
	var nulls atomic.Int64
	runPairs(t, conns, time.Duration(o.duration)*time.Second, &r.PairRun, func(ctx context.Context, i int, c *pgx.Conn) error {
		name := names[i]
		var tok *int64
		if err := c.QueryRow(ctx, "SELECT lease_acquire($1, $2)", name, 60).Scan(&tok); err != nil {
			return err
		}
		if tok == nil {
			nulls.Add(1)
		}
		var ok bool
		return c.QueryRow(ctx, "SELECT lease_release($1)", name).Scan(&ok)
	})
	r.NullTokens = nulls.Load()
	logf("lease throughput: %.0f pairs/s (%d pairs, %d errors)%s", r.PairsPerSec, r.Pairs, r.Errors, errSuffix(r.FirstError))
	return r
}

// MixedResult compares the unpinned sessions' throughput with and without
// 20 % of the sessions pinned by advisory locks.
type MixedResult struct {
	Sessions        int     `json:"sessions"`
	Pinned          int     `json:"pinned"`
	Budget          int     `json:"budget"`
	MaxPinned       int     `json:"max_pinned"`
	Description     string  `json:"description"`
	NoPinsTPS       float64 `json:"unpinned_tps_without_pins"`
	WithPinsTPS     float64 `json:"unpinned_tps_with_pins"`
	Ratio           float64 `json:"ratio"`
	PinnedSeen      float64 `json:"lockpool_pinned_sessions_seen"`
	PinnedLoopTPS   float64 `json:"pinned_sessions_tps"`
	BaselineLoopTPS float64 `json:"other_sessions_tps_in_baseline"`
	Error           string  `json:"error,omitempty"`
}

// mixedTest: S sessions through lockpool, 20 % of them ("side" sessions,
// driven from Go) run the same select-only query in a loop as the other 80 %
// (pgbench -S -M simple). In the pinned run each side session first takes
// pg_advisory_lock on its own key, so it is pinned for the whole run; in the
// baseline it does not. Same load both times; only pinning differs. The
// number reported is the pgbench (80 %) throughput.
func mixedTest(o *options, e *env) *MixedResult {
	s := o.mixedSess
	p := s / 5
	if p < 1 {
		p = 1
	}
	r := &MixedResult{Sessions: s, Pinned: p, Budget: o.budget, MaxPinned: o.maxPinned,
		Description: fmt.Sprintf("%d sessions through lockpool (budget %d, max_pinned %d): %d run pgbench -S -M simple; %d more run the same query from Go, holding pg_advisory_lock on their own key in the pinned run and no lock in the baseline", s, o.budget, o.maxPinned, s-p, p)}
	if p > o.maxPinned {
		r.Error = fmt.Sprintf("%d pinned sessions need max_pinned >= %d", p, p)
		return r
	}
	logf("mixed: %d sessions, %d pinned, baseline then pinned, %ds each", s, p, o.duration)
	base, baseSide, err := mixedRun(o, e, s-p, p, false)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	with, side, err := mixedRunSeen(o, e, s-p, p, r)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.NoPinsTPS, r.WithPinsTPS, r.BaselineLoopTPS, r.PinnedLoopTPS = base, with, baseSide, side
	if base > 0 {
		r.Ratio = with / base
	}
	logf("mixed: unpinned sessions %.0f tps without pins, %.0f tps with %d pinned (ratio %.3f; pinned sessions seen %g)",
		base, with, p, r.Ratio, r.PinnedSeen)
	return r
}

func mixedRunSeen(o *options, e *env, clients, pinned int, r *MixedResult) (float64, float64, error) {
	done := make(chan struct{})
	var seen float64
	go func() {
		defer close(done)
		time.Sleep(time.Duration(o.duration) * time.Second / 2)
		seen = pinnedGauge(e.lockpool)
	}()
	tps, side, err := mixedRun(o, e, clients, pinned, true)
	<-done
	r.PinnedSeen = seen
	return tps, side, err
}

var rePinned = regexp.MustCompile(`(?m)^lockpool_pinned_sessions\{[^}]*\} ([0-9.e+]+)$`)

func pinnedGauge(t *target) float64 { return metricSum(t, rePinned) }

// metricSum adds the values of every series re matches in t's /metrics
// (re's first group is the value); -1 when the scrape fails.
func metricSum(t *target, re *regexp.Regexp) float64 {
	resp, err := http.Get(t.AdminURL + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

func mixedRun(o *options, e *env, clients, side int, pin bool) (float64, float64, error) {
	t := e.lockpool
	ctx := context.Background()
	conns := make([]*pgx.Conn, side)
	for i := range conns {
		c, err := pgx.Connect(ctx, t.dsn())
		if err != nil {
			return 0, 0, err
		}
		defer c.Close(ctx)
		conns[i] = c
		if pin {
			if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(424200+i)); err != nil {
				return 0, 0, err
			}
		}
	}
	stop := make(chan struct{})
	var loops atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func(i int, c *pgx.Conn) {
			defer wg.Done()
			aid := int64(i*7919 + 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				var bal int64
				aid = aid*48271%int64(o.scale*100000) + 1
				if err := c.QueryRow(ctx, "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
					pgx.QueryExecModeSimpleProtocol, aid).Scan(&bal); err != nil {
					return
				}
				loops.Add(1)
			}
		}(i, c)
	}
	j := 2
	if clients < j {
		j = clients
	}
	cmd := exec.Command("pgbench", "-n", "-S", "-M", "simple", "-h", t.Host, "-p", strconv.Itoa(t.Port),
		"-U", benchUser, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(j), "-T", strconv.Itoa(o.duration), benchDB)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+benchPassword)
	out, err := cmd.CombinedOutput()
	close(stop)
	wg.Wait()
	sideTPS := float64(loops.Load()) / time.Since(start).Seconds()
	if pin {
		for i, c := range conns {
			_, _ = c.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(424200+i))
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("pgbench: %v: %s", err, firstError(string(out), err))
	}
	m := reTPS.FindStringSubmatch(string(out))
	if m == nil {
		return 0, 0, fmt.Errorf("pgbench: no tps in output: %s", strings.TrimSpace(string(out)))
	}
	tps, _ := strconv.ParseFloat(m[1], 64)
	return tps, sideTPS, nil
}
