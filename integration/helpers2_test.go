package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlState returns the SQLSTATE of a PostgreSQL error ("" if err is not one).
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// pgErr returns err as a *pgconn.PgError or fails the test.
func pgErr(t testing.TB, err error, want string) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("want SQLSTATE %s, got non-PostgreSQL error %v", want, err)
	}
	if pe.Code != want {
		t.Fatalf("want SQLSTATE %s, got %s: %s", want, pe.Code, pe.Message)
	}
	return pe
}

// countBackends counts client backends on the server matching where (an SQL
// condition over pg_stat_activity), excluding the asking connection.
func countBackends(ctx context.Context, super *pgx.Conn, where string) (int, error) {
	var n int
	err := super.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND ("+where+")").Scan(&n)
	return n, err
}

// psqlCmd builds a psql command through lockpool: -X, ON_ERROR_STOP, no
// password prompt.
func (l *lp) psqlCmd(ctx context.Context, user, db string, args ...string) *exec.Cmd {
	base := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", strconv.Itoa(l.port), "-U", user, "-d", db}
	cmd := exec.CommandContext(ctx, "/usr/bin/psql", append(base, args...)...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10", "PSQLRC=/dev/null")
	return cmd
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// connectCfg opens a pgx connection through lockpool with a config hook.
func (l *lp) connectCfg(t testing.TB, user, db string, edit func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(l.dsn(user, db))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through lockpool: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// uniqueName returns a table name unique to this test.
func uniqueName(t testing.TB, prefix string) string {
	r := strings.NewReplacer("/", "_", "-", "_", ".", "_")
	return strings.ToLower(prefix + "_" + r.Replace(t.Name()))
}

// sendCancel sends a raw CancelRequest to addr.
func sendCancel(t testing.TB, addr string, pid, secret uint32) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := binary.BigEndian.AppendUint32(nil, 16)
	b = binary.BigEndian.AppendUint32(b, 80877102)
	b = binary.BigEndian.AppendUint32(b, pid)
	b = binary.BigEndian.AppendUint32(b, secret)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	// The proxy closes the connection once it handled the request.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, c)
}

// skipOrFail skips a test whose client tool is missing on a developer's
// machine, and fails it under CI (where .ci/run installs the tools), so a
// missing tool never hides a test in CI.
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: .ci/run installs it)", why)
	}
	t.Skip(why)
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
