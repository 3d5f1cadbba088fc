package integration

// Each limit, exceeded, yields its documented error
// (an ErrorResponse with SQLSTATE and a lockpool: message, or a clean close
// before startup completes) and leaves the other clients unaffected.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

const limitsApp = "    database: appdb\n    max_connections: 4\n    max_pinned: 1\n    wait_timeout: 5s"

func limitsStart(t *testing.T, role, top, appExtra string) *lp {
	t.Helper()
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, role)
	l, _ := startYAML(t, testenv.UserYAML(c, top, 10, "", role, appPassword, limitsApp+appExtra))
	return l
}

// stillWorks runs a query on each conn.
func stillWorks(t *testing.T, conns ...*pgx.Conn) {
	t.Helper()
	for i, c := range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var n int
		err := c.QueryRow(ctx, "SELECT 41 + 1").Scan(&n)
		cancel()
		if err != nil || n != 42 {
			t.Errorf("other client %d affected: %v", i, err)
		}
	}
}

func wantRefused(t *testing.T, err error, code, contains string) {
	t.Helper()
	pe := pgErr(t, err, code)
	if !strings.HasPrefix(pe.Message, "lockpool:") || !strings.Contains(pe.Message, contains) {
		t.Errorf("message %q: want lockpool: ... %s", pe.Message, contains)
	}
	if pe.Hint == "" {
		t.Errorf("no hint with %s %q", code, pe.Message)
	}
}

func TestLimitMaxClientConnections(t *testing.T) {
	t.Parallel()
	l := limitsStart(t, "lmmaxconn", "max_client_connections: 3", "")
	conns := []*pgx.Conn{l.connect(t, "lmmaxconn", "appdb"), l.connect(t, "lmmaxconn", "appdb"), l.connect(t, "lmmaxconn", "appdb")}
	ctx := context.Background()
	_, err := pgx.Connect(ctx, l.dsn("lmmaxconn", "appdb"))
	wantRefused(t, err, "53300", "max_client_connections")
	stillWorks(t, conns...)
	// A place freed is usable again.
	_ = conns[0].Close(ctx)
	eventually(t, 5*time.Second, "a freed client place", func() bool {
		c, err := pgx.Connect(ctx, l.dsn("lmmaxconn", "appdb"))
		if err != nil {
			return false
		}
		c.Close(ctx)
		return true
	})
	stillWorks(t, conns[1:]...)
}

func TestLimitMaxClientsPerApplication(t *testing.T) {
	t.Parallel()
	l := limitsStart(t, "lmmaxcli", "", "\n    max_clients: 2")
	conns := []*pgx.Conn{l.connect(t, "lmmaxcli", "appdb"), l.connect(t, "lmmaxcli", "appdb")}
	_, err := pgx.Connect(context.Background(), l.dsn("lmmaxcli", "appdb"))
	wantRefused(t, err, "53300", "max_clients")
	stillWorks(t, conns...)
}

func TestLimitIdleTransactionTimeout(t *testing.T) {
	t.Parallel()
	l := limitsStart(t, "lmidletx", "idle_transaction_timeout: 500ms", "")
	ctx := context.Background()
	idleOutside := l.connect(t, "lmidletx", "appdb")
	busy := l.connect(t, "lmidletx", "appdb")
	victim := l.connect(t, "lmidletx", "appdb")
	tbl := uniqueName(t, "lm")
	if _, err := busy.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %s (id int PRIMARY KEY)", tbl, tbl)); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (1)", tbl)); err != nil {
		t.Fatal(err)
	}
	idleSince := time.Now()
	// Another client working in short transactions the whole time is fine,
	// until lockpool has ended the victim's session (three clients, then
	// two).
	deadline := time.Now().Add(10 * time.Second)
	for l.metric("lockpool_client_connections", map[string]string{"app": "lmidletx"}) == 3 {
		if time.Now().After(deadline) {
			t.Fatal("timed out after 10s waiting for lockpool to end the session idle in a transaction")
		}
		if _, err := busy.Exec(ctx, fmt.Sprintf("BEGIN; INSERT INTO %s VALUES (2) ON CONFLICT DO NOTHING; COMMIT", tbl)); err != nil {
			t.Fatalf("busy client: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the busy client's pace
	}
	if el := time.Since(idleSince); el < 500*time.Millisecond {
		t.Fatalf("the session idle in a transaction was ended after %v, before idle_transaction_timeout (500ms)", el)
	}
	_, err := victim.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("a client idle in a transaction past idle_transaction_timeout could still run a statement")
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.Code != "25P03" || !strings.HasPrefix(pe.Message, "lockpool:") {
			t.Errorf("got %s %q, want 25P03 lockpool:", pe.Code, pe.Message)
		}
	} else if !victim.IsClosed() {
		t.Errorf("want 25P03 and a closed connection, got %v", err)
	}
	// Its transaction was rolled back: the row lock is gone.
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := busy.Exec(qctx, fmt.Sprintf("INSERT INTO %s VALUES (1)", tbl)); err != nil {
		t.Errorf("the timed-out transaction left its row behind or locked: %v", err)
	}
	stillWorks(t, idleOutside, busy)
}

func TestLimitClientLoginTimeout(t *testing.T) {
	t.Parallel()
	// The timeout leaves room for a real login (SCRAM under -race on a
	// loaded machine takes a good part of a second) to finish in time.
	l := limitsStart(t, "lmlogin", "client_login_timeout: 2s", "")
	other := l.connect(t, "lmlogin", "appdb")
	// A length word alone; half a startup packet. (A connection that sends
	// nothing is not accepted at all: the listening socket defers accepts
	// until data comes, see evloop's TestListenDefersAccept.)
	for _, send := range [][]byte{{0, 0, 0, 40}, {0, 0, 0, 40, 0, 3, 0, 0}} {
		nc, err := net.DialTimeout("tcp", l.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(send) > 0 {
			_, _ = nc.Write(send)
		}
		t0 := time.Now()
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(io.Discard, nc)
		d := time.Since(t0)
		nc.Close()
		if err != nil || d < time.Second || d > 6*time.Second {
			t.Errorf("silent client (sent %d bytes) not closed at client_login_timeout: after %v, %v", len(send), d.Round(time.Millisecond), err)
		}
	}
	stillWorks(t, other)
}

func TestLimitMaxMessageSize(t *testing.T) {
	t.Parallel()
	l := limitsStart(t, "lmmsg", "max_message_size: 64kB", "")
	other := l.connect(t, "lmmsg", "appdb")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A message just under the limit works.
	big := "SELECT length('" + strings.Repeat("x", 60<<10) + "')"
	var n int
	if err := other.QueryRow(ctx, big).Scan(&n); err != nil || n != 60<<10 {
		t.Fatalf("a 60kB query: %v", err)
	}
	// Over the limit, from a raw logged-in connection: only the header and
	// a little of the body are sent, and lockpool answers at the header.
	pc, err := pgconn.Connect(ctx, l.dsn("lmmsg", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	hj, err := pc.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	nc := hj.Conn
	defer nc.Close()
	msg := []byte{'Q', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(65<<10+4))
	msg = append(msg, "SELECT '"...)
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(nc)
	if err != nil {
		t.Errorf("after the error the connection should close: %v", err)
	}
	if len(b) < 5 || b[0] != 'E' {
		t.Fatalf("want an ErrorResponse, got %q", b)
	}
	body := string(b[5:])
	if !strings.Contains(body, "SFATAL") || !strings.Contains(body, "C08P01") || !strings.Contains(body, "Mlockpool:") || !strings.Contains(body, "max_message_size") {
		t.Errorf("want FATAL 08P01 lockpool: ... max_message_size, got %q", body)
	}
	stillWorks(t, other)
}

func TestLimitAdminToken(t *testing.T) {
	t.Parallel()
	const token = "adm-tok-5f1c0e"
	l := limitsStart(t, "lmadmin", "admin_token: "+token, "")
	get := func(path, auth string) int {
		req, _ := http.NewRequest("GET", l.admin.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range []string{"/debug/locks", "/debug/pprof/"} {
		if code := get(p, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", p, code)
		}
		if code := get(p, "Bearer wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", p, code)
		}
		if code := get(p, "Bearer "+token); code != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200", p, code)
		}
	}
	for _, p := range []string{"/metrics", "/up"} {
		if code := get(p, ""); code != http.StatusOK {
			t.Errorf("%s needs no token: got %d", p, code)
		}
	}
	stillWorks(t, l.connect(t, "lmadmin", "appdb"))
}
