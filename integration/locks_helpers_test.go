package integration

// Helpers of the advisory-lock tests (locks_*_test.go): pg_locks keys and
// rows, one-value queries, /debug/locks. Their names start with "lk".

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/testenv"
)

// lkKey is an advisory lock key as pg_locks shows it.
type lkKey struct {
	classid, objid uint32
	objsubid       int // 1: one bigint key, 2: two int4 keys
}

// lkKey1 is the key of pg_advisory_lock(k bigint).
func lkKey1(k int64) lkKey { return lkKey{uint32(uint64(k) >> 32), uint32(uint64(k)), 1} }

// lkKey2 is the key of pg_advisory_lock(a int4, b int4).
func lkKey2(a, b int32) lkKey { return lkKey{uint32(a), uint32(b), 2} }

func (k lkKey) String() string { return fmt.Sprintf("%d:%d:%d", k.classid, k.objid, k.objsubid) }

// lkLockRow is one row of pg_locks for an advisory lock.
type lkLockRow struct {
	pid     uint32
	key     lkKey
	mode    string
	granted bool
}

// lkLocks lists the advisory locks on key (all pids), granted and waiting.
func lkLocks(ctx context.Context, su *pgx.Conn, k lkKey) ([]lkLockRow, error) {
	rows, err := su.Query(ctx, `SELECT pid, mode, granted FROM pg_locks
		WHERE locktype = 'advisory' AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = $3 ORDER BY pid`,
		int64(k.classid), int64(k.objid), k.objsubid)
	if err != nil {
		return nil, err
	}
	var out []lkLockRow
	for rows.Next() {
		var r lkLockRow
		var pid int32
		if err := rows.Scan(&pid, &r.mode, &r.granted); err != nil {
			return nil, err
		}
		r.pid, r.key = uint32(pid), k
		out = append(out, r)
	}
	return out, rows.Err()
}

// lkHolders returns the pids that hold key (granted), failing the test on
// error. Only call from the test goroutine.
func lkHolders(t testing.TB, su *pgx.Conn, k lkKey) []uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := lkLocks(ctx, su, k)
	if err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	var pids []uint32
	for _, r := range rows {
		if r.granted {
			pids = append(pids, r.pid)
		}
	}
	return pids
}

// lkWaiting returns how many backends wait for key.
func lkWaiting(t testing.TB, su *pgx.Conn, k lkKey) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := lkLocks(ctx, su, k)
	if err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	n := 0
	for _, r := range rows {
		if !r.granted {
			n++
		}
	}
	return n
}

// lkOwnAdvisory counts the advisory locks the backend serving c holds,
// asked inside c's current transaction (or statement).
const lkOwnAdvisorySQL = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"

// lkApp is an application with the given advisory policy and budgets.
func lkApp(name, user string, max, pinned int, advisory, wait string) appYAML {
	return appYAML{name: name, user: user, db: "appdb", max: max, pinned: pinned, advisory: advisory, state: "pin", wait: wait}
}

// lkBool runs a query returning one boolean.
func lkBool(ctx context.Context, c *pgx.Conn, sql string, args ...any) (bool, error) {
	var b bool
	err := c.QueryRow(ctx, sql, args...).Scan(&b)
	return b, err
}

// lkMustBool runs a query returning one boolean and fails the test on error.
func lkMustBool(t testing.TB, c *pgx.Conn, sql string, args ...any) bool {
	t.Helper()
	b, err := lkBool(testenv.Context(t, 15*time.Second), c, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return b
}

// lkMustExec runs a statement and fails the test on error.
func lkMustExec(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(testenv.Context(t, 15*time.Second), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// lkDebugLocks is the /debug/locks answer.
type lkDebugLocks struct {
	Holders []struct {
		Application string    `json:"application"`
		Client      string    `json:"client"`
		BackendPID  uint32    `json:"backend_pid"`
		PinnedSince time.Time `json:"pinned_since"`
		Reason      string    `json:"reason"`
		Locks       []struct {
			Key     string `json:"key"`
			Mode    string `json:"mode"`
			Granted bool   `json:"granted"`
		} `json:"locks"`
	} `json:"holders"`
	Waiters []struct {
		BackendPID  int      `json:"backend_pid"`
		Application string   `json:"application"`
		Client      string   `json:"client"`
		Key         string   `json:"key"`
		Waiting     float64  `json:"waiting_seconds"`
		BlockedBy   []int    `json:"blocked_by"`
		BlockerApps []string `json:"blocked_by_applications"`
	} `json:"waiters"`
}

// lkGetDebugLocks fetches and decodes /debug/locks.
func lkGetDebugLocks(t testing.TB, l *lp) lkDebugLocks {
	t.Helper()
	code, body := l.get("/debug/locks")
	if code != 200 {
		t.Fatalf("/debug/locks: HTTP %d: %s", code, body)
	}
	var d lkDebugLocks
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("/debug/locks: %v\n%s", err, body)
	}
	return d
}
