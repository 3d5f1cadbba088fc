// Command soak is lockpool's soak test: minutes of mixed load
// against a built lockpool binary while its goroutines, open file
// descriptors and resident memory are sampled and lock and lease invariants
// are checked.
//
// It starts its own PostgreSQL (internal/pgtest) with a role, a database
// and `pgbench -i -s 5`, builds ./cmd/lockpool and runs it as a separate
// process (transaction mode, budget 8, max_pinned 3, wait_timeout 5s,
// leak_check_interval 5s), then for -minutes runs at once:
//
//   - pgbench -S -c 8 -j 2 through lockpool, restarted whenever it exits;
//   - lock churn: clients take pg_try_advisory_lock / pg_advisory_lock
//     (bounded by the session's lock_timeout), stack, unlock and unlock_all
//     on a small key space, keeping a model of what they hold and on which
//     backend (every statement also returns pg_backend_pid()); under
//     -advisory hold (the default, as lockpool's) each statement is the
//     call alone (so lockpool answers it) and the locks live on lockpool's
//     lock connections; under -advisory pin they pin the client's session;
//   - lease churn: clients take lease_acquire(name, 3) on a few names and
//     record each hold in a table (entry, fenced writes, exit);
//   - plain transactions with a session application_name;
//   - abrupt kills: every few seconds the socket of a random client (half
//     the time one holding a lock or lease or inside a transaction) is
//     closed without a Terminate; the client reconnects.
//   - under hold, lock-connection terminations: every -kill-lock-conn
//     (20 s) on average one of lockpool's lock connections
//     that holds soak keys is terminated with pg_terminate_backend while
//     the lock clients pause between operations; lockpool must end the
//     sessions whose locks were there within 10 s, keep the others, and
//     hand the keys on as usual (lockconns.go).
//
// A checker compares pg_locks with the clients' models every second: every
// granted advisory lock must be held by a client that believes it holds that
// key on that backend (a killed client's locks get a 2 s grace); under hold,
// on a lock connection of lockpool's and no other backend, and no two lock
// clients may hold a key at once (exclusiveHolders). Every 10 s a
// sampler reads go_goroutines and lockpool_pinned_sessions from /metrics, the
// open fds (/proc/<pid>/fd) and VmRSS of the lockpool process, and checks
// from the lease table that no two holds of one name overlap and that tokens
// grow. At the end every client leaves and no lock, pin or lease may remain.
//
// It prints a table of the samples and a summary and exits 1 on any
// invariant violation, on an unexpected client error, or on a growth trend:
// for goroutines, fds and RSS the mean of the last third of the samples
// (after the warm-up) must not exceed the mean of the first third × 1.5 plus
// a slack of 20 goroutines, 20 fds, 20 MB.
//
// Run it with scripts/soak.sh (SOAK_MINUTES, default 10), or:
//
//	go run ./tools/soak -minutes 10
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

type options struct {
	minutes      float64
	lockClients  int
	leaseClients int
	txnClients   int
	killMin      time.Duration
	killMax      time.Duration
	warmup       time.Duration
	sampleEvery  time.Duration
	checkEvery   time.Duration
	seed         int64
	lockpoolBin  string
	keep         bool
	inject       bool
	advisory     string        // the application's advisory_locks policy: pin or hold
	killLockConn time.Duration // under hold: mean pause between two lock-connection terminations (0: none)
}

func parseFlags() (*options, error) {
	o := &options{}
	flag.Float64Var(&o.minutes, "minutes", 10, "how long the load runs")
	flag.IntVar(&o.lockClients, "lock-clients", 6, "advisory-lock churn clients")
	flag.IntVar(&o.leaseClients, "lease-clients", 6, "lease churn clients")
	flag.IntVar(&o.txnClients, "txn-clients", 2, "plain transaction clients")
	flag.DurationVar(&o.killMin, "kill-min", 2*time.Second, "shortest pause between two client kills")
	flag.DurationVar(&o.killMax, "kill-max", 4*time.Second, "longest pause between two client kills")
	flag.DurationVar(&o.warmup, "warmup", 30*time.Second, "samples before this are left out of the trend")
	flag.DurationVar(&o.sampleEvery, "sample", 10*time.Second, "sampling interval")
	flag.DurationVar(&o.checkEvery, "check", time.Second, "pg_locks invariant check interval")
	flag.Int64Var(&o.seed, "seed", 0, "random seed (0 = from the clock)")
	flag.StringVar(&o.lockpoolBin, "lockpool", "", "use this lockpool binary instead of building ./cmd/lockpool")
	flag.StringVar(&o.advisory, "advisory", "hold", "the application's advisory_locks policy, hold or pin (under hold the lock clients' locks live on lockpool's lock connections; under pin they pin the client's session)")
	flag.DurationVar(&o.killLockConn, "kill-lock-conn", 20*time.Second, "under -advisory hold, the mean pause between two terminations of a lockpool lock connection that holds soak keys (0: none)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (config, lockpool.log)")
	flag.BoolVar(&o.inject, "inject-faults", false, "self-test: halfway through, hold an advisory lock and write an overlapping lease hold behind lockpool's back (the run must FAIL)")
	flag.Parse()
	if o.minutes <= 0 {
		return nil, fmt.Errorf("-minutes must be > 0")
	}
	if o.advisory != "pin" && o.advisory != "hold" {
		return nil, fmt.Errorf("-advisory must be pin or hold")
	}
	if o.killMin <= 0 || o.killMax < o.killMin {
		return nil, fmt.Errorf("need 0 < -kill-min <= -kill-max")
	}
	if o.seed == 0 {
		o.seed = time.Now().UnixNano()
	}
	return o, nil
}

// soak is the run's shared state.
type soak struct {
	o *options
	e *env

	start   time.Time // load start
	stopCh  chan struct{}
	stopped atomic.Bool
	// abort kills a running pgbench (interrupt, lockpool died); at the
	// normal end pgbench's -T runs out by itself.
	abortCtx context.Context
	abort    context.CancelFunc

	locks *testenv.LockLog
	// held is, under advisory_locks: hold, which lock client holds each
	// key (lockpool's table decides among its clients: checked here).
	held *exclusiveHolders

	killerSU *pgx.Conn // the killer's superuser connection (lease kill marks)

	// lockGate pauses the lock clients between operations (they hold it
	// shared around each one) while a lock connection is terminated.
	lockGate sync.RWMutex

	lockOps  atomic.Int64
	leaseOps atomic.Int64
	kills    atomic.Int64

	pgb pgbenchStats

	mu          sync.Mutex
	counts      map[string]int64
	violations  []string
	nViol       int64
	violByKind  map[string]int64
	reported    map[string]bool
	unexpected  []string
	nUnexpected int64

	lockChecks  atomic.Int64
	leaseChecks atomic.Int64
	maxPinned   atomic.Int64
	samples     []sample
}

func (s *soak) stopping() bool { return s.stopped.Load() }

func (s *soak) count(what string) { s.countN(what, 1) }

func (s *soak) countN(what string, n int64) {
	s.mu.Lock()
	s.counts[what] += n
	s.mu.Unlock()
}

func (s *soak) elapsed() string {
	if s.start.IsZero() {
		return "setup"
	}
	return fmt.Sprintf("%6.1fs", time.Since(s.start).Seconds())
}

// violatef records an invariant violation.
func (s *soak) violatef(kind, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.nViol++
	s.violByKind[kind]++
	if len(s.violations) < 50 {
		s.violations = append(s.violations, fmt.Sprintf("[%s] %s: %s", s.elapsed(), kind, msg))
	}
	s.mu.Unlock()
	logf("VIOLATION (%s): %s", kind, msg)
}

// violateOnce records a violation once per key (for conditions the periodic
// checks see again and again).
func (s *soak) violateOnce(kind, key, format string, args ...any) {
	s.mu.Lock()
	seen := s.reported[key]
	s.reported[key] = true
	s.mu.Unlock()
	if !seen {
		s.violatef(kind, format, args...)
	}
}

// unexpectedf records a client error that is no acceptable outcome (not
// 53300, not lock_timeout, not caused by a kill).
func (s *soak) unexpectedf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.nUnexpected++
	if len(s.unexpected) < 50 {
		s.unexpected = append(s.unexpected, fmt.Sprintf("[%s] %s", s.elapsed(), msg))
	}
	s.mu.Unlock()
	logf("UNEXPECTED: %s", msg)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s soak: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func main() {
	os.Exit(run())
}

func run() int {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	began := time.Now()
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()

	setupCtx, cancel := context.WithTimeout(sigCtx, 5*time.Minute)
	e, err := setup(setupCtx, o)
	cancel()
	if e != nil {
		defer func() {
			e.close()
			if o.keep {
				logf("work directory kept: %s", e.work)
			} else {
				_ = os.RemoveAll(e.work)
			}
		}()
	}
	if err != nil {
		logf("setup failed: %v", err)
		return 2
	}

	s := &soak{o: o, e: e, stopCh: make(chan struct{}), locks: testenv.NewLockLog(), held: newExclusiveHolders(),
		counts: map[string]int64{}, violByKind: map[string]int64{}, reported: map[string]bool{}}
	s.pgb.errCounts = map[string]int{}
	s.abortCtx, s.abort = context.WithCancel(context.Background())
	defer s.abort()
	suConn := func() *pgx.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, e.Cluster.SuperuserDSN(soakDB))
		if err != nil {
			logf("superuser connection: %v", err)
			return nil
		}
		return c
	}
	checkSU, sampleSU, killerSU, finalSU, lockKillerSU := suConn(), suConn(), suConn(), suConn(), suConn()
	for _, c := range []*pgx.Conn{checkSU, sampleSU, killerSU, finalSU, lockKillerSU} {
		if c == nil {
			return 2
		}
		defer c.Close(context.Background())
	}
	s.killerSU = killerSU

	rng := rand.New(rand.NewSource(o.seed))
	var locks []*lockClient
	var leases []*leaseClient
	var txns []*txnClient
	var all []killable
	for i := 0; i < o.lockClients; i++ {
		c := newLockClient(s, i, rng.Int63())
		locks = append(locks, c)
		all = append(all, c)
	}
	for i := 0; i < o.leaseClients; i++ {
		c := newLeaseClient(s, i, rng.Int63())
		leases = append(leases, c)
		all = append(all, c)
	}
	for i := 0; i < o.txnClients; i++ {
		c := newTxnClient(s, i, rng.Int63())
		txns = append(txns, c)
		all = append(all, c)
	}

	dur := time.Duration(o.minutes * float64(time.Minute))
	logf("load for %v (seed %d): pgbench -S -c 8 -j 2, %d lock (advisory_locks: %s), %d lease, %d transaction clients, a kill every %v–%v%s",
		dur, o.seed, o.lockClients, o.advisory, o.leaseClients, o.txnClients, o.killMin, o.killMax, o.lockConnKillNote())
	s.start = time.Now()
	end := s.start.Add(dur)

	var clients, bg sync.WaitGroup
	clients.Add(1)
	go func() { defer clients.Done(); s.runPgbench(end) }()
	for _, c := range locks {
		clients.Add(1)
		go func() { defer clients.Done(); c.run() }()
	}
	for _, c := range leases {
		clients.Add(1)
		go func() { defer clients.Done(); c.run() }()
	}
	for _, c := range txns {
		clients.Add(1)
		go func() { defer clients.Done(); c.run() }()
	}
	bg.Add(1)
	go func() { defer bg.Done(); s.runKiller(rand.New(rand.NewSource(rng.Int63())), all) }()
	if o.advisory == "hold" && o.killLockConn > 0 {
		lockKillRng := rand.New(rand.NewSource(rng.Int63()))
		bg.Add(1)
		go func() { defer bg.Done(); s.runLockConnKiller(lockKillRng, lockKillerSU, locks) }()
	}
	checkDone := make(chan struct{})
	var checker sync.WaitGroup
	checker.Add(1)
	go func() { defer checker.Done(); s.runLockChecker(checkSU, checkDone) }()
	bg.Add(1)
	go func() { defer bg.Done(); s.runSampler(sampleSU) }()
	if o.inject {
		bg.Add(1)
		go func() { defer bg.Done(); s.injectFaults(dur / 2) }()
	}

	interrupted := false
	died := false
	select {
	case <-time.After(time.Until(end)):
	case <-sigCtx.Done():
		interrupted = true
		logf("interrupted: stopping the load early")
	case <-e.Lockpool.Done():
		died = true
	}
	if !died && !e.Lockpool.Alive() {
		died = true
	}
	if died {
		s.violatef("lockpool", "lockpool exited during the soak: %v\n%s", e.Lockpool.Err(), e.Lockpool.LogTail(3000))
	}
	if died || interrupted {
		s.abort()
	}
	s.stopped.Store(true)
	close(s.stopCh)
	logf("load over; waiting for clients to leave")
	bg.Wait()
	clients.Wait()
	left := time.Now()

	// Everyone left: no lock, pin or lease may remain once the grace is over.
	if e.Lockpool.Alive() {
		s.quiesce(finalSU, left)
	}
	close(checkDone)
	checker.Wait()
	ctx, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	if n, lost, killed, err := s.checkLeases(ctx, finalSU); err != nil {
		s.unexpectedf("final lease check: %v", err)
	} else {
		s.mu.Lock()
		s.counts["lease log: holds"] = int64(n)
		s.counts["lease log: holds lost"] = int64(lost)
		s.counts["lease log: holds cut by a kill while held"] = int64(killed)
		s.mu.Unlock()
	}
	cancel2()

	stopNote := ""
	if e.Lockpool.Alive() {
		t0 := time.Now()
		switch err := e.Lockpool.Stop(40 * time.Second); {
		case errors.Is(err, testenv.ErrStopTimeout):
			s.violatef("lockpool", "lockpool did not exit within 40s of SIGTERM (killed)")
		case err != nil:
			s.violatef("lockpool", "lockpool exited after SIGTERM with %v", err)
		default:
			stopNote = fmt.Sprintf("exit 0 %v after SIGTERM", time.Since(t0).Round(time.Millisecond))
		}
	}
	rep := s.report(began, interrupted, stopNote)
	fmt.Print(rep.text)
	if rep.pass {
		return 0
	}
	return 1
}

// quiesce waits until no advisory lock, pin or lease is left after every
// client left, for at most the kill grace plus a second.
func (s *soak) quiesce(su *pgx.Conn, left time.Time) {
	deadline := left.Add(killGrace + time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var locks []string
		rows, err := su.Query(ctx, `SELECT format('%s:%s:%s on backend %s (%s)', l.classid, l.objid, l.objsubid, l.pid, coalesce(a.application_name, ''))
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
		if err == nil {
			for rows.Next() {
				var x string
				if rows.Scan(&x) == nil {
					locks = append(locks, x)
				}
			}
			rows.Close()
			err = rows.Err()
		}
		var leases int
		var table *string
		if err == nil {
			err = su.QueryRow(ctx, "SELECT to_regclass('lockpool.leases')::text").Scan(&table)
		}
		if err == nil && table != nil {
			err = su.QueryRow(ctx, "SELECT count(*) FROM lockpool.leases WHERE expires_at > now()").Scan(&leases)
		}
		cancel()
		if err != nil {
			s.unexpectedf("final check: %v", err)
			return
		}
		m, merr := scrapeMetrics(s.e.AdminURL)
		pinned, held := -1.0, -1.0
		if merr == nil {
			pinned, held = m.sum("lockpool_pinned_sessions"), m.sum("lockpool_leases_held")
		}
		if len(locks) == 0 && leases == 0 && pinned == 0 && held == 0 {
			s.count("final: no lock, pin or lease left after every client left")
			return
		}
		if time.Now().After(deadline) {
			s.violatef("final", "%v after every client left: advisory locks %v, leases still held in lockpool.leases %d, lockpool_pinned_sessions %v, lockpool_leases_held %v (metrics error %v)",
				time.Since(left).Round(time.Millisecond), locks, leases, pinned, held, merr)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sortedCounts formats the counters with a prefix, sorted.
func (s *soak) sortedCounts(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, v := range s.counts {
		if strings.HasPrefix(k, prefix) {
			out = append(out, fmt.Sprintf("%s: %d", strings.TrimPrefix(k, prefix), v))
		}
	}
	sort.Strings(out)
	return out
}

// injectFaults breaks both invariants on purpose (-inject-faults), to show
// the checks catch what they claim to: a direct connection (not through
// lockpool) holds a soak lock key for 5 s, and a forged lease hold overlaps
// the real holds of one name with an old token.
func (s *soak) injectFaults(after time.Duration) {
	select {
	case <-s.stopCh:
		return
	case <-time.After(after):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.e.Cluster.SuperuserDSN(soakDB))
	if err != nil {
		logf("inject: %v", err)
		return
	}
	defer c.Close(context.Background())
	logf("inject: taking advisory lock %d directly and forging a lease hold", lockKeyBase+lockKeyN-1)
	if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1::bigint)", int64(lockKeyBase+lockKeyN-1)); err != nil {
		logf("inject: %v", err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO soak_lease_log (name, token, client, entered, last_ok)
VALUES ($1, 1, -1, clock_timestamp() - interval '20 seconds', clock_timestamp())`, leaseNames[0]); err != nil {
		logf("inject: %v", err)
	}
	select {
	case <-s.stopCh:
	case <-time.After(5 * time.Second):
	}
}
