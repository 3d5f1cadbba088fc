package integration

// A PostgreSQL restart (pg_ctl stop -m fast, then start) closes every
// server connection of lockpool's: lockpool logs that once, at INFO, with
// how many connections were lost and why (57P01, admin shutdown), not once
// per connection and not never.
//
// Not parallel: it restarts the package's shared cluster.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

func TestFaultRestartLogsOneLine(t *testing.T) {
	c := pgtest.Require(t)
	const role, db = "fltrestartlog", "fltrestartlogdb"
	const clients = 6
	testenv.EnsureRole(t, c, role)
	testenv.EnsureDatabase(t, c, db, role)
	yaml := testenv.UserYAML(c, "log_format: json", clients+4, "  idle_timeout: 10m", role, appPassword,
		fmt.Sprintf("    max_connections: %d\n    max_pinned: 1\n    wait_timeout: 5s", clients))
	l, logs := startYAML(t, yaml)

	// Load: every client runs short transactions until stop; each open
	// server connection is in use or idle between them when PostgreSQL
	// goes down.
	stop := make(chan struct{})
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		okBefore  = make([]int, clients)
		okAfter   = make([]int, clients)
		restarted = false
	)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					_ = conn.Close(context.Background())
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if conn == nil || conn.IsClosed() {
					var err error
					if conn, err = pgx.Connect(ctx, l.dsn(role, db)); err != nil {
						conn = nil
						cancel()
						continue
					}
				}
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.005)")
					return err
				})
				cancel()
				if err == nil {
					mu.Lock()
					if restarted {
						okAfter[i]++
					} else {
						okBefore[i]++
					}
					mu.Unlock()
				}
			}
		}(i)
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// Every server connection open and logged in (the gauge counts dials
	// too; the backends count those PostgreSQL accepted).
	su := superConn(t, "postgres")
	eventually(t, 15*time.Second, "every client's server connection to be open", func() bool {
		mu.Lock()
		for _, n := range okBefore {
			if n < 3 {
				mu.Unlock()
				return false
			}
		}
		mu.Unlock()
		n, err := testenv.CountServerConns(context.Background(), su, role)
		return err == nil && n == clients && l.metric("lockpool_server_connections", map[string]string{"app": role}) == clients
	})
	_ = su.Close(context.Background())

	if err := c.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	mu.Lock()
	restarted = true
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !logs.WaitFor(ctx, `"msg":"server connections lost"`, nil) {
		mu.Lock()
		t.Logf("commits after the restart: %v", okAfter)
		mu.Unlock()
		t.Fatalf("no \"server connections lost\" line within 30 s of the restart:\n%s", logs)
	}
	// Every client commits again (the pool recovered), then the log must
	// still hold exactly one line for the restart.
	eventually(t, 15*time.Second, "every client to commit after the restart", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range okAfter {
			if n < 2 {
				return false
			}
		}
		return true
	})
	var lines []map[string]any
	for _, text := range strings.Split(logs.String(), "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(text), &line) == nil && line["msg"] == "server connections lost" {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d \"server connections lost\" lines, want 1: %v", len(lines), lines)
	}
	line := lines[0]
	t.Logf("%v", line)
	reasons, _ := line["reasons"].(string)
	if line["level"] != "INFO" || line["count"] != float64(clients) || !strings.Contains(reasons, "57P01") {
		t.Errorf("line = %v, want INFO, count %d, a 57P01 reason", line, clients)
	}
	for _, text := range strings.Split(logs.String(), "\n") {
		if strings.Contains(text, `"level":"INFO"`) && strings.Contains(text, `"msg":"server connection lost"`) {
			t.Errorf("a per-connection INFO line: %s", text)
		}
	}
}
