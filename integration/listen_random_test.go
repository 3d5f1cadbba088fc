package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/proxy/console"
)

// TestListenRandomized runs 22 clients (16 pgx ones in this process, 6
// node-postgres ones in two node processes, integration/node/listen_random.js)
// that LISTEN, UNLISTEN (one channel, *, DISCARD ALL), NOTIFY and
// pg_notify at random on five channels (two of them quoted identifiers), in
// both protocols, in autocommit, in multi-statement queries and in
// transaction blocks that commit, roll back or fail, and wait for
// notifications in between, plus a session outside lockpool that notifies
// too; meanwhile a killer terminates, a few times, lockpool's listener
// backend (application_name 'lockpool listener' in the test's database,
// found from a superuser connection). It runs twice: directly against
// PostgreSQL (the kills then terminate two random clients' own backends),
// which proves the oracle (0 violations), and through lockpool
// (listen: shared unless LOCKPOOL_LISTEN_MODE says otherwise).
//
// Every client logs, on CLOCK_MONOTONIC (shared with node's
// process.hrtime), when each statement was sent and when it completed, and
// every notification it received; every notification's payload is a
// unique id. The oracle (listen_oracle_test.go) then decides, for every
// client connection and every notification:
//
//   - must receive: the notification's transaction committed (its COMMIT,
//     or its autocommit statement, was sent after and completed before...)
//     entirely inside a stretch where the connection certainly listened to
//     the channel: after its LISTEN (or the COMMIT of the block with it)
//     completed and before its UNLISTEN (or that block's COMMIT) was sent,
//     until its backend read it — at once when idle, at the end of the
//     statement in flight, or at the end of a transaction block the
//     connection was in (PostgreSQL holds notifications until the block
//     ends and then filters them by the channels listened to at that point)
//     — and before the connection's end (the final barrier, or, for a
//     connection a kill closed, 1 s before the kill);
//   - must not: the transaction rolled back (or never sent COMMIT), or the
//     connection certainly did not listen to the channel over that stretch
//     (before its LISTEN was sent, after its UNLISTEN completed), or it
//     committed after the connection was closed;
//   - may: everything in between (a LISTEN state change, or the commit's
//     outcome, in doubt).
//
// It also checks that no notification arrives twice, none inside a
// transaction block, that each connection receives them in commit order
// (strictly in order for one transaction, never after one that committed
// later), that a notification's pid is the receiver's own PID() exactly
// when the receiver sent it (and otherwise the sender's PID()), that
// pg_listening_channels() matches what the client committed, that no
// statement fails unexpectedly, and that every connection that listened
// throughout a kill's window (from the kill until 1.5 s after the killed
// backend was gone) was closed with a FATAL 57P01 or 08006, while every
// one that listened to nothing stayed open (direct: exactly the targeted
// backends' clients got one). A closed client reconnects as a new
// connection whose windows start over.
//
// LOCKPOOL_LISTEN_RANDOM_DURATION (default 8s; scripts/listen-soak.sh runs
// 30 s and more with -race), LOCKPOOL_LISTEN_RANDOM_TARGETS (direct,lockpool),
// LOCKPOOL_LISTEN_RANDOM_KILLS (default 3), LOCKPOOL_LISTEN_RANDOM_SEED.
func TestListenRandomized(t *testing.T) {
	t.Parallel()
	cluster := ensureListenRoleDB(t, listenRandRole, listenRandDB)
	dur := listenDuration(t, "LOCKPOOL_LISTEN_RANDOM_DURATION", 8*time.Second)
	seed := time.Now().UnixNano()
	if v := os.Getenv("LOCKPOOL_LISTEN_RANDOM_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("LOCKPOOL_LISTEN_RANDOM_SEED=%q: %v", v, err)
		}
		seed = s
	}
	kills := 3
	if v := os.Getenv("LOCKPOOL_LISTEN_RANDOM_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("LOCKPOOL_LISTEN_RANDOM_KILLS=%q: %v", v, err)
		}
		kills = n
	}
	targets := []string{"direct", "lockpool"}
	if v := os.Getenv("LOCKPOOL_LISTEN_RANDOM_TARGETS"); v != "" {
		targets = strings.Split(v, ",")
	}
	t.Logf("duration %v per target, seed %d (LOCKPOOL_LISTEN_RANDOM_SEED; the clients' interleaving is not reproducible), %d kills, lockpool listen: %s",
		dur, seed, kills, listenMode(t))
	for _, target := range targets {
		t.Run(target, func(t *testing.T) {
			cfg := lrConfig{target: target, duration: dur, seed: seed, kills: kills, pgx: 16, nodeProcs: 2, nodeClients: 3,
				direct: cluster.DSN(listenRandRole, appPassword, listenRandDB), cluster: cluster}
			switch target {
			case "direct":
				cfg.dsn = cfg.direct
				cfg.url = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", listenRandRole, appPassword, cluster.Host, cluster.Port, listenRandDB)
				cfg.finalWait = 50 * time.Millisecond
			case "lockpool":
				l := startListenLockpool(t, listenRandRole, listenRandDB)
				cfg.lockpool = l
				cfg.dsn = l.dsn(listenRandRole, listenRandDB)
				cfg.url = l.url(listenRandRole, listenRandDB)
				cfg.finalWait = time.Second
			default:
				t.Fatalf("LOCKPOOL_LISTEN_RANDOM_TARGETS: unknown target %q (direct, lockpool)", target)
			}
			runListenRandom(t, cfg)
		})
	}
}

// lrChannelNames are the channels; LISTEN, UNLISTEN and NOTIFY quote them.
var lrChannelNames = []string{"lr_a", "lr_b", "lr_c", "Lr Mixed", `lr"q`}

// lrMulti, as a statement's mode, sends several statements as one simple
// Query.
const lrMulti pgx.QueryExecMode = -1

const (
	lrDelta = time.Second             // see lrOracle.delta
	lrGrace = 1500 * time.Millisecond // see lrOracle.grace
)

type lrConfig struct {
	target                      string
	dsn, url, direct            string
	cluster                     *pgtest.Cluster
	lockpool                    *lp
	duration                    time.Duration
	seed                        int64
	kills                       int
	pgx, nodeProcs, nodeClients int
	finalWait                   time.Duration
}

// lrRun collects the events of one run.
type lrRun struct {
	cfg    lrConfig
	t0     int64
	mu     sync.Mutex
	events []lrEvent
	live   map[lrKey]uint32 // connections and their backend pids (direct-mode kill targets)
	kills  []lrKill
}

func (r *lrRun) emit(e lrEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	k := lrKey{e.C, e.G}
	switch e.Ev {
	case "conn":
		if e.C >= 0 {
			r.live[k] = e.PID
		}
	case "fatal", "end":
		delete(r.live, k)
	}
}

func runListenRandom(t *testing.T, cfg lrConfig) {
	ctx := listenCtx(t, cfg.duration+2*time.Minute)
	r := &lrRun{cfg: cfg, t0: monoNow(), live: map[lrKey]uint32{}}
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopAll := func() { stopOnce.Do(func() { close(stop) }) }
	// Every goroutine that reports to t ends before the test does, also
	// when it ends early (a t.Fatal below).
	var bg sync.WaitGroup
	defer func() {
		stopAll()
		bg.Wait()
	}()

	// The pgx clients.
	var wg sync.WaitGroup
	clients := make([]*lrClient, cfg.pgx)
	for i := range clients {
		clients[i] = &lrClient{id: i, role: lrRoleOf(i), r: r, rng: rand.New(rand.NewSource(cfg.seed + int64(i)))}
	}
	for _, c := range clients {
		wg.Add(1)
		bg.Add(1)
		go func() {
			defer bg.Done()
			defer wg.Done()
			c.loop(ctx, stop)
		}()
	}
	// The outside sender: a session directly on PostgreSQL.
	outsideDone := make(chan struct{})
	bg.Add(1)
	go func() {
		defer bg.Done()
		defer close(outsideDone)
		lrOutside(ctx, t, r, stop)
	}()
	// The node-postgres clients.
	var nodes []*lrNode
	for p := 0; p < cfg.nodeProcs; p++ {
		nodes = append(nodes, startLRNode(ctx, t, r, cfg.pgx+p*cfg.nodeClients, cfg.nodeClients, cfg.seed+int64(1000*(p+1))))
	}
	// The killer.
	killerDone := make(chan struct{})
	bg.Add(1)
	go func() {
		defer bg.Done()
		defer close(killerDone)
		lrKiller(ctx, t, r, stop)
	}()

	select {
	case <-time.After(cfg.duration):
	case <-ctx.Done():
	}
	stopAll()
	<-killerDone
	wg.Wait()
	<-outsideDone
	for _, n := range nodes {
		n.command("stop")
	}
	for _, n := range nodes {
		n.wait("stopped")
	}
	// Every commit has completed: the final barriers.
	var fw sync.WaitGroup
	for _, c := range clients {
		fw.Add(1)
		go func() {
			defer fw.Done()
			c.final(ctx)
		}()
	}
	for _, n := range nodes {
		n.command("final")
	}
	fw.Wait()
	for _, n := range nodes {
		n.finish()
	}
	var closedPIDs []uint32
	r.mu.Lock()
	for _, e := range r.events {
		if e.Ev == "fatal" {
			for _, c := range r.events {
				if c.Ev == "conn" && c.C == e.C && c.G == e.G {
					closedPIDs = append(closedPIDs, c.PID)
				}
			}
		}
	}
	events := append([]lrEvent(nil), r.events...)
	kills := append([]lrKill(nil), r.kills...)
	r.mu.Unlock()

	o := newLROracle(cfg.target, r.t0, events, kills, lrDelta, lrGrace)
	viol := o.check()
	if cfg.lockpool != nil {
		viol = append(viol, lrStillOpen(t, cfg.lockpool, closedPIDs)...)
		o.viol = viol
	}
	var ks []string
	for i, k := range kills {
		if cfg.target == "direct" {
			ks = append(ks, fmt.Sprintf("%d: %s, %d backends", i+1, o.ms(k.Sent), len(k.Targets)))
		} else {
			ks = append(ks, fmt.Sprintf("%d: %s, listener pids %v, gone after %.1f ms", i+1, o.ms(k.Sent), k.Listeners, float64(k.Gone-k.Sent)/1e6))
		}
	}
	t.Logf("%s: %s", cfg.target, o.summary())
	t.Logf("%s: kills: %s", cfg.target, strings.Join(ks, "; "))
	if len(viol) > 0 {
		t.Errorf("%s: %d violations (seed %d; every event in %s):\n%s", cfg.target, len(viol), cfg.seed, lrDump(t, cfg, r.t0, events, kills), o.report(12))
	} else {
		t.Logf("%s: 0 violations", cfg.target)
	}
	if cfg.target == "direct" && len(viol) == 0 {
		// The oracle must catch each rule broken on purpose in this log.
		caught, missed := lrSelfCheck(cfg.target, r.t0, events, kills, lrDelta, lrGrace)
		for _, c := range caught {
			t.Logf("oracle self-check: %s", c)
		}
		for _, m := range missed {
			t.Errorf("oracle self-check: %s", m)
		}
	}
	if o.stats["pairs must"] == 0 || o.stats["deliveries"] == 0 {
		t.Errorf("%s: the run proved nothing: %d must-receive pairs, %d deliveries", cfg.target, o.stats["pairs must"], o.stats["deliveries"])
	}
}

// lrDump writes the run's events and kills as JSON lines (times relative
// to the run's start, in ns) to a file that outlives the test, and returns
// its name.
func lrDump(t *testing.T, cfg lrConfig, t0 int64, events []lrEvent, kills []lrKill) string {
	f, err := os.CreateTemp("", fmt.Sprintf("lockpool-listen-random-%s-*.jsonl", cfg.target))
	if err != nil {
		return fmt.Sprintf("(not written: %v)", err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	rel := func(v int64) int64 {
		if v == 0 || v == lrInf {
			return v
		}
		return v - t0
	}
	for _, k := range kills {
		k.Sent, k.Done, k.Gone = rel(k.Sent), rel(k.Done), rel(k.Gone)
		_ = enc.Encode(map[string]any{"ev": "kill", "kill": k})
	}
	for _, e := range events {
		e.Sent, e.Done, e.T = rel(e.Sent), rel(e.Done), rel(e.T)
		_ = enc.Encode(e)
	}
	return f.Name()
}

// lrStillOpen: lockpool must have closed every client it sent a FATAL
// (none may still be listed in /debug/clients).
func lrStillOpen(t *testing.T, l *lp, pids []uint32) []lrViolation {
	code, body := l.get("/debug/clients")
	if code != 200 {
		t.Errorf("GET /debug/clients = %d %s", code, body)
		return nil
	}
	var rows []console.ClientRow
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Errorf("GET /debug/clients: %v", err)
		return nil
	}
	open := map[uint32]bool{}
	for _, row := range rows {
		open[row.ID] = true
	}
	var out []lrViolation
	for _, p := range pids {
		if open[p] {
			out = append(out, lrViolation{Kind: "not closed", Text: fmt.Sprintf("client with key pid %d got a FATAL but lockpool still lists it in /debug/clients", p)})
		}
	}
	return out
}

// lrClient is one pgx client.
type lrClient struct {
	id   int
	role lrRole
	r    *lrRun
	rng  *rand.Rand
	gen  int
	conn *pgx.Conn
	pid  uint32
	seq  int
	// The client's model of its own LISTEN state.
	committed map[string]bool
	pending   []lrAct
	inTx      bool // a block is open (BEGIN completed, no COMMIT/ROLLBACK sent)
	ending    bool // COMMIT or ROLLBACK sent
	failed    bool
	steps     int
}

func (c *lrClient) connect(ctx context.Context) bool {
	cfg, err := pgx.ParseConfig(c.r.cfg.dsn)
	if err != nil {
		panic(err)
	}
	gen := c.gen
	cfg.OnNotification = func(pc *pgconn.PgConn, n *pgconn.Notification) {
		st := pc.TxStatus()
		c.r.emit(lrEvent{Ev: "recv", C: c.id, G: gen, Ch: n.Channel, ID: n.Payload, PID: n.PID, T: monoNow(),
			InBlock: (st == 'T' || st == 'E') && !c.ending})
	}
	sent := monoNow()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		c.r.emit(lrEvent{Ev: "op", C: c.id, G: gen, Kind: lrStmt, SQL: "(connect)", Sent: sent, Done: monoNow(), Err: err.Error(), Code: sqlState(err), Sev: "ERROR"})
		c.gen++
		return false
	}
	c.conn, c.pid = conn, conn.PgConn().PID()
	c.committed, c.pending, c.inTx, c.ending, c.failed = map[string]bool{}, nil, false, false, false
	c.r.emit(lrEvent{Ev: "conn", C: c.id, G: gen, PID: c.pid, Sent: sent, Done: monoNow(), Driver: "pgx " + c.role.String()})
	return true
}

// dead ends the connection after err: a FATAL, or the connection lost.
func (c *lrClient) dead(err error) {
	e := lrEvent{Ev: "fatal", C: c.id, G: c.gen, T: monoNow(), Err: err.Error()}
	if pe := pgErrOf(err); pe != nil {
		e.Code, e.Sev = pe.Code, pe.SeverityUnlocalized
	}
	c.r.emit(e)
	_ = c.conn.Close(context.Background())
	c.conn = nil
	c.gen++
}

func pgErrOf(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// isDeath: err ended the connection.
func (c *lrClient) isDeath(err error) bool {
	if pe := pgErrOf(err); pe != nil && (pe.SeverityUnlocalized == "FATAL" || pe.SeverityUnlocalized == "PANIC") {
		return true
	}
	return c.conn.IsClosed()
}

// run sends one op and logs it; false when the connection died.
func (c *lrClient) run(ctx context.Context, kind, sql string, acts []lrAct, mode pgx.QueryExecMode, args ...any) (string, bool) {
	e := lrEvent{Ev: "op", C: c.id, G: c.gen, Kind: kind, SQL: sql, Acts: acts, Sent: monoNow()}
	if kind == lrCommit || kind == lrRollback {
		c.ending = true
	}
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var err error
	var tag string
	switch {
	case kind == lrChannels:
		var got []string
		rows, qerr := c.conn.Query(qctx, sql, mode)
		if qerr == nil {
			for rows.Next() {
				var ch string
				if serr := rows.Scan(&ch); serr != nil {
					qerr = serr
				}
				got = append(got, ch)
			}
			rows.Close()
			if qerr == nil {
				qerr = rows.Err()
			}
		}
		err = qerr
		sort.Strings(got)
		e.Got, e.Want = lrSorted(got), lrSet(c.committed)
	case mode == lrMulti:
		var rs []*pgconn.Result
		rs, err = c.conn.PgConn().Exec(qctx, sql).ReadAll()
		var tags []string
		for _, r := range rs {
			tags = append(tags, r.CommandTag.String())
		}
		tag = strings.Join(tags, ";")
	default:
		var ct pgconn.CommandTag
		ct, err = c.conn.Exec(qctx, sql, append([]any{mode}, args...)...)
		tag = ct.String()
	}
	e.Tag = tag
	if err != nil && c.isDeath(err) {
		c.r.emit(e) // Done 0: the connection died
		c.dead(err)
		return "", false
	}
	e.Done = monoNow()
	e.OK = err == nil
	if err != nil {
		e.Err = err.Error()
		if pe := pgErrOf(err); pe != nil {
			e.Code, e.Sev = pe.Code, pe.SeverityUnlocalized
		}
	}
	c.r.emit(e)
	// The model.
	switch kind {
	case lrBegin:
		c.inTx, c.ending, c.failed, c.pending, c.steps = err == nil, false, false, nil, 0
	case lrCommit:
		if err == nil && tag == "COMMIT" && !c.failed {
			lrApply(c.committed, c.pending)
		}
		c.inTx, c.ending, c.pending = false, false, nil
	case lrRollback:
		c.inTx, c.ending, c.pending = false, false, nil
	default:
		switch {
		case c.inTx && err != nil:
			c.failed = true
		case c.inTx:
			c.pending = append(c.pending, acts...)
		case err == nil:
			lrApply(c.committed, acts)
		}
	}
	return tag, true
}

func lrSet(m map[string]bool) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func lrSorted(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// wait waits up to d for notifications without sending anything.
func (c *lrClient) wait(ctx context.Context, d time.Duration) bool {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		err := c.conn.PgConn().WaitForNotification(wctx)
		if err == nil {
			continue // the handler logged it
		}
		if c.isDeath(err) {
			c.dead(err)
			return false
		}
		return true // the wait ended
	}
}

func (c *lrClient) channel() string { return lrChannelNames[c.rng.Intn(len(lrChannelNames))] }
func (c *lrClient) mode() pgx.QueryExecMode {
	return []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeDescribeExec}[c.rng.Intn(3)]
}
func (c *lrClient) nextID() string {
	c.seq++
	return fmt.Sprintf("n%d.%d.%d", c.id, c.gen, c.seq)
}

func qi(ch string) string { return pgx.Identifier{ch}.Sanitize() }

// notify is a NOTIFY or pg_notify statement sending a new id.
func (c *lrClient) notify(ctx context.Context) bool {
	ch, id := c.channel(), c.nextID()
	acts := []lrAct{{K: "notify", Ch: ch, ID: id}}
	switch c.rng.Intn(4) {
	case 0:
		_, ok := c.run(ctx, lrStmt, "NOTIFY "+qi(ch)+", '"+id+"'", acts, c.mode())
		return ok
	case 1:
		_, ok := c.run(ctx, lrStmt, "SELECT pg_notify($1, $2)", acts, pgx.QueryExecModeExec, ch, id)
		return ok
	case 2:
		_, ok := c.run(ctx, lrStmt, "SELECT pg_notify($1, $2)", acts, pgx.QueryExecModeSimpleProtocol, ch, id)
		return ok
	default:
		_, ok := c.run(ctx, lrStmt, "SELECT pg_notify($1, $2)", acts, pgx.QueryExecModeDescribeExec, ch, id)
		return ok
	}
}

func (c *lrClient) loop(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			if c.conn != nil && c.inTx {
				c.run(ctx, lrRollback, "ROLLBACK", nil, pgx.QueryExecModeSimpleProtocol)
			}
			return
		case <-ctx.Done():
			return
		default:
		}
		if c.conn == nil {
			if !c.connect(ctx) {
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			continue
		}
		if c.inTx {
			c.blockStep(ctx)
		} else {
			c.step(ctx)
		}
	}
}

// lrRole is how a client uses LISTEN. Steady clients LISTEN to their home
// channel as soon as they are connected and never UNLISTEN it (nor UNLISTEN
// *, nor DISCARD ALL): they listen throughout every kill, so lockpool must
// close them. Quiet clients never LISTEN: they must stay open. The others
// do anything.
type lrRole int

const (
	lrRandom lrRole = iota
	lrSteady
	lrQuiet
)

func lrRoleOf(id int) lrRole {
	switch id % 4 {
	case 1:
		return lrSteady
	case 3:
		return lrQuiet
	}
	return lrRandom
}

func (r lrRole) String() string { return [...]string{"random", "steady", "quiet"}[r] }

// home is a steady client's channel.
func lrHome(id int) string { return lrChannelNames[id%len(lrChannelNames)] }

// listen LISTENs to a random channel (a quiet client notifies instead).
func (c *lrClient) listen(ctx context.Context) {
	if c.role == lrQuiet {
		c.notify(ctx)
		return
	}
	ch := c.channel()
	c.run(ctx, lrStmt, "LISTEN "+qi(ch), []lrAct{{K: "listen", Ch: ch}}, c.mode())
}

// unlisten UNLISTENs a random channel (a steady client never its home).
func (c *lrClient) unlisten(ctx context.Context) {
	ch := c.channel()
	for c.role == lrSteady && ch == lrHome(c.id) {
		ch = c.channel()
	}
	c.run(ctx, lrStmt, "UNLISTEN "+qi(ch), []lrAct{{K: "unlisten", Ch: ch}}, c.mode())
}

// unlistenAll is UNLISTEN * or DISCARD ALL (a steady client notifies
// instead).
func (c *lrClient) unlistenAll(ctx context.Context, discard bool) {
	switch {
	case c.role == lrSteady:
		c.notify(ctx)
	case discard && !c.inTx:
		c.run(ctx, lrStmt, "DISCARD ALL", []lrAct{{K: "unlisten_all"}}, c.mode())
	default:
		c.run(ctx, lrStmt, "UNLISTEN *", []lrAct{{K: "unlisten_all"}}, c.mode())
	}
}

// step is one random action outside a block.
func (c *lrClient) step(ctx context.Context) {
	simple := pgx.QueryExecModeSimpleProtocol
	if c.role == lrSteady && !c.committed[lrHome(c.id)] {
		ch := lrHome(c.id)
		c.run(ctx, lrStmt, "LISTEN "+qi(ch), []lrAct{{K: "listen", Ch: ch}}, c.mode())
		return
	}
	switch n := c.rng.Intn(100); {
	case n < 14:
		c.listen(ctx)
	case n < 21:
		c.unlisten(ctx)
	case n < 23:
		c.unlistenAll(ctx, false)
	case n < 24:
		c.unlistenAll(ctx, true)
	case n < 44:
		c.notify(ctx)
	case n < 50:
		x, y := c.channel(), c.channel()
		k := c.rng.Intn(5)
		if c.role == lrQuiet {
			k = 1
		}
		switch k {
		case 0:
			c.run(ctx, lrStmt, "LISTEN "+qi(x)+"; SELECT 1", []lrAct{{K: "listen", Ch: x}}, lrMulti)
		case 1:
			i1, i2 := c.nextID(), c.nextID()
			c.run(ctx, lrStmt, "NOTIFY "+qi(x)+", '"+i1+"'; NOTIFY "+qi(y)+", '"+i2+"'",
				[]lrAct{{K: "notify", Ch: x, ID: i1}, {K: "notify", Ch: y, ID: i2}}, lrMulti)
		case 2:
			id := c.nextID()
			c.run(ctx, lrStmt, "LISTEN "+qi(x)+"; NOTIFY "+qi(y)+", '"+id+"'; SELECT 1/0",
				[]lrAct{{K: "listen", Ch: x}, {K: "notify", Ch: y, ID: id}}, lrMulti)
		case 3:
			// Net: no change for a channel listened to, a LISTEN for
			// another: either way no moment without it.
			c.run(ctx, lrStmt, "UNLISTEN "+qi(x)+"; LISTEN "+qi(x), []lrAct{{K: "unlisten", Ch: x}, {K: "listen", Ch: x}}, lrMulti)
		default:
			id := c.nextID()
			c.run(ctx, lrStmt, "BEGIN; LISTEN "+qi(x)+"; NOTIFY "+qi(y)+", '"+id+"'; COMMIT",
				[]lrAct{{K: "listen", Ch: x}, {K: "notify", Ch: y, ID: id}}, lrMulti)
		}
	case n < 64:
		c.run(ctx, lrBegin, "BEGIN", nil, c.pick2(simple, pgx.QueryExecModeExec))
	case n < 70:
		c.run(ctx, lrChannels, "SELECT pg_listening_channels()", nil, c.mode())
	default:
		c.wait(ctx, time.Duration(5+c.rng.Intn(45))*time.Millisecond)
	}
}

func (c *lrClient) pick2(a, b pgx.QueryExecMode) pgx.QueryExecMode {
	if c.rng.Intn(2) == 0 {
		return a
	}
	return b
}

// blockStep is one random action inside a block, or its end.
func (c *lrClient) blockStep(ctx context.Context) {
	simple := pgx.QueryExecModeSimpleProtocol
	c.steps++
	if c.steps > 1+c.rng.Intn(5) {
		switch n := c.rng.Intn(100); {
		case n < 62:
			c.run(ctx, lrCommit, "COMMIT", nil, c.pick2(simple, pgx.QueryExecModeExec))
		case n < 90:
			c.run(ctx, lrRollback, "ROLLBACK", nil, c.pick2(simple, pgx.QueryExecModeExec))
		default:
			if c.failed {
				c.run(ctx, lrCommit, "COMMIT", nil, simple)
				return
			}
			if _, ok := c.run(ctx, lrStmt, "SELECT 1/0", nil, simple); ok {
				c.run(ctx, lrCommit, "COMMIT", nil, simple) // ROLLBACK
			}
		}
		return
	}
	if c.failed {
		c.run(ctx, lrStmt, "SELECT 1", nil, simple) // 25P02
		return
	}
	switch n := c.rng.Intn(100); {
	case n < 25:
		c.listen(ctx)
	case n < 37:
		c.unlisten(ctx)
	case n < 41:
		c.unlistenAll(ctx, false)
	case n < 75:
		c.notify(ctx)
	case n < 83:
		c.run(ctx, lrChannels, "SELECT pg_listening_channels()", nil, c.mode())
	default:
		// Wait inside the block: nothing may arrive.
		c.wait(ctx, time.Duration(5+c.rng.Intn(30))*time.Millisecond)
	}
}

// final is the client's end: the barrier (a round trip, then a bounded
// wait for what the proxy may still deliver), then it closes.
func (c *lrClient) final(ctx context.Context) {
	if c.conn == nil {
		return
	}
	c.r.emit(lrEvent{Ev: "barrier", C: c.id, G: c.gen, Sent: monoNow()})
	if _, err := c.conn.PgConn().Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		if c.isDeath(err) {
			c.dead(err)
			return
		}
	}
	if !c.wait(ctx, c.r.cfg.finalWait) {
		return
	}
	c.r.emit(lrEvent{Ev: "end", C: c.id, G: c.gen, T: monoNow()})
	_ = c.conn.Close(context.Background())
	c.conn = nil
}

// lrOutside notifies from a session directly on PostgreSQL (client -1),
// in autocommit and in blocks, until stop.
func lrOutside(ctx context.Context, t *testing.T, r *lrRun, stop <-chan struct{}) {
	conn, err := pgx.Connect(ctx, r.cfg.direct)
	if err != nil {
		t.Errorf("outside sender: %v", err)
		return
	}
	defer conn.Close(context.Background())
	pid := conn.PgConn().PID()
	r.emit(lrEvent{Ev: "conn", C: -1, PID: pid, Sent: monoNow(), Done: monoNow(), Driver: "pgx outside lockpool"})
	rng := rand.New(rand.NewSource(r.cfg.seed - 1))
	seq := 0
	op := func(kind, sql string, acts []lrAct, args ...any) {
		e := lrEvent{Ev: "op", C: -1, Kind: kind, SQL: sql, Acts: acts, Sent: monoNow()}
		tag, err := conn.Exec(ctx, sql, args...)
		e.Done, e.OK, e.Tag = monoNow(), err == nil, tag.String()
		if err != nil {
			e.Err, e.Code, e.Sev = err.Error(), sqlState(err), "ERROR"
		}
		r.emit(e)
	}
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(10+rng.Intn(40)) * time.Millisecond):
		}
		seq++
		ch, id := lrChannelNames[rng.Intn(len(lrChannelNames))], fmt.Sprintf("x.%d", seq)
		if rng.Intn(3) == 0 {
			op(lrBegin, "BEGIN", nil)
			op(lrStmt, "SELECT pg_notify($1, $2)", []lrAct{{K: "notify", Ch: ch, ID: id}}, ch, id)
			id2 := id + "b"
			op(lrStmt, "NOTIFY "+qi(ch)+", '"+id2+"'", []lrAct{{K: "notify", Ch: ch, ID: id2}}, pgx.QueryExecModeSimpleProtocol)
			if rng.Intn(4) == 0 {
				op(lrRollback, "ROLLBACK", nil)
			} else {
				op(lrCommit, "COMMIT", nil)
			}
			continue
		}
		op(lrStmt, "SELECT pg_notify($1, $2)", []lrAct{{K: "notify", Ch: ch, ID: id}}, ch, id)
	}
}

// lrKiller terminates, cfg.kills times spread over the run, lockpool's
// listener backend (lockpool) or two random clients' backends (direct).
func lrKiller(ctx context.Context, t *testing.T, r *lrRun, stop <-chan struct{}) {
	n := r.cfg.kills
	if n <= 0 {
		return
	}
	su, err := pgx.Connect(ctx, r.cfg.cluster.SuperuserDSN("postgres"))
	if err != nil {
		t.Errorf("killer: %v", err)
		return
	}
	defer su.Close(context.Background())
	rng := rand.New(rand.NewSource(r.cfg.seed - 2))
	spacing := r.cfg.duration / time.Duration(n+1)
	if min := lrGrace + 500*time.Millisecond; spacing < min {
		spacing = min
	}
	for i := 0; i < n; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(spacing):
		}
		k := lrKill{Sent: monoNow()}
		var pids []int32
		if r.cfg.target == "lockpool" {
			rows, err := su.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2", listenRandDB, listenListenerAppName)
			if err == nil {
				pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			}
			if err != nil {
				t.Errorf("killer: %v", err)
				return
			}
			k.Listeners = pids
			if len(pids) == 0 {
				var names []string
				rows, err := su.Query(ctx, "SELECT DISTINCT coalesce(application_name, '') FROM pg_stat_activity WHERE datname = $1", listenRandDB)
				if err == nil {
					names, _ = pgx.CollectRows(rows, pgx.RowTo[string])
				}
				k.Note = fmt.Sprintf("application_names in the database: %q", names)
			}
		} else {
			r.mu.Lock()
			var keys []lrKey
			for key := range r.live {
				keys = append(keys, key)
			}
			sort.Slice(keys, func(i, j int) bool { return keys[i].C < keys[j].C || keys[i].C == keys[j].C && keys[i].G < keys[j].G })
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			if len(keys) > 2 {
				keys = keys[:2]
			}
			for _, key := range keys {
				pids = append(pids, int32(r.live[key]))
			}
			r.mu.Unlock()
			for j, key := range keys {
				var ok bool
				if err := su.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pids[j]).Scan(&ok); err == nil && ok {
					k.Targets = append(k.Targets, key)
				}
			}
			k.Done = monoNow()
			r.mu.Lock()
			r.kills = append(r.kills, k)
			r.mu.Unlock()
			continue
		}
		for _, pid := range pids {
			if _, err := su.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				t.Errorf("killer: %v", err)
			}
		}
		k.Done = monoNow()
		// Wait until the killed backends are gone.
		for deadline := time.Now().Add(10 * time.Second); len(pids) > 0 && time.Now().Before(deadline); {
			var left int
			if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&left); err != nil || left == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		k.Gone = monoNow()
		r.mu.Lock()
		r.kills = append(r.kills, k)
		r.mu.Unlock()
	}
}

// lrNode is one node process running listen_random.js.
type lrNode struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	mu     sync.Mutex
	seen   map[string]chan struct{}
	stderr strings.Builder
	done   chan struct{}
}

func startLRNode(ctx context.Context, t *testing.T, r *lrRun, base, clients int, seed int64) *lrNode {
	chs, _ := json.Marshal(lrChannelNames)
	cmd := nodeCommand(ctx, t, "listen_random.js", "DATABASE_URL="+r.cfg.url, fmt.Sprintf("CLIENT_BASE=%d", base),
		fmt.Sprintf("CLIENTS=%d", clients), fmt.Sprintf("SEED=%d", seed), "CHANNELS="+string(chs),
		fmt.Sprintf("FINAL_WAIT_MS=%d", r.cfg.finalWait.Milliseconds()))
	n := &lrNode{t: t, cmd: cmd, seen: map[string]chan struct{}{"stopped": make(chan struct{}), "done": make(chan struct{})}, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &n.mu, w: &n.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if n.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("node listen_random.js: %v", err)
	}
	go func() {
		defer close(n.done)
		err := readJSONLines(stdout, func(e lrEvent) {
			switch e.Ev {
			case "stopped", "done":
				close(n.seen[e.Ev])
			case "log":
				n.mu.Lock()
				fmt.Fprintf(&n.stderr, "node log: %s\n", e.Msg)
				n.mu.Unlock()
			default:
				r.emit(e)
			}
		}, func(line string) {
			n.mu.Lock()
			fmt.Fprintf(&n.stderr, "node stdout (not JSON): %s\n", line)
			n.mu.Unlock()
		})
		if err != nil {
			n.mu.Lock()
			fmt.Fprintf(&n.stderr, "reading node's output: %v\n", err)
			n.mu.Unlock()
		}
	}()
	return n
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (n *lrNode) command(c string) {
	if _, err := io.WriteString(n.stdin, c+"\n"); err != nil {
		n.t.Errorf("node: sending %q: %v", c, err)
	}
}

func (n *lrNode) wait(what string) {
	select {
	case <-n.seen[what]:
	case <-n.done:
		// The output ended; it may have said what in its last line.
		select {
		case <-n.seen[what]:
		default:
			n.t.Errorf("node listen_random.js ended before %q:\n%s", what, n.errText())
		}
	case <-time.After(60 * time.Second):
		n.t.Errorf("node listen_random.js: no %q within 60 s:\n%s", what, n.errText())
	}
}

func (n *lrNode) errText() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return shorten(n.stderr.String(), 4000)
}

func (n *lrNode) finish() {
	n.wait("done")
	_ = n.stdin.Close()
	<-n.done
	if err := n.cmd.Wait(); err != nil {
		n.t.Errorf("node listen_random.js: %v\n%s", err, n.errText())
	}
}
