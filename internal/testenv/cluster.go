package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// SuperConn connects to database db of the shared cluster as the superuser,
// directly (not through lockpool); the connection closes when t ends.
func SuperConn(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	c := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.SuperuserDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// ensureMu serialises EnsureRole and EnsureDatabase: two tests making the
// same role at once would otherwise race between the check and CREATE.
var ensureMu sync.Mutex

// EnsureRole creates a LOGIN role name with [Password] (SCRAM) on cluster c
// unless it exists.
func EnsureRole(t testing.TB, c *pgtest.Cluster, name string) {
	t.Helper()
	ensureMu.Lock()
	defer ensureMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sql := fmt.Sprintf(`SET password_encryption = 'scram-sha-256';
DO $$BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN
    CREATE ROLE %s LOGIN PASSWORD '%s';
  END IF;
END$$`, strings.ReplaceAll(name, "'", "''"), pgx.Identifier{name}.Sanitize(), Password)
	if err := c.Exec(ctx, "postgres", sql); err != nil {
		t.Fatal(err)
	}
}

// EnsureDatabase creates database name owned by owner on cluster c unless
// it exists.
func EnsureDatabase(t testing.TB, c *pgtest.Cluster, name, owner string) {
	t.Helper()
	ensureMu.Lock()
	defer ensureMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.SuperuserDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		if err := c.CreateDatabase(ctx, name, owner); err != nil {
			t.Fatal(err)
		}
	}
}

// CountBackends counts the client backends in pg_stat_activity that match
// where (an SQL condition), the asking connection not included.
func CountBackends(ctx context.Context, su *pgx.Conn, where string) (int, error) {
	var n int
	err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND ("+where+")").Scan(&n)
	return n, err
}

// CountServerConns counts lockpool's server connections for role, its own
// (lease, auth_query) connections, named lockpool..., not included.
func CountServerConns(ctx context.Context, su *pgx.Conn, role string) (int, error) {
	return CountBackends(ctx, su, fmt.Sprintf("usename = '%s' AND application_name NOT LIKE 'lockpool%%'", strings.ReplaceAll(role, "'", "''")))
}

// BackendPID is the server backend c's next statement runs on.
func BackendPID(t testing.TB, c *pgx.Conn) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var pid uint32
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("pg_backend_pid: %v", err)
	}
	return pid
}

// ClusterPIDs is the postmaster's pid of cluster c followed by every
// process whose parent it is (the backends and auxiliary processes).
func ClusterPIDs(t testing.TB, c *pgtest.Cluster) []int {
	t.Helper()
	pm, err := c.PostmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{pm}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pm {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ClockTicks is USER_HZ, the unit of [ProcCPUTicks] (100 on Linux).
const ClockTicks = 100

// ProcCPUTicks is the user plus system CPU time of process pid, in
// [ClockTicks].
func ProcCPUTicks(pid int) (int64, error) {
	u, sys, err := ProcCPUTimes(pid)
	return u + sys, err
}

// ProcCPUTimes is pid's user and system CPU time so far, in clock ticks
// (utime and stime of /proc/pid/stat).
func ProcCPUTimes(pid int) (user, sys int64, err error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, 0, err
	}
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, 0, errors.New("short /proc stat")
	}
	user, _ = strconv.ParseInt(f[11], 10, 64)
	sys, _ = strconv.ParseInt(f[12], 10, 64)
	return user, sys, nil
}

// ProcContextSwitches is the number of context switches (voluntary and
// not) of all of pid's current threads, from /proc/pid/task/*/status.
func ProcContextSwitches(pid int) (int64, error) {
	dirs, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "status"))
	if err != nil || len(dirs) == 0 {
		return 0, fmt.Errorf("no threads of %d: %v", pid, err)
	}
	var n int64
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += x
			}
		}
	}
	return n, nil
}

// procStat is /proc/pid/stat from the state field on (field 3, index 0):
// the command name before it may hold spaces, so it is cut at the last ')'.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return nil, errors.New("short /proc stat")
	}
	return f, nil
}

// ProcRSSKB is VmRSS of process pid in kB, or -1 if it cannot be read.
func ProcRSSKB(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return -1
}

// Code is the SQLSTATE of err if it is (or wraps) a PostgreSQL error, else
// "".
func Code(err error) string {
	if pe := PgError(err); pe != nil {
		return pe.Code
	}
	return ""
}

// PgError is err as a *pgconn.PgError, or nil if it is not one.
func PgError(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// RequireCode fails t unless err is a PostgreSQL error with SQLSTATE want,
// and returns it.
func RequireCode(t testing.TB, err error, want string) *pgconn.PgError {
	t.Helper()
	pe := PgError(err)
	if pe == nil {
		t.Fatalf("want SQLSTATE %s, got non-PostgreSQL error %v", want, err)
	}
	if pe.Code != want {
		t.Fatalf("want SQLSTATE %s, got %s: %s", want, pe.Code, pe.Message)
	}
	return pe
}
