package proxy

// Hot-path benchmarks: a client round trip through the relay
// in-process, against a scripted fake PostgreSQL on a loopback listener. Both
// the benchmark client and the fake server are written not to allocate in
// the steady state, so allocs/op is the proxy's own.
//
//	go test ./proxy -run '^$' -bench . -benchmem

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/pool"
)

// ---- wire helpers (encoded once, outside the timed loops) ----

func msg(typ byte, body []byte) []byte {
	b := make([]byte, 5, 5+len(body))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

func cstr(s string) []byte { return append([]byte(s), 0) }

func be16(v int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
func be32(v int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }

func join(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	fakeRowDesc = msg('T', join(be16(1), cstr("?column?"), be32(0), be16(0), be32(23), be16(4), be32(-1), be16(0)))
	fakeDataRow = msg('D', join(be16(1), be32(1), []byte("1")))
	fakeSelect1 = msg('C', cstr("SELECT 1"))
	fakeReady   = msg('Z', []byte{'I'})
	fakeParseOK = msg('1', nil)
	fakeBindOK  = msg('2', nil)
	fakeCloseOK = msg('3', nil)
	fakeNoParam = msg('t', be16(0))
)

// fakePG is a scripted PostgreSQL: every Query answers one row, the
// extended protocol is answered message by message, always idle.
type fakePG struct {
	ln    net.Listener
	conns atomic.Int64
}

func startFakePG(tb testing.TB) *fakePG {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &fakePG{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			go f.serve(c)
		}
	}()
	tb.Cleanup(func() { ln.Close() })
	return f
}

func (f *fakePG) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 32<<10)
	w := bufio.NewWriterSize(c, 32<<10)
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		var kind byte
		if hdr[0] == 'D' && n > 0 {
			b, err := r.Peek(1)
			if err != nil {
				return
			}
			kind = b[0]
		}
		if _, err := r.Discard(n); err != nil {
			return
		}
		switch hdr[0] {
		case 'Q':
			w.Write(fakeRowDesc)
			w.Write(fakeDataRow)
			w.Write(fakeSelect1)
			w.Write(fakeReady)
			if w.Flush() != nil {
				return
			}
		case 'P':
			w.Write(fakeParseOK)
		case 'B':
			w.Write(fakeBindOK)
		case 'D':
			if kind == 'S' {
				w.Write(fakeNoParam)
			}
			w.Write(fakeRowDesc)
		case 'E':
			w.Write(fakeDataRow)
			w.Write(fakeSelect1)
		case 'C':
			w.Write(fakeCloseOK)
		case 'S':
			w.Write(fakeReady)
			if w.Flush() != nil {
				return
			}
		case 'H':
			if w.Flush() != nil {
				return
			}
		case 'X':
			return
		}
	}
}

// dial is the pool Dial override: a "logged-in" connection to the fake.
func (f *fakePG) dial(ctx context.Context, app pool.AppConfig, database string) (*pool.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", f.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	return &pool.Conn{
		Net:       c,
		PID:       uint32(1000 + f.conns.Load()),
		SecretKey: []byte{1, 2, 3, 4},
		StartupParams: map[string]string{
			"server_version": "15.0", "server_encoding": "UTF8", "client_encoding": "UTF8",
			"DateStyle": "ISO, MDY", "TimeZone": "UTC", "integer_datetimes": "on",
			"standard_conforming_strings": "on", "IntervalStyle": "postgres", "is_superuser": "off",
			"application_name": "",
		},
	}, nil
}

// benchProxy starts a lockpool Server (trust auth, leases off) whose pool
// dials the fake server, and returns its address.
func benchProxy(tb testing.TB, budget int) string {
	f := startFakePG(tb)
	return fakeProxy(tb, f.ln.Addr().(*net.TCPAddr).Port, budget, f.dial)
}

// fakeProxy starts a lockpool Server (trust auth, leases off, user and
// application bench) whose pool dials with dial, and returns its address.
func fakeProxy(tb testing.TB, port, budget int, dial func(context.Context, pool.AppConfig, string) (*pool.Conn, error)) string {
	_, addr := fakeServer(tb, port, budget, dial)
	return addr
}

// fakeServer is fakeProxy, returning the Server too.
func fakeServer(tb testing.TB, port, budget int, dial func(context.Context, pool.AppConfig, string) (*pool.Conn, error)) (*Server, string) {
	yaml := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: trust
leak_check_interval: 0s
server:
  host: 127.0.0.1
  port: %d
  max_connections: %d
users:
  - name: bench
applications:
  - name: bench
    user: bench
    max_connections: %d
    max_pinned: 1
`, port, budget+4, budget)
	cfg, err := config.Parse([]byte(yaml), "bench.yaml", nil)
	if err != nil {
		tb.Fatalf("config: %v", err)
	}
	logger := slog.New(slog.DiscardHandler)
	srv, err := New(Options{Config: cfg, Logger: logger, NoLeases: true})
	if err != nil {
		tb.Fatal(err)
	}
	// proxy.New has no Dial hook; this in-package test swaps the pool for
	// one that dials the fake server.
	srv.pool.Close()
	pm, err := pool.New(pool.Options{Server: cfg.Server, Apps: srv.poolApps(cfg), Logger: logger, Dial: dial})
	if err != nil {
		tb.Fatal(err)
	}
	srv.pool = pm
	srv.shared.Pool = pm // the sessions' pool (the one New made is closed)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv, ln.Addr().String()
}

// rawClient is a logged-in client socket driven with pre-encoded messages.
type rawClient struct {
	c   net.Conn
	r   *bufio.Reader
	hdr [5]byte
}

func dialClient(tb testing.TB, addr string) *rawClient {
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=bench dbname=bench sslmode=disable", host, port))
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	hj, err := pc.Hijack()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { hj.Conn.Close() })
	return &rawClient{c: hj.Conn, r: bufio.NewReaderSize(hj.Conn, 32<<10)}
}

// roundTrip writes req and reads until ReadyForQuery; it fails on an
// ErrorResponse.
func (rc *rawClient) roundTrip(tb testing.TB, req []byte) {
	if err := rc.try(req); err != nil {
		tb.Fatal(err)
	}
}

func (rc *rawClient) try(req []byte) error {
	if _, err := rc.c.Write(req); err != nil {
		return err
	}
	for {
		if _, err := io.ReadFull(rc.r, rc.hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(rc.hdr[1:])) - 4
		if rc.hdr[0] == 'E' {
			b, _ := rc.r.Peek(n)
			return fmt.Errorf("ErrorResponse: %q", b)
		}
		if _, err := rc.r.Discard(n); err != nil {
			return err
		}
		if rc.hdr[0] == 'Z' {
			return nil
		}
	}
}

var (
	simpleQuery = msg('Q', cstr("SELECT abalance FROM pgbench_accounts WHERE aid = 42"))
	// pgbench -M extended: unnamed Parse, Bind, Describe portal, Execute, Sync.
	extendedTxn = join(
		msg('P', join(cstr(""), cstr("SELECT abalance FROM pgbench_accounts WHERE aid = $1"), be16(0))),
		msg('B', join(cstr(""), cstr(""), be16(0), be16(1), be32(2), []byte("42"), be16(0))),
		msg('D', join([]byte{'P'}, cstr(""))),
		msg('E', join(cstr(""), be32(0))),
		msg('S', nil),
	)
	// pgbench -M prepared after the first transaction: Bind of a named
	// statement, Describe, Execute, Sync.
	preparedParse = join(
		msg('P', join(cstr("P0_1"), cstr("SELECT abalance FROM pgbench_accounts WHERE aid = $1"), be16(0))),
		msg('S', nil),
	)
	preparedTxn = join(
		msg('B', join(cstr(""), cstr("P0_1"), be16(0), be16(1), be32(2), []byte("42"), be16(0))),
		msg('D', join([]byte{'P'}, cstr(""))),
		msg('E', join(cstr(""), be32(0))),
		msg('S', nil),
	)
)

// extendedBatch is five statements in one Sync (a pipelined batch).
var extendedBatch = func() []byte {
	var b []byte
	for i := 0; i < 5; i++ {
		b = append(b, extendedTxn[:len(extendedTxn)-5]...)
	}
	return append(b, msg('S', nil)...)
}()

func benchRoundTrip(b *testing.B, setup, req []byte) {
	addr := benchProxy(b, 4)
	c := dialClient(b, addr)
	if setup != nil {
		c.roundTrip(b, setup)
	}
	for i := 0; i < 100; i++ { // warm up: server connection, buffers
		c.roundTrip(b, req)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.roundTrip(b, req)
	}
}

// BenchmarkSimpleQuery: one Query → RowDescription/DataRow/CommandComplete/
// ReadyForQuery round trip through the relay (a server connection taken and
// given back per transaction).
func BenchmarkSimpleQuery(b *testing.B) { benchRoundTrip(b, nil, simpleQuery) }

// BenchmarkExtendedTxn: pgbench -M extended's message sequence.
func BenchmarkExtendedTxn(b *testing.B) { benchRoundTrip(b, nil, extendedTxn) }

// BenchmarkExtendedBatch: five Parse/Bind/Describe/Execute in one Sync.
func BenchmarkExtendedBatch(b *testing.B) { benchRoundTrip(b, nil, extendedBatch) }

// BenchmarkPreparedTxn: pgbench -M prepared (named statement, Bind/Execute).
func BenchmarkPreparedTxn(b *testing.B) { benchRoundTrip(b, preparedParse, preparedTxn) }

// BenchmarkSimpleQueryParallel: GOMAXPROCS×4 clients sharing a budget of 4
// server connections (pool contention).
func BenchmarkSimpleQueryParallel(b *testing.B) {
	addr := benchProxy(b, 4)
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := dialClient(b, addr) // Fatal on failure only stops the benchmark late; fine here
		for pb.Next() {
			if err := c.try(simpleQuery); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
