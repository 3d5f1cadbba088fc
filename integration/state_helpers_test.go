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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockpool/lockpool/internal/testenv"
)

// Helpers of the session-state tests (state_*_test.go): the refusal under
// session_state: reject, the pinned gauge, and a pgxpool workload.

// stWantReject checks that err is lockpool's 0A000 refusal with a hint.
func stWantReject(t testing.TB, what string, err error) {
	t.Helper()
	pe := testenv.PgError(err)
	switch {
	case err == nil:
		t.Errorf("%s: want SQLSTATE 0A000 under session_state: reject, got success", what)
	case pe == nil:
		t.Errorf("%s: want SQLSTATE 0A000, got non-PostgreSQL error %v", what, err)
	case pe.Code != "0A000":
		t.Errorf("%s: want SQLSTATE 0A000, got %s: %s", what, pe.Code, pe.Message)
	case pe.Hint == "":
		t.Errorf("%s: 0A000 without a hint: %s", what, pe.Message)
	case !strings.HasPrefix(pe.Message, "lockpool:"):
		t.Errorf("%s: message does not start with \"lockpool:\": %s", what, pe.Message)
	default:
		t.Logf("%s: %s (hint: %s)", what, pe.Message, pe.Hint)
	}
}

// wantPinned waits until the pinned gauge of app (for reason, or all
// reasons) is want.
func (l *lp) wantPinned(t testing.TB, app, reason string, want float64) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("lockpool_pinned_sessions{app=%q,reason=%q} = %v", app, reason, want), func() bool {
		return l.Pinned(app, reason) == want
	})
}

// pgxWorkload is a pgx program as applications write it: a pgxpool in its default exec
// mode (statement cache: named prepared statements reused per connection),
// `goroutines` goroutines sharing `total` queries over `distinct` statements,
// checking each result.
type pgxWorkload struct {
	goroutines, total, distinct, maxConns int
}

type pgxWorkloadResult struct {
	queries  int64
	errors   int64
	firstErr error
	elapsed  time.Duration
	stalled  bool // no query finished for 30 s: the run was stopped
}

func (w pgxWorkload) run(ctx context.Context, url string) (pgxWorkloadResult, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return pgxWorkloadResult{}, err
	}
	cfg.MaxConns = int32(w.maxConns)
	cfg.MinConns = 0
	// Default exec mode on purpose: pgx.QueryExecModeCacheStatement.
	if m := cfg.ConnConfig.DefaultQueryExecMode; m != pgx.QueryExecModeCacheStatement {
		return pgxWorkloadResult{}, fmt.Errorf("pgx default exec mode is %v, want cache_statement", m)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return pgxWorkloadResult{}, err
	}
	defer pool.Close()
	stmts := make([]string, w.distinct)
	for i := range stmts {
		stmts[i] = fmt.Sprintf("SELECT $1::int + %d", i)
	}
	var next, done, nerr atomic.Int64
	var once sync.Once
	var first error
	start := time.Now()
	// A stall (no query finishing for 30 s) stops the run instead of
	// waiting for the caller's deadline.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stalled atomic.Bool
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		last, lastChange := done.Load(), time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-watchDone:
				return
			case <-tick.C:
			}
			if d := done.Load(); d != last {
				last, lastChange = d, time.Now()
			} else if time.Since(lastChange) > 30*time.Second {
				stalled.Store(true)
				cancel()
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := 0; g < w.goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(w.total) || ctx.Err() != nil {
					return
				}
				k := int(i) % w.distinct
				x := int(i % 1000003)
				var got int
				err := pool.QueryRow(ctx, stmts[k], x).Scan(&got)
				if err == nil && got != x+k {
					err = fmt.Errorf("%s with $1=%d returned %d, want %d", stmts[k], x, got, x+k)
				}
				done.Add(1)
				if err != nil {
					nerr.Add(1)
					once.Do(func() { first = fmt.Errorf("goroutine %d, query %d: %w", g, i, err) })
				}
			}
		}(g)
	}
	wg.Wait()
	res := pgxWorkloadResult{queries: done.Load(), errors: nerr.Load(), elapsed: time.Since(start), stalled: stalled.Load()}
	once.Do(func() {})
	res.firstErr = first
	return res, nil
}
