package integration

// What TestListenDifferential and TestListenRandomized share: their roles
// and databases, the lockpool they run against, the clock both Go and the
// node-postgres scripts stamp their events with, and how a node script's
// JSON output is read.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// The LISTEN tests' roles and databases, their own so that the randomized
// test's kills (pg_terminate_backend of the backends of its database) never
// reach another test's sessions.
const (
	listenDiffRole = "lsndiff"
	listenDiffDB   = "lsndiff"
	listenRandRole = "lsnrand"
	listenRandDB   = "lsnrand"
)

// listenListenerAppName is the application_name of lockpool's shared
// listener connection (one per database) under listen: shared.
const listenListenerAppName = "lockpool listener"

// ensureListenRoleDB makes role and database db (owned by role) unless they
// exist, and returns the shared cluster.
func ensureListenRoleDB(t *testing.T, role, db string) *pgtest.Cluster {
	t.Helper()
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, role)
	testenv.EnsureDatabase(t, c, db, role)
	return c
}

// listenMode is the applications[].listen value the LISTEN tests give
// lockpool: LOCKPOOL_LISTEN_MODE (shared, pin or reject), shared by
// default. `pin` shows what the tests find in the behaviour that pins a
// server connection per listening client.
func listenMode(t testing.TB) string {
	t.Helper()
	switch m := os.Getenv("LOCKPOOL_LISTEN_MODE"); m {
	case "":
		return "shared"
	case "shared", "pin", "reject":
		return m
	default:
		t.Fatalf("LOCKPOOL_LISTEN_MODE=%q: want shared, pin or reject", m)
		return ""
	}
}

// startListenLockpool runs lockpool with one application for role on db
// under listenMode, with a budget generous enough that nothing waits: 45
// server connections of 60, 40 of them pinnable (so that listen: pin, which
// pins every listening client, can run the same tests).
func startListenLockpool(t *testing.T, role, db string) *lp {
	t.Helper()
	app := appYAML{name: "lsn", user: role, db: db, max: 45, pinned: 40, advisory: "pin", state: "pin",
		wait: "10s", extra: "    listen: " + listenMode(t) + "\n"}
	return startLockpool(t, 60, "", app)
}

// monoNow is CLOCK_MONOTONIC in nanoseconds: the clock node's
// process.hrtime.bigint() reads too, so that the times the Go clients and
// the node-postgres clients log can be compared.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// listenDuration reads a duration from the environment variable name, or
// returns def.
func listenDuration(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// readJSONLines decodes each line of r as JSON into a new T and hands it to
// each, until r ends; a line that is not JSON is passed to bad.
func readJSONLines[T any](r io.Reader, each func(T), bad func(string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			bad(line)
			continue
		}
		each(v)
	}
	return sc.Err()
}

// shorten is s, or its start and its length when it is long.
func shorten(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:max/2], len(s))
}

// listenCtx is a context for a whole LISTEN test run.
func listenCtx(t *testing.T, d time.Duration) context.Context {
	return testenv.Context(t, d)
}
