package main

import (
	"context"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// lockDB is the database of the benchmark's second application, whose
// advisory_locks policy is hold (lockpoolConfig); the bench application
// keeps pin for the mixed run.
const lockDB = "benchlocks"

// LockResult is the advisory lock throughput test under advisory_locks:
// hold.
type LockResult struct {
	Sessions    int     `json:"sessions"`
	Budget      int     `json:"budget"`
	Seconds     float64 `json:"seconds"`
	Pairs       int64   `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_second"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	FalseUnlock int64   `json:"unlocks_false"`
	MaxPinned   float64 `json:"lockpool_pinned_sessions_max"`
	Fallbacks   float64 `json:"lockpool_advisory_lock_fallbacks"`
	CPUPer1000  float64 `json:"lockpool_cpu_seconds_per_1000_pairs"`
}

// locksTest runs pg_advisory_lock + pg_advisory_unlock pairs, each session
// on its own key, from many pgx sessions (extended protocol, statement
// cache) through lockpool's hold application, and samples the pinned
// sessions gauge meanwhile: under hold a lock holder pins nothing.
func locksTest(o *options, e *env) *LockResult {
	t := e.lockpool
	n := o.lockSess
	r := &LockResult{Sessions: n, Budget: o.budget}
	logf("advisory lock throughput (hold): %d sessions for %ds", n, o.duration)
	ctx := context.Background()
	if err := e.Cluster.CreateDatabase(ctx, lockDB, benchUser); err != nil {
		r.FirstError = err.Error()
		return r
	}
	conns := make([]*pgx.Conn, n)
	for i := range conns {
		c, err := pgx.Connect(ctx, t.dsnDB(lockDB))
		if err != nil {
			r.FirstError = err.Error()
			return r
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			c.Close(ctx)
		}
	}()
	var pairs, errs, falses atomic.Int64
	var firstErr atomic.Value
	var maxPinned atomic.Uint64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tk.C:
				if p := pinnedGauge(t); p > float64(maxPinned.Load()) {
					maxPinned.Store(uint64(p))
				}
			}
		}
	}()
	d := time.Duration(o.duration) * time.Second
	before, _ := testenv.ProcCPUTicks(t.Proc.PID())
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func(key int64, c *pgx.Conn) {
			defer wg.Done()
			for time.Since(start) < d {
				if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(10 * time.Millisecond)
					continue
				}
				var ok bool
				if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				if !ok {
					falses.Add(1)
				}
				pairs.Add(1)
			}
		}(int64(733000+i), c)
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	after, _ := testenv.ProcCPUTicks(t.Proc.PID())
	close(stopSampling)
	<-sampled
	r.Pairs, r.Errors, r.FalseUnlock = pairs.Load(), errs.Load(), falses.Load()
	r.MaxPinned = float64(maxPinned.Load())
	r.Fallbacks = metricSum(t, reFallbacks)
	if v := firstErr.Load(); v != nil {
		r.FirstError = v.(string)
	}
	r.PairsPerSec = float64(r.Pairs) / r.Seconds
	if r.Pairs > 0 {
		r.CPUPer1000 = float64(after-before) / testenv.ClockTicks / float64(r.Pairs) * 1000
	}
	logf("advisory lock throughput (hold): %.0f pairs/s (%d pairs, %d errors, %d unlocks false, pinned at most %g, fallbacks %g)%s",
		r.PairsPerSec, r.Pairs, r.Errors, r.FalseUnlock, r.MaxPinned, r.Fallbacks, errSuffix(r.FirstError))
	return r
}

var reFallbacks = regexp.MustCompile(`(?m)^lockpool_advisory_lock_fallbacks_total\{[^}]*\} ([0-9.e+]+)$`)
