package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// Cluster budgets: helpers shared by the cluster tests. Each test has its
// own role (its backends are counted by usename) and keeps the cluster
// tables in a schema named after the role, in appdb.

const (
	clusterApp    = "cl"
	clusterBudget = 6
	clusterPins   = 2
	clusterTTL    = 2 * time.Second
)

// clusterYAML is the configuration of one instance of cluster name: the
// application cl of role on appdb with a cluster budget of 6 (max_pinned 2,
// min_share 0), ttl 2s, heartbeat 100ms; top is more top-level lines.
func clusterYAML(c *pgtest.Cluster, role, name, advisory, top string) string {
	return testenv.AppsYAML(c, 12, fmt.Sprintf(`%s
leases:
  schema: %s
cluster:
  name: %s
  database: appdb
  ttl: %s
  heartbeat: 100ms`, top, role, name, clusterTTL),
		testenv.App{Name: clusterApp, User: role, DB: "appdb", Max: clusterBudget, Pinned: clusterPins,
			Advisory: advisory, State: "pin", Wait: "30s", Extra: "    budget_scope: cluster\n    min_share: 0\n"})
}

// startClusterInstances runs n in-process instances of one cluster (top:
// more top-level lines).
func startClusterInstances(t *testing.T, n int, role, advisory, top string) []*lp {
	t.Helper()
	c := pgtest.Require(t)
	name := uniqueName(t, "cl")
	out := make([]*lp, n)
	for i := range out {
		out[i], _ = startYAML(t, clusterYAML(c, role, name, advisory, top))
	}
	return out
}

// clusterSelf waits until instance l shows its own row in /debug/cluster
// and returns its instance id.
func clusterSelf(t *testing.T, l *lp) string {
	t.Helper()
	var self string
	eventually(t, 10*time.Second, "the instance to show its own row", func() bool {
		_, body := l.get("/debug/cluster")
		var rows []struct {
			Instance string `json:"instance"`
			Self     bool   `json:"self"`
		}
		if json.Unmarshal([]byte(body), &rows) != nil {
			return false
		}
		for _, r := range rows {
			if r.Self {
				self = r.Instance
			}
		}
		return self != ""
	})
	return self
}

// clusterSlots reads instance inst's slots of the application in role's
// cluster tables (false: it has no row).
func clusterSlots(ctx context.Context, su *pgx.Conn, role, inst string) (int, bool) {
	var n int
	err := su.QueryRow(ctx, fmt.Sprintf("SELECT slots FROM %s.cluster_slots WHERE instance = $1", role), inst).Scan(&n)
	return n, err == nil
}

// backendSampler counts role's backends in pg_stat_activity every 20 ms
// (lockpool's own connections, application_name lockpool…, excluded) and
// records the largest count and every sample above the budget.
type backendSampler struct {
	mu       sync.Mutex
	max      int
	samples  int
	over     []string
	err      error
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func sampleBackends(t *testing.T, role string, budget int) *backendSampler {
	t.Helper()
	su := superConn(t, "postgres")
	suApp := superConn(t, "appdb") // the cluster tables, for the picture of a sample over the budget
	s := &backendSampler{stop: make(chan struct{}), done: make(chan struct{})}
	where := fmt.Sprintf("usename = '%s' AND application_name NOT LIKE 'lockpool%%'", role)
	go func() {
		defer close(s.done)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
			n, err := countBackends(context.Background(), su, where)
			s.mu.Lock()
			if err != nil && s.err == nil {
				s.err = err
			}
			s.samples++
			s.max = max(s.max, n)
			if n > budget {
				s.over = append(s.over, fmt.Sprintf("%s: %d backends %s", time.Now().Format("15:04:05.000"), n, backendsPicture(su, suApp, role, where)))
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.finish)
	return s
}

func (s *backendSampler) finish() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

// backendsPicture describes role's backends and the cluster's slot rows
// (which backend each instance recorded) for a sample over the budget, so
// a failure names the backend too many.
func backendsPicture(su, suApp *pgx.Conn, role, where string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var b strings.Builder
	rows, err := su.Query(ctx, "SELECT pid, application_name, backend_start::time::text, coalesce(state, '') FROM pg_stat_activity WHERE "+where+" ORDER BY backend_start")
	if err == nil {
		for rows.Next() {
			var pid int32
			var app, start, state string
			if rows.Scan(&pid, &app, &start, &state) == nil {
				fmt.Fprintf(&b, "[pid %d %q from %s %s]", pid, app, start, state)
			}
		}
		rows.Close()
	}
	rows, err = suApp.Query(ctx, fmt.Sprintf("SELECT instance, slots, pids::text FROM %s.cluster_slots ORDER BY instance", role))
	if err != nil {
		fmt.Fprintf(&b, " (slot rows: %v)", err)
	} else {
		for rows.Next() {
			var inst, pids string
			var slots int
			if rows.Scan(&inst, &slots, &pids) == nil {
				fmt.Fprintf(&b, " row %s: %d slots, pids %s;", inst, slots, pids)
			}
		}
		rows.Close()
	}
	return b.String()
}

// check stops the sampler and fails t if any sample exceeded the budget.
func (s *backendSampler) check(t *testing.T, budget int) {
	t.Helper()
	s.finish()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Fatalf("sampling pg_stat_activity: %v", s.err)
	}
	if s.samples < 10 {
		t.Fatalf("only %d samples of pg_stat_activity", s.samples)
	}
	if len(s.over) > 0 {
		t.Fatalf("%d of %d samples exceeded the cluster budget %d: %v", len(s.over), s.samples, budget, s.over)
	}
	t.Logf("%d samples of pg_stat_activity, at most %d backends (budget %d)", s.samples, s.max, budget)
}

// runPgbench runs pgbench through port as role for d with clients clients,
// each transaction one short sleep, and returns its output.
func runPgbench(ctx context.Context, t *testing.T, port int, role string, clients int, d time.Duration) (string, error) {
	script := filepath.Join(t.TempDir(), "sleep.sql")
	if err := os.WriteFile(script, []byte("SELECT pg_sleep(0.01);\n"), 0o600); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "/usr/bin/pgbench", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", role,
		"-n", "-f", script, "-c", strconv.Itoa(clients), "-j", "1", "-T", strconv.Itoa(int(d/time.Second)), "appdb")
	cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// loadClients keeps n clients running short transactions through dsn
// until ctx ends (an error fails t unless tolerate); the returned function
// waits for them and returns the number of committed transactions.
func loadClients(ctx context.Context, t *testing.T, dsn string, n int, tolerate bool) func() int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	commits := 0
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				if ctx.Err() == nil && !tolerate {
					t.Errorf("connect: %v", err)
				}
				return
			}
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.01)"); err != nil {
					if ctx.Err() == nil && !tolerate {
						t.Errorf("transaction: %v", err)
					}
					return
				}
				mu.Lock()
				commits++
				mu.Unlock()
			}
		}()
	}
	return func() int {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return commits
	}
}
