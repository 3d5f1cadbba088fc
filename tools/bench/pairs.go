package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// PairRun is what runPairs measured: pairs of statements (take and give
// back: a lease, a lock) run by many sessions in a loop.
type PairRun struct {
	Sessions    int     `json:"sessions"`
	Seconds     float64 `json:"seconds"`
	Pairs       int64   `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_second"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	CPUPer1000  float64 `json:"lockpool_cpu_seconds_per_1000_pairs"`
}

// openSessions opens n pgx sessions (default extended protocol with
// statement cache) to dsn; close them with closeSessions.
func openSessions(dsn string, n int) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, 0, n)
	for range n {
		c, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			closeSessions(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

func closeSessions(conns []*pgx.Conn) {
	for _, c := range conns {
		c.Close(context.Background())
	}
}

// runPairs runs pair on every session in a loop for d and fills r with
// the count, the errors and lockpool's CPU per 1,000 pairs (t's process).
// pair returns an error for a pair that failed (counted; the session waits
// 10 ms before its next try).
func runPairs(t *target, conns []*pgx.Conn, d time.Duration, r *PairRun, pair func(ctx context.Context, i int, c *pgx.Conn) error) {
	r.Sessions = len(conns)
	var pairs, errs atomic.Int64
	var firstErr atomic.Value
	before, _ := testenv.ProcCPUTicks(t.Proc.PID())
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for time.Since(start) < d {
				if err := pair(ctx, i, c); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(10 * time.Millisecond)
					continue
				}
				pairs.Add(1)
			}
		}()
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	after, _ := testenv.ProcCPUTicks(t.Proc.PID())
	r.Pairs, r.Errors = pairs.Load(), errs.Load()
	if v := firstErr.Load(); v != nil {
		r.FirstError = v.(string)
	}
	r.PairsPerSec = float64(r.Pairs) / r.Seconds
	if r.Pairs > 0 {
		r.CPUPer1000 = float64(after-before) / testenv.ClockTicks / float64(r.Pairs) * 1000
	}
}
