package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgbench -i -s 5, then pgbench -c 50 -j 2 in TPC-B
// and -S modes, each -M simple and -M extended, through lockpool with an
// application budget of 10: zero failed transactions and never more than 10
// server backends from lockpool. (-T 5 instead of 15 to keep the package run
// short.)
func TestPgbenchBudget10(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/pgbench"); err != nil {
		skipOrFail(t, "pgbench not installed")
	}
	const budget = 10
	app := appYAML{name: "bench", user: "bench", db: "benchdb", max: budget, pinned: 1, advisory: "pin", state: "pin", wait: "60s"}
	l := startLockpool(t, 20, "", app)

	diag := superConn(t, "postgres")
	pgbench := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		base := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(l.port), "-U", "bench"}
		cmd := exec.CommandContext(ctx, "/usr/bin/pgbench", append(append(base, args...), "benchdb")...)
		cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("pgbench %v: %v\n%s", args, err, out)
			t.Errorf("pg_stat_activity of role bench:\n%s", activity(diag, "usename = 'bench'"))
			t.FailNow()
		}
		return string(out)
	}

	// Sample the server during the whole test: all backends of role bench
	// come from lockpool (pgbench only connects through it).
	super := superConn(t, "postgres")
	var (
		mu       sync.Mutex
		maxSeen  int
		samples  int
		sampleEr error
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			n, err := countBackends(context.Background(), super, "usename = 'bench'")
			mu.Lock()
			if err != nil && sampleEr == nil {
				sampleEr = err
			}
			samples++
			if n > maxSeen {
				maxSeen = n
			}
			mu.Unlock()
		}
	}()
	stopSampler := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}
	t.Cleanup(stopSampler)

	out := pgbench("-i", "-s", "5", "-q")
	t.Logf("pgbench -i -s 5:\n%s", out)
	var rows int
	if err := superConn(t, "benchdb").QueryRow(context.Background(), "SELECT count(*) FROM pgbench_accounts").Scan(&rows); err != nil || rows != 500000 {
		t.Fatalf("pgbench_accounts after -i -s 5: %d rows, %v", rows, err)
	}

	failedRe := regexp.MustCompile(`number of failed transactions: (\d+)`)
	processedRe := regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	for _, mode := range []struct{ name, flags string }{
		{"tpcb-simple", "-M simple"},
		{"tpcb-extended", "-M extended"},
		{"select-only-simple", "-S -M simple"},
		{"select-only-extended", "-S -M extended"},
	} {
		args := []string{"-c", "50", "-j", "2", "-T", "5", "-n"}
		args = append(args, splitFlags(mode.flags)...)
		out := pgbench(args...)
		m := failedRe.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no 'number of failed transactions' in pgbench output:\n%s", mode.name, out)
		}
		if m[1] != "0" {
			t.Errorf("%s: %s failed transactions:\n%s", mode.name, m[1], out)
		}
		p := processedRe.FindStringSubmatch(out)
		if p == nil || p[1] == "0" {
			t.Errorf("%s: no transactions processed:\n%s", mode.name, out)
		} else {
			t.Logf("%s: %s transactions, 0 failed", mode.name, p[1])
		}
	}
	stopSampler()
	mu.Lock()
	defer mu.Unlock()
	if sampleEr != nil {
		t.Fatalf("sampling pg_stat_activity: %v", sampleEr)
	}
	t.Logf("pg_stat_activity: max %d backends of role bench over %d samples", maxSeen, samples)
	if samples < 50 {
		t.Errorf("only %d samples of pg_stat_activity", samples)
	}
	if maxSeen > budget {
		t.Errorf("pg_stat_activity showed %d backends from lockpool, budget is %d", maxSeen, budget)
	}
	if maxSeen == 0 {
		t.Errorf("sampler never saw a lockpool backend: the sampler is broken")
	}
}

func splitFlags(s string) []string {
	var out []string
	for _, f := range regexp.MustCompile(`\s+`).Split(s, -1) {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// activity describes the matching backends, for failure messages.
func activity(super interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, where string) string {
	rows, err := super.Query(context.Background(), "SELECT pid, coalesce(state, ''), coalesce(wait_event_type, '') || ':' || coalesce(wait_event, ''), now() - state_change, left(query, 80) FROM pg_stat_activity WHERE backend_type = 'client backend' AND ("+where+") ORDER BY pid")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var pid int
		var state, wait, query string
		var since time.Duration
		if err := rows.Scan(&pid, &state, &wait, &since, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  pid %d %-20s %-20s for %-12v %q\n", pid, state, wait, since.Round(time.Millisecond), query)
	}
	return b.String()
}
