package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/pool"
)

// closingSyncPG is a fake PostgreSQL that answers every simple Query with
// one row, except that it closes the connection, after a FATAL 57P01 as a
// shutting-down server sends, at the first lockpool parameter sync
// (set_config) it gets while closes is above zero.
type closingSyncPG struct {
	ln     net.Listener
	closes atomic.Int64 // syncs still to answer by closing
	closed atomic.Int64 // connections closed at a sync
	dials  atomic.Int64
}

func (f *closingSyncPG) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(hdr[1:]))-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch hdr[0] {
		case 'Q':
			if strings.Contains(string(body), "set_config") && f.closes.Add(-1) >= 0 {
				f.closed.Add(1)
				_, _ = c.Write(msg('E', join(cstr("SFATAL"), cstr("C57P01"), cstr("Mterminating connection due to administrator command"), []byte{0})))
				return
			}
			_, _ = c.Write(join(fakeRowDesc, fakeDataRow, fakeSelect1, fakeReady))
		case 'X':
			return
		}
	}
}

func (f *closingSyncPG) dial(ctx context.Context, _ pool.AppConfig, _ string) (*pool.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", f.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	n := f.dials.Add(1)
	return &pool.Conn{
		Net:       c,
		PID:       uint32(2000 + n),
		SecretKey: []byte{1, 2, 3, 4},
		StartupParams: map[string]string{
			"server_version": "15.0", "server_encoding": "UTF8", "client_encoding": "UTF8",
			"DateStyle": "ISO, MDY", "TimeZone": "UTC", "integer_datetimes": "on",
			"standard_conforming_strings": "on", "IntervalStyle": "postgres", "is_superuser": "off",
			"application_name": "",
		},
	}, nil
}

// TestAttachRetriesConnectionClosedAtSync: a server connection that the
// server closes while lockpool applies the client's parameters to it,
// before any of the client's statement was sent (a switchover's shutdown
// ending an idle backend just after the pool handed it out), is replaced
// by another: the client's statement runs, with no error. A server that
// closes every connection so still fails the statement, after a bounded
// number of attempts.
func TestAttachRetriesConnectionClosedAtSync(t *testing.T) {
	f := &closingSyncPG{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	addr := fakeProxy(t, ln.Addr().(*net.TCPAddr).Port, 4, f.dial)
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connect := func() *pgconn.PgConn {
		// application_name differs from the server's default: the
		// session syncs it on every server connection it attaches.
		pc, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%s user=bench dbname=bench sslmode=disable application_name=sync", host, port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pc.Close(context.Background()) })
		return pc
	}

	f.closes.Store(1)
	pc := connect()
	if _, err := pc.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("statement after a server connection closed at the parameter sync: %v", err)
	}
	if got := f.closed.Load(); got != 1 {
		t.Fatalf("the fake closed %d connections at the sync, want 1", got)
	}
	if got := f.dials.Load(); got != 2 {
		t.Errorf("%d server connections dialed, want 2 (the closed one and its replacement)", got)
	}

	// Every attempt closed: the statement fails, the session goes on.
	f.closes.Store(1000)
	f.closed.Store(0)
	pc = connect()
	_, err = pc.Exec(ctx, "SELECT 1").ReadAll()
	if err == nil {
		t.Fatal("no error from a server that closes every connection at the sync")
	}
	if got := f.closed.Load(); got != 3 { // the session's bound on attempts
		t.Errorf("%d attempts, want 3", got)
	}
	t.Logf("with every connection closed at the sync: %v", err)
	f.closes.Store(0)
	if _, err := pc.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Errorf("the next statement, once the server answers: %v", err)
	}
}
