package proxy

// Fuzz tests of the client-message framing: no
// input may panic or hang the startup reader, the frame reader, or a
// session's message loop.
//
//	go test ./proxy -run '^$' -fuzz FuzzFrame -fuzztime 10s
//	go test ./proxy -run '^$' -fuzz FuzzStartup -fuzztime 10s
//	go test ./proxy -run '^$' -fuzz FuzzSession -fuzztime 10s

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/startupparam"
)

// fuzzConfig: one application, and a server address where nothing listens
// (port 1), so a session that needs a server gets a quick connect error.
const fuzzConfig = `listen: 127.0.0.1:0
admin_listen: ""
auth_method: trust
leak_check_interval: 0s
client_login_timeout: 2s
max_message_size: 64kB
server:
  host: 127.0.0.1
  port: 1
  max_connections: 4
  connect_timeout: 200ms
users:
  - name: app
    password: pw
applications:
  - name: api
    user: app
    max_connections: 2
    max_pinned: 1
    wait_timeout: 200ms
`

func fuzzServer(tb testing.TB) *Server {
	tb.Helper()
	cfg, err := config.Parse([]byte(fuzzConfig), "fuzz.yaml", nil)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func fzMsg(typ byte, body ...[]byte) []byte {
	b := bytes.Join(body, nil)
	out := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)+4))
	return append(out, b...)
}

func fzStartup(code uint32, kv ...string) []byte {
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

// FuzzFrame reads typed messages from arbitrary bytes with readHeader, as
// the session and the auth exchange do.
func FuzzFrame(f *testing.F) {
	f.Add(fzMsg('Q', []byte("SELECT 1\x00")))
	f.Add(append(fzMsg('P', []byte("\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17")), fzMsg('S')...))
	f.Add([]byte{'X', 0, 0, 0, 4})
	f.Add([]byte{'Q', 0, 0, 0, 3})
	f.Add([]byte{'Q', 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{'d', 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		consumed := 0
		for i := 0; ; i++ {
			if i > len(data) {
				t.Fatalf("readHeader made no progress")
			}
			typ, n, err := wire.ReadHeader(br)
			if err != nil {
				if errors.Is(err, io.EOF) && consumed != len(data) {
					t.Fatalf("io.EOF with %d of %d bytes consumed", consumed, len(data))
				}
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, wire.ErrProtocol) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if typ != data[consumed] {
				t.Fatalf("type %q, want %q", typ, data[consumed])
			}
			if n < 0 || n > 1<<30-4 {
				t.Fatalf("body length %d", n)
			}
			consumed += 5
			d, _ := br.Discard(n)
			consumed += d
			if d < n {
				return
			}
		}
	})
}

// FuzzStartup feeds arbitrary bytes to readStartup (SSLRequest, GSSENCRequest,
// CancelRequest, startup packets) over a pipe, and the body to
// parseStartupParams. A first length word PostgreSQL would refuse gets no
// reply at all; an accepted packet always names a user.
func FuzzStartup(f *testing.F) {
	s := fuzzServer(f)
	f.Add(fzStartup(protocol30, "user", "app", "database", "appdb"))
	f.Add(fzStartup(protocol30+1, "user", "app", "_pq_.x", "1"))
	f.Add(append([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}, fzStartup(protocol30, "user", "app")...))
	f.Add([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30})
	f.Add([]byte{0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 1, 0, 0, 1, 2, 3, 4})
	f.Add([]byte{0, 0, 0, 8, 0, 2, 0, 0})
	f.Add([]byte{'X', 0, 0, 0, 4})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(fzStartup(protocol30, "user"))
	f.Add(fzStartup(protocol30, "replication", "database", "user", "x"))
	f.Add(fzStartup(protocol30, "user", "x", "options", "-c a=b --c-d=e -e"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) >= 8 {
			_, _, _ = parseStartupParams(data[8:])
		}
		_, _, _ = parseStartupParams(data)
		if o, ok := fzOptions(data); ok {
			_, _ = startupparam.ParseOptions(o)
		}

		client, server := net.Pipe()
		defer client.Close()
		_ = server.SetDeadline(time.Now().Add(5 * time.Second))
		_ = client.SetDeadline(time.Now().Add(5 * time.Second))
		replied := make(chan int, 1)
		go func() {
			// Answers (N to SSLRequest, errors) are counted and dropped.
			n, _ := io.Copy(io.Discard, client)
			replied <- int(n)
		}()
		go func() {
			_, _ = client.Write(data)
			// Nothing more will come: EOF for the reader.
			_ = client.Close()
		}()
		done := make(chan struct{})
		var pkt *startupPacket
		var err error
		go func() {
			defer close(done)
			_, _, pkt, err = s.readStartup(&loginCtx{}, server)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("readStartup hung on %q", data)
		}
		_ = server.Close()
		if err == nil && pkt.params["user"] == "" {
			t.Fatalf("startup accepted without a user: %v", pkt.params)
		}
		if len(data) >= 4 {
			if n := binary.BigEndian.Uint32(data); n < 8 || n-4 > maxStartupLen {
				if !errors.Is(err, errStartupLength) {
					t.Fatalf("invalid length %d: err %v, want errStartupLength", n, err)
				}
				if got := <-replied; got != 0 {
					t.Fatalf("invalid length %d: %d bytes of reply, want none", n, got)
				}
			}
		}
	})
}

// fzOptions returns the value of an "options" key in a startup packet body.
func fzOptions(data []byte) (string, bool) {
	parts := bytes.Split(data, []byte{0})
	for i := 0; i+1 < len(parts); i++ {
		if string(parts[i]) == "options" {
			return string(parts[i+1]), true
		}
	}
	return "", false
}

// FuzzSession runs a logged-in session's message loop over arbitrary client
// bytes. The server behind it is unreachable, so statements fail with a
// connect error; what is fuzzed is the framing and message parsing.
func FuzzSession(f *testing.F) {
	s := fuzzServer(f)
	f.Add(fzMsg('Q', []byte("SELECT 1\x00")))
	f.Add(bytes.Join([][]byte{
		fzMsg('P', []byte("\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17")),
		fzMsg('B', []byte("\x00\x00\x00\x00\x00\x01\x00\x00\x00\x011\x00\x00")),
		fzMsg('D', []byte("P\x00")), fzMsg('E', []byte("\x00\x00\x00\x00\x00")), fzMsg('S'),
	}, nil))
	f.Add(append(fzMsg('P', []byte("s1\x00SELECT 1\x00\x00\x00")), fzMsg('C', []byte("Ss1\x00"))...))
	f.Add(fzMsg('Q', []byte("SELECT pg_advisory_lock(1); LISTEN x\x00")))
	f.Add(fzMsg('Q', []byte("SELECT lease_acquire('a', 10)\x00")))
	f.Add(fzMsg('Q', []byte("SELECT pg_terminate_backend(4194305, 10)\x00")))
	f.Add(bytes.Join([][]byte{ // a bound pid that is no client's: sent on to the (unreachable) server
		fzMsg('P', []byte("\x00SELECT pg_terminate_backend($1, $2)\x00\x00\x00")),
		fzMsg('B', []byte("\x00\x00\x00\x00\x00\x02\x00\x00\x00\x0512345\x00\x00\x00\x015\x00\x00")),
		fzMsg('E', []byte("\x00\x00\x00\x00\x00")), fzMsg('S'),
	}, nil))
	f.Add(bytes.Join([][]byte{fzMsg('d', []byte("abc")), fzMsg('c'), fzMsg('f', []byte("x\x00")), fzMsg('H')}, nil))
	f.Add([]byte{'Q', 0, 0, 0, 4})
	f.Add([]byte{'P', 0, 0, 0, 5, 0})
	f.Add([]byte{'Z', 0, 0, 0, 4})
	f.Add([]byte{'Q', 0x7f, 0xff, 0xff, 0xff})
	rc := s.rc.Load()
	as := rc.apps["api"]
	f.Fuzz(func(t *testing.T, data []byte) {
		client, done := startLoopSession(t, s, as)
		defer client.Close()
		_ = client.SetDeadline(time.Now().Add(10 * time.Second))
		go func() { _, _ = io.Copy(io.Discard, client) }()
		go func() {
			_, _ = client.Write(data)
			// Half-close: the session reads to the end, its replies drain.
			if uc, ok := client.(*net.UnixConn); ok {
				_ = uc.CloseWrite()
			}
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatalf("session hung on %q", data)
		}
	})
}
