package integration

// Logins as PostgreSQL answers them: every test here runs the same login
// against the test cluster directly and through lockpool, and compares what
// the client gets (SQLSTATE, message, detail, hint, parameter values).

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// reportedParams are the parameters PostgreSQL 15 reports at login.
var reportedParams = []string{"application_name", "client_encoding", "DateStyle", "default_transaction_read_only",
	"in_hot_standby", "integer_datetimes", "IntervalStyle", "is_superuser", "server_encoding", "server_version",
	"session_authorization", "standard_conforming_strings", "TimeZone"}

// directDSN is a DSN for user on the test cluster itself.
func directDSN(t testing.TB, user, db string) string {
	c := pgtest.Require(t)
	return c.DSN(user, appPassword, db)
}

// pgxLogin connects with pgx to dsn with extra startup parameters.
func pgxLogin(ctx context.Context, t testing.TB, dsn string, params map[string]string) (*pgx.Conn, error) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		t.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	return c, err
}

// samePgError fails the test unless both errors are PostgreSQL errors with
// the same severity, SQLSTATE, message, detail and hint.
func samePgError(t testing.TB, direct, via error) {
	t.Helper()
	var d, l *pgconn.PgError
	if !errors.As(direct, &d) || !errors.As(via, &l) {
		t.Fatalf("direct: %v; through lockpool: %v (want PostgreSQL errors on both)", direct, via)
	}
	dv := [5]string{d.Severity, d.Code, d.Message, d.Detail, d.Hint}
	lv := [5]string{l.Severity, l.Code, l.Message, l.Detail, l.Hint}
	if dv != lv {
		t.Errorf("error through lockpool %q, direct %q (severity, code, message, detail, hint)", lv, dv)
	}
}

// TestStartupParamsPgx: startup parameters through pgx. A parameter
// PostgreSQL refuses is refused at login with PostgreSQL's FATAL; accepted
// ones have PostgreSQL's values, explicit parameters winning over options.
func TestStartupParamsPgx(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", defaultApp())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct := directDSN(t, "app", "appdb")
	for _, tc := range []struct {
		name   string
		params map[string]string
		show   []string // settings to compare after the login (reported ones are compared anyway)
		fails  bool     // PostgreSQL refuses the login
	}{
		{name: "unknown parameter", params: map[string]string{"DOESNOTEXIST": "foo"}, fails: true},
		{name: "invalid DateStyle", params: map[string]string{"DateStyle": "garbage"}, fails: true},
		{name: "invalid client_encoding", params: map[string]string{"client_encoding": "BOGUS"}, fails: true},
		{name: "not a Boolean", params: map[string]string{"enable_seqscan": "maybe"}, fails: true},
		{name: "value out of range", params: map[string]string{"extra_float_digits": "9"}, fails: true},
		{name: "internal parameter", params: map[string]string{"server_version": "1"}, fails: true},
		{name: "needs a restart", params: map[string]string{"shared_buffers": "1MB"}, fails: true},
		{name: "superuser parameter", params: map[string]string{"log_min_messages": "debug1"}, fails: true},
		{name: "bad custom name", params: map[string]string{"my app.x": "1"}, fails: true},
		{name: "custom parameter", params: map[string]string{"myapp.x": "1", "MyApp.Other": "two"}, show: []string{"myapp.x", "myapp.other"}},
		{name: "DateStyle completed by the server", params: map[string]string{"datestyle": "iso"}},
		{name: "TimeZone", params: map[string]string{"TimeZone": "Asia/Tokyo", "IntervalStyle": "iso_8601"}},
		{name: "search_path and numbers", params: map[string]string{"search_path": "a, public", "extra_float_digits": "2", "statement_timeout": "2min"}, show: []string{"search_path", "extra_float_digits", "statement_timeout"}},
		{name: "explicit parameter wins over options", params: map[string]string{"options": "-c client_encoding=LATIN1 -c DateStyle=SQL", "client_encoding": "UTF8", "DateStyle": "ISO"}},
		{name: "options alone", params: map[string]string{"options": "-c search_path=a -c work_mem=2MB --lock-timeout=3s -e"}, show: []string{"search_path", "work_mem", "lock_timeout"}},
		{name: "options with an escaped space", params: map[string]string{"options": `-c application_name=a\ b -c search_path=x\,y`}, show: []string{"search_path"}},
		{name: "alias in options and explicit", params: map[string]string{"options": "-c work_mem=1MB", "sort_mem": "2MB"}, show: []string{"work_mem"}},
		{name: "invalid option overridden by an explicit parameter", params: map[string]string{"options": "-c client_encoding=BOGUS", "client_encoding": "UTF8"}, fails: true},
		{name: "unknown parameter in options", params: map[string]string{"options": "-c DOESNOTEXIST=foo"}, fails: true},
		{name: "dashes in an options name", params: map[string]string{"options": "--DateStyle-x=foo"}, fails: true},
		{name: "bad switch", params: map[string]string{"options": "-x"}, fails: true},
		{name: "switch without its argument", params: map[string]string{"options": "-c"}, fails: true},
		{name: "setting without a value", params: map[string]string{"options": "-c foo"}, fails: true},
		{name: "argument that is no switch", params: map[string]string{"options": "foo -c search_path=a"}, fails: true},
		{name: "setting before an argument that is no switch", params: map[string]string{"options": "foo -c zzz=1"}, fails: true},
		{name: "setting before a bad switch", params: map[string]string{"options": "-s -x"}, fails: true},
		{name: "bad switch in a group", params: map[string]string{"options": "-c search_path=a foo -xs"}, fails: true},
		{name: "bad -f argument", params: map[string]string{"options": "-f z"}, fails: true},
		{name: "server switch", params: map[string]string{"options": "-B 100"}, fails: true},
		{name: "ignored switches", params: map[string]string{"options": "-C x -n -T -D /x -r y -v 9 -b -E -j --"}},
		{name: "long application_name", params: map[string]string{"application_name": strings.Repeat("a", 70)}},
		{name: "non-ASCII application_name", params: map[string]string{"application_name": "caf\u00e9\t1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dc, derr := pgxLogin(ctx, t, direct, tc.params)
			lc, lerr := pgxLogin(ctx, t, l.dsn("app", "appdb"), tc.params)
			if tc.fails {
				if derr == nil {
					t.Fatalf("PostgreSQL accepted the login; the case is wrong")
				}
				samePgError(t, derr, lerr)
				if pe := (*pgconn.PgError)(nil); errors.As(lerr, &pe) {
					t.Logf("%s %s: %s", pe.Severity, pe.Code, pe.Message)
				}
				return
			}
			if derr != nil || lerr != nil {
				t.Fatalf("direct: %v; through lockpool: %v", derr, lerr)
			}
			for _, k := range reportedParams {
				if d, v := dc.PgConn().ParameterStatus(k), lc.PgConn().ParameterStatus(k); d != v {
					t.Errorf("ParameterStatus %s = %q through lockpool, %q direct", k, v, d)
				}
			}
			for _, k := range append(tc.show, "application_name", "client_encoding", "DateStyle", "TimeZone", "IntervalStyle") {
				q := "SELECT pg_catalog.current_setting($1)"
				var d, v string
				if err := dc.QueryRow(ctx, q, k).Scan(&d); err != nil {
					t.Fatalf("direct %s: %v", k, err)
				}
				if err := lc.QueryRow(ctx, q, k).Scan(&v); err != nil {
					t.Fatalf("through lockpool %s: %v", k, err)
				}
				if d != v {
					t.Errorf("%s = %q through lockpool, %q direct", k, v, d)
				}
			}
		})
	}
}

// TestStartupParamsPsql: psql with options in its connection string, and
// client_encoding both in options and as its own parameter.
func TestStartupParamsPsql(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		skipOrFail(t, "psql not installed")
	}
	l := startLockpool(t, 10, "", defaultApp())
	c := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	psql := func(port int, conninfo string) (string, string, error) {
		// gssencmode=disable: PostgreSQL may offer GSS encryption (lockpool
		// never does), and libpq then tries twice.
		dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=app dbname=appdb password=%s sslmode=disable gssencmode=disable connect_timeout=10 %s", port, appPassword, conninfo)
		cmd := exec.CommandContext(ctx, "/usr/bin/psql", "-X", "-A", "-t", "-d", dsn,
			"-c", "SELECT current_setting('client_encoding') || ' ' || current_setting('DateStyle') || ' ' || current_setting('search_path')")
		cmd.Env = append(os.Environ(), "PSQLRC=/dev/null", "PGCLIENTENCODING=")
		var out, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &stderr
		err := cmd.Run()
		// "connection to server at "127.0.0.1", port N failed: " differs by port.
		msg := strings.ReplaceAll(stderr.String(), "port "+strconv.Itoa(port)+" ", "port PORT ")
		return strings.TrimSpace(out.String()), strings.TrimSpace(msg), err
	}
	for _, tc := range []struct {
		name, conninfo string
		fails          bool
	}{
		{"unknown parameter in options", `options='-c DOESNOTEXIST=foo'`, true},
		{"invalid DateStyle in options", `options='-c DateStyle=garbage'`, true},
		{"bad switch", `options='-x'`, true},
		{"options", `options='-c search_path=a,public -c datestyle=sql,dmy'`, false},
		{"client_encoding wins over options", `client_encoding=UTF8 options='-c client_encoding=LATIN1'`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dout, derr, dexit := psql(c.Port, tc.conninfo)
			lout, lerr, lexit := psql(l.port, tc.conninfo)
			if (dexit != nil) != tc.fails {
				t.Fatalf("psql direct: exit %v, stderr %q; the case is wrong", dexit, derr)
			}
			if (lexit != nil) != tc.fails || lout != dout || lerr != derr {
				t.Errorf("through lockpool: exit %v, out %q, err %q\ndirect: exit %v, out %q, err %q", lexit, lout, lerr, dexit, dout, derr)
			}
			t.Logf("%q %q", dout, derr)
		})
	}
}

// TestStartupParamsLibPQ: lib/pq sends unknown connection string keys as
// startup parameters, and always client_encoding=UTF8 and DateStyle=ISO,
// MDY, which must win over options.
func TestStartupParamsLibPQ(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", defaultApp())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	login := func(dsn string) (string, error) {
		connector, err := pq.NewConnector(dsn)
		if err != nil {
			return "", err
		}
		db := sql.OpenDB(connector)
		defer db.Close()
		var v string
		err = db.QueryRowContext(ctx, "SELECT current_setting('client_encoding') || ' ' || current_setting('DateStyle') || ' ' || current_setting('work_mem')").Scan(&v)
		return v, err
	}
	for _, tc := range []struct {
		name, extra string
		fails       bool
	}{
		{"unknown parameter", "DOESNOTEXIST=foo", true},
		{"invalid value", "work_mem=lots", true},
		{"options lose to lib/pq's parameters", `work_mem=3MB options='-c client_encoding=LATIN1 -c DateStyle=SQL -c work_mem=2MB'`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dv, derr := login(directDSN(t, "app", "appdb") + " " + tc.extra)
			lv, lerr := login(l.dsn("app", "appdb") + " " + tc.extra)
			if (derr != nil) != tc.fails {
				t.Fatalf("direct: %q, %v; the case is wrong", dv, derr)
			}
			if tc.fails {
				var d, v *pq.Error
				if !errors.As(derr, &d) || !errors.As(lerr, &v) {
					t.Fatalf("direct: %v; through lockpool: %v", derr, lerr)
				}
				if d.Code != v.Code || d.Message != v.Message || d.Severity != v.Severity {
					t.Errorf("through lockpool %s %s %q, direct %s %s %q", v.Severity, v.Code, v.Message, d.Severity, d.Code, d.Message)
				}
				return
			}
			if lerr != nil || lv != dv {
				t.Errorf("through lockpool %q, %v; direct %q", lv, lerr, dv)
			}
		})
	}
}

// rawReply is what a raw client got: single-byte answers, then messages
// (error and notice fields normalised: lockpool's "lockpool: " prefix and
// PostgreSQL's source-file fields dropped), ParameterStatus apart, and
// whether the server closed the connection.
type rawReply struct {
	msgs   []string
	params map[string]string
	closed bool
}

// rawStartup sends packets on a new connection to network/addr, reading
// singles single-byte answers first, and reads the reply until
// ReadyForQuery, an answer to an authentication request, or the close.
func rawStartup(t *testing.T, network, addr string, singles int, packets ...[]byte) rawReply {
	t.Helper()
	nc, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	for _, p := range packets {
		if _, err := nc.Write(p); err != nil {
			break // closed before all was written: the reply says why
		}
	}
	br := bufio.NewReader(nc)
	r := rawReply{params: map[string]string{}}
	for i := 0; i < singles; i++ {
		b, err := br.ReadByte()
		if err != nil {
			t.Fatalf("answer to an encryption request: %v", err)
		}
		r.msgs = append(r.msgs, string(b))
	}
	for {
		typ, err := br.ReadByte()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("no close after %q", r.msgs)
			}
			r.closed = true
			return r
		}
		if typ == 'E' && peekIs(br, "FATAL:") {
			text, err := br.ReadString(0)
			if err != nil {
				t.Fatalf("protocol 2.0 error: %v", err)
			}
			text = strings.TrimPrefix(strings.TrimSuffix(text, "\x00"), "FATAL:  ")
			r.msgs = append(r.msgs, "E2 "+strings.TrimPrefix(text, "lockpool: "))
			continue
		}
		var lb [4]byte
		if _, err := io.ReadFull(br, lb[:]); err != nil {
			t.Fatalf("message %q: %v", typ, err)
		}
		body := make([]byte, int(binary.BigEndian.Uint32(lb[:]))-4)
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatalf("message %q: %v", typ, err)
		}
		switch typ {
		case 'E', 'N':
			f := map[byte]string{}
			for _, field := range strings.Split(strings.TrimRight(string(body), "\x00"), "\x00") {
				if field != "" {
					f[field[0]] = field[1:]
				}
			}
			r.msgs = append(r.msgs, fmt.Sprintf("%c %s %s %s: %s | %s", typ, f['S'], f['V'], f['C'], strings.TrimPrefix(f['M'], "lockpool: "), f['D']))
		case 'S':
			kv := strings.Split(string(body), "\x00")
			r.params[kv[0]] = kv[1]
		case 'R':
			// AuthenticationOk is sent before a parameter error by
			// PostgreSQL, after all checks by lockpool: only other
			// authentication requests are compared.
			if code := binary.BigEndian.Uint32(body); code != 0 {
				r.msgs = append(r.msgs, fmt.Sprintf("R%d", code))
				return r
			}
		case 'K':
		case 'Z':
			r.msgs = append(r.msgs, "Z")
			return r
		default:
			r.msgs = append(r.msgs, string(typ))
		}
	}
}

// peekIs reports whether br's next bytes are prefix (a protocol 2.0 error
// text, where a 3.0 message has its length word); it reads no further than
// what the server sent.
func peekIs(br *bufio.Reader, prefix string) bool {
	for i := 1; i <= len(prefix); i++ {
		b, err := br.Peek(i)
		if err != nil || b[i-1] != prefix[i-1] {
			return false
		}
	}
	return true
}

// startupPacket is a protocol 3.0 (or code) startup packet with pairs.
func startupPacket(code uint32, kv ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0)
	b = binary.BigEndian.AppendUint32(b, code)
	for _, s := range kv {
		b = append(b, s...)
		b = append(b, 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	return b
}

// TestStartupPacketsAsPostgres: raw startup packets, to PostgreSQL over its
// Unix socket (trust) and to lockpool (auth_method trust): garbage and a
// Terminate before the startup packet get no reply, bad protocol versions,
// encryption requests, packet layouts and the order of several bad
// parameters get PostgreSQL's answer, and an error is the last message.
func TestStartupPacketsAsPostgres(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: trust
leak_check_interval: 0s
server:
  host: %s
  port: %d
  max_connections: 4
users:
  - name: app
    password: %s
applications:
  - name: api
    user: app
    max_connections: 2
    max_pinned: 1
`, c.Host, c.Port, appPassword)), "trust.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	l := startLockpoolConfig(t, cfg)
	socket := filepath.Join(c.SocketDir, ".s.PGSQL."+strconv.Itoa(c.Port))
	const v30 = 3 << 16
	ssl := []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}
	login := func(kv ...string) []byte {
		return startupPacket(v30, append([]string{"user", "app", "database", "appdb"}, kv...)...)
	}
	for _, tc := range []struct {
		name    string
		singles int
		packets [][]byte
	}{
		{"Terminate before the startup packet", 0, [][]byte{{'X', 0, 0, 0, 4}}},
		{"HTTP request", 0, [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")}},
		{"length 4", 0, [][]byte{{0, 0, 0, 4, 0, 3, 0, 0}}},
		{"length over the limit", 0, [][]byte{{0, 0, 0x27, 0x15, 0, 3, 0, 0}}},
		{"protocol 2.0", 0, [][]byte{{0, 0, 0, 8, 0, 2, 0, 0}}},
		{"protocol 0.0", 0, [][]byte{{0, 0, 0, 8, 0, 0, 0, 0}}},
		{"protocol 4.0", 0, [][]byte{{0, 0, 0, 8, 0, 4, 0, 0}}},
		{"data after SSLRequest", 1, [][]byte{append(append([]byte{}, ssl...), login()...)}},
		{"empty startup packet", 0, [][]byte{{0, 0, 0, 8, 0, 3, 0, 0}}},
		{"no user", 0, [][]byte{startupPacket(v30, "database", "appdb")}},
		{"bad replication value", 0, [][]byte{login("replication", "bogus")}},
		{"unknown database before a bad parameter", 0, [][]byte{startupPacket(v30, "user", "app", "database", "no_such_db", "zzz", "1")}},
		{"two bad parameters", 0, [][]byte{login("zzz", "1", "DateStyle", "garbage")}},
		{"two bad parameters, other order", 0, [][]byte{login("DateStyle", "garbage", "zzz", "1")}},
		{"bad option before bad parameter", 0, [][]byte{login("zzz", "1", "options", "-c DateStyle=garbage")}},
		{"DateStyle in options and explicit", 0, [][]byte{login("DateStyle", "sql", "options", "-c datestyle=dmy")}},
		{"same parameter twice", 0, [][]byte{login("search_path", "a", "search_path", "b")}},
		{"long application_name (a notice)", 0, [][]byte{login("application_name", strings.Repeat("x", 70))}},
		{"protocol 3.1 and a _pq_ option", 0, [][]byte{startupPacket(v30+1, "user", "app", "database", "appdb", "_pq_.x", "1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rawStartup(t, "unix", socket, tc.singles, tc.packets...)
			v := rawStartup(t, "tcp", l.addr, tc.singles, tc.packets...)
			if !reflect.DeepEqual(d.msgs, v.msgs) || d.closed != v.closed {
				t.Errorf("through lockpool %q (closed %v)\ndirect          %q (closed %v)", v.msgs, v.closed, d.msgs, d.closed)
			}
			if len(d.params) > 0 && !reflect.DeepEqual(d.params, v.params) {
				t.Errorf("ParameterStatus through lockpool %v\ndirect %v", v.params, d.params)
			}
			if n := len(v.msgs); v.closed && n > 0 && !strings.HasPrefix(v.msgs[n-1], "E") {
				t.Errorf("closed after %q: the last message is no error", v.msgs[n-1])
			}
			t.Logf("%q", d.msgs)
		})
	}
}

// TestStartupAuthProtocolViolation: a client that answers the SCRAM request
// with a Query gets PostgreSQL's FATAL 08P01, as its last message.
func TestStartupAuthProtocolViolation(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	l := startLockpool(t, 10, "", defaultApp())
	query := []byte{'Q', 0, 0, 0, 13, 'S', 'E', 'L', 'E', 'C', 'T', ' ', '1', 0}
	exchange := func(addr string) []string {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		var got []string
		write := func(b []byte) {
			if _, err := nc.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		write(startupPacket(3<<16, "user", "app", "database", "appdb"))
		br := bufio.NewReader(nc)
		for {
			typ, err := br.ReadByte()
			if err != nil {
				return append(got, "close")
			}
			var lb [4]byte
			if _, err := io.ReadFull(br, lb[:]); err != nil {
				t.Fatal(err)
			}
			body := make([]byte, int(binary.BigEndian.Uint32(lb[:]))-4)
			if _, err := io.ReadFull(br, body); err != nil {
				t.Fatal(err)
			}
			switch typ {
			case 'R':
				got = append(got, fmt.Sprintf("R%d", binary.BigEndian.Uint32(body)))
				write(query)
			case 'E':
				f := map[byte]string{}
				for _, field := range strings.Split(strings.TrimRight(string(body), "\x00"), "\x00") {
					f[field[0]] = field[1:]
				}
				got = append(got, "E "+f['V']+" "+f['C']+" "+strings.TrimPrefix(f['M'], "lockpool: "))
			default:
				got = append(got, string(typ))
			}
		}
	}
	d := exchange(net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	v := exchange(l.addr)
	want := []string{"R10", "E FATAL 08P01 expected SASL response, got message type 81", "close"}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("PostgreSQL answered %q; the test expects %q", d, want)
	}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("through lockpool %q, want %q (as PostgreSQL)", v, want)
	}
}

// tcpForwarder passes TCP connections through to a target until it is
// switched off: then it closes the connections it passed and closes new
// ones at once, as a server that went away.
type tcpForwarder struct {
	ln     net.Listener
	target string
	off    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func startForwarder(t *testing.T, target string) *tcpForwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &tcpForwarder{ln: ln, target: target}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if f.off.Load() {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, s)
			f.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	t.Cleanup(func() { f.setOff(true); ln.Close() })
	return f
}

func (f *tcpForwarder) setOff(off bool) {
	f.off.Store(off)
	if !off {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// TestStartupParamsServerUnreachable: with PostgreSQL out of reach, a login
// whose settings were checked before is accepted (the check is cached), a
// login with only well-known parameters is accepted and its values are
// checked by its first statement (a bad one is then a FATAL), and any other
// login is refused with 08006.
func TestStartupParamsServerUnreachable(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	fwd := startForwarder(t, net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	yaml := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: scram-sha-256
leak_check_interval: 0s
server:
  host: 127.0.0.1
  port: %d
  max_connections: 4
  connect_timeout: 2s
users:
  - name: app
    password: %s
applications:
  - name: api
    user: app
    database: appdb
    max_connections: 2
    max_pinned: 1
    wait_timeout: 2s
`, fwd.ln.Addr().(*net.TCPAddr).Port, appPassword)
	cfg, err := config.Parse([]byte(yaml), "unreachable.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	l := startLockpoolConfig(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := l.dsn("app", "appdb")
	for _, p := range []map[string]string{{"DateStyle": "SQL, DMY"}, {"myapp.x": "1"}} {
		conn, err := pgxLogin(ctx, t, dsn, p)
		if err != nil {
			t.Fatalf("login with %v while PostgreSQL is up: %v", p, err)
		}
		_ = conn.Close(ctx)
	}

	fwd.setOff(true)
	for _, tc := range []struct {
		params map[string]string
		code   string // "" when the login succeeds
	}{
		{map[string]string{"DateStyle": "SQL, DMY"}, ""},
		{map[string]string{"myapp.x": "1"}, ""},
		{map[string]string{"TimeZone": "Asia/Tokyo", "application_name": "x", "search_path": "a"}, ""},
		{map[string]string{"myapp.y": "1"}, "08006"},
		{map[string]string{"TimeZone": "Asia/Tokyo", "myapp.y": "1"}, "08006"},
	} {
		_, err := pgxLogin(ctx, t, dsn, tc.params)
		if got := sqlState(err); got != tc.code || (tc.code == "" && err != nil) {
			t.Errorf("login with %v while PostgreSQL is away: %v, want SQLSTATE %q", tc.params, err, tc.code)
		}
	}
	lazy, err := pgxLogin(ctx, t, dsn, map[string]string{"DateStyle": "garbage"})
	if err != nil {
		t.Fatalf("login with a well-known parameter while PostgreSQL is away: %v", err)
	}
	tokyo, err := pgxLogin(ctx, t, dsn, map[string]string{"TimeZone": "Asia/Tokyo"})
	if err != nil {
		t.Fatalf("login with a well-known parameter while PostgreSQL is away: %v", err)
	}

	fwd.setOff(false)
	// The first statement applies the unchecked value: PostgreSQL refuses it
	// and the client gets the FATAL it would have got at login.
	_, err = lazy.Exec(ctx, "SELECT 1")
	if pe := pgErr(t, err, "22023"); pe.Severity != "FATAL" || !strings.Contains(pe.Message, `invalid value for parameter "DateStyle": "garbage"`) {
		t.Errorf("first statement with an unchecked bad value: %s %s, want FATAL", pe.Severity, pe.Message)
	}
	if !lazy.IsClosed() {
		t.Errorf("connection open after its FATAL")
	}
	var tz string
	if err := tokyo.QueryRow(ctx, "SELECT current_setting('TimeZone')").Scan(&tz); err != nil || tz != "Asia/Tokyo" {
		t.Errorf("TimeZone of a login accepted unchecked: %q, %v", tz, err)
	}
}
