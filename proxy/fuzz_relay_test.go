package proxy

// Fuzz test of the server-message relay: whatever a
// server sends after a statement, the relay neither panics nor hangs, and
// the session ends when its client leaves.
//
//	go test ./proxy -run '^$' -fuzz FuzzRelay -fuzztime 10s

import (
	"bufio"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/session"
)

// fuzzPG is a server that logs anyone in and answers the first message
// after login with the bytes in reply, then closes.
type fuzzPG struct {
	ln    net.Listener
	reply atomic.Pointer[[]byte]
}

func startFuzzPG(tb testing.TB) *fuzzPG {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &fuzzPG{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	tb.Cleanup(func() { _ = ln.Close() })
	return f
}

func (f *fuzzPG) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if n < 8 || n > 10000 {
			return
		}
		if _, err := br.Discard(n - 8); err != nil {
			return
		}
		switch binary.BigEndian.Uint32(hdr[4:]) {
		case codeSSLRequest, codeGSSENCRequest:
			_, _ = c.Write([]byte{'N'})
			continue
		case codeCancelRequest:
			return
		}
		break
	}
	var out []byte
	out = append(out, 'R', 0, 0, 0, 8, 0, 0, 0, 0)
	for _, kv := range [][2]string{{"server_version", "15.0"}, {"client_encoding", "UTF8"}, {"DateStyle", "ISO, MDY"},
		{"TimeZone", "UTC"}, {"integer_datetimes", "on"}, {"standard_conforming_strings", "on"}} {
		out = wire.AppendFrame(out, 'S', []byte(kv[0]+"\x00"+kv[1]+"\x00"))
	}
	out = append(out, 'K', 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 2)
	out = append(out, 'Z', 0, 0, 0, 5, 'I')
	if _, err := c.Write(out); err != nil {
		return
	}
	// The first message from lockpool (a statement, a SET, a probe): the
	// answer is the fuzzer's.
	var h [5]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return
	}
	if n := int(binary.BigEndian.Uint32(h[1:])) - 4; n > 0 {
		_, _ = br.Discard(n)
	}
	if p := f.reply.Load(); p != nil {
		_, _ = c.Write(*p)
	}
}

func FuzzRelay(f *testing.F) {
	pg := startFuzzPG(f)
	port := pg.ln.Addr().(*net.TCPAddr).Port
	cfg, err := config.Parse([]byte(`listen: 127.0.0.1:0
admin_listen: ""
auth_method: trust
leak_check_interval: 0s
server:
  host: 127.0.0.1
  port: `+fuzzItoa(port)+`
  tls: disable
  max_connections: 4
  connect_timeout: 1s
users:
  - name: app
    password: pw
applications:
  - name: api
    user: app
    max_connections: 2
    max_pinned: 1
    wait_timeout: 1s
`), "fuzz.yaml", nil)
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoLeases: true})
	if err != nil {
		f.Fatal(err)
	}
	as := s.rc.Load().apps["api"]
	msg := func(typ byte, body string) []byte { return wire.AppendFrame(nil, typ, []byte(body)) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	rowDesc := "\x00\x01?column?\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x17\x00\x04\xff\xff\xff\xff\x00\x00"
	f.Add(cat(msg('T', rowDesc), msg('D', "\x00\x01\x00\x00\x00\x011"), msg('C', "SELECT 1\x00"), msg('Z', "I")))
	f.Add(cat(msg('E', "SERROR\x00C42601\x00Msyntax\x00\x00"), msg('Z', "I")))
	f.Add(cat(msg('C', "BEGIN\x00"), msg('Z', "T")))
	f.Add(cat(msg('1', ""), msg('2', ""), msg('3', ""), msg('n', ""), msg('Z', "I")))
	f.Add(cat(msg('S', "application_name\x00x\x00"), msg('N', "SNOTICE\x00Mhi\x00\x00"), msg('A', "\x00\x00\x00\x01ch\x00p\x00"), msg('Z', "I")))
	f.Add(cat(msg('G', "\x00\x00\x00"), msg('H', "\x00\x00\x00"), msg('d', "abc"), msg('c', ""), msg('Z', "I")))
	f.Add(cat(msg('E', "SFATAL\x00C57P01\x00Mterminating\x00\x00")))
	f.Add([]byte{'D', 0x7f, 0xff, 0xff, 0xff, 0, 1})
	f.Add([]byte{'Z', 0, 0, 0, 6, 'I', 'I'})
	f.Add([]byte{'Z', 0, 0, 0, 3})
	f.Add([]byte{'S', 0, 0, 0, 5, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		d := append([]byte(nil), data...)
		pg.reply.Store(&d)
		s.clientCount.Add(1)
		as.Admit()
		client, done := startLoopSession(t, s, as)
		defer client.Close()
		_ = client.SetDeadline(time.Now().Add(10 * time.Second))
		// The client: one statement, then read until ReadyForQuery, EOF or
		// a quiet second, then leave.
		go func() {
			_, _ = client.Write(wire.AppendQuery(nil, "SELECT 1"))
			cr := bufio.NewReader(client)
			for {
				_ = client.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				typ, err := cr.ReadByte()
				if err != nil {
					break
				}
				var l [4]byte
				if _, err := io.ReadFull(cr, l[:]); err != nil {
					break
				}
				n := int(binary.BigEndian.Uint32(l[:])) - 4
				if n < 0 {
					break
				}
				if _, err := cr.Discard(n); err != nil {
					break
				}
				if typ == 'Z' {
					break
				}
			}
			_, _ = client.Write([]byte{'X', 0, 0, 0, 4})
			_ = client.Close()
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("session hung on server reply %q", data)
		}
	})
}

// startLoopSession runs a logged-in session of application as on one of
// s's event loops, over a socket pair, as lockpool runs every client's
// session: it returns the client's end and a channel closed when the
// session has ended.
func startLoopSession(tb testing.TB, s *Server, as *appstate.App) (net.Conn, chan struct{}) {
	tb.Helper()
	s.mu.Lock()
	if s.loops == nil {
		if err := s.startLoops(); err != nil {
			s.mu.Unlock()
			tb.Fatal(err)
		}
	}
	s.mu.Unlock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			tb.Fatal(err)
		}
		conns[i] = c
	}
	sock := evloop.Wrap(conns[1])
	ss := session.New(s.shared, sock, bufio.NewReaderSize(sock, startupReadBuf), as, "app", "app", map[string]string{"user": "app", "database": "app"})
	if !s.register(ss) {
		tb.Fatal("register")
	}
	done := make(chan struct{})
	l := s.pickLoop()
	l.Post(func() {
		l.Go(func(co *evloop.Co) {
			ss.Run(co, sock, func() {
				_ = sock.Close()
				close(done)
			})
		})
	})
	return conns[0], done
}

func fuzzItoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
