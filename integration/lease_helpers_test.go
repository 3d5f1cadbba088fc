package integration

// Helpers for the issue 4 lease acceptance tests (lease_*_test.go).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// leaseApplicationName is what lockpool's lease store sets as
// application_name on its own connections (lease/store.go).
const leaseApplicationName = "lockpool-lease"

var leaseRoleMu sync.Mutex

// leaseRole creates a LOGIN role (password appPassword) if it does not exist.
func leaseRole(t testing.TB, name string) {
	t.Helper()
	leaseRoleMu.Lock()
	defer leaseRoleMu.Unlock()
	su := superConn(t, "postgres")
	ctx := context.Background()
	var exists bool
	if err := su.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		return
	}
	if err := pgtest.Require(t).CreateRole(ctx, name, appPassword); err != nil {
		t.Fatal(err)
	}
}

// leaseExecSuper runs SQL as the superuser in appdb.
func leaseExecSuper(t testing.TB, sql string) {
	t.Helper()
	if err := pgtest.Require(t).Exec(context.Background(), "appdb", sql); err != nil {
		t.Fatal(err)
	}
}

// leaseTable creates a table in appdb (as superuser) that every role may use.
func leaseTable(t testing.TB, name, cols string) {
	t.Helper()
	leaseExecSuper(t, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (%[2]s); GRANT ALL ON %[1]s TO PUBLIC; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO PUBLIC", name, cols))
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

var (
	lockpoolBinOnce sync.Once
	lockpoolBinPath string
	lockpoolBinErr  error
)

// lockpoolBinary builds ./cmd/lockpool once per test binary.
func lockpoolBinary(t testing.TB) string {
	t.Helper()
	lockpoolBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lockpool-lease-bin-")
		if err != nil {
			lockpoolBinErr = err
			return
		}
		lockpoolBinPath = filepath.Join(dir, "lockpool")
		cmd := exec.Command("go", "build", "-o", lockpoolBinPath, "github.com/lockpool/lockpool/cmd/lockpool")
		if out, err := cmd.CombinedOutput(); err != nil {
			lockpoolBinErr = fmt.Errorf("go build ./cmd/lockpool: %v\n%s", err, out)
		}
	})
	if lockpoolBinErr != nil {
		t.Fatal(lockpoolBinErr)
	}
	return lockpoolBinPath
}

// lpProc is lockpool running as a separate process.
type lpProc struct {
	cmd    *exec.Cmd
	port   int
	stderr *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (p *lpProc) dsn(user, db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", p.port, user, appPassword, db)
}

// startLockpoolProcess runs the lockpool binary with one application (user
// app, database appdb) and the given instance id.
func startLockpoolProcess(t *testing.T, instanceID string) *lpProc {
	t.Helper()
	c := pgtest.Require(t)
	bin := lockpoolBinary(t)
	port := freePort(t)
	yaml := fmt.Sprintf(`listen: 127.0.0.1:%d
admin_listen: ""
auth_method: scram-sha-256
instance_id: %s
leak_check_interval: 0s
server:
  host: %s
  port: %d
  max_connections: 10
users:
  - name: app
    password: %s
applications:
  - name: api
    user: app
    database: appdb
    pool_mode: transaction
    max_connections: 4
    max_pinned: 1
    advisory_locks: pin
    session_state: pin
    wait_timeout: 5s
`, port, instanceID, c.Host, c.Port, appPassword)
	dir := t.TempDir()
	path := filepath.Join(dir, "lockpool.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &lpProc{port: port, stderr: &syncBuffer{}}
	p.cmd = exec.Command(bin, "-config", path, "-debug")
	p.cmd.Stdout = p.stderr
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("lockpool process log:\n%s", p.stderr.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, p.dsn("app", "appdb"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			break
		}
		select {
		case <-exited:
			t.Fatalf("lockpool process exited: %s", p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("lockpool process not accepting connections: %v\n%s", err, p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}
