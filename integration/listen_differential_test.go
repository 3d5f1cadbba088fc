package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestListenDifferential runs LISTEN/NOTIFY scenarios, each a function of
// client code, once directly against PostgreSQL (twice: the two runs must
// agree, or the scenario itself is not deterministic) and once through
// lockpool (one application, listen: shared unless LOCKPOOL_LISTEN_MODE
// says otherwise, a budget nothing waits for), and compares what the
// clients observed: every statement's command tag or SQLSTATE (and the
// SQLSTATEs of its notices), every pg_listening_channels() result, and every
// notification with its channel, payload and sender, in order. The sender
// is named by whose PID() the notification's pid equals: "self" when it is
// the receiving client's own (the own-pid flag), the name of another client
// of the scenario, or "?" when it matches none. The same scenarios run with
// node-postgres (integration/node/listen_scenarios.js), compared the same
// way.
//
// Timing. No sleep synchronises anything. A scenario waits for a
// notification it expects (up to 5 s; it returns as soon as it arrives). To
// show that a notification is NOT delivered at some point (before the COMMIT
// of the listener's block, after an UNLISTEN, after a rolled-back NOTIFY)
// the listener uses a barrier, once the other session's transaction has
// committed (its COMMIT returned): a round trip (SELECT 1), then a short
// bounded wait. On PostgreSQL the round trip proves it: a committing
// backend signals every listening backend before its COMMIT returns; a
// listening backend that is idle reads the queue on that signal, and one
// that is busy reads it before it sends ReadyForQuery (postgres.c processes
// a pending notify interrupt before ReadyForQuery whenever it is not in a
// transaction block), so a notification that is not there once the round
// trip's ReadyForQuery arrived will not come at that point — and inside a
// transaction block PostgreSQL sends none at all until the block ends. So
// the direct runs wait only 20 ms after the round trip. Through a proxy the
// round trip proves the same only if the proxy delivers what its listener
// received before it forwards the next ReadyForQuery; lockpool's listener is
// another connection, so a notification can reach lockpool just after it
// forwarded the round trip's reply, and a lockpool that delivered it
// wrongly (inside the block, after the UNLISTEN) could do so a moment
// later. The lockpool runs therefore wait LOCKPOOL_LISTEN_ABSENCE_WAIT
// (250 ms by default) after the round trip: long against a delivery on
// loopback, and bounded.
//
// Three scenarios (heldQuirk) show where PostgreSQL's own behaviour is finer
// than the rules lockpool states: a notification held while the listener
// is in a transaction block is filtered by the channels the listener has
// once the block ends, so it is lost if the block UNLISTENed its channel
// and delivered if the block LISTENed it (and the session already listened
// to something). Their differences are logged, not failed; the randomized
// test allows both outcomes there.
//
// go test reports this test at 60–100 s under -race in the whole suite: its
// scenarios run in parallel with the package's other tests, and the
// reported time counts their wait for a -parallel slot. Their own work is
// about 20 s (18 scenarios of 1–3 s, and the node-postgres run).
func TestListenDifferential(t *testing.T) {
	t.Parallel()
	cluster := ensureListenRoleDB(t, listenDiffRole, listenDiffDB)
	l := startListenLockpool(t, listenDiffRole, listenDiffDB)
	direct := cluster.DSN(listenDiffRole, appPassword, listenDiffDB)
	absence := listenDuration(t, "LOCKPOOL_LISTEN_ABSENCE_WAIT", 250*time.Millisecond)
	t.Logf("lockpool with listen: %s; absence wait through lockpool %v", listenMode(t), absence)

	targets := []ldTarget{
		{name: "direct", dsn: direct, outside: direct, absence: 20 * time.Millisecond, letter: "d"},
		{name: "direct again", dsn: direct, outside: direct, absence: 20 * time.Millisecond, letter: "e"},
		{name: "lockpool", dsn: l.dsn(listenDiffRole, listenDiffDB), outside: direct, absence: absence, letter: "l"},
	}
	t.Run("pgx", func(t *testing.T) {
		for i, sc := range listenScenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				var runs [][]string
				for _, tg := range targets {
					runs = append(runs, runScene(t, tg, fmt.Sprintf("ld%02d%s_", i, tg.letter), sc.run))
				}
				compareListenRuns(t, sc.name, sc.quirk, runs[0], runs[1], runs[2])
			})
		}
	})
	t.Run("node-postgres", func(t *testing.T) {
		t.Parallel()
		testListenDifferentialNode(t, l.url(listenDiffRole, listenDiffDB), absence)
	})
}

// ldTarget is where a scene's clients connect: PostgreSQL or lockpool.
// Outside sessions always connect to PostgreSQL directly.
type ldTarget struct {
	name, dsn, outside string
	absence            time.Duration // the bounded wait after a barrier round trip
	letter             string        // in the channel prefix, so runs never share a channel
}

// compareListenRuns fails t (or only logs, for a quirk scenario) when the
// lockpool run differs from the direct run, and fails it when the two
// direct runs differ (the scenario is not deterministic: a test problem).
func compareListenRuns(t *testing.T, name string, quirk bool, direct, again, pooled []string) {
	t.Helper()
	if d := diffLines(direct, again); d != "" {
		t.Errorf("%s: the two direct runs differ (a test problem, not lockpool's):\n%s", name, d)
		return
	}
	d := diffLines(direct, pooled)
	switch {
	case d == "":
		t.Logf("%s: %d observations, lockpool = PostgreSQL", name, len(direct))
	case quirk:
		t.Logf("%s (PostgreSQL's finer behaviour, not failed): lockpool differs:\n%s", name, d)
	default:
		t.Errorf("%s: lockpool differs from PostgreSQL:\n%s", name, d)
	}
}

// diffLines shows two observation sequences side by side from their first
// difference on ("" when equal).
func diffLines(want, got []string) string {
	n := len(want)
	if len(got) > n {
		n = len(got)
	}
	first := -1
	for i := 0; i < n; i++ {
		if i >= len(want) || i >= len(got) || want[i] != got[i] {
			first = i
			break
		}
	}
	if first < 0 {
		return ""
	}
	var b strings.Builder
	from := first - 2
	if from < 0 {
		from = 0
	}
	for i := from; i < n; i++ {
		w, g := "(none)", "(none)"
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		mark := "  "
		if w != g {
			mark = "≠ "
		}
		fmt.Fprintf(&b, "%s%3d PostgreSQL: %s\n", mark, i, w)
		if w != g {
			fmt.Fprintf(&b, "      lockpool:   %s\n", g)
		}
	}
	return b.String()
}

// ldScenario is one scenario: client code run against each target.
type ldScenario struct {
	name  string
	quirk bool // heldQuirk: differences are logged, not failed
	run   func(s *ldScene)
}

// ldScene is one run of a scenario: its clients and what they observed.
type ldScene struct {
	t       *testing.T
	ctx     context.Context
	target  ldTarget
	prefix  string // of every channel name of this run
	mu      sync.Mutex
	obs     []string
	clients []*ldClient
}

// ldClient is one session of a scene.
type ldClient struct {
	s       *ldScene
	name    string
	conn    *pgx.Conn
	mu      sync.Mutex
	notices []string
}

func runScene(t *testing.T, tg ldTarget, prefix string, run func(*ldScene)) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := &ldScene{t: t, ctx: ctx, target: tg, prefix: prefix}
	defer func() {
		for _, c := range s.clients {
			if c.conn != nil {
				_ = c.conn.Close(context.Background())
			}
		}
	}()
	run(s)
	return s.obs
}

// note records an observation.
func (s *ldScene) note(format string, args ...any) {
	s.mu.Lock()
	s.obs = append(s.obs, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

// ch is the channel name n of this run (prefixed); q is it as a quoted
// identifier.
func (s *ldScene) ch(n string) string { return s.prefix + n }
func (s *ldScene) q(n string) string  { return pgx.Identifier{s.prefix + n}.Sanitize() }

// show is text as observations show it: the run's prefix removed (so that
// the runs compare) and long text shortened.
func (s *ldScene) show(text string) string {
	return shorten(strings.ReplaceAll(text, s.prefix, ""), 160)
}

// client connects a session through the target; outsider one directly to
// PostgreSQL.
func (s *ldScene) client(name string) *ldClient   { return s.connect(name, s.target.dsn) }
func (s *ldScene) outsider(name string) *ldClient { return s.connect(name, s.target.outside) }

func (s *ldScene) connect(name, dsn string) *ldClient {
	s.t.Helper()
	c := &ldClient{s: s, name: name}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		c.mu.Lock()
		c.notices = append(c.notices, n.SeverityUnlocalized+" "+n.Code)
		c.mu.Unlock()
	}
	c.conn, err = pgx.ConnectConfig(s.ctx, cfg)
	if err != nil {
		s.t.Fatalf("%s: connect %s (%s): %v", s.target.name, name, dsn, err)
	}
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

// close ends the client's session.
func (c *ldClient) close() {
	_ = c.conn.Close(c.s.ctx)
	c.s.note("%s: closed", c.name)
}

var ldModeNames = map[pgx.QueryExecMode]string{
	pgx.QueryExecModeSimpleProtocol: "simple", pgx.QueryExecModeExec: "extended",
	pgx.QueryExecModeDescribeExec: "describe", pgx.QueryExecModeCacheStatement: "prepared",
}

const (
	simple   = pgx.QueryExecModeSimpleProtocol
	extended = pgx.QueryExecModeExec
	describe = pgx.QueryExecModeDescribeExec
	prepared = pgx.QueryExecModeCacheStatement
)

// takeNotices returns and clears the notices received so far.
func (c *ldClient) takeNotices() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.notices) == 0 {
		return ""
	}
	s := " +" + strings.Join(c.notices, " +")
	c.notices = nil
	return s
}

// outcome is an error as observations show it: its SQLSTATE (and severity
// when not ERROR), or what kind of failure it is when it has none.
func outcome(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.SeverityUnlocalized != "ERROR" && pe.SeverityUnlocalized != "" {
			return pe.SeverityUnlocalized + " " + pe.Code
		}
		return "ERROR " + pe.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "TIMEOUT"
	}
	return "CONNECTION ERROR"
}

// exec runs one statement in mode and records its command tag or error.
func (c *ldClient) exec(sql string, mode pgx.QueryExecMode, args ...any) {
	tag, err := c.conn.Exec(c.s.ctx, sql, append([]any{mode}, args...)...)
	res := tag.String()
	if err != nil {
		res = outcome(err)
	}
	c.s.note("%s: %s [%s] → %s%s", c.name, c.s.show(sql), ldModeNames[mode], res, c.takeNotices())
}

// query runs one statement in mode and records its rows, sorted (the
// channel names in them without the run's prefix).
func (c *ldClient) query(sql string, mode pgx.QueryExecMode, args ...any) {
	rows, err := c.conn.Query(c.s.ctx, sql, append([]any{mode}, args...)...)
	var got []string
	if err == nil {
		for rows.Next() {
			vals, verr := rows.Values()
			if verr != nil {
				err = verr
				break
			}
			var cells []string
			for _, v := range vals {
				cells = append(cells, c.s.show(fmt.Sprint(v)))
			}
			got = append(got, strings.Join(cells, "|"))
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	sort.Strings(got)
	res := fmt.Sprintf("rows %q", got)
	if err != nil {
		res = outcome(err)
	}
	c.s.note("%s: %s [%s] → %s%s", c.name, c.s.show(sql), ldModeNames[mode], res, c.takeNotices())
}

// channels records pg_listening_channels() (sorted) in mode.
func (c *ldClient) channels(mode pgx.QueryExecMode) {
	c.query("SELECT pg_listening_channels()", mode)
}

// multi sends sql (several statements) as one simple Query and records the
// result of each statement up to the first error.
func (c *ldClient) multi(sql string) {
	rs, err := c.conn.PgConn().Exec(c.s.ctx, sql).ReadAll()
	var parts []string
	for _, r := range rs {
		p := r.CommandTag.String()
		if len(r.Rows) > 0 {
			var rows []string
			for _, row := range r.Rows {
				var cells []string
				for _, v := range row {
					cells = append(cells, c.s.show(string(v)))
				}
				rows = append(rows, strings.Join(cells, "|"))
			}
			sort.Strings(rows)
			p += fmt.Sprintf(" %q", rows)
		}
		if r.Err != nil {
			p = outcome(r.Err)
		}
		parts = append(parts, p)
	}
	if err != nil && (len(rs) == 0 || rs[len(rs)-1].Err == nil) {
		parts = append(parts, outcome(err))
	}
	c.s.note("%s: %s [one query] → %s%s", c.name, c.s.show(sql), strings.Join(parts, "; "), c.takeNotices())
}

// pipeline sends the statements as one extended-protocol pipeline (one
// Sync: outside a block they run in one implicit transaction) and records
// each statement's result.
func (c *ldClient) pipeline(sqls ...string) {
	b := &pgconn.Batch{}
	for _, q := range sqls {
		b.ExecParams(q, nil, nil, nil, nil)
	}
	rs, err := c.conn.PgConn().ExecBatch(c.s.ctx, b).ReadAll()
	var parts []string
	for _, r := range rs {
		p := r.CommandTag.String()
		if len(r.Rows) > 0 {
			var rows []string
			for _, row := range r.Rows {
				rows = append(rows, c.s.show(string(row[0])))
			}
			sort.Strings(rows)
			p += fmt.Sprintf(" %q", rows)
		}
		if r.Err != nil {
			p = outcome(r.Err)
		}
		parts = append(parts, p)
	}
	if err != nil && (len(rs) == 0 || rs[len(rs)-1].Err == nil) {
		parts = append(parts, outcome(err))
	}
	c.s.note("%s: %s [pipeline] → %s%s", c.name, c.s.show(strings.Join(sqls, "; ")), strings.Join(parts, "; "), c.takeNotices())
}

// from names the session a notification's pid belongs to: "self", another
// client of the scene, or "?".
func (c *ldClient) from(pid uint32) string {
	if pid == c.conn.PgConn().PID() {
		return "self"
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	for _, o := range c.s.clients {
		if o != c && o.conn != nil && o.conn.PgConn().PID() == pid {
			return o.name
		}
	}
	return "?"
}

func (c *ldClient) showNotification(n *pgconn.Notification) string {
	return fmt.Sprintf("notification %s %q from %s", c.s.show(n.Channel), shorten(n.Payload, 40), c.from(n.PID))
}

// expect waits for n notifications (each up to 5 s) and records them.
func (c *ldClient) expect(n int) {
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(c.s.ctx, 5*time.Second)
		got, err := c.conn.WaitForNotification(ctx)
		cancel()
		if err != nil || got == nil {
			c.s.note("%s: no notification within 5 s (%d of %d expected): %s", c.name, i, n, outcome(err))
			return
		}
		c.s.note("%s: %s", c.name, c.showNotification(got))
	}
}

// expectNone is the barrier: a round trip, then the target's bounded wait;
// it records every notification that arrived, or that none did.
func (c *ldClient) expectNone() {
	_, _ = c.conn.PgConn().Exec(c.s.ctx, "SELECT 1").ReadAll()
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.target.absence)
	defer cancel()
	none := true
	for {
		got, err := c.conn.WaitForNotification(ctx)
		if err != nil || got == nil {
			break
		}
		none = false
		c.s.note("%s: %s", c.name, c.showNotification(got))
	}
	if c.conn.IsClosed() {
		c.s.note("%s: connection closed", c.name)
	} else if none {
		c.s.note("%s: no notification", c.name)
	} else {
		c.s.note("%s: no more", c.name)
	}
	c.takeNotices()
}

// waitIdle waits (up to 5 s) for one notification while sending nothing,
// with pgx's WaitForNotification, and returns the notifications that
// arrived with send running meanwhile: send runs once the wait has begun.
func (c *ldClient) waitIdle(send func()) {
	type result struct {
		n   *pgconn.Notification
		err error
	}
	started, done := make(chan struct{}), make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(c.s.ctx, 5*time.Second)
		defer cancel()
		close(started)
		n, err := c.conn.WaitForNotification(ctx)
		done <- result{n, err}
	}()
	<-started
	send()
	r := <-done
	if r.err != nil || r.n == nil {
		c.s.note("%s: waiting idle: no notification within 5 s: %s", c.name, outcome(r.err))
		return
	}
	c.s.note("%s: waiting idle: %s", c.name, c.showNotification(r.n))
}

// listenScenarios are the scenarios; see TestListenDifferential.
var listenScenarios = []ldScenario{
	{name: "listen_then_notify_from_others", run: func(s *ldScene) {
		l, o, x := s.client("L"), s.client("O"), s.outsider("X")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("LISTEN "+s.ch("a"), simple) // again: still one subscription
		l.exec("LISTEN "+s.ch("b"), simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("a")+", 'from O'", simple)
		x.exec("NOTIFY "+s.ch("a")+", 'from X outside'", simple)
		o.query("SELECT pg_notify($1, $2)", extended, s.ch("b"), "from O via pg_notify")
		o.exec("NOTIFY "+s.ch("c")+", 'not listened'", simple)
		o.exec("NOTIFY "+s.ch("a"), simple) // empty payload
		l.expect(4)
		l.expectNone()
	}},
	{name: "notify_in_committed_and_rolled_back_transactions", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("a"), simple)
		o.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'c1'", simple)
		o.query("SELECT pg_notify($1, 'c2')", extended, s.ch("a"))
		o.exec("NOTIFY "+s.ch("a")+", 'dup'", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'dup'", simple) // folded into one by PostgreSQL
		l.expectNone()                                // not before the sender commits
		o.exec("COMMIT", simple)
		l.expect(3)
		l.expectNone()
		o.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'rolled back'", simple)
		o.exec("ROLLBACK", simple)
		l.expectNone()
		o.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'failed block'", simple)
		o.exec("SELECT 1/0", simple)
		o.exec("COMMIT", simple) // ROLLBACK
		l.expectNone()
		o.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'savepoint kept'", simple)
		o.exec("SAVEPOINT s1", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'savepoint rolled back'", simple)
		o.exec("ROLLBACK TO SAVEPOINT s1", simple)
		o.exec("COMMIT", simple)
		l.expect(1)
		l.expectNone()
		o.exec("NOTIFY "+s.ch("a")+", 'after'", extended)
		l.expect(1)
		l.expectNone()
	}},
	{name: "listen_inside_committed_and_rolled_back_blocks", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.exec("BEGIN", simple)
		l.exec("LISTEN "+s.ch("a"), simple)
		l.channels(simple) // not yet: LISTEN takes effect at COMMIT
		l.exec("COMMIT", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("a")+", 'after commit'", simple)
		l.expect(1)
		l.exec("BEGIN", simple)
		l.exec("LISTEN "+s.ch("b"), simple)
		l.channels(extended)
		l.exec("ROLLBACK", simple)
		l.channels(extended)
		o.exec("NOTIFY "+s.ch("b")+", 'b after rollback'", simple)
		l.expectNone()
		l.exec("BEGIN", simple)
		l.exec("LISTEN "+s.ch("c"), simple)
		l.exec("SELECT 1/0", simple)
		l.exec("LISTEN "+s.ch("d"), simple) // 25P02
		l.exec("COMMIT", simple)            // ROLLBACK
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("c")+", 'c after failed block'", simple)
		l.expectNone()
		l.exec("BEGIN", simple)
		l.exec("SAVEPOINT s1", simple)
		l.exec("LISTEN "+s.ch("e"), simple)
		l.exec("ROLLBACK TO SAVEPOINT s1", simple)
		l.exec("LISTEN "+s.ch("f"), simple)
		l.exec("COMMIT", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("e")+", 'e: its LISTEN was rolled back to the savepoint'", simple)
		o.exec("NOTIFY "+s.ch("f")+", 'f'", simple)
		l.expect(1)
		l.expectNone()
		l.exec("BEGIN", simple)
		l.exec("UNLISTEN "+s.ch("a"), simple)
		l.channels(simple) // still listening until COMMIT
		l.exec("ROLLBACK", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("a")+", 'a after a rolled-back UNLISTEN'", simple)
		l.expect(1)
		l.expectNone()
	}},
	{name: "listen_in_block_first_listen", run: func(s *ldScene) {
		// A session that listens to nothing LISTENs in a block; a
		// notification committed before that block commits is never
		// delivered (the session starts reading the queue at its COMMIT).
		l, o := s.client("L"), s.client("O")
		l.exec("BEGIN", simple)
		l.exec("LISTEN "+s.ch("a"), simple)
		o.exec("NOTIFY "+s.ch("a")+", 'committed before the LISTEN block commits'", simple)
		l.expectNone()
		l.exec("COMMIT", simple)
		l.expectNone()
		o.exec("NOTIFY "+s.ch("a")+", 'after'", simple)
		l.expect(1)
		l.expectNone()
	}},
	{name: "unlisten_and_unlisten_all", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		for _, n := range []string{"a", "b", "c"} {
			l.exec("LISTEN "+s.ch(n), simple)
		}
		l.exec("UNLISTEN "+s.ch("a"), simple)
		l.exec("UNLISTEN "+s.ch("never"), simple) // not listened: no error
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("a")+", 'a'", simple)
		o.exec("NOTIFY "+s.ch("b")+", 'b'", simple)
		l.expect(1)
		l.expectNone()
		l.exec("BEGIN", simple)
		l.exec("UNLISTEN "+s.ch("b"), simple)
		l.exec("COMMIT", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("b")+", 'b after UNLISTEN committed'", simple)
		o.exec("NOTIFY "+s.ch("c")+", 'c'", simple)
		l.expect(1)
		l.expectNone()
		l.exec("LISTEN "+s.ch("d"), extended)
		l.exec("UNLISTEN *", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("c")+", 'c after UNLISTEN *'", simple)
		o.exec("NOTIFY "+s.ch("d")+", 'd after UNLISTEN *'", simple)
		l.expectNone()
		l.exec("UNLISTEN *", extended) // nothing to unlisten
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("BEGIN", simple)
		l.exec("UNLISTEN *", simple)
		l.exec("LISTEN "+s.ch("e"), simple)
		l.exec("COMMIT", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("a")+", 'a after UNLISTEN * in a block'", simple)
		o.exec("NOTIFY "+s.ch("e")+", 'e'", simple)
		l.expect(1)
		l.expectNone()
	}},
	{name: "discard_all", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("LISTEN "+s.ch("b"), simple)
		l.exec("BEGIN", simple)
		l.exec("DISCARD ALL", simple) // 25001
		l.exec("ROLLBACK", simple)
		l.multi("SELECT 1; DISCARD ALL") // 25001: the implicit transaction is a block
		l.channels(simple)
		l.exec("DISCARD ALL", simple)
		l.channels(simple)
		o.exec("NOTIFY "+s.ch("a")+", 'after DISCARD ALL'", simple)
		l.expectNone()
		l.exec("LISTEN "+s.ch("c"), simple)
		l.exec("DISCARD ALL", extended)
		l.channels(extended)
		o.exec("NOTIFY "+s.ch("c")+", 'after DISCARD ALL (extended)'", simple)
		l.expectNone()
		l.exec("LISTEN "+s.ch("a"), simple)
		o.exec("NOTIFY "+s.ch("a")+", 'listening again'", simple)
		l.expect(1)
		l.expectNone()
	}},
	{name: "self_notification", run: func(s *ldScene) {
		l := s.client("L")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("NOTIFY "+s.ch("a")+", 'notify simple'", simple)
		l.expect(1)
		l.exec("NOTIFY "+s.ch("a")+", 'notify extended'", extended)
		l.expect(1)
		l.exec("NOTIFY "+s.ch("a")+", 'notify describe'", describe)
		l.expect(1)
		l.exec("NOTIFY "+s.ch("a")+", 'notify prepared'", prepared)
		l.expect(1)
		l.query("SELECT pg_notify('"+s.ch("a")+"', 'pg_notify simple')", simple)
		l.expect(1)
		l.query("SELECT pg_notify($1, $2)", extended, s.ch("a"), "pg_notify extended")
		l.expect(1)
		l.query("SELECT pg_notify($1, $2)", prepared, s.ch("a"), "pg_notify prepared")
		l.expect(1)
		l.exec("BEGIN", simple)
		l.exec("NOTIFY "+s.ch("a")+", 'in a block'", simple)
		l.query("SELECT pg_notify($1, 'in a block too')", extended, s.ch("a"))
		l.expectNone()
		l.exec("COMMIT", simple)
		l.expect(2)
		// NOTIFY and then LISTEN in one transaction: a self-notification
		// at COMMIT.
		l.exec("BEGIN", simple)
		l.exec("NOTIFY "+s.ch("b")+", 'notify before listen'", simple)
		l.exec("LISTEN "+s.ch("b"), simple)
		l.exec("COMMIT", simple)
		l.expect(1)
		l.multi("NOTIFY " + s.ch("a") + ", 'multi 1'; SELECT pg_notify('" + s.ch("b") + "', 'multi 2')")
		l.expect(2)
		l.expectNone()
	}},
	{name: "delivery_while_idle", run: func(s *ldScene) {
		l, o, x := s.client("L"), s.client("O"), s.outsider("X")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.waitIdle(func() { o.exec("NOTIFY "+s.ch("a")+", 'to an idle client'", simple) })
		l.waitIdle(func() { x.query("SELECT pg_notify($1, 'from outside to an idle client')", extended, s.ch("a")) })
		l.waitIdle(func() {
			o.exec("BEGIN", simple)
			o.exec("NOTIFY "+s.ch("a")+", 'committed block'", simple)
			o.exec("COMMIT", simple)
		})
		l.expectNone()
	}},
	{name: "held_while_in_a_block", run: func(s *ldScene) {
		l, o, x := s.client("L"), s.client("O"), s.outsider("X")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("BEGIN", simple)
		l.exec("SELECT 1", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'h1'", simple)
		x.exec("NOTIFY "+s.ch("a")+", 'h2 outside'", simple)
		l.expectNone() // inside the block: nothing
		l.exec("SELECT 2", extended)
		l.expectNone()
		l.exec("COMMIT", simple)
		l.expect(2)
		l.expectNone()
		// Held while the block is failed, delivered after ROLLBACK.
		l.exec("BEGIN", simple)
		l.exec("SELECT 1/0", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'h3 while failed'", simple)
		l.expectNone()
		l.exec("ROLLBACK", simple)
		l.expect(1)
		// Held while a block rolls back.
		l.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'h4'", simple)
		l.expectNone()
		l.exec("ROLLBACK", simple)
		l.expect(1)
		// A block opened and closed inside one Query.
		l.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'h5'", simple)
		l.multi("SELECT 1; COMMIT")
		l.expect(1)
		l.expectNone()
	}},
	{name: "order_across_three_senders", run: func(s *ldScene) {
		l := s.client("L")
		a, b, c := s.client("A"), s.client("B"), s.client("C")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("LISTEN "+s.ch("b"), extended)
		for round := 1; round <= 2; round++ {
			r := fmt.Sprint(round)
			a.exec("BEGIN", simple)
			a.exec("NOTIFY "+s.ch("a")+", 'A1."+r+"'", simple)
			b.exec("BEGIN", simple)
			b.query("SELECT pg_notify($1, $2)", extended, s.ch("a"), "B1."+r)
			a.exec("NOTIFY "+s.ch("b")+", 'A2."+r+"'", simple)
			c.exec("NOTIFY "+s.ch("a")+", 'C0."+r+"'", simple) // autocommit: first
			b.exec("NOTIFY "+s.ch("b")+", 'B2."+r+"'", extended)
			b.exec("COMMIT", simple) // second
			a.exec("NOTIFY "+s.ch("a")+", 'A3."+r+"'", simple)
			c.exec("BEGIN", simple)
			c.exec("NOTIFY "+s.ch("b")+", 'C1."+r+"'", simple)
			c.query("SELECT pg_notify($1, $2)", extended, s.ch("a"), "C2."+r)
			a.exec("COMMIT", simple) // third
			c.exec("NOTIFY "+s.ch("b")+", 'C3."+r+"'", simple)
			c.exec("COMMIT", simple) // fourth
			b.multi("NOTIFY " + s.ch("a") + ", 'B3." + r + "'; NOTIFY " + s.ch("b") + ", 'B4." + r + "'")
		}
		l.expect(22)
		l.expectNone()
	}},
	{name: "payload_7999_bytes", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("a"), simple)
		big := strings.Repeat("0123456789abcdef", 500)[:7999]
		o.exec("NOTIFY "+s.ch("a")+", '"+big+"'", simple)
		o.query("SELECT pg_notify($1, $2)", extended, s.ch("a"), "x"+big[1:])
		o.query("SELECT pg_notify($1, $2)", extended, s.ch("a"), big+"y") // 8000 bytes: 22023
		o.query("SELECT pg_notify($1, $2)", extended, s.ch("a"), "quote ' backslash \\ newline \n tab \t unicode é 😀")
		l.expect(3)
		l.expectNone()
	}},
	{name: "listen_inside_multi_statement_queries", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.multi("LISTEN " + s.ch("a") + "; SELECT 1")
		l.channels(simple)
		l.multi("BEGIN; LISTEN " + s.ch("b") + "; COMMIT")
		l.channels(simple)
		l.multi("LISTEN " + s.ch("c") + "; SELECT 1/0") // the implicit transaction rolls back
		l.channels(simple)
		l.multi("LISTEN " + s.ch("d") + "; SELECT pg_listening_channels()") // not yet inside
		l.channels(simple)
		l.multi("UNLISTEN " + s.ch("a") + "; SELECT 1/0") // still listening to a
		l.multi("SELECT 1; LISTEN " + s.ch("e") + "; SELECT 2")
		l.multi("BEGIN; LISTEN " + s.ch("f"))
		l.channels(simple)
		l.multi("COMMIT")
		l.channels(simple)
		l.multi("BEGIN; LISTEN " + s.ch("g") + "; ROLLBACK")
		l.multi("UNLISTEN " + s.ch("d") + "; LISTEN " + s.ch("d"))
		l.channels(simple)
		for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
			o.exec("NOTIFY "+s.ch(n)+", '"+n+"'", simple)
		}
		l.expect(5)
		l.expectNone()
		l.multi("LISTEN " + s.ch("h") + "; NOTIFY " + s.ch("h") + ", 'self in one query'")
		l.expect(1)
		l.expectNone()
	}},
	{name: "extended_protocol_listen", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("a"), extended)
		l.exec("LISTEN "+s.ch("b"), describe)
		l.exec("LISTEN "+s.ch("c"), prepared)
		l.exec("LISTEN "+s.ch("c"), prepared) // the prepared statement again
		l.channels(extended)
		l.query("SELECT * FROM pg_listening_channels()", describe)
		o.exec("NOTIFY "+s.ch("a")+", 'a'", extended)
		o.exec("NOTIFY "+s.ch("b")+", 'b'", describe)
		o.exec("NOTIFY "+s.ch("c")+", 'c'", prepared)
		l.expect(3)
		l.exec("UNLISTEN "+s.ch("a"), extended)
		l.exec("UNLISTEN "+s.ch("b"), prepared)
		l.channels(describe)
		o.exec("NOTIFY "+s.ch("a")+", 'a after UNLISTEN'", extended)
		o.exec("NOTIFY "+s.ch("c")+", 'c again'", extended)
		l.expect(1)
		l.expectNone()
		l.exec("BEGIN", extended)
		l.exec("LISTEN "+s.ch("d"), extended)
		l.channels(extended)
		l.exec("COMMIT", extended)
		l.pipeline("LISTEN "+s.ch("e"), "SELECT pg_listening_channels()", "NOTIFY "+s.ch("e")+", 'self in a pipeline'")
		l.expect(1)
		l.pipeline("UNLISTEN "+s.ch("c"), "SELECT 1/0") // the pipeline's implicit transaction rolls back
		l.channels(extended)
		o.exec("NOTIFY "+s.ch("c")+", 'c after failed pipeline'", simple)
		o.exec("NOTIFY "+s.ch("d")+", 'd'", simple)
		l.expect(2)
		l.exec("UNLISTEN *", prepared)
		l.channels(prepared)
		o.exec("NOTIFY "+s.ch("d")+", 'd after UNLISTEN *'", simple)
		l.expectNone()
	}},
	{name: "quoted_and_mixed_case_channels", run: func(s *ldScene) {
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.q("MiXed"), simple)                     // "…MiXed"
		l.exec("LISTEN "+s.ch("MiXed"), simple)                    // folds to …mixed
		l.exec("LISTEN "+s.q(`we"ird`), extended)                  // …we"ird
		l.exec("LISTEN "+s.q("with space"), simple)                // …with space
		l.exec("LISTEN "+s.q("ünïcödé"), simple)                   // multibyte
		l.exec("LISTEN "+s.ch(strings.Repeat("long", 18)), simple) // 78 bytes: truncated to 63 with a NOTICE
		l.channels(simple)
		o.exec("NOTIFY "+s.q("MiXed")+", 'q1 quoted'", simple)
		o.exec("NOTIFY "+s.ch("MIXED")+", 'q2 folded'", simple)
		o.query("SELECT pg_notify($1, 'q3 exact case')", extended, s.ch("MiXed"))
		o.query("SELECT pg_notify($1, 'q4 lower case')", extended, s.ch("mixed"))
		o.query("SELECT pg_notify($1, 'q5 no such channel')", extended, s.ch("MIXED"))
		o.query("SELECT pg_notify($1, 'q6')", extended, s.ch(`we"ird`))
		o.exec("NOTIFY "+s.q("with space")+", 'q7'", simple)
		o.exec("NOTIFY "+s.q("ünïcödé")+", 'q8'", simple)
		o.exec("NOTIFY "+s.ch(strings.Repeat("long", 18))+", 'q9 truncated too'", simple)
		o.query("SELECT pg_notify($1, 'q10 too long')", extended, s.ch(strings.Repeat("long", 18))) // 22023
		l.expect(8)
		l.expectNone()
		l.exec("UNLISTEN "+s.q("MiXed"), simple)
		l.exec("UNLISTEN "+s.ch("MIXED"), simple) // …mixed
		l.channels(simple)
		o.query("SELECT pg_notify($1, 'q11')", extended, s.ch("MiXed"))
		o.query("SELECT pg_notify($1, 'q12')", extended, s.ch("mixed"))
		o.query("SELECT pg_notify($1, 'q13')", extended, s.ch(`we"ird`))
		l.expect(1)
		l.expectNone()
	}},
	{name: "listeners_sharing_a_channel", run: func(s *ldScene) {
		l1, l2, l3, o := s.client("L1"), s.client("L2"), s.client("L3"), s.client("O")
		l1.exec("LISTEN "+s.ch("a"), simple)
		l2.exec("LISTEN "+s.ch("a"), simple)
		o.exec("NOTIFY "+s.ch("a")+", 'both'", simple)
		l1.expect(1)
		l2.expect(1)
		l1.exec("UNLISTEN "+s.ch("a"), simple)
		o.exec("NOTIFY "+s.ch("a")+", 'L2 only'", simple)
		l2.expect(1)
		l1.expectNone()
		l1.exec("LISTEN "+s.ch("a"), simple)
		l2.exec("DISCARD ALL", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'L1 only'", simple)
		l1.expect(1)
		l2.expectNone()
		l3.exec("LISTEN "+s.ch("a"), simple)
		l1.close() // session end unlistens
		o.exec("NOTIFY "+s.ch("a")+", 'L3 only'", simple)
		l3.expect(1)
		l3.expectNone()
		l2.expectNone()
		// New sessions start listening to nothing.
		for i := 0; i < 3; i++ {
			n := s.client(fmt.Sprintf("N%d", i))
			n.channels(simple)
			n.exec("BEGIN", simple)
			n.channels(extended)
			n.exec("COMMIT", simple)
			o.exec("NOTIFY "+s.ch("a")+fmt.Sprintf(", 'while N%d exists'", i), simple)
			n.expectNone()
			l3.expect(1)
			n.close()
		}
	}},
	{name: "held_quirk_unlisten_in_block", quirk: true, run: func(s *ldScene) {
		// PostgreSQL filters a held notification by the channels listened
		// to when the block ends: this one was committed while L still
		// listened, and is lost.
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("BEGIN", simple)
		l.exec("UNLISTEN "+s.ch("a"), simple)
		o.exec("NOTIFY "+s.ch("a")+", 'committed while L listened, before its COMMIT'", simple)
		l.exec("COMMIT", simple)
		l.expectNone()
	}},
	{name: "held_quirk_listen_in_block", quirk: true, run: func(s *ldScene) {
		// The same filter delivers a notification committed before the
		// LISTEN's block commits, when the session already listened to
		// something (it reads the queue from where it was).
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("z"), simple)
		l.exec("BEGIN", simple)
		l.exec("LISTEN "+s.ch("a"), simple)
		o.exec("NOTIFY "+s.ch("a")+", 'committed before the LISTEN block commits'", simple)
		l.exec("COMMIT", simple)
		l.expectNone()
	}},
	{name: "held_quirk_notify_before_listen_in_block", quirk: true, run: func(s *ldScene) {
		// And even one committed before the LISTEN statement was sent, as
		// long as the block was open then.
		l, o := s.client("L"), s.client("O")
		l.exec("LISTEN "+s.ch("z"), simple)
		l.exec("BEGIN", simple)
		o.exec("NOTIFY "+s.ch("a")+", 'committed before LISTEN was sent'", simple)
		l.exec("LISTEN "+s.ch("a"), simple)
		l.exec("COMMIT", simple)
		l.expectNone()
	}},
}

// ldNodeResult is listen_scenarios.js's output: each scenario's
// observations, by name, and the names in the order run.
type ldNodeResult struct {
	Order     []string            `json:"order"`
	Scenarios map[string][]string `json:"scenarios"`
	Quirks    []string            `json:"quirks"`
}

// testListenDifferentialNode runs listen_scenarios.js directly (twice) and
// through lockpool and compares the scenarios' observations.
func testListenDifferentialNode(t *testing.T, pooledURL string, absence time.Duration) {
	c := ensureListenRoleDB(t, listenDiffRole, listenDiffDB)
	directURL := fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", listenDiffRole, appPassword, c.Host, c.Port, listenDiffDB)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(target, url, prefix string, wait time.Duration) ldNodeResult {
		cmd := nodeCommand(ctx, t, "listen_scenarios.js", "DATABASE_URL="+url, "OUTSIDE_URL="+directURL,
			"CHANNEL_PREFIX="+prefix, fmt.Sprintf("ABSENCE_WAIT_MS=%d", wait.Milliseconds()))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node listen_scenarios.js (%s): %v\nstderr:\n%s\nstdout:\n%s", target, err, stderr.String(), shorten(string(out), 4000))
		}
		var res ldNodeResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("node listen_scenarios.js (%s): output is not JSON: %v\n%s", target, err, shorten(string(out), 4000))
		}
		return res
	}
	var d, e, p ldNodeResult
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); d = run("direct", directURL, "lnd_", 20*time.Millisecond) }()
	go func() { defer wg.Done(); e = run("direct again", directURL, "lne_", 20*time.Millisecond) }()
	go func() { defer wg.Done(); p = run("lockpool", pooledURL, "lnl_", absence) }()
	wg.Wait()
	if t.Failed() {
		return
	}
	quirks := map[string]bool{}
	for _, q := range d.Quirks {
		quirks[q] = true
	}
	for _, name := range d.Order {
		compareListenRuns(t, "node "+name, quirks[name], d.Scenarios[name], e.Scenarios[name], p.Scenarios[name])
	}
	if len(d.Order) < 10 {
		t.Errorf("listen_scenarios.js ran %d scenarios, want at least 10", len(d.Order))
	}
}
