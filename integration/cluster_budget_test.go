package integration

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// Three instances share one application's budget of 6 (min_share 0) under
// pgbench: the application's backends never exceed 6 at any 20 ms sample;
// with load on one instance only, that instance holds at least 5 within
// 2 s; with equal load on all three each holds 2 ± 1 in at least 90 % of
// the samples taken 2–6 s into the load.
func TestClusterBudgetFollowsLoad(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/pgbench"); err != nil {
		skipOrFail(t, "pgbench not installed")
	}
	const role = "clbudget"
	ls := startClusterInstances(t, 3, role, "pin", "")
	sampler := sampleBackends(t, role, clusterBudget)
	open := func(i int) int { return ls[i].srv.Pool().Stats(clusterApp).Open }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Load on the first instance only. The clock starts when the load
	// reaches the instance (a client holds or waits for a connection), not
	// when pgbench starts logging in its clients.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if out, err := runPgbench(ctx, t, ls[0].port, role, 8, 6*time.Second); err != nil {
			t.Errorf("pgbench through instance 0: %v\n%s", err, out)
		}
	}()
	var start time.Time
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if st := ls[0].srv.Pool().Stats(clusterApp); st.InUse+st.Waiting+st.Dialing > 0 {
			start = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pgbench's load did not reach instance 0 within 20 s")
		}
	}
	reached := time.Duration(0)
	for time.Since(start) < 4*time.Second {
		if open(0) >= 5 {
			reached = time.Since(start)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	if reached == 0 || reached > 2*time.Second {
		t.Fatalf("with load on instance 0 only it held %d connections; wanted ≥ 5 within 2 s (reached after %v)", open(0), reached)
	}
	t.Logf("instance 0 held ≥ 5 of 6 %v after its load started", reached.Round(time.Millisecond))

	// Equal load on all three (the clock starts when all three have it).
	for i := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := runPgbench(ctx, t, ls[i].port, role, 4, 9*time.Second); err != nil {
				t.Errorf("pgbench through instance %d: %v\n%s", i, err, out)
			}
		}()
	}
	eventually(t, 20*time.Second, "pgbench's load to reach all three instances", func() bool {
		start = time.Now()
		for _, l := range ls {
			if st := l.srv.Pool().Stats(clusterApp); st.InUse+st.Waiting == 0 {
				return false
			}
		}
		return true
	})
	var samples int
	inRange := make([]int, len(ls))
	for time.Since(start) < 6*time.Second {
		time.Sleep(50 * time.Millisecond)
		if time.Since(start) < 2*time.Second {
			continue
		}
		samples++
		if testing.Verbose() {
			t.Logf("%v: open %d %d %d", time.Since(start).Round(time.Millisecond), open(0), open(1), open(2))
		}
		for i := range ls {
			if n := open(i); n >= 1 && n <= 3 {
				inRange[i]++
			}
		}
	}
	wg.Wait()
	for i, n := range inRange {
		share := float64(n) / float64(samples)
		t.Logf("instance %d held 2 ± 1 in %d of %d samples (%.0f %%)", i, n, samples, 100*share)
		if share < 0.9 {
			t.Errorf("instance %d held 2 ± 1 connections in %.0f %% of the samples 2–6 s into equal load, want ≥ 90 %%", i, 100*share)
		}
	}
	sampler.check(t, clusterBudget)
}
