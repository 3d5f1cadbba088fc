package main

import (
	"context"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockDB is the database of the benchmark's second application, whose
// advisory_locks policy is hold (lockpoolConfig); the bench application
// keeps pin for the mixed run.
const lockDB = "benchlocks"

// LockResult is the advisory lock throughput test under advisory_locks:
// hold.
type LockResult struct {
	PairRun
	Budget      int     `json:"budget"`
	FalseUnlock int64   `json:"unlocks_false"`
	MaxPinned   float64 `json:"lockpool_pinned_sessions_max"`
	Fallbacks   float64 `json:"lockpool_advisory_lock_fallbacks"`
}

// locksTest runs pg_advisory_lock + pg_advisory_unlock pairs, each session
// on its own key, from many pgx sessions (extended protocol, statement
// cache) through lockpool's hold application, and samples the pinned
// sessions gauge meanwhile: under hold a lock holder pins nothing.
func locksTest(o *options, e *env) *LockResult {
	t := e.lockpool
	r := &LockResult{PairRun: PairRun{Sessions: o.lockSess}, Budget: o.budget}
	logf("advisory lock throughput (hold): %d sessions for %ds", o.lockSess, o.duration)
	if err := e.Cluster.CreateDatabase(context.Background(), lockDB, benchUser); err != nil {
		r.FirstError = err.Error()
		return r
	}
	conns, err := openSessions(t.dsnDB(lockDB), o.lockSess)
	if err != nil {
		r.FirstError = err.Error()
		return r
	}
	defer closeSessions(conns)
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
	var falses atomic.Int64
	runPairs(t, conns, time.Duration(o.duration)*time.Second, &r.PairRun, func(ctx context.Context, i int, c *pgx.Conn) error {
		key := int64(733000 + i)
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return err
		}
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			falses.Add(1)
		}
		return nil
	})
	close(stopSampling)
	<-sampled
	r.FalseUnlock = falses.Load()
	r.MaxPinned = float64(maxPinned.Load())
	r.Fallbacks = metricSum(t, reFallbacks)
	logf("advisory lock throughput (hold): %.0f pairs/s (%d pairs, %d errors, %d unlocks false, pinned at most %g, fallbacks %g)%s",
		r.PairsPerSec, r.Pairs, r.Errors, r.FalseUnlock, r.MaxPinned, r.Fallbacks, errSuffix(r.FirstError))
	return r
}

var reFallbacks = regexp.MustCompile(`(?m)^lockpool_advisory_lock_fallbacks_total\{[^}]*\} ([0-9.e+]+)$`)
