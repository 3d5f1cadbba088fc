package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/pool"
)

// startupMsgs is what a client got before the close, summarised: single-byte
// answers as themselves, messages as type, then ":SQLSTATE" for errors and
// "=text" for a protocol 2.0 error.
func startupMsgs(t *testing.T, b []byte, singles int) []string {
	t.Helper()
	var out []string
	for i := 0; i < singles && len(b) > 0; i++ {
		out = append(out, string(b[:1]))
		b = b[1:]
	}
	for len(b) > 0 {
		if b[0] == 'E' && bytes.HasPrefix(b[1:], []byte("FATAL:")) {
			end := bytes.IndexByte(b, 0)
			if end < 0 {
				t.Fatalf("protocol 2.0 error without terminator: %q", b)
			}
			out = append(out, "E="+string(b[1:end]))
			b = b[end+1:]
			continue
		}
		if len(b) < 5 {
			t.Fatalf("truncated message %q", b)
		}
		n := int(binary.BigEndian.Uint32(b[1:]))
		if n < 4 || 1+n > len(b) {
			t.Fatalf("bad message length in %q", b)
		}
		typ, body := b[0], b[5:1+n]
		b = b[1+n:]
		if typ == 'E' {
			e := pgerr.FromBody(body)
			out = append(out, "E:"+e.Code+" "+e.Message)
			continue
		}
		out = append(out, string(typ))
	}
	return out
}

func fzPacket(code uint32, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, body...)
}

// TestStartupRepliesBeforeLogin: what a client gets for each kind of first
// packet, as PostgreSQL 15 answers it: nothing for a length PostgreSQL
// refuses (a Terminate, an HTTP request) or a short packet, a protocol 2.0
// error for protocols 0.1 to 2.x, and otherwise a 3.0 FATAL as the last
// message before the close.
func TestStartupRepliesBeforeLogin(t *testing.T) {
	s := fuzzServer(t)
	t.Cleanup(s.pool.Close)
	sslReq := fzPacket(codeSSLRequest, nil)
	gssReq := fzPacket(codeGSSENCRequest, nil)
	noUser := fzStartup(protocol30, "database", "x")
	for _, tc := range []struct {
		name    string
		in      []byte
		singles int    // single-byte answers (to SSL and GSS requests) before the messages
		after   []byte // sent once the first single-byte answer arrived
		want    []string
	}{
		{"terminate", []byte{'X', 0, 0, 0, 4}, 0, nil, nil},
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 0, nil, nil},
		{"length 4", []byte{0, 0, 0, 4, 0, 3, 0, 0}, 0, nil, nil},
		{"length over 10004", []byte{0, 0, 0x27, 0x15, 0, 3, 0, 0}, 0, nil, nil},
		{"short packet", []byte{0, 0, 0, 20, 0, 3, 0}, 0, nil, nil},
		{"nothing", nil, 0, nil, nil},
		{"protocol 2.0", fzPacket(2<<16, make([]byte, 288)), 0, nil, []string{"E=FATAL:  lockpool: unsupported frontend protocol 2.0: server supports 3.0 to 3.0\n"}},
		{"protocol 0.1", fzPacket(1, nil), 0, nil, []string{"E=FATAL:  lockpool: unsupported frontend protocol 0.1: server supports 3.0 to 3.0\n"}},
		{"protocol 0.0", fzPacket(0, nil), 0, nil, []string{"E:0A000 lockpool: unsupported frontend protocol 0.0: server supports 3.0 to 3.0"}},
		{"protocol 4.0", fzPacket(4<<16, nil), 0, nil, []string{"E:0A000 lockpool: unsupported frontend protocol 4.0: server supports 3.0 to 3.0"}},
		{"data after SSLRequest", append(sslReq, noUser...), 1, nil, []string{"N", "E:08P01 lockpool: received unencrypted data after SSL request"}},
		{"data after GSSENCRequest", append(gssReq, noUser...), 1, nil, []string{"N", "E:08P01 lockpool: received unencrypted data after GSSAPI encryption request"}},
		{"SSLRequest twice", sslReq, 1, sslReq, []string{"N", "E:0A000 lockpool: unsupported frontend protocol 1234.5679: server supports 3.0 to 3.0"}},
		{"GSSENCRequest twice", gssReq, 1, gssReq, []string{"N", "E:0A000 lockpool: unsupported frontend protocol 1234.5680: server supports 3.0 to 3.0"}},
		{"GSSENCRequest then SSLRequest", gssReq, 2, append(sslReq, noUser...), []string{"N", "N", "E:08P01 lockpool: received unencrypted data after SSL request"}},
		{"empty packet", fzPacket(protocol30, nil), 0, nil, []string{"E:08P01 lockpool: invalid startup packet layout: expected terminator as last byte"}},
		{"pair after the terminator's place", fzPacket(protocol30, []byte("user\x00x\x00a\x00b")), 0, nil, []string{"E:08P01 lockpool: invalid startup packet layout: expected terminator as last byte"}},
		// PostgreSQL reads a lone byte in the terminator's place as the terminator.
		{"byte in the terminator's place", fzPacket(protocol30, []byte("user\x00x\x00a")), 0, nil, []string{`E:28000 lockpool: role "x" is not configured`}},
		{"no user", noUser, 0, nil, []string{"E:28000 lockpool: no PostgreSQL user name specified in startup packet"}},
		{"bad replication", fzStartup(protocol30, "user", "x", "replication", "bogus"), 0, nil, []string{`E:22023 invalid value for parameter "replication": "bogus"`}},
		{"replication", fzStartup(protocol30, "user", "x", "replication", "database"), 0, nil, []string{"E:0A000 lockpool: replication connections are not supported"}},
		{"protocol 3.1 and _pq_ option", fzStartup(protocol30+1, "_pq_.x", "1", "database", "x"), 0, nil, []string{"v", "E:28000 lockpool: no PostgreSQL user name specified in startup packet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			_ = client.SetDeadline(time.Now().Add(10 * time.Second))
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.handleConn(server)
			}()
			var first []byte
			if tc.after != nil {
				first = make([]byte, 1)
				go func() { _, _ = client.Write(tc.in) }()
				if _, err := io.ReadFull(client, first); err != nil {
					t.Fatalf("answer to the encryption request: %v", err)
				}
				tc.in = tc.after
			}
			go func() { _, _ = client.Write(tc.in) }()
			got, err := io.ReadAll(client)
			got = append(first, got...)
			if err != nil {
				t.Fatalf("read: %v (got %q)", err, got)
			}
			<-done
			if msgs := startupMsgs(t, got, tc.singles); !reflect.DeepEqual(msgs, tc.want) {
				t.Errorf("got %q, want %q", msgs, tc.want)
			}
		})
	}
}

// checkFakePG is a scripted PostgreSQL for the startup check: it answers
// lockpool's check query with each value in upper case (as PostgreSQL
// answers "iso" with "ISO, MDY"), refuses the parameter named "bad" with
// 22023, and answers any other query with an empty result.
type checkFakePG struct {
	ln     net.Listener
	checks atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
	down   atomic.Bool
}

func startCheckFakePG(t *testing.T) *checkFakePG {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &checkFakePG{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			go f.serve(c)
		}
	}()
	t.Cleanup(f.stop)
	return f
}

// stop makes the server unreachable: existing connections are closed and
// new dials fail.
func (f *checkFakePG) stop() {
	f.down.Store(true)
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

func (f *checkFakePG) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		typ, n, err := wire.ReadHeader(r)
		if err != nil {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if typ == 'X' {
			return
		}
		if typ != 'Q' {
			continue
		}
		q := string(bytes.TrimRight(body, "\x00"))
		var out []byte
		switch {
		case strings.Contains(q, "set_config("):
			f.checks.Add(1)
			lits := strings.Split(q, "$lockpool$")
			// Literals are the odd pieces: name, value, name, value, ...
			var vals []string
			failed := ""
			for i := 1; i+2 < len(lits); i += 4 {
				name, val := lits[i], lits[i+2]
				if name == "bad" && failed == "" {
					failed = val
				}
				vals = append(vals, strings.ToUpper(val))
			}
			out = wire.AppendFrame(out, 'C', []byte("BEGIN\x00"))
			out = wire.AppendFrame(out, 'C', []byte("RESET\x00"))
			if failed != "" {
				out = (&pgerr.Error{Code: "22023", Message: fmt.Sprintf(`invalid value for parameter "bad": %q`, failed)}).AppendTo(out, 'E')
				out = wire.AppendReadyForQuery(out, 'E')
				break
			}
			row := binary.BigEndian.AppendUint16(nil, uint16(len(vals)))
			for _, v := range vals {
				row = binary.BigEndian.AppendUint32(row, uint32(len(v)))
				row = append(row, v...)
			}
			out = wire.AppendFrame(out, 'D', row)
			out = wire.AppendFrame(out, 'C', []byte("SELECT 1\x00"))
			out = wire.AppendFrame(out, 'C', []byte("ROLLBACK\x00"))
			out = wire.AppendReadyForQuery(out, 'I')
		default:
			out = wire.AppendFrame(out, 'C', []byte("ROLLBACK\x00"))
			out = wire.AppendReadyForQuery(out, 'I')
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func (f *checkFakePG) dial(ctx context.Context, app pool.AppConfig, database string) (*pool.Conn, error) {
	if f.down.Load() {
		return nil, errors.New("connection refused (server stopped by the test)")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", f.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	return &pool.Conn{Net: c, PID: 1, SecretKey: []byte{1, 2, 3, 4},
		StartupParams: map[string]string{"server_version": "15.0", "DateStyle": "ISO, MDY", "TimeZone": "UTC", "client_encoding": "UTF8"}}, nil
}

// TestStartupCheckCacheAndUnreachableServer: a set of startup settings is
// checked on the server once and then served from the cache; a refused
// setting is the server's FATAL; with the server gone, a set of well-known
// parameters is accepted unchecked, a known set is accepted from the cache,
// and any other set is refused with 08006.
func TestStartupCheckCacheAndUnreachableServer(t *testing.T) {
	f := startCheckFakePG(t)
	cfg, err := config.Parse([]byte(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: trust
leak_check_interval: 0s
server:
  host: 127.0.0.1
  port: 1
  max_connections: 4
  connect_timeout: 1s
users:
  - name: app
applications:
  - name: api
    user: app
    max_connections: 2
    max_pinned: 1
    wait_timeout: 1s
`), "check.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	srv, err := New(Options{Config: cfg, Logger: logger, NoLeases: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.pool.Close()
	pm, err := pool.New(pool.Options{Server: cfg.Server, Apps: srv.poolApps(cfg), Logger: logger, Dial: f.dial})
	if err != nil {
		t.Fatal(err)
	}
	srv.pool = pm
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	connect := func(params map[string]string) (*pgconn.PgConn, error) {
		pc, err := pgconn.ParseConfig("host=127.0.0.1 user=app dbname=appdb sslmode=disable connect_timeout=5 port=" + fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range params {
			pc.RuntimeParams[k] = v
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgconn.ConnectConfig(ctx, pc)
		if err == nil {
			t.Cleanup(func() { _ = c.Close(context.Background()) })
		}
		return c, err
	}
	type step struct {
		name       string
		params     map[string]string
		code       string // SQLSTATE of the refused login, "" when it succeeds
		datestyle  string // ParameterStatus DateStyle after a login
		wantChecks int64  // checks the fake server saw so far
	}
	run := func(steps []step) {
		t.Helper()
		for _, st := range steps {
			c, err := connect(st.params)
			switch {
			case st.code == "" && err != nil:
				t.Errorf("%s: login failed: %v", st.name, err)
			case st.code != "":
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != st.code || pe.Severity != "FATAL" {
					t.Errorf("%s: login error %v, want FATAL %s", st.name, err, st.code)
				}
			case st.datestyle != "":
				if got := c.ParameterStatus("DateStyle"); got != st.datestyle {
					t.Errorf("%s: DateStyle %q, want %q", st.name, got, st.datestyle)
				}
			}
			if got := f.checks.Load(); got != st.wantChecks {
				t.Errorf("%s: %d checks on the server, want %d", st.name, got, st.wantChecks)
			}
		}
	}
	run([]step{
		{"application_name needs no check", map[string]string{"application_name": "web-1"}, "", "ISO, MDY", 0},
		{"first login with a set", map[string]string{"DateStyle": "iso", "application_name": "web-1"}, "", "ISO", 1},
		{"same set, other application_name", map[string]string{"DateStyle": "iso", "application_name": "web-2"}, "", "ISO", 1},
		{"refused setting", map[string]string{"bad": "x"}, "22023", "", 2},
		{"refused again (not cached)", map[string]string{"bad": "x"}, "22023", "", 3},
		{"custom parameter", map[string]string{"myapp.x": "1"}, "", "", 4},
		{"options then explicit", map[string]string{"options": "-c DateStyle=sql", "DateStyle": "iso"}, "", "ISO", 5},
	})
	f.stop()
	run([]step{
		{"unreachable: cached set", map[string]string{"DateStyle": "iso"}, "", "ISO", 5},
		{"unreachable: cached custom set", map[string]string{"myapp.x": "1"}, "", "", 5},
		{"unreachable: well-known parameters", map[string]string{"DateStyle": "sql", "TimeZone": "UTC", "search_path": "a"}, "", "sql", 5},
		{"unreachable: other parameter", map[string]string{"myapp.y": "1"}, "08006", "", 5},
		{"unreachable: bad options", map[string]string{"options": "-x"}, "42601", "", 5},
	})
}
