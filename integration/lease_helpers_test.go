package integration

// Helpers of the lease tests (lease_*_test.go): the lease SQL functions,
// notices, and lockpool as a process with an instance id.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// leaseApplicationName is what lockpool's lease store sets as
// application_name on its own connections (lease/store.go).
const leaseApplicationName = "lockpool-lease"

// leaseTable creates a table in appdb (as superuser) that every role may use.
func leaseTable(t testing.TB, name, cols string) {
	t.Helper()
	if err := pgtest.Require(t).Exec(context.Background(), "appdb", fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (%[2]s); GRANT ALL ON %[1]s TO PUBLIC; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO PUBLIC", name, cols)); err != nil {
		t.Fatal(err)
	}
}

// noticeConn is a pgx connection through lockpool that records notices.
type noticeConn struct {
	*pgx.Conn
	mu      sync.Mutex
	notices []*pgconn.Notice
}

func (n *noticeConn) Notices() []*pgconn.Notice {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*pgconn.Notice(nil), n.notices...)
}

func (l *lp) connectNotices(t testing.TB, user, db string) *noticeConn {
	t.Helper()
	nc := &noticeConn{}
	nc.Conn = l.connectCfg(t, user, db, func(cfg *pgx.ConnConfig) {
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			nc.mu.Lock()
			nc.notices = append(nc.notices, n)
			nc.mu.Unlock()
		}
	})
	return nc
}

// leaseQuerier is what the lease helpers need from a connection.
type leaseQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// acquireLease calls lease_acquire(name, ttl, wait) with parameters (the
// extended protocol in pgx's default mode). ok is false when the result is
// NULL (held by another holder).
func acquireLease(ctx context.Context, c leaseQuerier, name string, ttl, wait float64) (int64, bool, error) {
	var tok *int64
	if err := c.QueryRow(ctx, "SELECT lease_acquire($1, $2, $3)", name, ttl, wait).Scan(&tok); err != nil {
		return 0, false, err
	}
	if tok == nil {
		return 0, false, nil
	}
	return *tok, true, nil
}

// startLeasePair starts two lockpools with instance ids prefix-a and
// prefix-b and returns them with a lease name unique to the run
// (prefix-<nanoseconds>).
func startLeasePair(t *testing.T, prefix string) (a, b *lp, name string) {
	t.Helper()
	a = startLockpool(t, 10, "instance_id: "+prefix+"-a")
	b = startLockpool(t, 10, "instance_id: "+prefix+"-b")
	return a, b, fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

// leaseGrant is what a lease_acquire returned, and when.
type leaseGrant struct {
	tok int64
	ok  bool
	err error
	at  time.Time
}

// leaseRow waits up to d until lease name's row in appdb's lockpool.leases
// satisfies cond (SQL on the row; $1 is the name, args are $2...). what
// says what was awaited.
func leaseRow(t testing.TB, su *pgx.Conn, name string, d time.Duration, what, cond string, args ...any) {
	t.Helper()
	eventually(t, d, what, func() bool {
		var ok bool
		err := su.QueryRow(context.Background(), "SELECT "+cond+" FROM lockpool.leases WHERE name = $1", append([]any{name}, args...)...).Scan(&ok)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("lease %q: %v", name, err)
		}
		return ok
	})
}

// waitLease calls lease_acquire(name, ttl, wait) on c in the background;
// the channel gets its result.
func waitLease(ctx context.Context, c leaseQuerier, name string, ttl, wait float64) <-chan leaseGrant {
	done := make(chan leaseGrant, 1)
	go func() {
		tok, ok, err := acquireLease(ctx, c, name, ttl, wait)
		done <- leaseGrant{tok, ok, err, time.Now()}
	}()
	return done
}

// leaseTakeover waits up to timeout (after what) for the waiter's result
// on done, which must be a token larger than old.
func leaseTakeover(t testing.TB, done <-chan leaseGrant, old int64, timeout time.Duration, what string) leaseGrant {
	t.Helper()
	select {
	case r := <-done:
		if r.err != nil || !r.ok {
			t.Fatalf("waiter: token %d ok %v err %v", r.tok, r.ok, r.err)
		}
		if r.tok <= old {
			t.Fatalf("takeover token %d <= old token %d", r.tok, old)
		}
		return r
	case <-time.After(timeout):
		t.Fatalf("waiter did not get the lease within %v of %s", timeout, what)
	}
	return leaseGrant{}
}

func mustAcquire(t testing.TB, c leaseQuerier, name string, ttl, wait float64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(wait+15)*time.Second)
	defer cancel()
	tok, ok, err := acquireLease(ctx, c, name, ttl, wait)
	if err != nil {
		t.Fatalf("lease_acquire(%q, %v, %v): %v", name, ttl, wait, err)
	}
	if !ok {
		t.Fatalf("lease_acquire(%q, %v, %v) = NULL, want a token", name, ttl, wait)
	}
	return tok
}

func leaseBool(t testing.TB, c leaseQuerier, fn, name string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var ok bool
	if err := c.QueryRow(ctx, "SELECT "+fn+"($1)", name).Scan(&ok); err != nil {
		t.Fatalf("%s(%q): %v", fn, name, err)
	}
	return ok
}

// leaseListRow is one row of lease_list().
type leaseListRow struct {
	Name, Holder       string
	Token              int64
	TakenAt, ExpiresAt time.Time
	Mine               bool
}

func listLeases(t testing.TB, c leaseQuerier) []leaseListRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	q, ok := c.(interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	})
	if !ok {
		t.Fatal("listLeases needs Query")
	}
	rows, err := q.Query(ctx, "SELECT * FROM lease_list()")
	if err != nil {
		t.Fatalf("lease_list(): %v", err)
	}
	var out []leaseListRow
	for rows.Next() {
		var r leaseListRow
		if err := rows.Scan(&r.Name, &r.Holder, &r.Token, &r.TakenAt, &r.ExpiresAt, &r.Mine); err != nil {
			t.Fatalf("lease_list() scan: %v", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("lease_list(): %v", err)
	}
	return out
}

func findLease(rows []leaseListRow, name string) (leaseListRow, bool) {
	for _, r := range rows {
		if r.Name == name {
			return r, true
		}
	}
	return leaseListRow{}, false
}

// startLockpoolProcess runs the lockpool binary (-debug) with the default
// application and instance id.
func startLockpoolProcess(t *testing.T, instanceID string) *testenv.LockpoolProcess {
	t.Helper()
	c := pgtest.Require(t)
	return testenv.StartLockpoolProcess(t, func(port int) string {
		return testenv.AppsYAML(c, 10, fmt.Sprintf("listen: 127.0.0.1:%d\ninstance_id: %s", port, instanceID))
	}, "-debug")
}
