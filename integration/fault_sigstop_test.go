package integration

// PostgreSQL frozen with SIGSTOP for 5 s (the
// postmaster and all its children: stopping only the postmaster leaves the
// backends running). Clients waiting for a connection get 53300 after
// wait_timeout; a statement already running on a frozen backend gets its
// result after SIGCONT (nothing can answer it sooner); so no operation
// outlives max(start + wait_timeout, SIGCONT) + 1 s. Goroutines stay
// bounded while PostgreSQL is frozen and return to idle afterwards.
//
// Not parallel: it freezes the package's shared cluster.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

func TestFaultSIGSTOPPostgres(t *testing.T) {
	c := pgtest.Require(t)
	const role = "fltstop"
	testenv.EnsureRole(t, c, role)
	const clients, wait, freeze = 12, 2 * time.Second, 5 * time.Second
	l, _ := startYAML(t, testenv.UserYAML(c, "", 10, "  connect_timeout: 1s", role, appPassword,
		fmt.Sprintf("    database: appdb\n    max_connections: 4\n    max_pinned: 1\n    wait_timeout: %s", wait)))
	ctx := context.Background()
	baseline := l.servingGoroutines(t)

	type op struct {
		client     int
		start, end time.Time
		err        error
	}
	var (
		mu   sync.Mutex
		ops  []op
		wg   sync.WaitGroup
		stop = make(chan struct{})
	)
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		conns[i] = l.connect(t, role, "appdb")
	}
	// allWorked reports whether every client has had a statement that
	// started after since succeed.
	allWorked := func(since time.Time) bool {
		mu.Lock()
		defer mu.Unlock()
		worked := map[int]bool{}
		for _, o := range ops {
			if o.err == nil && o.start.After(since) {
				worked[o.client] = true
			}
		}
		return len(worked) == clients
	}
	loadStart := time.Now()
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int, conn *pgx.Conn) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := op{client: i, start: time.Now()}
				qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, o.err = conn.Exec(qctx, "SELECT pg_sleep(0.05)")
				cancel()
				o.end = time.Now()
				mu.Lock()
				ops = append(ops, o)
				mu.Unlock()
				if o.err != nil {
					time.Sleep(10 * time.Millisecond) // the client's pause after an error
				}
			}
		}(i, conns[i])
	}
	// The load runs: every client's statements get through lockpool.
	eventually(t, 10*time.Second, "every client to run a statement before the freeze", func() bool { return allWorked(loadStart) })

	// Freeze: the postmaster first (no new children), then its children,
	// then once more for any child forked in between.
	stopped := map[int]bool{}
	cont := func() {
		for pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer cont()
	for round := 0; round < 2; round++ {
		for _, pid := range testenv.ClusterPIDs(t, c) {
			if !stopped[pid] {
				if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					t.Logf("SIGSTOP %d: %v", pid, err)
					continue
				}
				stopped[pid] = true
			}
		}
	}
	tStop := time.Now()
	maxG := 0
	for time.Since(tStop) < freeze { // the freeze's length is what the test is about
		if n := runtime.NumGoroutine(); n > maxG {
			maxG = n
		}
		time.Sleep(50 * time.Millisecond)
	}
	cont()
	tCont := time.Now()
	t.Logf("froze %d processes for %v", len(stopped), tCont.Sub(tStop).Round(time.Millisecond))
	// The load recovers: every client has a statement through that started
	// over 1 s after SIGCONT (from then on no error is allowed, below).
	eventually(t, 10*time.Second, "every client to run a statement started 1 s after SIGCONT", func() bool { return allWorked(tCont.Add(time.Second)) })
	close(stop)
	wg.Wait()

	var ok, timeouts, other, frozenOK int
	for _, o := range ops {
		limit := o.start.Add(wait + time.Second)
		if l2 := tCont.Add(time.Second); l2.After(limit) {
			limit = l2
		}
		if o.end.After(limit) {
			t.Errorf("operation started %v into the freeze took %v (ended %v after SIGCONT): %v",
				o.start.Sub(tStop).Round(time.Millisecond), o.end.Sub(o.start).Round(time.Millisecond),
				o.end.Sub(tCont).Round(time.Millisecond), o.err)
		}
		switch {
		case o.err == nil:
			ok++
			if o.start.After(tStop) && o.start.Before(tCont) {
				frozenOK++
			}
		case sqlState(o.err) == "53300":
			timeouts++
			if d := o.end.Sub(o.start); d < wait-100*time.Millisecond || d > wait+time.Second {
				t.Errorf("53300 after %v, want about wait_timeout %v", d.Round(time.Millisecond), wait)
			}
		default:
			other++
			if o.start.After(tCont.Add(time.Second)) || o.end.Before(tStop) {
				t.Errorf("error outside the freeze: %v", o.err)
			} else {
				t.Logf("error during the freeze: %v", o.err)
			}
		}
	}
	t.Logf("%d operations: %d ok (%d of them started during the freeze), %d got 53300, %d other errors; goroutines: %d idle, max %d frozen",
		len(ops), ok, frozenOK, timeouts, other, baseline, maxG)
	if timeouts == 0 {
		t.Errorf("no client got 53300 while PostgreSQL was frozen")
	}
	if maxG > baseline+10*clients {
		t.Errorf("goroutines grew to %d while PostgreSQL was frozen (%d at idle, %d clients)", maxG, baseline, clients)
	}
	// Every client works again.
	for i, conn := range conns {
		if conn.IsClosed() {
			conn = l.connect(t, role, "appdb")
		}
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("client %d after SIGCONT: %v", i, err)
		}
		_ = conn.Close(ctx)
	}
	if n := testenv.SettleGoroutines(baseline+5, 15*time.Second); n > baseline+5 {
		t.Errorf("goroutines: %d after the freeze, %d at idle before it\n%s", n, baseline, testenv.DumpGoroutines(t))
	}
}
