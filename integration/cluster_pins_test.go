package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// 20 sessions pinned by advisory locks (advisory_locks: pin) across three
// instances never hold more than the cluster's max_pinned (2) at once —
// neither in the pools' pin counts nor in pg_locks — and clients that take
// no lock keep committing meanwhile.
func TestClusterPinsShareMaxPinned(t *testing.T) {
	t.Parallel()
	const role = "clpin"
	const sessions = 20
	const keyBase = 71400000 // this test's advisory lock keys: keyBase .. keyBase+19
	ls := startClusterInstances(t, 3, role, "pin", "")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()

	// Pin count sampler: the pools' pin slots and the server's advisory locks.
	su := superConn(t, "postgres")
	var mu sync.Mutex
	var samples, maxPinned, maxLocked int
	var over []string
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		for ctx.Err() == nil {
			pinned := 0
			for _, l := range ls {
				pinned += l.srv.Pool().Stats(clusterApp).Pinned
			}
			var locked int
			err := su.QueryRow(context.Background(), `SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND a.usename = $1`, role).Scan(&locked)
			mu.Lock()
			samples++
			maxPinned, maxLocked = max(maxPinned, pinned), max(maxLocked, locked)
			if err == nil && (pinned > clusterPins || locked > clusterPins) {
				over = append(over, fmt.Sprintf("%s: %d pin slots, %d sessions holding advisory locks", time.Now().Format("15:04:05.000"), pinned, locked))
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	cycles := make([]int, sessions)
	for i := 0; i < sessions; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, ls[i%3].dsn(role, "appdb"))
			if err != nil {
				t.Errorf("session %d: connect: %v", i, err)
				return
			}
			defer conn.Close(context.Background())
			key := keyBase + i
			for ctx.Err() == nil {
				for _, q := range []string{"SELECT pg_advisory_lock($1)", "SELECT pg_sleep(0.03)", "SELECT pg_advisory_unlock($1)"} {
					args := []any{key}
					if q == "SELECT pg_sleep(0.03)" {
						args = nil
					}
					if _, err := conn.Exec(ctx, q, args...); err != nil {
						if ctx.Err() == nil {
							t.Errorf("session %d: %s: %v", i, q, err)
						}
						return
					}
				}
				cycles[i]++
			}
		}()
	}
	var commits []func() int
	for _, l := range ls {
		commits = append(commits, loadClients(ctx, t, l.dsn(role, "appdb"), 1, false))
	}
	wg.Wait()
	<-samplerDone
	for i, c := range commits {
		n := c()
		t.Logf("instance %d: %d transactions without locks committed", i, n)
		if n < 10 {
			t.Errorf("instance %d committed %d transactions without locks while the pinned sessions ran, want at least 10", i, n)
		}
	}
	total := 0
	for _, n := range cycles {
		total += n
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d lock cycles of %d sessions; %d samples: at most %d pin slots and %d sessions holding locks (max_pinned %d)", total, sessions, samples, maxPinned, maxLocked, clusterPins)
	if len(over) > 0 {
		t.Fatalf("%d samples above the cluster's max_pinned: %v", len(over), over)
	}
	if total == 0 || maxPinned == 0 {
		t.Fatalf("no session ever pinned (cycles %d, max pinned %d)", total, maxPinned)
	}
}
