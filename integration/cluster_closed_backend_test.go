package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A backend counts against the cluster budget until PostgreSQL has ended
// it, also after lockpool let its connection go: an instance keeps a slot
// in its row for every backend it recorded that is still in
// pg_stat_activity. The test records a direct backend of the role in one
// instance's row, as lockpool records its own (a connection it closed whose
// backend has not read the Terminate yet looks the same), and puts the
// whole budget's demand on the other instance: while that backend lives the
// other instance's row stays one short of the budget and the role's
// backends never exceed it; once the backend is gone the slot moves.
func TestClusterSlotOutlivesClosedBackend(t *testing.T) {
	t.Parallel()
	const role = "clclosed"
	ls := startClusterInstances(t, 2, role, "pin", "")
	idle, busy := ls[0], ls[1]
	ctx := context.Background()
	su := superConn(t, "appdb")
	idleID, busyID := clusterSelf(t, idle), clusterSelf(t, busy)
	eventually(t, 10*time.Second, "both instances to have rows", func() bool {
		_, ok1 := clusterSlots(ctx, su, role, idleID)
		_, ok2 := clusterSlots(ctx, su, role, busyID)
		return ok1 && ok2
	})

	lingering, err := pgx.Connect(ctx, pgtestDSN(t, role))
	if err != nil {
		t.Fatal(err)
	}
	defer lingering.Close(ctx)
	pid := lingering.PgConn().PID()
	if _, err := su.Exec(ctx, fmt.Sprintf("UPDATE %s.cluster_slots SET pids = array_append(pids, $2::int) WHERE instance = $1", role), idleID, int32(pid)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the idle instance to keep a slot for the recorded backend", func() bool {
		n, _ := clusterSlots(ctx, su, role, idleID)
		return n >= 1
	})

	sampler := sampleBackends(t, role, clusterBudget)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	wait := loadClients(loadCtx, t, busy.dsn(role, "appdb"), clusterBudget+2, false)
	eventually(t, 15*time.Second, "the busy instance to take every other slot", func() bool {
		n, _ := clusterSlots(ctx, su, role, busyID)
		return n == clusterBudget-1
	})
	// Ten heartbeats of each instance later (each heartbeat_at is a round
	// of its coordinator) the recorded backend still holds its slot.
	beats := map[string]int{}
	last := map[string]time.Time{}
	deadline := time.Now().Add(15 * time.Second)
	for beats[idleID] < 10 || beats[busyID] < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 15s waiting for ten heartbeats of each instance (%v)", beats)
		}
		n, _ := clusterSlots(ctx, su, role, idleID)
		m, _ := clusterSlots(ctx, su, role, busyID)
		if n < 1 || m > clusterBudget-1 {
			t.Fatalf("with the recorded backend %d alive, the idle instance holds %d slots and the busy one %d (budget %d)", pid, n, m, clusterBudget)
		}
		for _, id := range []string{idleID, busyID} {
			var at time.Time
			if err := su.QueryRow(ctx, fmt.Sprintf("SELECT heartbeat_at FROM %s.cluster_instances WHERE instance = $1", role), id).Scan(&at); err != nil {
				t.Fatal(err)
			}
			if !at.Equal(last[id]) {
				if !last[id].IsZero() {
					beats[id]++
				}
				last[id] = at
			}
		}
		time.Sleep(20 * time.Millisecond) // polling the cluster tables
	}

	if err := lingering.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the slot to move once the backend is gone", func() bool {
		n, _ := clusterSlots(ctx, su, role, idleID)
		m, _ := clusterSlots(ctx, su, role, busyID)
		return n == 0 && m == clusterBudget
	})
	stopLoad()
	if n := wait(); n == 0 {
		t.Error("the busy instance committed nothing")
	}
	sampler.check(t, clusterBudget)
}
