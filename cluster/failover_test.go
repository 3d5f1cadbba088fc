package cluster

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/pool"
)

// limitPool is a statsPool that remembers the last limit set.
type limitPool struct {
	statsPool
	lmu   sync.Mutex
	limit [2]int
}

func (p *limitPool) SetLimit(_ string, conns, pins int) {
	p.lmu.Lock()
	p.limit = [2]int{conns, pins}
	p.lmu.Unlock()
}

func (p *limitPool) conns() int {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	return p.limit[0]
}

// TestCoordinatorRebuildsAfterFailover: instances A, B and C share a budget
// of 4 on a primary; the standby stops receiving WAL, slots move on the
// primary (A 3 → 0, B 1 → 4, C registers), and the primary crashes. On the
// promoted standby the rows say A 3, B 1 (with a pid of the old server)
// and nothing of C. Each coordinator, reconnecting there, rebuilds from
// those rows, not from memory: no backend is recorded before its first
// balance there, its pids of the old server are cleared, its number is
// kept, its limit is what the new server's row backs, and a row missing
// there is written again. A dead instance's row of the old server is taken
// away without terminating the backend that now has one of its pids.
func TestCoordinatorRebuildsAfterFailover(t *testing.T) {
	pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = primary.Destroy() }()
	standby, err := primary.StartStandby(ctx, pgtest.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = standby.Destroy() }()
	var cur atomic.Pointer[pgtest.Cluster]
	cur.Store(primary)
	su := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, cur.Load().SuperuserDSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}

	const ttl = 3 * time.Second
	apps := []App{{Name: "a", User: "postgres", Budget: 4}}
	newCoord := func(instance string, p Pool) *Coordinator {
		c, err := New(Options{
			Cluster: "failover", Schema: "lockpool_failover_test", InstanceID: instance,
			TTL: ttl, Heartbeat: time.Second,
			Connect: func(ctx context.Context) (*pgx.Conn, error) {
				return pgx.Connect(ctx, cur.Load().SuperuserDSN("postgres"))
			},
			Apps: func() []App { return apps },
			Pool: p,
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
	pa, pb, pc, pd := &limitPool{}, &limitPool{}, &limitPool{}, &limitPool{}
	a, b, c, d := newCoord("A", pa), newCoord("B", pb), newCoord("C", pc), newCoord("D", pd)
	type row struct {
		slots int
		pids  []int32
	}
	rows := func() map[string]row {
		conn := su()
		defer conn.Close(ctx)
		r, err := conn.Query(ctx, "SELECT instance, slots, pids FROM lockpool_failover_test.cluster_slots WHERE cluster = 'failover' AND app = 'a'")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]row{}
		for r.Next() {
			var id string
			var x row
			if err := r.Scan(&id, &x.slots, &x.pids); err != nil {
				t.Fatal(err)
			}
			out[id] = x
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	checkBudget := func(when string) map[string]row {
		t.Helper()
		rs := rows()
		sum := 0
		for _, r := range rs {
			sum += r.slots
		}
		if sum > 4 {
			t.Fatalf("%s: the rows hold %d slots for a budget of 4: %v", when, sum, rs)
		}
		for _, x := range []struct {
			c *Coordinator
			p *limitPool
		}{{a, pa}, {b, pb}, {c, pc}} {
			if r, ok := rs[x.c.id]; x.p.conns() > 0 && (!ok || x.p.conns() > r.slots) {
				t.Fatalf("%s: %s's pool limit is %d, its row on the server %v (present %v)", when, x.c.id, x.p.conns(), r.slots, ok)
			}
		}
		return rs
	}

	// On the primary: A wants 3, B 1; D is there, wanting nothing.
	pa.set(pool.Stats{Waiting: 3})
	pb.set(pool.Stats{Waiting: 1})
	step(t, d, apps)
	step(t, a, apps)
	step(t, b, apps)
	pa.set(pool.Stats{Open: 3, InUse: 3})
	pb.set(pool.Stats{Open: 1, InUse: 1})
	step(t, a, apps)
	step(t, b, apps)
	// B's connection, recorded in its row.
	oldConn := su()
	oldPID := oldConn.PgConn().PID()
	if err := b.recordDial(ctx, "a", oldPID); err != nil {
		t.Fatal(err)
	}
	rs := checkBudget("on the primary")
	if rs[a.id].slots != 3 || rs[b.id].slots != 1 || !slices.Contains(rs[b.id].pids, int32(oldPID)) {
		t.Fatalf("on the primary: rows %v; want A 3, B 1 with pid %d", rs, oldPID)
	}
	numB, numC := b.Number(), 0
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}

	// Lost with the primary: A's load ends, B takes the budget, C registers.
	pa.set(pool.Stats{})
	step(t, a, apps)
	pb.set(pool.Stats{Open: 1, InUse: 1, Waiting: 3})
	step(t, b, apps)
	step(t, b, apps)
	step(t, c, apps)
	numC = c.Number()
	rs = checkBudget("on the primary, after the standby stopped receiving")
	if rs[a.id].slots != 0 || rs[b.id].slots != 4 || pb.conns() != 4 {
		t.Fatalf("on the primary: rows %v, B's limit %d; want A 0, B 4", rs, pb.conns())
	}

	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	cur.Store(standby)
	// The old server's connections are gone; B's clients wait for 4.
	pa.set(pool.Stats{})
	pb.set(pool.Stats{Waiting: 4})
	rs = rows()
	if rs[a.id].slots != 3 || rs[b.id].slots != 1 || !slices.Contains(rs[b.id].pids, int32(oldPID)) {
		t.Fatalf("the new primary's rows %v; want A 3, B 1 (with the old server's pid %d), as last replicated", rs, oldPID)
	}
	if _, ok := rs[c.id]; ok {
		t.Fatal("the new primary has C's row, registered after the standby stopped receiving")
	}
	// A connection on the new primary: its pid may be any old pid.
	newConn := su()
	newPID := newConn.PgConn().PID()

	// Before B reconnects, no backend on the new server can be recorded
	// into its stale row (the first try fails on the dead recording
	// connection, the next on the row naming the old server).
	for i := range 2 {
		if err := b.recordDial(ctx, "a", newPID); err == nil {
			t.Fatalf("recordDial #%d on the new primary before B registered there succeeded", i)
		}
	}
	// B's tick fails on its dead connection; it then registers on the new
	// primary (done here by hand, to look between registration and balance).
	b.tick(ctx)
	if b.conn != nil {
		t.Fatal("B kept its connection to the crashed primary")
	}
	if b.conn, err = b.opts.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.t.migrate(ctx, b.conn); err != nil {
		t.Fatal(err)
	}
	if err := b.register(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Number() != numB {
		t.Fatalf("B's number on the new primary is %d, was %d", b.Number(), numB)
	}
	if got := pb.conns(); got != 0 {
		t.Fatalf("B's limit after registering on the new primary is %d; want 0 (nothing open)", got)
	}
	if p := rows()[b.id].pids; len(p) != 0 {
		t.Fatalf("B's row on the new primary keeps the old server's pids %v", p)
	}
	if err := b.recordDial(ctx, "a", newPID); err == nil {
		t.Fatal("recordDial on the new primary between B's registration and its first balance there succeeded")
	}
	// B's first balance on the new primary: its row there says 1 and A's
	// 3, so B holds 1 (not the 4 it held on the old primary).
	step(t, b, apps)
	rs = checkBudget("after B's first balance on the new primary")
	if rs[b.id].slots != 1 || pb.conns() != 1 {
		t.Fatalf("after B's first balance on the new primary: rows %v, B's limit %d; want B 1, limit 1", rs, pb.conns())
	}
	if err := b.recordDial(ctx, "a", newPID); err != nil {
		t.Fatalf("recordDial after B's balance on the new primary: %v", err)
	}

	// A comes back: its row falls from 3 to its demand, 0; B then takes 4.
	a.tick(ctx)
	step(t, a, apps)
	step(t, b, apps)
	rs = checkBudget("after A came back")
	if rs[a.id].slots != 0 || rs[b.id].slots != 4 || pa.conns() != 0 || pb.conns() != 4 {
		t.Fatalf("after A came back: rows %v, limits A %d B %d; want A 0, B 4", rs, pa.conns(), pb.conns())
	}

	// C has no row on the new primary: it registers again under its
	// number and writes its row anew.
	c.tick(ctx)
	step(t, c, apps)
	if c.Number() != numC {
		t.Fatalf("C's number on the new primary is %d, was %d", c.Number(), numC)
	}
	rs = checkBudget("after C came back")
	if r, ok := rs[c.id]; !ok || r.slots != 0 {
		t.Fatalf("C's row on the new primary: %v, %v; want 0 slots", r, ok)
	}

	// D never comes back. Its row (of the old server) gets a pid that a
	// live backend on the new primary has: it is taken away without
	// terminating that backend, once A has been on the new server for ttl.
	victim := su()
	if _, err := newConn.Exec(ctx, "UPDATE lockpool_failover_test.cluster_slots SET pids = ARRAY[$1::int] WHERE cluster = 'failover' AND instance = $2", int32(victim.PgConn().PID()), d.id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(ttl + 10*time.Second)
	for {
		step(t, a, apps)
		step(t, b, apps)
		if _, ok := rows()[d.id]; !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("D's row of the old server is still there %s after the failover", ttl+10*time.Second)
		}
		time.Sleep(200 * time.Millisecond) // a heartbeat's pace while polling for the reclaim
	}
	if err := victim.Ping(ctx); err != nil {
		t.Fatalf("the backend with one of D's old pids was terminated: %v", err)
	}
	checkBudget("after D's row was taken away")
}
