package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// The partition tests put the primary in a network namespace and cut it
// off (every packet dropped, no reset) while clients work through lockpool.
const (
	ptUserTimeout = 3 * time.Second
	ptBound       = ptUserTimeout + 2*time.Second // the longest a client may wait for a dead host
	ptPartition   = 10 * time.Second              // how long the partition lasts, well past ptBound
	ptServerLines = "  health_check_interval: 200ms\n  connect_timeout: 2s\n  tcp_user_timeout: 3s"
	ptCallGuard   = 30 * time.Second // a call still running after this is a hang
)

// ptCall is one client call: when it ran and how it ended.
type ptCall struct {
	client     string
	what       string
	start, end time.Time
	err        error
	port       int // inet_server_port() of a read that answered
}

// ptClients are pgx clients through lockpool of kinds:
//   - loop: transactions one after the other (BEGIN, a read, COMMIT),
//     reconnecting after an error;
//   - midtx: inside a transaction (BEGIN and a read done) when the
//     partition begins; then its next statement, then a loop;
//   - sleep: running SELECT pg_sleep(60) when the partition begins; then a
//     loop;
//   - idle: one transaction before the partition, nothing during it, then
//     a loop once there is a primary again (the partition healed, or a
//     standby promoted);
//   - burst: logged in, of an application of its own, and nothing run
//     before the partition; all of them start a loop when it begins.
//
// Every call is timed and recorded, with a guard of ptCallGuard: a call
// that takes that long hangs.
type ptClients struct {
	t        *testing.T
	ctx      context.Context
	dsn      string
	burstDSN string // the burst clients' application
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	partitioned chan struct{} // closed when the partition begins
	back        chan struct{} // closed when the primary is back, or replaced
	ready       sync.WaitGroup

	mu    sync.Mutex
	calls []ptCall
}

// ptKinds is how many clients of each kind a test runs.
type ptKinds struct{ loop, midtx, sleep, idle, burst int }

// names is every client's name.
func (k ptKinds) names() []string {
	var out []string
	for _, x := range []struct {
		kind string
		n    int
	}{{"loop", k.loop}, {"midtx", k.midtx}, {"sleep", k.sleep}, {"idle", k.idle}, {"burst", k.burst}} {
		for i := range x.n {
			out = append(out, fmt.Sprintf("%s%d", x.kind, i))
		}
	}
	return out
}

// ptKindsUsed are the clients of the partition tests: more clients that
// need a new server connection at once than server.dial_concurrency (4),
// so that dials wait for their turn.
var ptKindsUsed = ptKinds{loop: 12, midtx: 2, sleep: 2, idle: 2, burst: 14}

// startPTClients starts the clients of kinds k: those of kind burst log in
// at burstDSN, the others at dsn.
func startPTClients(t *testing.T, dsn, burstDSN string, k ptKinds) *ptClients {
	t.Helper()
	ctx, cancel := context.WithCancel(testenv.Context(t, 2*time.Minute))
	c := &ptClients{t: t, ctx: ctx, dsn: dsn, burstDSN: burstDSN, cancel: cancel, partitioned: make(chan struct{}), back: make(chan struct{})}
	t.Cleanup(c.stop)
	start := func(name string, run func(name string)) {
		c.ready.Add(1)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			run(name)
		}()
	}
	for i := range k.loop {
		start(fmt.Sprintf("loop%d", i), func(name string) {
			c.ready.Done()
			c.loop(name, nil)
		})
	}
	for i := range k.midtx {
		start(fmt.Sprintf("midtx%d", i), c.midTx)
	}
	for i := range k.sleep {
		start(fmt.Sprintf("sleep%d", i), c.sleep)
	}
	for i := range k.idle {
		start(fmt.Sprintf("idle%d", i), c.idle)
	}
	for i := range k.burst {
		start(fmt.Sprintf("burst%d", i), c.burst)
	}
	return c
}

// stop ends the clients and waits for them.
func (c *ptClients) stop() {
	c.cancel()
	c.wg.Wait()
}

// call runs f as one timed call of client and records it.
func (c *ptClients) call(client, what string, f func(ctx context.Context) error) error {
	_, err := c.callPort(client, what, func(ctx context.Context) (int, error) { return 0, f(ctx) })
	return err
}

// callPort is call for a read that returns the server's port.
func (c *ptClients) callPort(client, what string, f func(ctx context.Context) (int, error)) (int, error) {
	ctx, cancel := context.WithTimeout(c.ctx, ptCallGuard)
	defer cancel()
	start := time.Now()
	port, err := f(ctx)
	end := time.Now()
	if c.ctx.Err() != nil {
		return port, err // the test is over: not a result
	}
	c.mu.Lock()
	c.calls = append(c.calls, ptCall{client: client, what: what, start: start, end: end, err: err, port: port})
	c.mu.Unlock()
	return port, err
}

// connect opens a connection through lockpool as one timed call.
func (c *ptClients) connect(client string) (*pgx.Conn, error) {
	dsn := c.dsn
	if strings.HasPrefix(client, "burst") {
		dsn = c.burstDSN
	}
	var conn *pgx.Conn
	err := c.call(client, "connect", func(ctx context.Context) error {
		var err error
		conn, err = pgx.Connect(ctx, dsn)
		return err
	})
	return conn, err
}

// txn runs one transaction (BEGIN, a read of the server's port, COMMIT),
// each statement a timed call; it returns the first error, after which conn is closed.
func (c *ptClients) txn(client string, conn *pgx.Conn) error {
	var tx pgx.Tx
	err := c.call(client, "BEGIN", func(ctx context.Context) error {
		var err error
		tx, err = conn.Begin(ctx)
		return err
	})
	if err == nil {
		_, err = c.callPort(client, "SELECT", func(ctx context.Context) (int, error) {
			var port int
			err := tx.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port)
			return port, err
		})
	}
	if err == nil {
		err = c.call(client, "COMMIT", func(ctx context.Context) error { return tx.Commit(ctx) })
	}
	if err != nil {
		_ = conn.Close(context.Background())
	}
	return err
}

// loop runs transactions until the clients stop, on conn (nil: connect).
func (c *ptClients) loop(client string, conn *pgx.Conn) {
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for c.ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = c.connect(client); err != nil {
				conn = nil
				time.Sleep(20 * time.Millisecond) // pacing of reconnects, not a synchronisation
				continue
			}
		}
		if err := c.txn(client, conn); err != nil {
			conn = nil
			time.Sleep(20 * time.Millisecond) // pacing, as above
		}
	}
}

// midTx is inside a transaction when the partition begins, then runs its
// next statement.
func (c *ptClients) midTx(client string) {
	conn, err := c.connect(client)
	if err != nil {
		c.ready.Done()
		c.t.Errorf("%s: connect: %v", client, err)
		return
	}
	tx, err := conn.Begin(c.ctx)
	if err == nil {
		_, err = tx.Exec(c.ctx, "SELECT 1")
	}
	c.ready.Done()
	if err != nil {
		c.t.Errorf("%s: BEGIN; SELECT 1: %v", client, err)
		return
	}
	select {
	case <-c.partitioned:
	case <-c.ctx.Done():
		return
	}
	err = c.call(client, "in-transaction SELECT", func(ctx context.Context) error {
		_, err := tx.Exec(ctx, "SELECT 2")
		return err
	})
	if err == nil {
		err = c.call(client, "COMMIT", func(ctx context.Context) error { return tx.Commit(ctx) })
	}
	if err != nil {
		_ = conn.Close(context.Background())
		conn = nil
	}
	c.loop(client, conn)
}

// sleep runs SELECT pg_sleep(60), in flight when the partition begins (the
// test waits for it in pg_stat_activity), then loops.
func (c *ptClients) sleep(client string) {
	conn, err := c.connect(client)
	c.ready.Done()
	if err != nil {
		c.t.Errorf("%s: connect: %v", client, err)
		return
	}
	err = c.call(client, "pg_sleep", func(ctx context.Context) error {
		_, err := conn.Exec(ctx, "SELECT pg_sleep(60)")
		return err
	})
	if err != nil {
		_ = conn.Close(context.Background())
		conn = nil
	}
	c.loop(client, conn)
}

// idle runs one transaction before the partition, then waits until the
// primary is back (or replaced), then loops on the same connection.
func (c *ptClients) idle(client string) {
	conn, err := c.connect(client)
	if err == nil {
		err = c.txn(client, conn)
	}
	c.ready.Done()
	if err != nil {
		c.t.Errorf("%s: before the partition: %v", client, err)
		return
	}
	select {
	case <-c.back:
	case <-c.ctx.Done():
		_ = conn.Close(context.Background())
		return
	}
	c.loop(client, conn)
}

// burst logs in before the partition, then starts its first transaction
// when the partition begins, with the other burst clients: their
// application's server connections are not enough, so most of them dial
// then, while lockpool still takes the primary for up; then it loops.
func (c *ptClients) burst(client string) {
	conn, err := c.connect(client)
	c.ready.Done()
	if err != nil {
		c.t.Errorf("%s: connect: %v", client, err)
		return
	}
	select {
	case <-c.partitioned:
	case <-c.ctx.Done():
		_ = conn.Close(context.Background())
		return
	}
	c.loop(client, conn)
}

// snapshot is the calls so far.
func (c *ptClients) snapshot() []ptCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ptCall(nil), c.calls...)
}

// waitSleeping waits until n backends of role app run pg_sleep on the
// primary (seen over its unix socket, which a partition does not cut).
func waitSleeping(t *testing.T, ctx context.Context, c *pgtest.Cluster, n int) {
	t.Helper()
	su, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=appdb sslmode=disable", c.SocketDir, c.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d clients in pg_sleep", n), func() bool {
		k, err := testenv.CountBackends(ctx, su, "usename = 'app' AND state = 'active' AND query LIKE 'SELECT pg_sleep%'")
		return err == nil && k == n
	})
}

// checkBounded fails t for every call that was running while the primary
// was cut off (from cut to until) and returned more than ptBound after it
// started or after the cut, whichever is later; it returns the longest such
// wait and its call, and the number of calls checked and of errors among
// them.
func checkBounded(t *testing.T, calls []ptCall, cut, until time.Time) (longest time.Duration, worst ptCall, checked, errs int) {
	t.Helper()
	for _, c := range calls {
		if c.end.Before(cut) || c.start.After(until) {
			continue
		}
		checked++
		if c.err != nil {
			errs++
		}
		from := c.start
		if from.Before(cut) {
			from = cut
		}
		wait := c.end.Sub(from)
		if wait > longest {
			longest, worst = wait, c
		}
		if wait > ptBound {
			t.Errorf("%s: %s returned %v after the partition or its start (%v), want within tcp_user_timeout + 2s = %v: %v",
				c.client, c.what, wait.Round(time.Millisecond), c.start.Format("15:04:05.000"), ptBound, errText(c.err))
		}
	}
	return longest, worst, checked, errs
}

// outcomes summarises calls by client kind, what and outcome.
func outcomes(calls []ptCall) string {
	n := map[string]int{}
	for _, c := range calls {
		kind := strings.TrimRight(c.client, "0123456789")
		n[kind+" "+c.what+": "+errText(c.err)]++
	}
	var lines []string
	for k, v := range n {
		lines = append(lines, fmt.Sprintf("  %3d × %s", v, k))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// startPartitionLockpool runs lockpool over the pair with applications api
// (role app) and burst (role burster), target primary, whose budgets leave
// room for every client, so no client waits for a slot.
func startPartitionLockpool(t *testing.T, pair *testenv.Pair) (*testenv.Lockpool, *testenv.LogBuffer) {
	t.Helper()
	if err := pair.Primary.CreateRole(testenv.Context(t, 30*time.Second), "burster", testenv.Password); err != nil {
		t.Fatal(err)
	}
	api := testenv.App{Name: "api", User: "app", DB: "appdb", Max: 24, Pinned: 1, Advisory: "pin", State: "pin", Wait: "2s"}
	burst := testenv.App{Name: "burst", User: "burster", DB: "appdb", Max: 16, Pinned: 1, Advisory: "pin", State: "pin", Wait: "2s"}
	yaml := testenv.HostsYAML([]*pgtest.Cluster{pair.Primary, pair.Standby}, 48, "", ptServerLines, api, burst)
	lp, log := testenv.StartYAML(t, yaml)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lockpool log:\n%s", log.String())
		}
	})
	testenv.Eventually(t, 20*time.Second, "lockpool to see the primary and the standby", func() bool {
		hs := lp.Hosts()
		return testenv.HostRow(hs, pair.Primary).State == "primary" && testenv.HostRow(hs, pair.Standby).State == "standby"
	})
	return lp, log
}

// TestPartitionClients: the primary is cut off the network (its packets
// dropped, no reset) for ten seconds while 32 pgx clients work through
// lockpool with tcp_user_timeout 3s, connect_timeout 2s and wait_timeout
// 2s: clients looping over transactions, clients inside a transaction,
// clients running pg_sleep, idle clients, and a burst of clients that all
// need a new server connection as the partition begins (more than
// server.dial_concurrency, so dials wait for their turn). Every call that
// was running during the partition returns, with an error or an answer,
// within tcp_user_timeout + 2 s of the partition or of its own start; none
// hangs; SHOW HOSTS says the primary is down. Once the partition heals,
// service resumes: every client, the idle ones included, completes
// transactions again, on the primary.
func TestPartitionClients(t *testing.T) {
	pair := testenv.StartPairWith(t, testenv.PairOptions{NetNS: true})
	lp, log := startPartitionLockpool(t, pair)
	ctx := testenv.Context(t, 2*time.Minute)

	cl := startPTClients(t, lp.DSN("app", "appdb"), lp.DSN("burster", "appdb"), ptKindsUsed)
	cl.ready.Wait()
	waitSleeping(t, ctx, pair.Primary, ptKindsUsed.sleep)
	if t.Failed() {
		t.FailNow()
	}
	testenv.Eventually(t, 10*time.Second, "the looping clients' transactions", func() bool { return len(cl.snapshot()) >= 100 })

	if err := pair.Primary.Partition(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	close(cl.partitioned)
	t.Cleanup(func() { _ = pair.Primary.Heal() })
	testenv.Eventually(t, 10*time.Second, "SHOW HOSTS: the primary down", func() bool {
		return testenv.HostRow(lp.Hosts(), pair.Primary).State == "down"
	})
	down := time.Since(cut)
	// The partition lasts ptPartition; meanwhile the clients' calls are
	// bounded, which checkBounded checks below.
	time.Sleep(ptPartition - time.Since(cut)) // the partition's length: no signal to wait for
	if err := pair.Primary.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	close(cl.back)

	// Service resumes: every client completes a transaction that began
	// after the heal.
	lastResume := cl.waitResumed(healed, pair.Primary.Port, ptKindsUsed)
	n := len(cl.snapshot())
	testenv.Eventually(t, 10*time.Second, "transactions go on", func() bool { return len(cl.snapshot()) >= n+100 })
	cl.stop()
	calls := cl.snapshot()

	longest, worst, checked, errs := checkBounded(t, calls, cut, healed)
	t.Logf("partition %v; SHOW HOSTS said down %v after the cut; %d calls ran during it, %d of them failed; longest wait %v (%s %s: %s); every client committed again within %v of the heal",
		ptPartition, down.Round(time.Millisecond), checked, errs, longest.Round(time.Millisecond), worst.client, worst.what, errText(worst.err), lastResume.Round(time.Millisecond))
	t.Logf("calls during the partition:\n%s", outcomes(during(calls, cut, healed)))
	t.Logf("calls after the heal:\n%s", outcomes(during(calls, healed, time.Now())))

	// The clients inside a transaction and in pg_sleep lost their server
	// connection: each got an error.
	for _, c := range calls {
		if (c.what == "in-transaction SELECT" || c.what == "pg_sleep") && c.err == nil {
			t.Errorf("%s: %s succeeded across the partition, want an error", c.client, c.what)
		}
	}
	// After the heal, the clients run on the primary again: no failed
	// call began later than a second after it, and every read ran there.
	for _, c := range calls {
		if c.err != nil && c.start.After(healed.Add(time.Second)) {
			t.Errorf("%s: %s at %v, %v after the heal: %v", c.client, c.what, c.start.Format("15:04:05.000"),
				c.start.Sub(healed).Round(time.Millisecond), errText(c.err))
		}
		if c.what == "SELECT" && c.err == nil && c.port != pair.Primary.Port {
			t.Errorf("%s: a read ran on port %d, not the primary's %d", c.client, c.port, pair.Primary.Port)
		}
	}
	if !strings.Contains(log.String(), "hosts: host does not answer") {
		t.Error(`no log line "hosts: host does not answer" for the partitioned primary`)
	}
	if st := testenv.HostRow(lp.Hosts(), pair.Primary).State; st != "primary" {
		t.Errorf("SHOW HOSTS after the heal: the primary is %s", st)
	}
	logFailures(t, calls, cut)
}

// waitResumed waits until every client committed a transaction that
// began after since and read port as inet_server_port(), and returns how
// long after since the last of them committed its first such transaction.
func (c *ptClients) waitResumed(since time.Time, port int, k ptKinds) time.Duration {
	c.t.Helper()
	want := map[string]bool{}
	for _, n := range k.names() {
		want[n] = true
	}
	var last time.Duration
	testenv.Eventually(c.t, 20*time.Second, fmt.Sprintf("a transaction of every client on port %d", port), func() bool {
		onPort := map[string]bool{} // the client's last read, since since, ran on port
		done := map[string]time.Time{}
		for _, x := range c.snapshot() {
			if x.start.Before(since) {
				continue
			}
			switch {
			case x.what == "SELECT" && x.err == nil:
				onPort[x.client] = x.port == port
			case x.what == "COMMIT" && x.err == nil && onPort[x.client]:
				if _, ok := done[x.client]; !ok {
					done[x.client] = x.end
				}
			}
		}
		last = 0
		for cl := range want {
			at, ok := done[cl]
			if !ok {
				return false
			}
			last = max(last, at.Sub(since))
		}
		return true
	})
	return last
}

// logFailures logs, when t failed, every failed call with its times from
// the cut.
func logFailures(t *testing.T, calls []ptCall, cut time.Time) {
	if !t.Failed() {
		return
	}
	for _, c := range calls {
		if c.err != nil {
			t.Logf("%s %s: from %v to %v after the cut: %s", c.client, c.what,
				c.start.Sub(cut).Round(time.Millisecond), c.end.Sub(cut).Round(time.Millisecond), errText(c.err))
		}
	}
}

// during is the calls that were running at some time in [from, to].
func during(calls []ptCall, from, to time.Time) []ptCall {
	var out []ptCall
	for _, c := range calls {
		if !c.end.Before(from) && !c.start.After(to) {
			out = append(out, c)
		}
	}
	return out
}

// TestPartitionPromote: the primary is cut off the network (no reset) while
// the clients of TestPartitionClients work through lockpool, and once
// lockpool finds it down the standby is promoted: lockpool moves to the new
// primary without a restart or a reload. Every call running meanwhile
// returns within tcp_user_timeout + 2 s of the partition or of its own
// start; the clients inside a transaction or in pg_sleep on the old
// primary get an error; every client, the idle ones included, commits on
// the new primary within tcp_user_timeout + 2 s of the promotion, and no
// read after the cut runs on the old primary (dials that waited for their
// turn go to the new one); lockpool_failovers_total is 1.
func TestPartitionPromote(t *testing.T) {
	pair := testenv.StartPairWith(t, testenv.PairOptions{NetNS: true})
	lp, log := startPartitionLockpool(t, pair)
	ctx := testenv.Context(t, 2*time.Minute)

	cl := startPTClients(t, lp.DSN("app", "appdb"), lp.DSN("burster", "appdb"), ptKindsUsed)
	cl.ready.Wait()
	waitSleeping(t, ctx, pair.Primary, ptKindsUsed.sleep)
	if t.Failed() {
		t.FailNow()
	}
	testenv.Eventually(t, 10*time.Second, "the looping clients' transactions", func() bool { return len(cl.snapshot()) >= 100 })

	old, next := pair.Primary, pair.Standby
	if err := old.Partition(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	close(cl.partitioned)
	// The old primary stays cut off until the end: healed, it would answer
	// as a second primary (a split brain, another test's matter).
	testenv.Eventually(t, 10*time.Second, "SHOW HOSTS: the primary down", func() bool {
		return testenv.HostRow(lp.Hosts(), old).State == "down"
	})
	down := time.Since(cut)
	if err := next.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	pair.Primary, pair.Standby = next, old
	close(cl.back)

	lastResume := cl.waitResumed(promoted, next.Port, ptKindsUsed)
	n := len(cl.snapshot())
	testenv.Eventually(t, 10*time.Second, "transactions go on", func() bool { return len(cl.snapshot()) >= n+100 })
	cl.stop()
	calls := cl.snapshot()

	longest, worst, checked, errs := checkBounded(t, calls, cut, time.Now())
	t.Logf("SHOW HOSTS said down %v after the cut, promoted %v after it; %d calls ran since the cut, %d of them failed; longest wait %v (%s %s: %s); every client committed on the new primary within %v of the promotion",
		down.Round(time.Millisecond), promoted.Sub(cut).Round(time.Millisecond), checked, errs, longest.Round(time.Millisecond),
		worst.client, worst.what, errText(worst.err), lastResume.Round(time.Millisecond))
	t.Logf("calls from the cut to the promotion:\n%s", outcomes(during(calls, cut, promoted)))
	t.Logf("calls after the promotion:\n%s", outcomes(during(calls, promoted, time.Now())))
	if lastResume > ptBound {
		t.Errorf("the last client committed on the new primary %v after the promotion, want within %v", lastResume.Round(time.Millisecond), ptBound)
	}
	for _, c := range calls {
		if (c.what == "in-transaction SELECT" || c.what == "pg_sleep") && c.err == nil {
			t.Errorf("%s: %s succeeded across the partition, want an error", c.client, c.what)
		}
		if c.what == "SELECT" && c.err == nil && c.start.After(cut) && c.port != next.Port {
			t.Errorf("%s: a read after the cut ran on port %d, not the new primary's %d", c.client, c.port, next.Port)
		}
	}
	if got := lp.Metric("lockpool_failovers_total", nil); got != 1 {
		t.Errorf("lockpool_failovers_total = %v, want 1", got)
	}
	if got := lp.Metric("lockpool_host_role", map[string]string{"host": testenv.Addr(next), "role": "primary"}); got != 1 {
		t.Errorf("lockpool_host_role{host=%s,role=primary} = %v, want 1", testenv.Addr(next), got)
	}
	if !strings.Contains(log.String(), "hosts: primary changed") {
		t.Error(`no log line "hosts: primary changed"`)
	}
	logFailures(t, calls, cut)
}
