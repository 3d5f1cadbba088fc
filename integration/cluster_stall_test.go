package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// An instance that still runs but cannot heartbeat (its row in
// cluster_instances is locked, so its heartbeat and its re-registration
// block) is taken for dead after cluster.ttl: the others terminate the
// backends in its row and take its slots. The application's backends never
// exceed the budget meanwhile, the others keep committing, and once the
// instance can heartbeat again it gets a share back and serves.
func TestClusterStalledInstanceReclaimedSafely(t *testing.T) {
	t.Parallel()
	const role = "clstall"
	ls := startClusterInstances(t, 3, role, "pin", "")
	stalled := ls[2]
	sampler := sampleBackends(t, role, clusterBudget)
	ctx := context.Background()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var waits []func() int
	for i, l := range ls {
		waits = append(waits, loadClients(loadCtx, t, l.dsn(role, "appdb"), 3, i == 2))
	}
	su := superConn(t, "appdb")
	slotsOf := func(inst string) (int, bool) { return clusterSlots(ctx, su, role, inst) }
	self := clusterSelf(t, stalled)
	eventually(t, 10*time.Second, "the stalled instance to hold slots", func() bool {
		n, ok := slotsOf(self)
		return ok && n >= 1
	})

	// Stall its heartbeat: a transaction of ours holds its instance row.
	lock := superConn(t, "appdb")
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT 1 FROM %s.cluster_instances WHERE instance = $1 FOR UPDATE", role), self); err != nil {
		t.Fatal(err)
	}
	stalledAt := time.Now()
	// About ttl (2 s). The property is that it happens, safely (the
	// sampler checks the budget meanwhile); the bound leaves room for a
	// loaded machine, and the time it took is logged.
	eventually(t, clusterTTL+15*time.Second, "the others to reclaim the stalled instance's slots", func() bool {
		_, ok := slotsOf(self)
		return !ok
	})
	t.Logf("the stalled instance's slots were reclaimed %v after its heartbeat stopped", time.Since(stalledAt).Round(time.Millisecond))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// It heartbeats again: a client of its own gets it a share back (its
	// load clients gave up when their backends were terminated).
	eventually(t, 15*time.Second, "the instance to serve a new client again", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		c, err := pgx.Connect(cctx, stalled.dsn(role, "appdb"))
		if err != nil {
			t.Logf("connecting through the instance: %v", err)
			return false
		}
		defer c.Close(ctx)
		var one int
		if err := c.QueryRow(cctx, "SELECT 1").Scan(&one); err != nil {
			t.Logf("SELECT 1 through the instance: %v (pool %+v)", err, stalled.srv.Pool().Stats(clusterApp))
			return false
		}
		return one == 1
	})
	stopLoad()
	for i, w := range waits {
		if n := w(); n == 0 {
			t.Errorf("instance %d committed nothing", i)
		}
	}
	sampler.check(t, clusterBudget)
}
