package listen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// framedConn hands out at most max bytes per Read and follows the
// protocol's framing (type byte, length) of what it reads, so it can count
// reads interrupted (by a deadline) in the middle of a message.
type framedConn struct {
	net.Conn
	max  int
	hdr  []byte // header bytes of the message being read
	body int    // body bytes of it still to come
	mid  atomic.Int64
}

func (c *framedConn) Read(p []byte) (int, error) {
	if len(p) > c.max {
		p = p[:c.max]
	}
	n, err := c.Conn.Read(p)
	for b := p[:n]; len(b) > 0; {
		if c.body > 0 {
			k := min(c.body, len(b))
			c.body -= k
			b = b[k:]
			continue
		}
		k := min(5-len(c.hdr), len(b))
		c.hdr = append(c.hdr, b[:k]...)
		b = b[k:]
		if len(c.hdr) == 5 {
			c.body = int(binary.BigEndian.Uint32(c.hdr[1:])) - 4
			c.hdr = c.hdr[:0]
		}
	}
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() && (len(c.hdr) > 0 || c.body > 0) {
		c.mid.Add(1)
	}
	return n, err
}

// TestInterruptedWaitKeepsConnection checks what the hub relies on in
// pgx v5: with the listener's configuration, a WaitForNotification whose
// context ends interrupts only the read, also in the middle of a
// notification, keeps what was read, and leaves the connection usable for
// commands and later waits; notifications received during a command come
// through OnNotification in order.
func TestInterruptedWaitKeepsConnection(t *testing.T) {
	cl := pgtest.Require(t)
	ctx := testCtx(t)
	cc, err := pgx.ParseConfig(cl.DSN(appUser, appPW, appDB))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got []string
	)
	cfg := listenerConfig(cc, time.Second, func(_ *pgconn.PgConn, n *pgconn.Notification) {
		mu.Lock()
		got = append(got, n.Payload)
		mu.Unlock()
	})
	var fc *framedConn
	cfg.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, c net.Conn) (net.Conn, error) {
		fc = &framedConn{Conn: c, max: 100}
		return fc, nil
	}
	pgc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pgc.Close(context.Background())
	if err := pgc.Exec(ctx, `LISTEN "wait"`).Close(); err != nil {
		t.Fatal(err)
	}

	const count = 400
	rng := rand.New(rand.NewSource(3))
	want := make([]string, count)
	for i := range want {
		want[i] = fmt.Sprintf("%04d %s", i, randomText(rng, 7000+rng.Intn(990)))
	}
	snd := sender(t, appDB)
	sendErr := make(chan error, 1)
	go func() {
		for i := 0; i < count; i += 4 {
			b := &pgx.Batch{}
			for _, p := range want[i:min(i+4, count)] {
				b.Queue("SELECT pg_notify('wait', $1)", p)
			}
			if err := snd.SendBatch(ctx, b).Close(); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()

	var interrupted, commands int
	for i := 0; ; i++ {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= count {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("got %d of %d notifications", n, count)
		}
		if i%50 == 49 {
			commands++
			if err := pgc.Exec(ctx, barrierSQL).Close(); err != nil {
				t.Fatalf("command after interrupted waits: %v", err)
			}
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, time.Duration(rng.Intn(300))*time.Microsecond)
		err := pgc.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
		case !pgc.IsClosed() && (errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)):
			interrupted++
		default:
			t.Fatalf("wait: %v (closed: %v)", err, pgc.IsClosed())
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("notification %d: got %q, want %q", i, short(got[i]), short(want[i]))
			}
		}
		t.Fatalf("got %d notifications, want %d", len(got), len(want))
	}
	mid := fc.mid.Load()
	t.Logf("%d waits interrupted, %d of them in the middle of a message; %d commands between", interrupted, mid, commands)
	if mid == 0 {
		t.Fatal("no wait was interrupted in the middle of a message: the test did not test that")
	}
	if pgc.ParameterStatus("application_name") != ApplicationName {
		t.Errorf("application_name %q", pgc.ParameterStatus("application_name"))
	}
}
