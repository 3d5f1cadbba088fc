package integration

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"math/rand"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// Wrong password, unknown user, unknown database,
// protocol 2.0 and 1 KB of random bytes each get PostgreSQL's answer (an
// error, or a close without a reply for bytes that are no startup packet)
// and leave no goroutine behind.
//
// Not parallel: goleak looks at every goroutine of the process.
func TestBadInputNoGoroutineLeak(t *testing.T) {
	anyDB := appYAML{name: "anydb", user: "other", max: 2, pinned: 1, advisory: "pin", state: "pin", wait: "5s"}
	l := startLockpool(t, 10, "", defaultApp(), anyDB)
	ctx := context.Background()

	// Warm up: one good login and transaction per application, so that
	// lazily started parts (pools, parameter caches) exist before the
	// snapshot.
	for _, u := range []struct{ user, db string }{{"app", "appdb"}, {"other", "postgres"}} {
		c, err := pgx.Connect(ctx, l.dsn(u.user, u.db))
		if err != nil {
			t.Fatalf("warm-up %s: %v", u.user, err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
	}
	// clientsGone waits until lockpool has ended every client's session.
	clientsGone := func(what string) {
		t.Helper()
		eventually(t, 5*time.Second, "lockpool to end the sessions of "+what, func() bool {
			return l.metric("lockpool_client_connections", nil) == 0
		})
	}
	clientsGone("the warm-up clients")
	base := goleak.IgnoreCurrent()
	noLeak := func(what string) {
		t.Helper()
		if err := goleak.Find(base); err != nil {
			t.Errorf("%s left goroutines behind: %v", what, err)
		}
	}

	dsnWith := func(user, pw, db string) string {
		return "host=127.0.0.1 port=" + strconv.Itoa(l.port) + " user=" + user + " password=" + pw + " dbname=" + db + " sslmode=disable connect_timeout=5"
	}
	for _, tc := range []struct {
		name, dsn, code string
	}{
		{"wrong password", dsnWith("app", "not-the-password", "appdb"), "28P01"},
		{"unknown user", dsnWith("nobody_here", appPassword, "appdb"), "28P01"},
		{"unknown database", dsnWith("other", appPassword, "no_such_db"), "3D000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Now()
			c, err := pgx.Connect(ctx, tc.dsn)
			if err == nil {
				_ = c.Close(ctx)
				t.Fatalf("login succeeded")
			}
			pe := pgErr(t, err, tc.code)
			if !strings.HasPrefix(pe.Message, "lockpool:") {
				t.Errorf("message %q does not start with lockpool:", pe.Message)
			}
			if pe.Hint == "" {
				t.Errorf("no hint")
			}
			if pe.Severity != "FATAL" {
				t.Errorf("severity %q, want FATAL", pe.Severity)
			}
			if tc.name == "unknown user" && strings.Contains(pe.Message, "nobody_here") && strings.Contains(pe.Message, "not") {
				t.Logf("note: message reveals the user is unknown: %q", pe.Message)
			}
			t.Logf("%s after %v: %s %s", tc.name, time.Since(t0).Round(time.Millisecond), pe.Code, pe.Message)
			noLeak(tc.name)
		})
	}

	t.Run("protocol 2.0", func(t *testing.T) {
		// A real 2.0 startup packet: length 296, version 2.0, fixed-size
		// fields database[64] user[32] options[64] unused[64] tty[64]. As
		// PostgreSQL 15, lockpool answers in the 2.0 error format (which such
		// a client reads) and closes.
		pkt := make([]byte, 296)
		binary.BigEndian.PutUint32(pkt, 296)
		binary.BigEndian.PutUint32(pkt[4:], 0x00020000)
		copy(pkt[8:], "appdb")
		copy(pkt[72:], "app")
		want := "EFATAL:  lockpool: unsupported frontend protocol 2.0: server supports 3.0 to 3.0\n\x00"
		for _, p := range [][]byte{pkt, {0, 0, 0, 8, 0, 2, 0, 0}} {
			nc, err := net.DialTimeout("tcp", l.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := nc.Write(p); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(nc)
			nc.Close()
			if err != nil {
				t.Errorf("protocol 2.0 startup (%d bytes): no close: %v", len(p), err)
			}
			if string(got) != want {
				t.Errorf("protocol 2.0 startup (%d bytes): got %q, want %q", len(p), got, want)
			}
		}
		noLeak("protocol 2.0")
	})

	t.Run("1 KB random bytes", func(t *testing.T) {
		rng := rand.New(rand.NewSource(2))
		for i := 0; i < 20; i++ {
			junk := make([]byte, 1024)
			rng.Read(junk)
			if i == 0 {
				// A plausible length word in front, so the body is read.
				binary.BigEndian.PutUint32(junk, 1024)
			}
			typ, fields, rest := rawExchange(t, l.addr, junk, true)
			if n := binary.BigEndian.Uint32(junk); n < 8 || n > 10004 {
				// Not a startup packet length: PostgreSQL closes without a
				// reply, and so does lockpool.
				if typ != 0 {
					t.Errorf("random bytes #%d (length word %d): got message %q, want no reply", i, n, typ)
				}
			} else if typ != 0 && typ != 'E' {
				t.Errorf("random bytes #%d: got message %q, want an ErrorResponse or a close", i, typ)
			}
			if typ == 'E' && len(fields) > 0 && !strings.HasPrefix(fields['M'], "lockpool:") {
				t.Errorf("random bytes #%d: error %v", i, fields)
			}
			if rest != nil {
				t.Errorf("random bytes #%d: connection not closed: %v", i, rest)
			}
		}
		noLeak("random bytes before startup")

		// Random bytes after a successful login, on the raw socket.
		for i := 0; i < 10; i++ {
			c, err := pgx.Connect(ctx, l.dsn("app", "appdb"))
			if err != nil {
				t.Fatal(err)
			}
			hj, err := c.PgConn().Hijack()
			if err != nil {
				t.Fatal(err)
			}
			junk := make([]byte, 1024)
			rng.Read(junk)
			nc := hj.Conn
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = nc.Write(junk)
			if tc, ok := nc.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			t0 := time.Now()
			_, err = io.Copy(io.Discard, nc)
			if el := time.Since(t0); el > 5*time.Second {
				t.Errorf("random bytes after login #%d: lockpool took %v to close (%v)", i, el, err)
			}
			_ = nc.Close()
		}
		// The application still works.
		c, err := pgx.Connect(ctx, l.dsn("app", "appdb"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
		clientsGone("the clients that sent random bytes")
		noLeak("random bytes after login")
	})
}

// rawExchange sends b on a fresh connection (then half-closes it when
// closeWrite) and reads what comes back until the server closes. It returns
// the first message's type (0 if none), the fields when it is an error or
// notice, and a non-nil error when the server did not close within 5 s.
func rawExchange(t *testing.T, addr string, b []byte, closeWrite bool) (typ byte, fields map[byte]string, notClosed error) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(b); err != nil {
		return 0, nil, nil // closed before we finished writing: a clean close
	}
	if closeWrite {
		_ = nc.(*net.TCPConn).CloseWrite()
	}
	br := bufio.NewReader(nc)
	fields = map[byte]string{}
	first, err := br.ReadByte()
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return 0, nil, err
		}
		return 0, nil, nil
	}
	typ = first
	var lb [4]byte
	if _, err := io.ReadFull(br, lb[:]); err == nil {
		n := int(binary.BigEndian.Uint32(lb[:])) - 4
		if n >= 0 && n < 1<<20 {
			body := make([]byte, n)
			if _, err := io.ReadFull(br, body); err == nil && (typ == 'E' || typ == 'N') {
				for len(body) > 1 && body[0] != 0 {
					k := body[0]
					end := 1
					for end < len(body) && body[end] != 0 {
						end++
					}
					fields[k] = string(body[1:end])
					if end+1 > len(body) {
						break
					}
					body = body[end+1:]
				}
			}
		}
	}
	_, err = io.Copy(io.Discard, br)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return typ, fields, err
	}
	return typ, fields, nil
}
