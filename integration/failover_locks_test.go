package integration

// The randomized lock test with its oracle across failovers: clients take
// and release advisory locks at random through lockpool (one application
// under advisory_locks: hold, one under pin) and directly on the current
// primary, while the primary changes (switchovers and crash failovers).

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	folHoldApp = "api" // startFailoverLockpool's application (role app): advisory_locks: hold
	folPinApp  = "pinned"
	folPinUser = "apppin"
	folHolders = 5 // clients of the hold application
	folPinners = 5 // clients of the pin application
	folDirects = 3 // direct sessions on the current primary
	folKeyBase = 9400001
	folKeys    = 8
	// folCall is every call's deadline: a call that reaches it hangs.
	folCall   = 20 * time.Second
	folWarmup = 3 * time.Second // before the first failover
	folTail   = 4 * time.Second // after the last one
	// folSoon is how long before a failover the clients are told it is
	// near: a lock taken then is held long, so that locks are held at
	// every failover.
	folSoon = 1500 * time.Millisecond
	// folLockTimeout is every client's lock_timeout (a startup parameter),
	// which bounds the blocking acquires.
	folLockTimeout = "1s"
	// folHint is what the hint of the FATAL of a hold client whose locks
	// were lost with the primary says (pgerr.LocksLost).
	folHint = "primary changed"
)

// folKind is what a client of the test is.
type folKind int

const (
	folHold   folKind = iota // through lockpool, advisory_locks: hold
	folPin                   // through lockpool, advisory_locks: pin
	folDirect                // a session on the current primary, without lockpool
)

var folKindNames = [...]string{"hold", "pin", "direct"}

func (k folKind) String() string { return folKindNames[k] }

// folBelief is one period in which a client believed it held a key: from
// the acquire's reply until just before its unlock (or COMMIT, for a
// transaction-level lock) was sent, or until an error reached the client.
type folBelief struct {
	c        *folClient
	key      int64
	xact     bool
	from, to time.Time // to is zero while the belief lasts
	hold     *testenv.LockHold
	// err is the error that ended the belief, or that its unlock or COMMIT
	// got, and op the call that got it; closed says the client's
	// connection was closed by then (a FATAL or a lost connection), not by
	// the client.
	err    error
	op     string
	closed bool
}

// folRun is the state of one TestFailoverLockOracle: the clients' beliefs
// (in the lock log, for the overlap check, and as a list, for the
// failovers' check), the violations and the outcome counts.
type folRun struct {
	t       *testing.T
	log     *testenv.LockLog
	fails   atomic.Int64
	mu      sync.Mutex
	beliefs []*folBelief
	counts  map[string]int
	tally   folTally
	// soon is set from folSoon before a failover until its new primary is
	// promoted.
	soon atomic.Bool
}

func (r *folRun) failf(format string, args ...any) {
	if n := r.fails.Add(1); n <= 25 {
		r.t.Errorf(format, args...)
	} else if n == 26 {
		r.t.Errorf("(further violations not shown)")
	}
}

func (r *folRun) count(what string) {
	r.mu.Lock()
	r.counts[what]++
	r.mu.Unlock()
}

// folClient is one client: its kind, where it connects, its random source
// and its connection (nil while it has none).
type folClient struct {
	r    *folRun
	id   int
	kind folKind
	dsn  string
	rng  *rand.Rand
	conn *pgx.Conn
	down time.Time // since when connecting fails (zero: it did not)
}

func (c *folClient) name() string { return fmt.Sprintf("client %d (%s)", c.id, c.kind) }

func (c *folClient) mode() pgx.QueryExecMode { return lkrModes[c.rng.Intn(len(lkrModes))] }

// do runs one call of the client under its deadline; reaching the
// deadline is a violation (a hang).
func (c *folClient) do(what string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), folCall)
	defer cancel()
	err := f(ctx)
	if err != nil && ctx.Err() != nil {
		c.r.failf("%s: %s did not answer within %v (%v)", c.name(), what, folCall, err)
	}
	return err
}

// run steps until stop is closed, reconnecting whenever the client has no
// connection.
func (c *folClient) run(stop <-chan struct{}) {
	defer c.hangUp()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if c.conn == nil && !c.connect() {
			time.Sleep(50 * time.Millisecond) // pacing of reconnects while there is no primary
			continue
		}
		c.step()
		time.Sleep(time.Duration(c.rng.Intn(20)) * time.Millisecond)
	}
}

// connect dials the client's DSN: lockpool, or for a direct session
// whichever host is the primary now (target_session_attrs=primary).
func (c *folClient) connect() bool {
	var conn *pgx.Conn
	err := c.do("connect", func(ctx context.Context) (err error) {
		conn, err = pgx.Connect(ctx, c.dsn)
		return err
	})
	if err != nil {
		c.r.count(fmt.Sprintf("%s connect: %s", c.kind, errText(err)))
		switch {
		case c.down.IsZero():
			c.down = time.Now()
		case time.Since(c.down) > time.Minute:
			c.r.failf("%s: could not connect for a minute: %v", c.name(), err)
			c.down = time.Now()
		}
		return false
	}
	c.down = time.Time{}
	c.conn = conn
	return true
}

// hangUp closes the client's connection.
func (c *folClient) hangUp() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = c.conn.Close(ctx)
	cancel()
	c.conn = nil
}

func (c *folClient) step() {
	key := int64(folKeyBase + c.rng.Intn(folKeys))
	p := c.rng.Intn(100)
	if c.r.soon.Load() {
		p /= 2 // mostly session-level locks, held across the failover
	}
	switch {
	case p < 40:
		c.session(key, false)
	case p < 70:
		c.session(key, true)
	default:
		c.xact(key, c.rng.Intn(2) == 0)
	}
}

// believe starts a belief of key, now (the acquire answered).
func (c *folClient) believe(key int64, xact bool) *folBelief {
	b := &folBelief{c: c, key: key, xact: xact, from: time.Now()}
	b.hold = c.r.log.Open(c.id, key)
	c.r.mu.Lock()
	c.r.beliefs = append(c.r.beliefs, b)
	c.r.counts[fmt.Sprintf("%s acquired (xact %v)", c.kind, xact)]++
	c.r.mu.Unlock()
	return b
}

// end ends belief b at `at` (unless it ended already) and notes err, the
// first error it got, the call op that got it, and whether that error
// closed the connection.
func (c *folClient) end(b *folBelief, at time.Time, op string, err error) {
	if b.to.IsZero() {
		b.to = at
		c.r.log.Close(b.hold, at)
	}
	if b.err == nil && err != nil {
		b.err, b.op = err, op
		b.closed = c.conn == nil || c.conn.IsClosed()
	}
}

// failed handles the error of op: it ends belief b (if any) now, counts
// the error, and drops the connection (the session's state is not known;
// a FATAL has closed it already).
func (c *folClient) failed(op string, err error, b *folBelief) {
	at := time.Now()
	if b != nil {
		c.end(b, at, op, err)
	}
	c.r.count(fmt.Sprintf("%s %s: %s", c.kind, op, errText(err)))
	c.hangUp()
}

// The calls of a client's work while it holds a key.
const (
	folWait      = "wait on the socket"
	folStatement = "statement" // on a server connection (pooled under hold)
)

// work is what the client does while it holds b's key: it waits on its
// socket (where a FATAL arrives at once) or runs statements, a few times,
// briefly or one time in four for long. A lock taken when a failover is
// near is held until the failover is over, mostly waiting: so that locks
// are held across every failover. It reports whether the key is still held (false: an error
// ended the belief).
func (c *folClient) work(b *folBelief) bool {
	soon := c.r.soon.Load()
	long := soon || c.rng.Intn(4) == 0
	n := 1 + c.rng.Intn(3)
	for i := 0; i < n || soon && c.r.soon.Load() && time.Since(b.from) < folCall/2; i++ {
		d := time.Duration(5+c.rng.Intn(45)) * time.Millisecond
		if long {
			d = time.Duration(300+c.rng.Intn(1200)) * time.Millisecond
		}
		var err error
		op := folWait
		if c.rng.Intn(4) < 2 || soon && c.rng.Intn(4) < 3 {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			err = c.conn.PgConn().WaitForNotification(ctx)
			cancel()
			if err != nil && pgconn.Timeout(err) && !c.conn.IsClosed() {
				err = nil // the work's time is up
			}
		} else {
			op = folStatement
			err = c.do("pg_sleep", func(ctx context.Context) error {
				_, err := c.conn.Exec(ctx, "SELECT pg_sleep($1::float8)", c.mode(), d.Seconds())
				return err
			})
		}
		if err != nil {
			c.failed(op, err, b)
			return false
		}
	}
	return true
}

// session takes key with a session-level lock (the blocking form under
// lock_timeout, or the try form), works and unlocks.
func (c *folClient) session(key int64, blocking bool) {
	ok := true
	err := c.do("acquire", func(ctx context.Context) error {
		if blocking {
			_, err := c.conn.Exec(ctx, "SELECT pg_advisory_lock($1)", c.mode(), key)
			return err
		}
		return c.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", c.mode(), key).Scan(&ok)
	})
	if err != nil {
		if blocking && sqlState(err) == "55P03" {
			c.r.count(fmt.Sprintf("%s pg_advisory_lock: lock_timeout", c.kind))
			// PostgreSQL may grant the lock as lock_timeout fires: give
			// back whatever the session holds (nothing else).
			if err := c.do("unlock_all", func(ctx context.Context) error {
				_, err := c.conn.Exec(ctx, "SELECT pg_advisory_unlock_all()")
				return err
			}); err != nil {
				c.failed("pg_advisory_unlock_all", err, nil)
			}
			return
		}
		c.failed("acquire", err, nil)
		return
	}
	if !ok {
		c.r.count(fmt.Sprintf("%s pg_try_advisory_lock=false", c.kind))
		return
	}
	b := c.believe(key, false)
	if !c.work(b) {
		return
	}
	c.end(b, time.Now(), "", nil)
	err = c.do("unlock", func(ctx context.Context) error {
		return c.conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", c.mode(), key).Scan(&ok)
	})
	if err != nil {
		c.failed("unlock", err, b)
		return
	}
	if !ok {
		c.r.failf("%s: pg_advisory_unlock(%d) = false: the lock it took at %s was gone without an error",
			c.name(), key, b.from.Format(time.StampMilli))
		c.hangUp()
	}
}

// xact takes key with a transaction-level lock (blocking under
// lock_timeout, or the try form) in a transaction, works in it and
// commits.
func (c *folClient) xact(key int64, blocking bool) {
	var tx pgx.Tx
	if err := c.do("BEGIN", func(ctx context.Context) (err error) {
		tx, err = c.conn.Begin(ctx)
		return err
	}); err != nil {
		c.failed("BEGIN", err, nil)
		return
	}
	ok := true
	err := c.do("xact acquire", func(ctx context.Context) error {
		if blocking {
			_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", c.mode(), key)
			return err
		}
		return tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", c.mode(), key).Scan(&ok)
	})
	if err != nil {
		if blocking && sqlState(err) == "55P03" {
			c.r.count(fmt.Sprintf("%s pg_advisory_xact_lock: lock_timeout", c.kind))
			if err := c.do("ROLLBACK", tx.Rollback); err != nil {
				c.failed("ROLLBACK", err, nil)
			}
			return
		}
		c.failed("xact acquire", err, nil)
		return
	}
	var b *folBelief
	if ok {
		b = c.believe(key, true)
		if !c.work(b) {
			return
		}
		c.end(b, time.Now(), "", nil)
	} else {
		c.r.count(fmt.Sprintf("%s pg_try_advisory_xact_lock=false", c.kind))
	}
	if err := c.do("COMMIT", tx.Commit); err != nil {
		c.failed("COMMIT", err, b)
	}
}

// folFailover is one change of the primary and when its steps happened.
type folFailover struct {
	crash bool
	ts    pgtest.SwitchoverTimes
}

func (f folFailover) String() string {
	kind := "switchover"
	if f.crash {
		kind = "crash"
	}
	return fmt.Sprintf("%s at %s (old primary gone after %v, new one promoted %v later)", kind,
		f.ts.Stopping.Format(time.StampMilli), f.ts.Stopped.Sub(f.ts.Stopping).Round(time.Millisecond),
		f.ts.Promoted.Sub(f.ts.Stopped).Round(time.Millisecond))
}

// spans reports whether belief b lasted across f's loss of the old
// primary: the lock was taken there (before it was gone) and was still
// believed held when it was gone, or an error ended the belief while it
// went.
func (f folFailover) spans(b *folBelief) bool {
	if !b.from.Before(f.ts.Stopped) {
		return false
	}
	return b.to.IsZero() || !b.to.Before(f.ts.Stopped) || b.err != nil && !b.to.Before(f.ts.Stopping)
}

// TestFailoverLockOracle: a primary and its synchronous standby, lockpool
// over both with an application under advisory_locks: hold and one under
// pin, and random clients of both and direct sessions on the current
// primary, each taking a random key of a small key space (session-level,
// blocking or try, or transaction-level in a transaction), working,
// unlocking, while the primary changes: switchovers and crash failovers
// (testenv.PlanFailovers: a soak under LOCKPOOL_FAILOVER_SOAK). The oracle:
//
//  1. no two clients ever believed they held the same key at once; a
//     belief lasts from the acquire's reply until just before its unlock
//     or COMMIT is sent, or until an error reaches the client, so a client
//     whose lock was lost with the old primary must have been told before
//     anyone's acquire of the key returns on the new one;
//  2. every lockpool client that held a lock when the old primary went got
//     an error before the new primary was promoted (from then on anyone
//     may take the key there: check 1 at its most adversarial), and its
//     connection was closed: for a session-level lock under hold the FATAL
//     57P01 of lost locks, whose hint names the primary change (unless its
//     own statement's server connection died first and brought that
//     connection's FATAL); and it happened to some clients of both
//     applications, some hold clients with the FATAL of lost locks;
//  3. no call hangs: each has a deadline.
//
// One overlap of check 1 is tolerated: an acquire that returned on the old
// primary while it stopped, against a holder whose lock PostgreSQL had
// released there a moment before and whose error was still on its way
// through lockpool (see folRun.check).
func TestFailoverLockOracle(t *testing.T) {
	plan := testenv.PlanFailovers(t, 3, 8*time.Second)
	if plan.Soak {
		t.Parallel()
	}
	seed := lkrSeed(t, 20261215)
	pair := testenv.StartPair(t, true)
	setup := testenv.Context(t, time.Minute)
	if err := pair.Primary.CreateRole(setup, folPinUser, testenv.Password); err != nil {
		t.Fatal(err)
	}
	lp, _ := startFailoverLockpool(t, pair, testenv.App{Name: folPinApp, User: folPinUser, DB: "appdb", Max: 8, Pinned: 6, Advisory: "pin", State: "pin", Wait: "10s"})

	r := &folRun{t: t, log: testenv.NewLockLog(), counts: map[string]int{}}
	direct := fmt.Sprintf("host=%s,%s port=%d,%d user=app password=%s dbname=appdb sslmode=disable target_session_attrs=primary connect_timeout=2 lock_timeout=%s",
		pair.Primary.Host, pair.Standby.Host, pair.Primary.Port, pair.Standby.Port, testenv.Password, folLockTimeout)
	var clients []*folClient
	add := func(n int, kind folKind, dsn string) {
		for range n {
			id := len(clients)
			clients = append(clients, &folClient{r: r, id: id, kind: kind, dsn: dsn, rng: rand.New(rand.NewSource(seed + int64(id)))})
		}
	}
	add(folHolders, folHold, lp.DSN("app", "appdb")+" lock_timeout="+folLockTimeout)
	add(folPinners, folPin, lp.DSN(folPinUser, "appdb")+" lock_timeout="+folLockTimeout)
	add(folDirects, folDirect, direct)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(stop)
		}()
	}

	// The failovers: one in four a crash (the second of the short run),
	// the others switchovers.
	var fos []folFailover
	start := time.Now()
	for i := range plan.Failovers {
		at := start.Add(folWarmup + time.Duration(i)*plan.Every)
		time.Sleep(time.Until(at.Add(-folSoon)))
		r.soon.Store(true)
		time.Sleep(time.Until(at))
		f := folFailover{crash: i%4 == 1}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var err error
		if f.crash {
			f.ts, err = pair.Crash(ctx)
		} else {
			f.ts, err = pair.Switch(ctx)
		}
		cancel()
		r.soon.Store(false)
		if err != nil {
			t.Errorf("failover %d: %v", i+1, err)
			break
		}
		fos = append(fos, f)
		t.Logf("failover %d: %v", len(fos), f)
	}
	time.Sleep(folTail)
	close(stop)
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * folCall):
		t.Fatalf("the clients did not stop within %v: %s", 2*folCall, testenv.DumpGoroutines(t))
	}

	// lockpool followed every failover.
	testenv.Eventually(t, 10*time.Second, "lockpool_failovers_total to count every failover", func() bool {
		return lp.Metric("lockpool_failovers_total", nil) == float64(len(fos))
	})

	r.check(fos)

	// Nothing is left on the primary once every client has gone.
	end := testenv.Context(t, 30*time.Second)
	su, err := testenv.Connect(end, pair.Primary, "appdb")
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	var left int
	if !lkrPoll(time.Now().Add(5*time.Second), 50*time.Millisecond, func() bool {
		err := su.QueryRow(end, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND ((classid::bigint << 32) | objid::bigint) BETWEEN $1 AND $2",
			folKeyBase, folKeyBase+folKeys-1).Scan(&left)
		return err == nil && left == 0
	}) {
		r.failf("%d advisory locks of the test remain on the primary after every client left", left)
	}

	r.summary(seed, len(clients), fos, lp.Metric("lockpool_advisory_locks_lost_total", map[string]string{"app": folHoldApp}))
}

// folTally is what the failovers' check found.
type folTally struct {
	spanning [3]int // beliefs across a failover, by kind
	told     int    // lockpool's among them told as they must be
	lost     int    // hold clients told with the FATAL of lost locks
	races    int    // overlaps tolerated: a release race on the stopping primary
}

// check runs the oracle's checks (1) and (2) once every client stopped.
func (r *folRun) check(fos []folFailover) {
	t := r.t
	byHold := map[*testenv.LockHold]*folBelief{}
	for _, b := range r.beliefs {
		byHold[b.hold] = b
	}
	describe := func(b *folBelief) string {
		what := fmt.Sprintf("%s from %s to %s (", b.c.name(), b.from.Format(time.StampMicro), b.to.Format(time.StampMicro))
		if b.xact {
			what += "xact lock, "
		} else {
			what += "session lock, "
		}
		if b.err == nil {
			return what + "released)"
		}
		return what + b.op + ": " + errText(b.err) + ")"
	}
	// inStop is the failover during whose stop of the old primary t fell.
	inStop := func(at time.Time) (folFailover, bool) {
		for _, f := range fos {
			if !at.Before(f.ts.Stopping) && !at.After(f.ts.Stopped) {
				return f, true
			}
		}
		return folFailover{}, false
	}

	// (1) No two clients believed they held a key at once. One overlap is
	// no violation: a client whose lock the old primary released as it
	// stopped (its backend, or lockpool's lock connection, ended) hears of
	// it a moment after another client's acquire of the key on that same
	// server returned (PostgreSQL serialised the two; the error reaches
	// the first client through lockpool, one more hop). That acquire began
	// during the stop, and its own lock is on the stopping server: it is
	// checked in turn against the acquires on the new primary.
	for _, x := range r.log.Conflicts() {
		a, b := byHold[x.AHold], byHold[x.BHold]
		if f, ok := inStop(b.from); ok && a.err != nil {
			r.tally.races++
			if r.tally.races <= 5 {
				t.Logf("key %d: release race during the stop of the %s: %s; %s", x.Key, f, describe(a), describe(b))
			}
			continue
		}
		r.failf("key %d: two clients believed they held it at once: %s; %s", x.Key, describe(a), describe(b))
	}

	// (2) Every lockpool client that held a lock when the old primary
	// went was told with a FATAL before the new primary was promoted, and
	// closed: under hold, with the FATAL of lost locks, whose hint names
	// the primary change; or, when it was in a statement on a server
	// connection to the old primary, with that connection's FATAL
	// (PostgreSQL's own, or lockpool's of a lost connection), which came
	// first.
	for i, f := range fos {
		var here [3]int
		for _, b := range r.beliefs {
			if !f.spans(b) {
				continue
			}
			here[b.c.kind]++
			what := fmt.Sprintf("failover %d (%s): %s", i+1, f, describe(b))
			pe := testenv.PgError(b.err)
			lost := pe != nil && pe.Severity == "FATAL" && pe.Code == "57P01" && strings.Contains(pe.Hint, folHint)
			switch {
			case b.c.kind == folDirect:
				// PostgreSQL's own behaviour: the oracle's check of itself.
				if b.err == nil || b.to.After(f.ts.Promoted) {
					r.failf("%s: a direct session held a lock across the failover and was not told before the new primary was promoted", what)
				}
				continue
			case b.err == nil:
				r.failf("%s: it held the lock across the failover and got no error", what)
				continue
			case b.to.After(f.ts.Promoted):
				// From the promotion on, anyone may take the key on the new
				// primary: (1) at its most adversarial.
				r.failf("%s: told %v after the new primary was promoted", what, b.to.Sub(f.ts.Promoted).Round(time.Millisecond))
				continue
			case !b.closed:
				r.failf("%s: its connection stayed open after the error", what)
				continue
			case b.c.kind == folHold && !b.xact && b.op != folStatement && !lost:
				hint := ""
				if pe != nil {
					hint = pe.Hint
				}
				r.failf("%s (hint %q): want FATAL 57P01 with a hint that says the %s", what, hint, folHint)
				continue
			}
			r.tally.told++
			if lost && b.c.kind == folHold {
				r.tally.lost++
			}
			r.count(fmt.Sprintf("at a failover, %s (xact %v) during %q got: %s", b.c.kind, b.xact, b.op, errText(b.err)))
		}
		t.Logf("failover %d: locks held across it: %d hold, %d pin, %d direct", i+1, here[folHold], here[folPin], here[folDirect])
		for k := range here {
			r.tally.spanning[k] += here[k]
		}
	}
	// A test that cannot fail is no test: locks must have been held
	// through lockpool at the failovers, and hold clients told of lost
	// locks.
	if len(fos) > 0 && (r.tally.spanning[folHold] == 0 || r.tally.spanning[folPin] == 0 || r.tally.lost == 0) {
		r.failf("the failovers found %d locks held under hold and %d under pin, %d hold clients told of lost locks: want some of each",
			r.tally.spanning[folHold], r.tally.spanning[folPin], r.tally.lost)
	}
}

// summary logs the outcome counts and the run's summary line.
func (r *folRun) summary(seed int64, clients int, fos []folFailover, lostMetric float64) {
	r.mu.Lock()
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %6d  %s", r.counts[k], k)
	}
	acquired := len(r.beliefs)
	r.mu.Unlock()
	r.t.Logf("seed %d: %d clients (%d hold, %d pin, %d direct); outcomes:%s", seed, clients, folHolders, folPinners, folDirects, b.String())
	crashes := 0
	for _, f := range fos {
		if f.crash {
			crashes++
		}
	}
	n := r.tally
	r.t.Logf("soak summary: TestFailoverLockOracle: %d failovers (%d switchovers, %d crashes), %d acquisitions, "+
		"%d FATALs received by the %d lockpool clients holding a lock at a failover (%d hold, %d pin; %d hold clients told of lost locks, lockpool_advisory_locks_lost_total %v), "+
		"%d direct sessions holding one, %d release races on a stopping primary, %d violations",
		len(fos), len(fos)-crashes, crashes, acquired, n.told, n.spanning[folHold]+n.spanning[folPin], n.spanning[folHold], n.spanning[folPin], n.lost, lostMetric,
		n.spanning[folDirect], n.races, r.fails.Load())
}
