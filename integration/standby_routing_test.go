package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// The standby routing tests run lockpool over a primary and its
// asynchronous standby with three applications of their own roles:
// api (role app, target primary), reads (role reader, target standby) and
// prefer (role fallback, target prefer-standby), both of the latter with
// max_lag srMaxLag.
const (
	srMaxLag      = time.Second
	srReadsWait   = 2 * time.Second // wait_timeout of reads: how long its 53300 takes
	srServerLines = "  health_check_interval: 100ms\n  connect_timeout: 2s\n  tcp_user_timeout: 5s"
)

// The 53300 a target: standby application gets when no standby is within
// max_lag (hosts.Monitor.noHost).
const (
	srNoStandbyMessage = "lockpool: no standby is available within max_lag 1s"
	srNoStandbyHint    = "Every standby is down or replays further behind than max_lag; raise max_lag, or use target prefer-standby to fall back to the primary."
)

// srEnv is one standby routing test's pair and lockpool.
type srEnv struct {
	t    *testing.T
	ctx  context.Context
	pair *testenv.Pair
	lp   *testenv.Lockpool
	log  *testenv.LogBuffer
	// superuser connections to appdb on each host, for pg_stat_activity
	onPrimary, onStandby *pgx.Conn
}

// startStandbyRouting starts the pair, the roles reader and fallback, the
// table sr_rows (one row, replayed on the standby, so that the standby's
// replay lag has a last replayed commit to count from), and lockpool; it
// returns once lockpool sees one primary and one standby.
func startStandbyRouting(t *testing.T) *srEnv {
	t.Helper()
	ctx := testenv.Context(t, 90*time.Second)
	pair := testenv.StartPair(t, false)
	for _, role := range []string{"reader", "fallback"} {
		if err := pair.Primary.CreateRole(ctx, role, testenv.Password); err != nil {
			t.Fatal(err)
		}
	}
	if err := pair.Exec(ctx, "appdb", `CREATE TABLE sr_rows (n int NOT NULL);
		ALTER TABLE sr_rows OWNER TO app;
		GRANT SELECT ON sr_rows TO reader, fallback;
		INSERT INTO sr_rows VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := pair.Primary.WaitReplayed(ctx, pair.Standby); err != nil {
		t.Fatal(err)
	}
	api := testenv.App{Name: "api", User: "app", DB: "appdb", Max: 4, Pinned: 1, Advisory: "pin", State: "pin", Wait: "5s"}
	reads := testenv.App{Name: "reads", User: "reader", DB: "appdb", Max: 4, Pinned: 1, Advisory: "pin", State: "pin",
		Wait: srReadsWait.String(), Target: "standby", MaxLag: srMaxLag.String()}
	prefer := testenv.App{Name: "prefer", User: "fallback", DB: "appdb", Max: 4, Pinned: 1, Advisory: "pin", State: "pin",
		Wait: "5s", Target: "prefer-standby", MaxLag: srMaxLag.String()}
	yaml := testenv.HostsYAML([]*pgtest.Cluster{pair.Primary, pair.Standby}, 20, "", srServerLines, api, reads, prefer)
	lp, log := testenv.StartYAML(t, yaml)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lockpool log:\n%s", log.String())
		}
	})
	e := &srEnv{t: t, ctx: ctx, pair: pair, lp: lp, log: log}
	var err error
	if e.onPrimary, err = testenv.Connect(ctx, pair.Primary, "appdb"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.onPrimary.Close(context.Background()) })
	if e.onStandby, err = testenv.Connect(ctx, pair.Standby, "appdb"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.onStandby.Close(context.Background()) })
	e.waitStates("primary", "standby")
	return e
}

// waitStates waits until SHOW HOSTS names the primary's and the standby's
// states so.
func (e *srEnv) waitStates(primary, standby string) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, "hosts "+primary+" and "+standby, func() bool {
		hs := e.lp.Hosts()
		return testenv.HostRow(hs, e.pair.Primary).State == primary && testenv.HostRow(hs, e.pair.Standby).State == standby
	})
}

// srServed is where one transaction through lockpool ran.
type srServed struct {
	pid     uint32
	standby bool // pg_is_in_recovery()
	port    int  // inet_server_port()
}

// read runs one transaction on conn that reads sr_rows and says where it
// runs; while it is open, check sees where it ran. It fails the test on an
// error.
func (e *srEnv) read(conn *pgx.Conn, check func(srServed)) srServed {
	e.t.Helper()
	tx, err := conn.Begin(e.ctx)
	if err != nil {
		e.t.Fatalf("%s: BEGIN: %v (%s)", conn.Config().User, err, pgDetail(err))
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var s srServed
	var n int
	err = tx.QueryRow(e.ctx, "SELECT pg_backend_pid(), pg_is_in_recovery(), inet_server_port(), (SELECT count(*) FROM sr_rows)").
		Scan(&s.pid, &s.standby, &s.port, &n)
	if err != nil {
		e.t.Fatalf("%s: read: %v (%s)", conn.Config().User, err, pgDetail(err))
	}
	if n < 1 {
		e.t.Fatalf("%s: sr_rows has %d rows, want at least 1", conn.Config().User, n)
	}
	if check != nil {
		check(s)
	}
	if err := tx.Commit(e.ctx); err != nil {
		e.t.Fatalf("%s: COMMIT: %v", conn.Config().User, err)
	}
	return s
}

// pgDetail is the detail of a PostgreSQL error (lockpool's 53300 names
// the hosts' states there).
func pgDetail(err error) string {
	if pe := testenv.PgError(err); pe != nil {
		return pe.Detail
	}
	return ""
}

// wantOn checks that a transaction of role user ran on host on (the
// standby or the primary), open now: inet_server_port() is on's port, and
// its backend is in on's pg_stat_activity as user on appdb, idle in
// transaction, and not in the other host's (unless that one is stopped:
// its connection is nil).
func (e *srEnv) wantOn(user string, on *pgtest.Cluster) func(srServed) {
	return func(s srServed) {
		e.t.Helper()
		here, there := e.onPrimary, e.onStandby
		wantStandby := on == e.pair.Standby
		if wantStandby {
			here, there = e.onStandby, e.onPrimary
		}
		if s.standby != wantStandby || s.port != on.Port {
			e.t.Fatalf("%s: transaction ran with pg_is_in_recovery() %v on port %d, want %v on %d",
				user, s.standby, s.port, wantStandby, on.Port)
		}
		var usename, datname, state string
		err := here.QueryRow(e.ctx, "SELECT usename, datname, state FROM pg_stat_activity WHERE pid = $1", s.pid).
			Scan(&usename, &datname, &state)
		if err != nil {
			e.t.Fatalf("%s: backend %d in pg_stat_activity on port %d: %v", user, s.pid, on.Port, err)
		}
		if usename != user || datname != "appdb" || state != "idle in transaction" {
			e.t.Fatalf("%s: backend %d on port %d is %s on %s, %s; want %s on appdb, idle in transaction",
				user, s.pid, on.Port, usename, datname, state, user)
		}
		if there == nil {
			return // the other host is stopped
		}
		var elsewhere int
		if err := there.QueryRow(e.ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", s.pid).Scan(&elsewhere); err != nil {
			e.t.Fatal(err)
		}
		if elsewhere != 0 {
			e.t.Fatalf("%s: backend %d is also in the other host's pg_stat_activity", user, s.pid)
		}
	}
}

// wantNoStandby runs one autocommit read on conn (of target standby) and
// checks that it fails after about wait_timeout with the 53300 of no
// standby within max_lag, whose detail names the standby as state.
func (e *srEnv) wantNoStandby(conn *pgx.Conn, state string) time.Duration {
	e.t.Helper()
	t0 := time.Now()
	var in bool
	err := conn.QueryRow(e.ctx, "SELECT pg_is_in_recovery() FROM sr_rows LIMIT 1").Scan(&in)
	took := time.Since(t0)
	if err == nil {
		e.t.Fatalf("reads: a read ran (pg_is_in_recovery() %v) with no standby within max_lag", in)
	}
	pe := testenv.RequireCode(e.t, err, "53300")
	if pe.Message != srNoStandbyMessage || pe.Hint != srNoStandbyHint {
		e.t.Errorf("reads: 53300 %q hint %q, want %q hint %q", pe.Message, pe.Hint, srNoStandbyMessage, srNoStandbyHint)
	}
	if want := testenv.Addr(e.pair.Standby) + " " + state; !strings.Contains(pe.Detail, want) {
		e.t.Errorf("reads: 53300 detail %q does not name %q", pe.Detail, want)
	}
	if took < srReadsWait*9/10 || took > srReadsWait+3*time.Second {
		e.t.Errorf("reads: 53300 after %v, want after its wait_timeout %v", took.Round(time.Millisecond), srReadsWait)
	}
	if pe.Severity != "ERROR" {
		e.t.Errorf("reads: 53300 with severity %s, want ERROR (the client stays connected)", pe.Severity)
	}
	// At once: the next dial that succeeds would clear the gauge.
	e.wantReachable()
	return took
}

// wantReachable checks that lockpool did not take the missing standby for
// PostgreSQL being unreachable: the primary answered all along.
func (e *srEnv) wantReachable() {
	e.t.Helper()
	if got := e.lp.Metric("lockpool_server_unreachable", nil); got != 0 {
		e.t.Errorf("lockpool_server_unreachable = %v while the primary answers, want 0", got)
	}
	if strings.Contains(e.log.String(), "PostgreSQL unreachable") {
		e.t.Error(`lockpool logged "PostgreSQL unreachable" while the primary answers`)
	}
}

// TestStandbyRouting: with a primary and a standby in server.hosts, every
// transaction of a target: standby application and of a target:
// prefer-standby application runs on the standby (its backend is in the
// standby's pg_stat_activity, as its role, idle in transaction while the
// transaction is open, and not in the primary's; pg_is_in_recovery() is
// true), and every transaction of a target: primary application runs on the
// primary; SHOW HOSTS counts the connections of each host.
func TestStandbyRouting(t *testing.T) {
	e := startStandbyRouting(t)
	reader := e.lp.Connect(t, "reader", "appdb")
	fallback := e.lp.Connect(t, "fallback", "appdb")
	app := e.lp.Connect(t, "app", "appdb")
	const rounds = 10
	for range rounds {
		e.read(reader, e.wantOn("reader", e.pair.Standby))
		e.read(fallback, e.wantOn("fallback", e.pair.Standby))
		e.read(app, e.wantOn("app", e.pair.Primary))
	}
	// Autocommit statements too, and writes of the primary application.
	var in bool
	if err := reader.QueryRow(e.ctx, "SELECT pg_is_in_recovery()").Scan(&in); err != nil || !in {
		t.Fatalf("reads: autocommit pg_is_in_recovery() = %v, %v; want true", in, err)
	}
	if _, err := reader.Exec(e.ctx, "INSERT INTO sr_rows VALUES (2)"); testenv.Code(err) != "25006" {
		t.Errorf("reads: INSERT: %v, want 25006 (read-only transaction, as on the standby)", err)
	}
	if _, err := app.Exec(e.ctx, "INSERT INTO sr_rows VALUES (2)"); err != nil {
		t.Fatalf("api: INSERT: %v", err)
	}
	hs := e.lp.Hosts()
	p, s := testenv.HostRow(hs, e.pair.Primary), testenv.HostRow(hs, e.pair.Standby)
	t.Logf("%d transactions of each application; SHOW HOSTS: primary %s %d connections, standby %s %d connections",
		rounds, p.State, p.Connections, s.State, s.Connections)
	if p.Connections < 1 || s.Connections < 2 {
		t.Errorf("SHOW HOSTS counts %d connections on the primary and %d on the standby, want at least 1 and 2", p.Connections, s.Connections)
	}
	if got := e.lp.Metric("lockpool_host_server_connections", map[string]string{"host": testenv.Addr(e.pair.Standby)}); got < 2 {
		t.Errorf("lockpool_host_server_connections{host=standby} = %v, want at least 2", got)
	}
	e.wantReachable()
}

// TestStandbyRoutingLag: with the standby's replay paused while the primary
// writes, once lockpool measures its replay lag past max_lag (SHOW HOSTS
// and lockpool_host_replay_lag_seconds) the standby is excluded: a target:
// standby application's statement waits its wait_timeout and fails with
// 53300, the no-standby message and hint, and the standby named lagging in
// the detail, while lockpool_server_unreachable stays 0 (the primary
// answers); a target: prefer-standby application's transactions run on the
// primary meanwhile. Once replay resumes and catches up, both run on the
// standby again, and prefer-standby's connections to the primary are
// closed.
func TestStandbyRoutingLag(t *testing.T) {
	e := startStandbyRouting(t)
	reader := e.lp.Connect(t, "reader", "appdb")
	fallback := e.lp.Connect(t, "fallback", "appdb")
	e.read(reader, e.wantOn("reader", e.pair.Standby))
	e.read(fallback, e.wantOn("fallback", e.pair.Standby))

	if err := e.pair.Standby.PauseReplay(e.ctx); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	// Lag grows only once the standby has received WAL it does not replay.
	if err := e.pair.Exec(e.ctx, "appdb", "INSERT INTO sr_rows VALUES (3)"); err != nil {
		t.Fatal(err)
	}
	standbyAddr := testenv.Addr(e.pair.Standby)
	testenv.Eventually(t, 20*time.Second, "the standby's replay lag past max_lag", func() bool {
		return testenv.HostRow(e.lp.Hosts(), e.pair.Standby).LagSeconds > srMaxLag.Seconds()
	})
	lag := e.lp.Metric("lockpool_host_replay_lag_seconds", map[string]string{"host": standbyAddr})
	t.Logf("lag past max_lag %v after the pause; lockpool_host_replay_lag_seconds = %.2f", time.Since(paused).Round(time.Millisecond), lag)
	if lag <= srMaxLag.Seconds() {
		t.Errorf("lockpool_host_replay_lag_seconds{host=%s} = %v, want > %v", standbyAddr, lag, srMaxLag.Seconds())
	}

	took := e.wantNoStandby(reader, "lagging")
	t.Logf("target standby: 53300 after %v", took.Round(time.Millisecond))
	// A fresh client of the same application gets the same.
	e.wantNoStandby(e.lp.Connect(t, "reader", "appdb"), "lagging")
	for range 3 {
		e.read(fallback, e.wantOn("fallback", e.pair.Primary))
	}
	e.wantReachable()

	if err := e.pair.Standby.ResumeReplay(e.ctx); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	testenv.Eventually(t, 20*time.Second, "the standby's replay lag within max_lag", func() bool {
		return testenv.HostRow(e.lp.Hosts(), e.pair.Standby).LagSeconds <= srMaxLag.Seconds()
	})
	t.Logf("lag within max_lag %v after replay resumed", time.Since(resumed).Round(time.Millisecond))
	e.read(fallback, e.wantOn("fallback", e.pair.Standby))
	e.read(reader, e.wantOn("reader", e.pair.Standby))
	// The reader's statement that failed left it connected, outside a
	// transaction: autocommit statements run too.
	var n int
	if err := reader.QueryRow(e.ctx, "SELECT count(*) FROM sr_rows").Scan(&n); err != nil || n != 2 {
		t.Fatalf("reads after the resume: count %d, %v; want 2 (the row written during the pause, replayed)", n, err)
	}
	testenv.Eventually(t, 10*time.Second, "prefer-standby's connections to the primary closed", func() bool {
		k, err := testenv.CountBackends(e.ctx, e.onPrimary, "usename = 'fallback'")
		return err == nil && k == 0
	})
	e.wantReachable()
}

// TestStandbyRoutingDown: a standby that stops answering (stopped) is
// excluded: SHOW HOSTS says down, a target: standby application gets 53300
// after its wait_timeout with the no-standby hint and the standby named
// down, lockpool_server_unreachable stays 0 (the primary answers), and a
// target: prefer-standby application runs on the primary; once the standby
// is started again (the primary idle meanwhile), lockpool finds it within
// max_lag, and both run on it.
func TestStandbyRoutingDown(t *testing.T) {
	e := startStandbyRouting(t)
	reader := e.lp.Connect(t, "reader", "appdb")
	fallback := e.lp.Connect(t, "fallback", "appdb")
	e.read(reader, e.wantOn("reader", e.pair.Standby))
	e.read(fallback, e.wantOn("fallback", e.pair.Standby))

	if err := e.pair.Standby.Stop(); err != nil {
		t.Fatal(err)
	}
	_ = e.onStandby.Close(context.Background())
	e.onStandby = nil
	stopped := time.Now()
	e.waitStates("primary", "down")
	t.Logf("SHOW HOSTS says down %v after the stop", time.Since(stopped).Round(time.Millisecond))
	// The reader's idle server connection died with the standby; its next
	// statement is not run on the primary.
	took := e.wantNoStandby(reader, "down")
	t.Logf("target standby: 53300 after %v", took.Round(time.Millisecond))
	for range 3 {
		e.read(fallback, e.wantOn("fallback", e.pair.Primary))
	}
	e.wantReachable()

	if err := e.pair.Standby.StartAgain(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	var err error
	if e.onStandby, err = testenv.Connect(e.ctx, e.pair.Standby, "appdb"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.onStandby.Close(context.Background()) })
	e.waitStates("primary", "standby")
	// Until its WAL receiver streams again, the standby's lag counts from
	// its last replayed commit; then it has replayed all it received.
	testenv.Eventually(t, 20*time.Second, "the restarted standby within max_lag", func() bool {
		return testenv.HostRow(e.lp.Hosts(), e.pair.Standby).LagSeconds <= srMaxLag.Seconds()
	})
	t.Logf("the restarted standby is within max_lag %v after its start", time.Since(restarted).Round(time.Millisecond))
	e.read(reader, e.wantOn("reader", e.pair.Standby))
	e.read(fallback, e.wantOn("fallback", e.pair.Standby))
	e.wantReachable()
}
