package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/bgtask"
	"github.com/lockpool/lockpool/pool"
)

// AppName is the application_name of the coordination connection.
const AppName = "lockpool cluster"

// maxNumber is the highest instance number (the number is encoded in the
// backend keys the proxy hands out; see the proxy's cancel forwarding).
const maxNumber = 255

// errRowReclaimed: this instance's slot row of an application is gone (the
// others took the instance for dead and reclaimed it).
var errRowReclaimed = errors.New("cluster: this instance's slot row was reclaimed")

// Pool is what the coordinator needs from the connection pool.
type Pool interface {
	Stats(app string) pool.Stats
	SetLimit(app string, conns, pins int)
	OnDial(fn func(ctx context.Context, app string, pid uint32) error)
	DialGate(fn func(app string) (time.Time, error))
}

// App is one cluster-scoped application as the configuration in force
// declares it.
type App struct {
	Name     string
	User     string // the role its server connections log in as
	Budget   int    // max_connections, for the whole cluster
	Pins     int    // max_pinned, for the whole cluster
	MinShare int    // min_share
}

// Options configure a Coordinator.
type Options struct {
	Cluster    string        // cluster.name
	Schema     string        // where the tables live
	InstanceID string        // instance_id; a random suffix makes the row's key unique per start
	TTL        time.Duration // cluster.ttl
	Heartbeat  time.Duration // tick interval
	// Advertise returns the address forwarded cancel and signal requests reach this
	// instance on ("" while unknown).
	Advertise func() string
	// SignalKey is the key the signal requests other instances forward to
	// this one are authenticated with (the proxy's, hex-encoded); it is
	// written to this instance's row, where the others read it. "": none
	// (the others forward it no signal request).
	SignalKey string
	// Connect opens the coordination connection.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Apps returns the cluster applications of the configuration in force.
	Apps    func() []App
	Pool    Pool
	Logger  *slog.Logger
	Metrics *Metrics
	// Task counts failed heartbeats and says when to log them at WARN
	// (nil: every one).
	Task *bgtask.Task
}

// Coordinator runs one instance's side of the cluster protocol.
type Coordinator struct {
	opts   Options
	log    *slog.Logger
	t      tables
	id     string // this start's row key
	m      *Metrics
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	number   int                           // this instance's number (0: not registered)
	peers    map[int]Peer                  // by number: the live instances
	view     View                          // the last tick's picture
	apps     map[string]bool               // the cluster applications (names)
	peak     map[string]struct{ c, p int } // app -> demand peak since the last tick
	slots    map[string]struct{ c, p int } // app -> this instance's row as last committed
	lastBeat time.Time                     // when the last successful heartbeat was sent
	conn     *pgx.Conn                     // owned by the loop goroutine

	ensured map[string]bool // apps whose rows this registration wrote (loop goroutine only)
	dialOK  map[string]bool // apps whose row this registration committed (under mu; dialGate)
	ticks   int             // ticks run (loop goroutine only)

	// server is pg_postmaster_start_time() of the PostgreSQL server this
	// instance registered on last, serverSince when it first registered
	// there (loop goroutine only). Another value at a registration means
	// another server: a failover to a standby, or a restart.
	server, serverSince time.Time
	// rebuild: applications whose row has not been balanced since this
	// instance registered on another server (under mu). recordDial
	// records no backend for them: a dial that passed the gate under the
	// old server's row must not count against the new server's row until
	// a balance there has covered it.
	rebuild map[string]bool

	recMu sync.Mutex
	rec   *pgx.Conn // recordDial's connection
}

// View is what SHOW CLUSTER shows: the instances and the slots.
type View struct {
	Instances []InstanceView
	Slots     []SlotView
}

// InstanceView is one row of cluster_instances.
type InstanceView struct {
	Instance     string
	Number       int
	Address      string
	HeartbeatAge time.Duration
	Live         bool
	Self         bool
}

// SlotView is one row of cluster_slots.
type SlotView struct {
	App, Instance     string
	Slots, Pins       int
	Demand, PinDemand int
	Live, Self        bool
}

// New builds a Coordinator and sets every cluster application's pool limit
// to 0: nothing is opened before this instance holds slots. Start runs it.
func New(opts Options) (*Coordinator, error) {
	if opts.Cluster == "" || opts.Connect == nil || opts.Pool == nil || opts.Apps == nil {
		return nil, errors.New("cluster: incomplete options")
	}
	if opts.TTL <= 0 || opts.Heartbeat <= 0 || 2*opts.Heartbeat >= opts.TTL {
		return nil, fmt.Errorf("cluster: heartbeat %s must be positive and less than half of ttl %s", opts.Heartbeat, opts.TTL)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	c := &Coordinator{
		opts:    opts,
		log:     opts.Logger,
		t:       newTables(opts.Schema),
		id:      opts.InstanceID + "/" + hex.EncodeToString(b[:]),
		m:       opts.Metrics,
		peers:   map[int]Peer{},
		apps:    map[string]bool{},
		ensured: map[string]bool{},
		dialOK:  map[string]bool{},
		rebuild: map[string]bool{},
		peak:    map[string]struct{ c, p int }{},
		slots:   map[string]struct{ c, p int }{},
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.m == nil {
		c.m = NewMetrics(nil)
	}
	for _, a := range opts.Apps() {
		opts.Pool.SetLimit(a.Name, 0, 0)
		c.m.setSlots(a.Name, 0)
		c.apps[a.Name] = true
	}
	opts.Pool.OnDial(c.recordDial)
	opts.Pool.DialGate(c.dialGate)
	return c, nil
}

// ID is this instance's key in the cluster tables.
func (c *Coordinator) ID() string { return c.id }

// Start runs the coordination loop until Close.
func (c *Coordinator) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.done = make(chan struct{})
	go c.run(ctx)
}

// Close stops the loop and removes this instance's rows, so the others can
// take its slots at once (its pool must be closed first, or be about to
// be: the rows say it holds nothing). The context bounds the removal.
func (c *Coordinator) Close(ctx context.Context, poolClosed bool) {
	if c.cancel == nil {
		return
	}
	c.cancel()
	<-c.done
	c.opts.Pool.OnDial(nil)
	c.opts.Pool.DialGate(nil)
	c.closeRec(ctx)
	if c.conn == nil {
		return
	}
	if poolClosed {
		_, err := c.conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE cluster = $1 AND instance = $2`, c.t.slots), c.opts.Cluster, c.id)
		if err == nil {
			_, err = c.conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE cluster = $1 AND instance = $2`, c.t.instances), c.opts.Cluster, c.id)
		}
		if err != nil {
			c.log.Warn("cluster: could not remove this instance's rows; the others reclaim them after cluster.ttl", "err", err)
		}
	}
	_ = c.conn.Close(ctx)
	c.conn = nil
}

// closeRec closes recordDial's connection.
func (c *Coordinator) closeRec(ctx context.Context) {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	if c.rec != nil {
		_ = c.rec.Close(ctx)
		c.rec = nil
	}
}

// Number is this instance's number in the cluster (1..255), 0 while it is
// not registered.
func (c *Coordinator) Number() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.number
}

// Peer is what an instance knows of another live instance of its cluster.
type Peer struct {
	Address   string // where it takes forwarded cancel and signal requests
	SignalKey string // the key its signal requests are authenticated with ("": none)
}

// Peer returns the advertised address of live instance number n.
func (c *Coordinator) Peer(n int) (string, bool) {
	p, ok := c.PeerInfo(n)
	return p.Address, ok
}

// PeerInfo returns live instance number n, when it advertises an address.
func (c *Coordinator) PeerInfo(n int) (Peer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.peers[n]
	return p, ok && p.Address != ""
}

// Snapshot returns the last tick's picture of the cluster.
func (c *Coordinator) Snapshot() View {
	c.mu.Lock()
	defer c.mu.Unlock()
	return View{Instances: append([]InstanceView(nil), c.view.Instances...), Slots: append([]SlotView(nil), c.view.Slots...)}
}

// dialGate is asked by the pool before every dial attempt: a cluster
// application may dial only while this registration's row is in place and
// the last successful heartbeat was sent less than ttl/2 ago, and the
// attempt must end by that send + 0.9 × ttl — before the others, who
// count ttl from the heartbeat's arrival, could take this instance for
// dead. So no dial is in flight when a survivor takes this instance's
// slots (unless the process is frozen mid-dial; see README, Limits).
func (c *Coordinator) dialGate(app string) (time.Time, error) {
	if !c.apps[app] {
		return time.Time{}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dialOK[app] {
		return time.Time{}, errors.New("cluster: this instance holds no committed slot row yet")
	}
	if c.lastBeat.IsZero() || time.Since(c.lastBeat) > c.opts.TTL/2 {
		return time.Time{}, errors.New("cluster: this instance's heartbeat is stale; it takes nothing new")
	}
	return c.lastBeat.Add(c.opts.TTL * 9 / 10), nil
}

// recordDial writes the backend pid of a server connection a cluster
// application's pool just opened into this instance's slot row, before the
// pool hands the connection out (pool.Manager.OnDial): every backend an
// instance uses is in its row, so survivors that take a dead instance's
// row for dead terminate all of them first. It fails — and the pool closes
// the connection — when the row is gone (reclaimed, or not written yet) or
// PostgreSQL cannot record it: an instance that cannot record takes
// nothing new. It runs on the dialing goroutine, on a connection of its
// own (the loop owns the coordination connection).
func (c *Coordinator) recordDial(ctx context.Context, app string, pid uint32) error {
	if !c.apps[app] {
		return nil
	}
	c.mu.Lock()
	rebuilding := c.rebuild[app]
	c.mu.Unlock()
	if rebuilding {
		return fmt.Errorf("cluster: application %q: this instance's row is not rebuilt on the new PostgreSQL server yet", app)
	}
	c.recMu.Lock()
	defer c.recMu.Unlock()
	if c.rec == nil {
		conn, err := c.opts.Connect(ctx)
		if err != nil {
			return fmt.Errorf("cluster: recording a server connection: %w", err)
		}
		c.rec = conn
	}
	// Only on the server this instance registered on: after a failover the
	// row may have come over from the old primary, and until this instance
	// has registered on the new one (and balanced there, rebuild above) its
	// row does not back a backend here.
	tag, err := c.rec.Exec(ctx, fmt.Sprintf(`UPDATE %s SET pids = array_append(pids, $4::int) WHERE cluster = $1 AND app = $2 AND instance = $3
  AND EXISTS (SELECT 1 FROM %s i WHERE i.cluster = $1 AND i.instance = $3 AND i.coord_server = pg_postmaster_start_time())`, c.t.slots, c.t.instances),
		c.opts.Cluster, app, c.id, int32(pid))
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.rec.Close(cctx)
		cancel()
		c.rec = nil
		return fmt.Errorf("cluster: recording a server connection: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("cluster: application %q: this instance holds no slots on this server (its row is not written yet, was reclaimed, or is of another server)", app)
	}
	return nil
}

// sample records the current demand of each application (the peak until
// the next tick). It reports whether clients wait for more than this
// instance holds (then the loop ticks early).
func (c *Coordinator) sample(apps []App) (starved bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range apps {
		st := c.opts.Pool.Stats(a.Name)
		s := c.slots[a.Name]
		if st.Waiting > 0 && s.c < a.Budget || st.PinWaiting > 0 && s.p < a.Pins {
			starved = true
		}
		p := c.peak[a.Name]
		p.c = max(p.c, st.InUse+st.Dialing+st.Waiting)
		p.p = max(p.p, st.Pinned+st.PinWaiting)
		c.peak[a.Name] = p
	}
	return starved
}

func (c *Coordinator) takePeak(app string) (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peak[app]
	delete(c.peak, app)
	return p.c, p.p
}

func (c *Coordinator) run(ctx context.Context) {
	defer close(c.done)
	tick := time.NewTicker(c.opts.Heartbeat)
	defer tick.Stop()
	sampleEvery := max(c.opts.Heartbeat/5, time.Millisecond)
	samp := time.NewTicker(sampleEvery)
	defer samp.Stop()
	c.tick(ctx)
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-samp.C:
			// Clients waiting for slots this instance does not hold: tick
			// early (at most every heartbeat/4) instead of at the next beat.
			if c.sample(c.opts.Apps()) && time.Since(last) >= c.opts.Heartbeat/4 {
				c.tick(ctx)
				last = time.Now()
			}
		case <-tick.C:
			c.sample(c.opts.Apps())
			c.tick(ctx)
			last = time.Now()
		}
	}
}

// tick heartbeats, moves this instance's slots and refreshes the view. On
// any error the connection is dropped and re-opened at the next tick.
func (c *Coordinator) tick(ctx context.Context) {
	tctx, cancel := context.WithTimeout(ctx, c.opts.TTL/2)
	defer cancel()
	apps := c.opts.Apps()
	err := c.exchange(tctx, apps)
	switch {
	case err == nil:
		if c.opts.Task.OK() {
			c.log.Info("cluster: coordination works again")
		}
	case ctx.Err() != nil:
	case c.opts.Task.Failed():
		c.log.Warn("cluster: coordination failed; keeping the slots held, taking none", "err", err)
	default:
		c.log.Debug("cluster: coordination failed again", "err", err)
	}
	if err != nil && ctx.Err() == nil {
		if c.conn != nil {
			cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.conn.Close(cctx)
			ccancel()
			c.conn = nil
		}
	}
	c.fence(apps)
}

// fence: when the last successful heartbeat was sent more than ttl/2 ago,
// every cluster application's limit falls to what is open (never rises).
func (c *Coordinator) fence(apps []App) {
	c.mu.Lock()
	stale := c.lastBeat.IsZero() || time.Since(c.lastBeat) > c.opts.TTL/2
	c.mu.Unlock()
	if !stale {
		return
	}
	for _, a := range apps {
		st := c.opts.Pool.Stats(a.Name)
		c.mu.Lock()
		s := c.slots[a.Name]
		s.c, s.p = min(s.c, st.Open), min(s.p, st.Pinned)
		c.slots[a.Name] = s
		c.mu.Unlock()
		c.opts.Pool.SetLimit(a.Name, s.c, s.p)
	}
}

func (c *Coordinator) exchange(ctx context.Context, apps []App) error {
	if c.conn == nil {
		conn, err := c.opts.Connect(ctx)
		if err != nil {
			return fmt.Errorf("connecting: %w", err)
		}
		c.conn = conn
		if err := c.t.migrate(ctx, conn); err != nil {
			return fmt.Errorf("creating the cluster tables: %w", err)
		}
		if err := c.register(ctx); err != nil {
			return fmt.Errorf("registering: %w", err)
		}
	}
	sent := time.Now()
	var n int
	err := c.conn.QueryRow(ctx, fmt.Sprintf(`UPDATE %s SET heartbeat_at = now(), address = $3
WHERE cluster = $1 AND instance = $2 AND coord_pid = pg_backend_pid() RETURNING number`, c.t.instances),
		c.opts.Cluster, c.id, c.address()).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		// Our row is gone: the others took us for dead and reclaimed our
		// slots (register drops them here too).
		return c.register(ctx)
	}
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	c.mu.Lock()
	c.lastBeat = sent
	c.mu.Unlock()
	for _, a := range apps {
		err := c.balance(ctx, a)
		if errors.Is(err, errRowReclaimed) {
			c.log.Error("cluster: this instance's slots were reclaimed by the others; holding none until its share comes back", "app", a.Name)
			continue
		}
		if err != nil {
			return fmt.Errorf("application %q: %w", a.Name, err)
		}
	}
	return c.refreshView(ctx)
}

func (c *Coordinator) address() string {
	if c.opts.Advertise == nil {
		return ""
	}
	return c.opts.Advertise()
}

// register inserts this instance's row with its number of before if that
// is free, else the lowest free number, or takes over its row if it is
// there. On another PostgreSQL server than at the last registration (a
// failover, or a restart) this instance's rows may be stale or missing
// (asynchronous replication loses the last commits): the pids they record
// are of backends on the old server, so they are cleared; the pool's
// limits fall to what is open (what the table backs is only known at the
// next balance), and no backend is recorded until that balance (rebuild).
// The table, not memory, says what the instance holds: balance moves its
// row from what the row says there, within the budget.
func (c *Coordinator) register(ctx context.Context) error {
	var n int
	var inserted, changed bool
	var server time.Time
	err := pgx.BeginFunc(ctx, c.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "lockpool cluster "+c.opts.Cluster); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&server); err != nil {
			return err
		}
		changed = !c.server.IsZero() && !server.Equal(c.server)
		if changed {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET pids = '{}' WHERE cluster = $1 AND instance = $2`, c.t.slots), c.opts.Cluster, c.id); err != nil {
				return err
			}
		}
		c.mu.Lock()
		prev := c.number
		c.mu.Unlock()
		return tx.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %[1]s AS i (cluster, instance, number, address, signal_key, coord_pid, coord_start, coord_server)
SELECT $1, $2, n, $3, $4, pg_backend_pid(), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()), pg_postmaster_start_time()
FROM generate_series(1, %[2]d) n
WHERE n NOT IN (SELECT number FROM %[1]s WHERE cluster = $1 AND instance <> $2)
ORDER BY n = $5 DESC, n LIMIT 1
ON CONFLICT (cluster, instance) DO UPDATE SET coord_pid = excluded.coord_pid, coord_start = excluded.coord_start,
  coord_server = excluded.coord_server, address = excluded.address, signal_key = excluded.signal_key, heartbeat_at = now()
RETURNING i.number, i.xmax = 0`, c.t.instances, maxNumber), c.opts.Cluster, c.id, c.address(), c.opts.SignalKey, prev).Scan(&n, &inserted)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("cluster %q already has %d instances", c.opts.Cluster, maxNumber)
	}
	if err != nil {
		return err
	}
	if c.server.IsZero() || changed {
		c.serverSince = time.Now()
	}
	c.server = server
	apps := c.opts.Apps()
	clear(c.ensured)
	c.mu.Lock()
	clear(c.dialOK)
	if changed {
		for _, a := range apps {
			c.rebuild[a.Name] = true
		}
	}
	again := inserted && c.number != 0
	c.number = n
	if again {
		clear(c.slots)
	}
	c.mu.Unlock()
	switch {
	case again && changed:
		// Registered before, on another server, and this one has no row
		// of this instance (it registered after the last commit that
		// reached it). Start over as after a reclaim.
		c.log.Error("cluster: PostgreSQL is another server now (a failover or a restart) and has no row of this instance; dropping its slots and starting over", "number", n)
	case again:
		// Registered before, and the row was gone: the others took this
		// instance for dead and reclaimed its slots (after terminating its
		// backends). Hold nothing until the protocol gives slots back.
		c.log.Error("cluster: this instance's rows were reclaimed by the others; dropping its slots and starting over")
	case changed:
		c.log.Warn("cluster: PostgreSQL is another server now (a failover or a restart); rebuilding this instance's slots from its rows there", "number", n)
	}
	if again {
		for _, a := range apps {
			c.opts.Pool.SetLimit(a.Name, 0, 0)
		}
	} else if changed {
		// Hold what is open, take nothing new until a balance on this
		// server has written a row that backs it.
		for _, a := range apps {
			st := c.opts.Pool.Stats(a.Name)
			c.mu.Lock()
			sl := c.slots[a.Name]
			sl.c, sl.p = min(sl.c, st.Open), min(sl.p, st.Pinned)
			c.slots[a.Name] = sl
			c.mu.Unlock()
			c.opts.Pool.SetLimit(a.Name, sl.c, sl.p)
		}
	}
	c.log.Info("cluster: registered", "cluster", c.opts.Cluster, "instance", c.id, "number", n)
	return nil
}

// ensureRow makes sure this instance has its slot row for a (once per
// registration). A missing row — the first time, or after the others
// reclaimed it — is only written once the pool holds nothing of the
// application: the limit goes to 0 first, and until every connection it
// still counts (ghosts of terminated backends, dials in flight, which
// cannot record themselves without the row) is gone, the row stays
// absent and ensureRow reports false. A new row starts at 0 slots and
// the next balance claims what is open (dials waiting at the gate
// included) before the gate lets a dial through.
func (c *Coordinator) ensureRow(ctx context.Context, a App) (bool, error) {
	if _, err := c.conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (cluster, app) VALUES ($1, $2) ON CONFLICT DO NOTHING`, c.t.apps), c.opts.Cluster, a.Name); err != nil {
		return false, err
	}
	var exists bool
	if err := c.conn.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE cluster = $1 AND app = $2 AND instance = $3)`, c.t.slots),
		c.opts.Cluster, a.Name, c.id).Scan(&exists); err != nil {
		return false, err
	}
	if !exists {
		c.mu.Lock()
		delete(c.slots, a.Name)
		c.dialOK[a.Name] = false
		c.mu.Unlock()
		c.opts.Pool.SetLimit(a.Name, 0, 0)
		c.m.setSlots(a.Name, 0)
		// Dials count as open but have no backend here: the gate refuses
		// them without the row, and any attempt let through earlier ended
		// before the others could reclaim the row (dialGate).
		if st := c.opts.Pool.Stats(a.Name); st.Open-st.Dialing > 0 || st.Pinned > 0 {
			c.log.Warn("cluster: waiting for this instance's connections to close before it takes slots again", "app", a.Name, "open", st.Open-st.Dialing, "pinned", st.Pinned)
			return false, nil
		}
		if _, err := c.conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (cluster, app, instance, usename) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, c.t.slots),
			c.opts.Cluster, a.Name, c.id, a.User); err != nil {
			return false, err
		}
	}
	c.ensured[a.Name] = true
	return true, nil
}

// lockSlotRowFresh locks instance's row of the slots table in tx (its pids
// into pids, if not nil), then drops the transaction's snapshot of
// pg_stat_activity. PostgreSQL takes that snapshot at a transaction's first
// look at the view and keeps it to the end: a backend that started after it
// — one a recordDial appended while tx waited for the row — would look gone,
// and its pid be dropped from the row while the backend still counts
// against the budget.
func lockSlotRowFresh(ctx context.Context, tx pgx.Tx, slots, cluster, app, instance string, pids *[]int32) error {
	var got []int32
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT pids FROM %s WHERE cluster = $1 AND app = $2 AND instance = $3 FOR UPDATE`, slots),
		cluster, app, instance).Scan(&got); err != nil {
		return err
	}
	if pids != nil {
		*pids = got
	}
	_, err := tx.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	return err
}

// slotRow is one row of cluster_slots as balance reads it.
type slotRow struct {
	instance          string
	slots, pins       int
	demand, pinDemand int
	pids              []int32
	live, coordGone   bool
	elsewhere         bool // its instance registered last on another server: its pids are not of this one
}

// balance runs one step of the protocol for app, in one transaction that
// holds the application's lock row.
func (c *Coordinator) balance(ctx context.Context, a App) error {
	wantConns, wantPins := c.takePeak(a.Name)
	c.mu.Lock()
	cur := c.slots[a.Name]
	c.mu.Unlock()

	if !c.ensured[a.Name] {
		ok, err := c.ensureRow(ctx, a)
		if err != nil || !ok {
			return err
		}
	}
	var newSlots, newPins, share, pinShare, open int
	err := pgx.BeginFunc(ctx, c.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE cluster = $1 AND app = $2 FOR UPDATE`, c.t.apps), c.opts.Cluster, a.Name); err != nil {
			return err
		}
		// turn: the server clock's second, for units a fair split cannot
		// divide (the same for every instance).
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT s.instance, s.slots, s.pins, s.demand, s.pin_demand, s.pids,
  i.instance IS NOT NULL AND i.heartbeat_at > now() - $3::float8 * interval '1 second',
  i.instance IS NULL OR NOT EXISTS (SELECT 1 FROM pg_stat_activity p WHERE p.pid = i.coord_pid AND p.backend_start = i.coord_start),
  coalesce(i.coord_server <> pg_postmaster_start_time(), false),
  (floor(extract(epoch FROM now())) %% 1000000)::int8
FROM %s s LEFT JOIN %s i ON i.cluster = s.cluster AND i.instance = s.instance
WHERE s.cluster = $1 AND s.app = $2`, c.t.slots, c.t.instances), c.opts.Cluster, a.Name, c.opts.TTL.Seconds())
		if err != nil {
			return err
		}
		var all []slotRow
		var turn int
		found := false
		for rows.Next() {
			var r slotRow
			if err := rows.Scan(&r.instance, &r.slots, &r.pins, &r.demand, &r.pinDemand, &r.pids, &r.live, &r.coordGone, &r.elsewhere, &turn); err != nil {
				rows.Close()
				return err
			}
			if r.instance == c.id {
				found = true
				r.live, r.coordGone, r.elsewhere = true, false, false
				r.demand, r.pinDemand = wantConns, wantPins
			}
			all = append(all, r)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if !found {
			// Reclaimed by the others (who terminated this instance's
			// backends first): hold nothing; the row is written again at
			// the next tick.
			c.ensured[a.Name] = false
			c.mu.Lock()
			c.dialOK[a.Name] = false
			c.mu.Unlock()
			c.opts.Pool.SetLimit(a.Name, 0, 0)
			return errRowReclaimed
		}
		var livePIDs []int32
		for _, r := range all {
			if r.live {
				livePIDs = append(livePIDs, r.pids...)
			}
		}
		var held, heldPins []int
		var members []member
		var myRow slotRow
		for _, r := range all {
			if !r.live {
				gone, err := c.reclaim(ctx, tx, a, r, livePIDs)
				if err != nil {
					return err
				}
				if gone {
					continue
				}
			}
			held = append(held, r.slots)
			heldPins = append(heldPins, r.pins)
			if r.live {
				members = append(members, member{r.instance, r.demand})
			}
			if r.instance == c.id {
				myRow = r
			}
		}
		pinMembers := make([]member, 0, len(all))
		for _, r := range all {
			if r.live {
				pinMembers = append(pinMembers, member{r.instance, r.pinDemand})
			}
		}
		share = fairShares(a.Budget, a.MinShare, members, turn)[c.id]
		pinShare = fairShares(a.Pins, 0, pinMembers, turn)[c.id]
		// Lower the pool's limit first, then write no less than what is open.
		if share < myRow.slots || pinShare < myRow.pins {
			c.opts.Pool.SetLimit(a.Name, min(share, myRow.slots), min(pinShare, myRow.pins))
		}
		st := c.opts.Pool.Stats(a.Name)
		// A connection the pool closed leaves a backend that PostgreSQL
		// ends only when it reads the Terminate: until it is gone from
		// pg_stat_activity it still counts against the budget, so the row
		// keeps a slot for every recorded backend still there (and for
		// dials not recorded yet). The row is locked first: a recordDial
		// waits, and every pid recorded before is of a backend that
		// started before the lock was had.
		if err := lockSlotRowFresh(ctx, tx, c.t.slots, c.opts.Cluster, a.Name, c.id, nil); err != nil {
			return err
		}
		var present int
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity p,
  (SELECT pids FROM %s WHERE cluster = $1 AND app = $2 AND instance = $3) r
WHERE p.usename = $4::text AND p.pid = ANY(r.pids)`, c.t.slots),
			c.opts.Cluster, a.Name, c.id, a.User).Scan(&present); err != nil {
			return err
		}
		open = max(st.Open, present+st.Dialing)
		newSlots = nextSlots(a.Budget, held, myRow.slots, share, open)
		newPins = nextSlots(a.Pins, heldPins, myRow.pins, pinShare, st.Pinned)
		// pids keeps the backends still there (re-read under the row lock,
		// so a pid recordDial appended meanwhile is kept).
		_, err = tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET slots = $4, pins = $5, demand = $6, pin_demand = $7, usename = $8::text,
  pids = ARRAY(SELECT pid FROM pg_stat_activity WHERE pid = ANY(pids) AND usename = $8::text)
WHERE cluster = $1 AND app = $2 AND instance = $3`, c.t.slots),
			c.opts.Cluster, a.Name, c.id, newSlots, newPins, wantConns, wantPins, a.User)
		return err
	})
	if err != nil {
		// The row may or may not have been raised: keep the limit no
		// higher than before (it was lowered above if it had to be).
		return err
	}
	c.mu.Lock()
	c.slots[a.Name] = struct{ c, p int }{newSlots, newPins}
	delete(c.rebuild, a.Name)
	// The gate opens only while the row covers everything the pool counts
	// open, dials waiting at the gate included: a row that could not be
	// raised that far (nothing free) lets none of them through — they wait
	// at the gate (or their wait_timeout ends), as a dial past the budget
	// would otherwise put one backend too many on the server.
	c.dialOK[a.Name] = newSlots >= open
	c.mu.Unlock()
	if newSlots != cur.c || newPins != cur.p {
		c.log.Debug("cluster: slots moved", "app", a.Name, "slots", newSlots, "pins", newPins, "was", cur.c)
	}
	// The limit is the share, or what the row could be raised to: never
	// more than the row (which may still cover connections above the
	// share until they close).
	c.opts.Pool.SetLimit(a.Name, min(newSlots, share), min(newPins, pinShare))
	c.m.setSlots(a.Name, newSlots)
	return nil
}

// reclaim removes a dead instance's row when it is safe: its coordination
// backend is gone and so is every server backend it recorded (those still
// there are terminated now, and the row stays until a later tick finds
// them gone). It reports whether the row was removed.
func (c *Coordinator) reclaim(ctx context.Context, tx pgx.Tx, a App, r slotRow, livePIDs []int32) (bool, error) {
	if !r.coordGone {
		return false, nil
	}
	if r.elsewhere {
		return c.reclaimElsewhere(ctx, tx, a, r)
	}
	// Lock the row first: a recordDial of that instance (if it still
	// lives) waits, and finds the row gone once it is deleted.
	if err := lockSlotRowFresh(ctx, tx, c.t.slots, c.opts.Cluster, a.Name, r.instance, &r.pids); err != nil {
		return false, err
	}
	var left int
	if len(r.pids) > 0 {
		// Only backends this role may signal are terminated (the others
		// stay counted until they end by themselves).
		err := tx.QueryRow(ctx, `SELECT count(*) FROM (
  SELECT CASE WHEN pg_has_role(p.usename, 'MEMBER') OR pg_has_role('pg_signal_backend', 'MEMBER') THEN pg_terminate_backend(p.pid) END
  FROM pg_stat_activity p
  WHERE p.pid = ANY($1::int[]) AND p.usename = $2::text AND NOT (p.pid = ANY($3::int[]))) t`, r.pids, a.User, livePIDs).Scan(&left)
		if err != nil {
			return false, err
		}
	}
	if left > 0 {
		c.log.Warn("cluster: terminating the server backends of a dead instance before taking its slots", "app", a.Name, "instance", r.instance, "backends", left)
		return false, nil
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE cluster = $1 AND app = $2 AND instance = $3`, c.t.slots), c.opts.Cluster, a.Name, r.instance); err != nil {
		return false, err
	}
	c.log.Info("cluster: reclaimed the slots of a dead instance", "app", a.Name, "instance", r.instance, "slots", r.slots, "pins", r.pins)
	return true, nil
}

// reclaimElsewhere removes the row of an instance that registered last on
// another PostgreSQL server (before a failover or a restart) and has not
// heartbeaten here for ttl: none of the backends it recorded is on this
// server (its pids may be those of unrelated backends here, so nothing is
// terminated), and none can be recorded until it registers here. The row
// is left alone until this instance has been on this server for ttl, so
// that a live instance, reconnecting after the failover, re-registers and
// keeps its row; and it stays if that instance registered here meanwhile.
func (c *Coordinator) reclaimElsewhere(ctx context.Context, tx pgx.Tx, a App, r slotRow) (bool, error) {
	if time.Since(c.serverSince) < c.opts.TTL {
		return false, nil
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s s WHERE s.cluster = $1 AND s.app = $2 AND s.instance = $3
  AND NOT EXISTS (SELECT 1 FROM %s i WHERE i.cluster = $1 AND i.instance = $3 AND i.coord_server = pg_postmaster_start_time())`, c.t.slots, c.t.instances),
		c.opts.Cluster, a.Name, r.instance)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	c.log.Info("cluster: reclaimed the slots of a dead instance", "app", a.Name, "instance", r.instance, "slots", r.slots, "pins", r.pins, "registered_on_another_server", true)
	return true, nil
}

// refreshView reads the instances and slots for SHOW CLUSTER and the
// peers' addresses, and removes dead instances that hold no slots any more.
func (c *Coordinator) refreshView(ctx context.Context) error {
	ttl := c.opts.TTL.Seconds()
	c.ticks++
	if c.ticks%10 == 1 {
		// Dead instances that hold no slot rows any more (every tenth tick).
		if _, err := c.conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s i WHERE i.cluster = $1 AND i.heartbeat_at < now() - $2::float8 * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM %[2]s s WHERE s.cluster = i.cluster AND s.instance = i.instance)
  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity p WHERE p.pid = i.coord_pid AND p.backend_start = i.coord_start)`, c.t.instances, c.t.slots),
			c.opts.Cluster, ttl); err != nil {
			return err
		}
	}
	rows, err := c.conn.Query(ctx, fmt.Sprintf(`SELECT instance, number, address, signal_key, extract(epoch FROM now() - heartbeat_at)::float8,
  heartbeat_at > now() - $2::float8 * interval '1 second'
FROM %s WHERE cluster = $1 ORDER BY number`, c.t.instances), c.opts.Cluster, ttl)
	if err != nil {
		return err
	}
	var v View
	peers := map[int]Peer{}
	live := map[string]bool{}
	for rows.Next() {
		var iv InstanceView
		var age float64
		var key string
		if err := rows.Scan(&iv.Instance, &iv.Number, &iv.Address, &key, &age, &iv.Live); err != nil {
			rows.Close()
			return err
		}
		iv.HeartbeatAge = time.Duration(age * float64(time.Second))
		iv.Self = iv.Instance == c.id
		if iv.Live {
			peers[iv.Number] = Peer{Address: iv.Address, SignalKey: key}
			live[iv.Instance] = true
		}
		v.Instances = append(v.Instances, iv)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = c.conn.Query(ctx, fmt.Sprintf(`SELECT app, instance, slots, pins, demand, pin_demand FROM %s WHERE cluster = $1`, c.t.slots), c.opts.Cluster)
	if err != nil {
		return err
	}
	for rows.Next() {
		var sv SlotView
		if err := rows.Scan(&sv.App, &sv.Instance, &sv.Slots, &sv.Pins, &sv.Demand, &sv.PinDemand); err != nil {
			rows.Close()
			return err
		}
		sv.Live, sv.Self = live[sv.Instance], sv.Instance == c.id
		v.Slots = append(v.Slots, sv)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	sort.Slice(v.Slots, func(i, j int) bool {
		if v.Slots[i].App != v.Slots[j].App {
			return v.Slots[i].App < v.Slots[j].App
		}
		return v.Slots[i].Instance < v.Slots[j].Instance
	})
	c.mu.Lock()
	c.view, c.peers = v, peers
	c.mu.Unlock()
	c.m.setInstances(len(peers))
	return nil
}
