package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/pool"
)

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, nil)) }

// statsPool is a Pool whose Stats the test sets.
type statsPool struct {
	mu    sync.Mutex
	stats pool.Stats
}

func (p *statsPool) set(st pool.Stats) {
	p.mu.Lock()
	p.stats = st
	p.mu.Unlock()
}

func (p *statsPool) Stats(string) pool.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

func (p *statsPool) SetLimit(string, int, int) {}

func (p *statsPool) OnDial(func(context.Context, string, uint32) error) {}
func (p *statsPool) DialGate(func(string) (time.Time, error))           {}

// newTestCoordinator is one instance of cluster name over pg, driven by
// the test: it calls sample and tick itself, so every step is one
// heartbeat and nothing runs in between.
func newTestCoordinator(t *testing.T, pg *pgtest.Cluster, name, instance string, p *statsPool, apps []App) *Coordinator {
	t.Helper()
	c, err := New(Options{
		Cluster: name, Schema: "lockpool_cluster_test", InstanceID: instance,
		TTL: time.Minute, Heartbeat: time.Second,
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, pg.SuperuserDSN("postgres")) },
		Apps:    func() []App { return apps },
		Pool:    p,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.conn != nil {
			_ = c.conn.Close(context.Background())
		}
		c.closeRec(context.Background())
	})
	return c
}

// step samples the pool and runs one tick, which must succeed.
func step(t *testing.T, c *Coordinator, apps []App) {
	t.Helper()
	c.sample(apps)
	c.tick(context.Background())
	c.mu.Lock()
	beat := c.lastBeat
	c.mu.Unlock()
	if beat.IsZero() || time.Since(beat) > time.Minute/2 {
		t.Fatalf("%s: the tick did not heartbeat", c.id)
	}
}

// TestDialGateWaitsWhileRowCannotCoverOpen: an instance whose pool counts a
// dial waiting at the gate (open, no backend yet) while the other instance
// holds the whole budget writes a row it cannot raise to cover that dial;
// its gate stays shut until the row covers it, so the dial never puts a
// backend past the budget. (Before, any committed row opened the gate.)
func TestDialGateWaitsWhileRowCannotCoverOpen(t *testing.T) {
	pg := pgtest.Require(t)
	apps := []App{{Name: "a", User: "postgres", Budget: 2}}
	pa, pb := &statsPool{}, &statsPool{}
	name := fmt.Sprintf("gate-%d", time.Now().UnixNano()) // no rows of an earlier run
	a := newTestCoordinator(t, pg, name, "A", pa, apps)
	b := newTestCoordinator(t, pg, name, "B", pb, apps)

	// B takes the whole budget (clients waiting: the demand its row shows
	// the next tick), then uses it.
	pb.set(pool.Stats{Waiting: 2})
	step(t, b, apps)
	step(t, b, apps)
	pb.set(pool.Stats{Open: 2, InUse: 2})
	step(t, b, apps)
	if got := b.slots["a"].c; got != 2 {
		t.Fatalf("B holds %d slots, want the budget of 2", got)
	}
	if _, err := b.dialGate("a"); err != nil {
		t.Fatalf("B's gate with a row covering its 2 open connections: %v", err)
	}

	// A has one dial at its gate. Nothing is free: its row stays at 0.
	pa.set(pool.Stats{Open: 1, Dialing: 1})
	step(t, a, apps)
	if got := a.slots["a"].c; got != 0 {
		t.Fatalf("A's row has %d slots while B holds the budget", got)
	}
	if _, err := a.dialGate("a"); err == nil {
		t.Fatal("A's gate opened with a row of 0 slots under 1 open (a dial): one backend past the budget")
	}

	// B's connections close: its row falls to its share, A's rises to
	// cover the dial, and only then does A's gate open.
	pb.set(pool.Stats{})
	step(t, b, apps)
	step(t, a, apps)
	if got := a.slots["a"].c; got < 1 {
		t.Fatalf("A's row has %d slots after B's connections closed, want at least its 1 open", got)
	}
	if _, err := a.dialGate("a"); err != nil {
		t.Fatalf("A's gate with a row covering its open dial: %v", err)
	}
	if sum := a.slots["a"].c + b.slots["a"].c; sum > 2 {
		t.Fatalf("rows hold %d slots for a budget of 2", sum)
	}
}

// TestRecordedPidOfNewerBackendKept: a pid recorded while the heartbeat's
// transaction waits for its row, of a backend that started after that
// transaction first read pg_stat_activity, stays in the row and keeps its
// slot. (Before, the transaction's snapshot of pg_stat_activity, taken at
// its first read, did not show the backend, and the heartbeat dropped the
// pid: a closed connection's lingering backend then counted against no row.)
func TestRecordedPidOfNewerBackendKept(t *testing.T) {
	pg := pgtest.Require(t)
	ctx := context.Background()
	apps := []App{{Name: "a", User: "postgres", Budget: 2}}
	pa := &statsPool{}
	name := fmt.Sprintf("newer-%d", time.Now().UnixNano()) // no rows of an earlier run
	a := newTestCoordinator(t, pg, name, "A", pa, apps)
	pa.set(pool.Stats{Waiting: 1})
	step(t, a, apps) // registers, writes A's row
	coordPID := a.conn.PgConn().PID()

	su, err := pgx.Connect(ctx, pg.SuperuserDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	tx, err := su.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	slots := "lockpool_cluster_test.cluster_slots"
	if tag, err := tx.Exec(ctx, "SELECT 1 FROM "+slots+" WHERE cluster = $1 AND app = 'a' AND instance = $2 FOR UPDATE", name, a.id); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("locking A's row: %v (%d rows)", err, tag.RowsAffected())
	}

	// The heartbeat reads the rows (and pg_stat_activity), then waits for
	// A's row, which the test holds.
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		a.sample(apps)
		a.tick(ctx)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := su.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')", coordPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			var st, q string
			_ = su.QueryRow(ctx, "SELECT coalesce(state,'') || ' ' || coalesce(wait_event_type,'') || ' ' || coalesce(wait_event,''), query FROM pg_stat_activity WHERE pid = $1", coordPID).Scan(&st, &q)
			t.Fatalf("the heartbeat never waited for the locked row: coordinator backend %d: %s: %s", coordPID, st, q)
		}
		time.Sleep(10 * time.Millisecond) // polling another backend's wait: no signal
	}

	// A backend that starts now, recorded as recordDial records one.
	newer, err := pgx.Connect(ctx, pg.SuperuserDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close(ctx)
	pid := newer.PgConn().PID()
	if _, err := tx.Exec(ctx, "UPDATE "+slots+" SET pids = array_append(pids, $2::int) WHERE cluster = $1 AND app = 'a' AND instance = $3", name, int32(pid), a.id); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-ticked

	var pids []int32
	if err := su.QueryRow(ctx, "SELECT pids FROM "+slots+" WHERE cluster = $1 AND app = 'a' AND instance = $2", name, a.id).Scan(&pids); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, int32(pid)) {
		t.Fatalf("after the heartbeat A's row records pids %v: the live backend %d was dropped", pids, pid)
	}
	if got := a.slots["a"].c; got < 1 {
		t.Fatalf("A's row has %d slots with the recorded backend %d alive", got, pid)
	}
}
