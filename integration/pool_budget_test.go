package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// 200 concurrent clients on a budget of 4 commit all
// of 20,000 short transactions, and never use more than 4 server backends.
func TestPool200ClientsBudget4(t *testing.T) {
	t.Parallel()
	const (
		clients = 200
		perConn = 100
		budget  = 4
	)
	app := appYAML{name: "pooler", user: "pooler", db: "appdb", max: budget, pinned: 1, advisory: "pin", state: "pin", wait: "60s"}
	l := startLockpool(t, 10, "", app)
	tbl := uniqueName(t, "t")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (client int, seq int, PRIMARY KEY (client, seq)); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}

	// Connect all clients first, so they are really concurrent.
	conns := make([]*pgx.Conn, clients)
	var wg sync.WaitGroup
	var connErr atomic.Value
	sem := make(chan struct{}, 20)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := pgx.Connect(ctx, l.dsn("pooler", "appdb"))
			if err != nil {
				connErr.Store(err)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close(context.Background())
			}
		}
	})
	if err, _ := connErr.Load().(error); err != nil {
		t.Fatalf("connect: %v", err)
	}

	var maxSeen atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	samplerConn := superConn(t, "postgres")
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			n, err := countBackends(ctx, samplerConn, "usename = 'pooler'")
			if err == nil && int64(n) > maxSeen.Load() {
				maxSeen.Store(int64(n))
			}
		}
	}()

	var failed atomic.Int64
	var firstErr atomic.Value
	start := make(chan struct{})
	t0 := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := 0; j < perConn; j++ {
				// One round trip per transaction: half the clients
				// send BEGIN; INSERT; COMMIT as one simple query, the
				// others as one pipelined extended-protocol batch.
				var err error
				if i%2 == 0 {
					_, err = c.Exec(ctx, fmt.Sprintf("BEGIN; INSERT INTO %s (client, seq) VALUES (%d, %d); COMMIT", tbl, i, j), pgx.QueryExecModeSimpleProtocol)
				} else {
					b := &pgx.Batch{}
					b.Queue("BEGIN")
					b.Queue("INSERT INTO "+tbl+" (client, seq) VALUES ($1, $2)", i, j)
					b.Queue("COMMIT")
					err = c.SendBatch(ctx, b).Close()
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("client %d tx %d: %w", i, j, err))
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(stop)
	<-sampled
	t.Logf("%d transactions by %d clients in %v; max %d backends", clients*perConn, clients, time.Since(t0).Round(time.Millisecond), maxSeen.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d transactions failed; first: %v", n, firstErr.Load())
	}
	var n int
	if err := super.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil || n != clients*perConn {
		t.Fatalf("committed rows: %d (%v), want %d", n, err, clients*perConn)
	}
	if m := maxSeen.Load(); m > budget {
		t.Errorf("pg_stat_activity showed %d backends for a budget of %d", m, budget)
	}
}

// With the budget held past wait_timeout a waiting
// client gets 53300 with a lockpool: message, stays connected, and succeeds
// on retry on the same connection.
func TestWaitTimeout53300(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "tight", 1, 0, "300ms"
	app.user = "jobs"
	l := startLockpool(t, 10, "", app)
	ctx := context.Background()
	holder := l.connect(t, "jobs", "appdb")
	waiter := l.connect(t, "jobs", "appdb")

	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"simple", "extended"} {
		t0 := time.Now()
		var err error
		if mode == "simple" {
			_, err = waiter.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol)
		} else {
			_, err = waiter.Exec(ctx, "SELECT $1::int", 1)
		}
		el := time.Since(t0)
		pe := pgErr(t, err, "53300")
		if !strings.HasPrefix(pe.Message, "lockpool:") {
			t.Errorf("%s: 53300 message %q does not start with lockpool:", mode, pe.Message)
		}
		if pe.Hint == "" {
			t.Errorf("%s: 53300 without a hint", mode)
		}
		if el < 250*time.Millisecond || el > 3*time.Second {
			t.Errorf("%s: 53300 after %v, wait_timeout is 300ms", mode, el)
		}
		if waiter.IsClosed() {
			t.Fatalf("%s: the waiting client was disconnected", mode)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := waiter.QueryRow(ctx, "SELECT $1::int + 1", 41).Scan(&v); err != nil || v != 42 {
		t.Fatalf("retry on the same connection: %d, %v", v, err)
	}
	if _, err := waiter.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("simple retry: %v", err)
	}
	// The holder is fine too.
	if _, err := holder.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}
