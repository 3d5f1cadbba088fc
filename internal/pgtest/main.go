package pgtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"
)

var (
	shared      *Cluster
	unavailable string // why no shared cluster exists
	short       bool   // go test -short: no cluster, tests needing one skip (also under $CI)
)

// RunMain is for TestMain: it starts one cluster for the package, calls
// setup (may be nil), runs m.Run, destroys the cluster and returns the exit
// code for os.Exit.
//
// If the PostgreSQL binaries are missing and $CI is non-empty it prints why
// and returns 1 without running tests. Locally it records the reason and
// runs the tests; those calling Require are skipped. With -short (the
// quick tier) it starts nothing and every test calling Require skips.
func RunMain(m *testing.M, setup func(*Cluster) error) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		short, unavailable = true, "-short: tests that need PostgreSQL do not run"
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := Start(ctx)
	cancel()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			fmt.Fprintf(os.Stderr, "FAIL: pgtest: starting PostgreSQL: %v\n", err)
			return 1
		}
		unavailable = err.Error()
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "FAIL: pgtest: %v (CI is set: this is a failure, not a skip)\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "pgtest: %v; tests needing PostgreSQL will be skipped\n", err)
		return m.Run()
	}
	if os.Getenv("PGTEST_VERBOSE") != "" {
		fmt.Fprintf(os.Stderr, "pgtest: cluster on port %d started in %v\n", c.Port, c.StartupTime.Round(time.Millisecond))
	}
	if setup != nil {
		if err := setup(c); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: pgtest: setup: %v\n--- server log ---\n%s\n", err, c.Log())
			_ = c.Destroy()
			return 1
		}
	}
	shared = c
	code := m.Run()
	shared = nil
	if err := c.Destroy(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: pgtest: destroy: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Shared returns the cluster RunMain started, or nil.
func Shared() *Cluster { return shared }

// Require returns Shared(). Without a cluster it skips the test, or fails
// it when $CI is non-empty or RunMain was never called.
func Require(t testing.TB) *Cluster {
	t.Helper()
	if shared != nil {
		return shared
	}
	if unavailable == "" {
		t.Fatal("pgtest: no shared cluster: call pgtest.RunMain from TestMain")
	}
	if os.Getenv("CI") != "" && !short {
		t.Fatalf("pgtest: %s (CI is set)", unavailable)
	}
	t.Skipf("pgtest: %s", unavailable)
	return nil
}
