package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestUnnamedStatementNeverCrossesClients runs pgx's DescribeExec mode
// (Parse+Describe of the unnamed statement, Sync, then Bind+Execute, Sync)
// from two clients sharing one server connection. Between the two round
// trips the connection may serve the other client, whose unnamed statement
// must never run for this one: lockpool re-sends the client's own Parse.
func TestUnnamedStatementNeverCrossesClients(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned = "unnamed1", 1, 0
	l := startLockpool(t, 10, "", app)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := l.connect(t, "app", "appdb")
	b := l.connect(t, "app", "appdb")
	var wg sync.WaitGroup
	run := func(c *pgx.Conn, twoParams bool) {
		defer wg.Done()
		for i := 0; i < 300; i++ {
			if twoParams {
				var got int
				if err := c.QueryRow(ctx, "SELECT $1::int * 1000 + $2::int", pgx.QueryExecModeDescribeExec, i, 7).Scan(&got); err != nil || got != i*1000+7 {
					t.Errorf("two-parameter statement %d: got %d, %v", i, got, err)
					return
				}
			} else {
				var got string
				if err := c.QueryRow(ctx, "SELECT 'b:' || $1::text", pgx.QueryExecModeDescribeExec, itoa(i)).Scan(&got); err != nil || got != "b:"+itoa(i) {
					t.Errorf("one-parameter statement %d: got %q, %v", i, got, err)
					return
				}
			}
		}
	}
	wg.Add(2)
	go run(a, true)
	go run(b, false)
	wg.Wait()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for i > 0 {
		b = append([]byte{byte('0' + i%10)}, b...)
		i /= 10
	}
	return string(b)
}
