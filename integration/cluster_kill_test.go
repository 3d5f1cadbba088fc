package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// kill -9 of one of three instances under load: its slots return to the
// survivors within cluster.ttl + 2 s, and the application's backends never
// exceed the budget meanwhile.
func TestClusterKilledInstanceSlotsReturn(t *testing.T) {
	t.Parallel()
	const role = "clkill"
	c := pgtest.Require(t)
	name := uniqueName(t, "cl")
	var ps []*testenv.LockpoolProcess
	for i := 0; i < 3; i++ {
		ps = append(ps, testenv.StartLockpoolProcess(t, func(port int) string {
			return clusterYAML(c, role, name, "pin", fmt.Sprintf("listen: 127.0.0.1:%d\ninstance_id: %s-%d", port, role, i))
		}))
	}
	sampler := sampleBackends(t, role, clusterBudget)
	su := superConn(t, "appdb")
	ctx := context.Background()
	slots := func() (map[string]int, error) {
		rows, err := su.Query(ctx, fmt.Sprintf("SELECT instance, slots FROM %s.cluster_slots WHERE cluster = $1 AND app = $2", role), name, clusterApp)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var inst string
			var n int
			if err := rows.Scan(&inst, &n); err != nil {
				return nil, err
			}
			out[inst[:strings.LastIndexByte(inst, '/')]] = n
		}
		return out, rows.Err()
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var waits []func() int
	for i, p := range ps {
		waits = append(waits, loadClients(loadCtx, t, p.DSN(role, "appdb"), 4, i == 2))
	}
	eventually(t, 10*time.Second, "all three instances to hold slots", func() bool {
		s, err := slots()
		return err == nil && len(s) == 3 && s[role+"-0"] >= 1 && s[role+"-1"] >= 1 && s[role+"-2"] >= 1
	})
	before, _ := slots()
	killed := time.Now()
	ps[2].Kill()
	var returned time.Duration
	deadline := killed.Add(clusterTTL + 5*time.Second)
	var last map[string]int
	for time.Now().Before(deadline) {
		s, err := slots()
		if err != nil {
			t.Fatal(err)
		}
		last = s
		if _, dead := s[role+"-2"]; !dead && s[role+"-0"]+s[role+"-1"] == clusterBudget {
			returned = time.Since(killed)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("slots before the kill %v; the survivors held all %d after %v", before, clusterBudget, returned.Round(time.Millisecond))
	if returned == 0 || returned > clusterTTL+2*time.Second {
		t.Fatalf("the killed instance's slots did not return within ttl + 2 s = %v (after %v: %v)", clusterTTL+2*time.Second, time.Since(killed).Round(time.Millisecond), last)
	}
	stopLoad()
	for i, w := range waits {
		if n := w(); i < 2 && n == 0 {
			t.Errorf("instance %d committed nothing", i)
		}
	}
	sampler.check(t, clusterBudget)
}
