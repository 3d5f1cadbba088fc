package integration

// The names this package's tests use for internal/testenv: an in-process
// lockpool (lp) with lower-case methods, and one-line wrappers. Everything
// here delegates; the code lives in testenv.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/testenv"
	"github.com/lockpool/lockpool/proxy"
	"github.com/lockpool/lockpool/proxy/console"
)

// appPassword is the password of every test role ([testenv.Password]).
const appPassword = testenv.Password

// lp is lockpool running in the test process ([testenv.Lockpool]); srv,
// addr, port and admin are its Server, Addr, Port and Admin.
type lp struct {
	*testenv.Lockpool
	srv   *proxy.Server
	addr  string
	port  int
	admin *httptest.Server
}

func wrapLockpool(l *testenv.Lockpool) *lp {
	return &lp{Lockpool: l, srv: l.Server, addr: l.Addr, port: l.Port, admin: l.Admin}
}

// appYAML is one application for startLockpool ([testenv.App]).
type appYAML struct {
	name, user, db  string
	max, pinned     int
	advisory, state string
	wait            string
	mode            string
	extra           string
}

func (a appYAML) app() testenv.App {
	return testenv.App{Name: a.name, User: a.user, DB: a.db, Max: a.max, Pinned: a.pinned,
		Advisory: a.advisory, State: a.state, Wait: a.wait, Mode: a.mode, Extra: a.extra}
}

// defaultApp is [testenv.DefaultApp].
func defaultApp() appYAML {
	a := testenv.DefaultApp()
	return appYAML{name: a.Name, user: a.User, db: a.DB, max: a.Max, pinned: a.Pinned,
		advisory: a.Advisory, state: a.State, wait: a.Wait, mode: a.Mode, extra: a.Extra}
}

// startLockpool runs lockpool in-process against the shared cluster
// ([testenv.Start]).
func startLockpool(t *testing.T, serverMax int, extra string, apps ...appYAML) *lp {
	t.Helper()
	as := make([]testenv.App, len(apps))
	for i, a := range apps {
		as[i] = a.app()
	}
	return wrapLockpool(testenv.Start(t, serverMax, extra, as...))
}

// startLockpoolConfig is [testenv.StartConfig].
func startLockpoolConfig(t *testing.T, cfg *config.Config) *lp {
	t.Helper()
	return wrapLockpool(testenv.StartConfig(t, cfg))
}

// startYAML is [testenv.StartYAML].
func startYAML(t *testing.T, yaml string) (*lp, *testenv.LogBuffer) {
	t.Helper()
	l, log := testenv.StartYAML(t, yaml)
	return wrapLockpool(l), log
}

func (l *lp) dsn(user, db string) string { return l.DSN(user, db) }

func (l *lp) url(user, db string) string { return l.URL(user, db) }

func (l *lp) connect(t testing.TB, user, db string) *pgx.Conn {
	t.Helper()
	return l.Connect(t, user, db)
}

func (l *lp) connectCfg(t testing.TB, user, db string, edit func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	return l.ConnectConfig(t, user, db, edit)
}

func (l *lp) psqlCmd(ctx context.Context, user, db string, args ...string) *exec.Cmd {
	return l.PsqlCmd(ctx, user, db, args...)
}

func (l *lp) metric(name string, labels map[string]string) float64 { return l.Metric(name, labels) }

func (l *lp) get(path string) (int, string) { return l.Get(path) }

// superConn is [testenv.SuperConn].
func superConn(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	return testenv.SuperConn(t, db)
}

// sqlState is [testenv.Code].
func sqlState(err error) string { return testenv.Code(err) }

// pgErr is [testenv.RequireCode].
func pgErr(t testing.TB, err error, want string) *pgconn.PgError {
	t.Helper()
	return testenv.RequireCode(t, err, want)
}

// eventually is [testenv.Eventually].
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, d, what, cond)
}

// countBackends is [testenv.CountBackends].
func countBackends(ctx context.Context, su *pgx.Conn, where string) (int, error) {
	return testenv.CountBackends(ctx, su, where)
}

// freePort is [testenv.FreePort].
func freePort(t testing.TB) int {
	t.Helper()
	return testenv.FreePort(t)
}

// uniqueName is [testenv.UniqueName].
func uniqueName(t testing.TB, prefix string) string { return testenv.UniqueName(t, prefix) }

// mustConnect connects to dsn with pgx for the test's lifetime.
func mustConnect(ctx context.Context, t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// skipOrFail is [testenv.SkipOrFail].
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	testenv.SkipOrFail(t, why)
}

// rollbackFailedBegin ends the failed transaction block a BEGIN leaves when
// lockpool could not reach PostgreSQL for it (ReadyForQuery 'E': every
// statement gets 25P02 until ROLLBACK, so none runs in autocommit by
// mistake). pgx's Begin returns the error without ending the block.
func rollbackFailedBegin(ctx context.Context, conn *pgx.Conn) {
	if conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'E' {
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
}

// clientWaiting waits until lockpool's /debug/clients shows the client
// whose backend key is pid waiting in lockpool (for a connection, a lock or
// a lease).
func clientWaiting(t testing.TB, l *lp, pid uint32) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("client %d waiting in lockpool", pid), func() bool {
		code, body := l.get("/debug/clients")
		if code != 200 {
			t.Fatalf("GET /debug/clients = %d %s", code, body)
		}
		var rows []console.ClientRow
		if err := json.Unmarshal([]byte(body), &rows); err != nil {
			t.Fatalf("GET /debug/clients: %v\n%s", err, body)
		}
		for _, r := range rows {
			if r.ID == pid {
				return r.State == "waiting"
			}
		}
		return false
	})
}

// servingGoroutines waits until l answers a client (an SSLRequest): by
// then Serve has started the event loops and background loops that
// startLockpool and startYAML do not wait for. It returns the process's
// goroutine count then, the idle level a test compares with later (it may
// include the probe's own session, about to end).
func (l *lp) servingGoroutines(t testing.TB) int {
	t.Helper()
	eventually(t, 10*time.Second, "lockpool to answer an SSLRequest", func() bool {
		nc, err := net.DialTimeout("tcp", l.addr, time.Second)
		if err != nil {
			return false
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(time.Second))
		req := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), 80877103)
		if _, err := nc.Write(req); err != nil {
			return false
		}
		var b [1]byte
		_, err = io.ReadFull(nc, b[:])
		return err == nil && (b[0] == 'N' || b[0] == 'S')
	})
	return runtime.NumGoroutine()
}
