package pgtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// wantTimeout fails t unless err is a timeout (not a reset, refusal or
// unreachable host) that took about d.
func wantTimeout(t *testing.T, what string, err error, took, d time.Duration) {
	t.Helper()
	var ne net.Error
	timeout := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
	for _, errno := range []syscall.Errno{syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		if errors.Is(err, errno) {
			timeout = false
		}
	}
	if err == nil || !timeout {
		t.Fatalf("%s while partitioned: %v, want a timeout", what, err)
	}
	if took < d*9/10 {
		t.Fatalf("%s while partitioned failed after %v, before its %v timeout: %v", what, took, d, err)
	}
}

// sslRequest is the 8-byte SSLRequest message; a server answers it with
// one byte ('N' here), which makes it a minimal request/response exchange.
func sslRequest() []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b[0:4], 8)
	binary.BigEndian.PutUint32(b[4:8], 80877103)
	return b
}

func TestPartition(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	c := RequireNetNS(t)
	t.Logf("%s at %s:%d started in %v", c.Name, c.Host, c.Port, c.StartupTime.Round(time.Millisecond))
	if !strings.HasPrefix(c.Host, "10.") || c.Port != 5432 {
		t.Fatalf("Host:Port = %s:%d, want 10.x.y.z:5432", c.Host, c.Port)
	}
	setupApp(t, ctx, c) // over TCP through the namespace's veth, SCRAM for app
	addr := net.JoinHostPort(c.Host, strconv.Itoa(c.Port))

	conn, err := pgx.Connect(ctx, c.DSN("app", "app pw", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()

	if err := c.Partition(); err != nil {
		t.Fatal(err)
	}
	const d = time.Second

	// An established connection: the query hangs until the deadline.
	qctx, cancel := context.WithTimeout(ctx, d)
	t0 := time.Now()
	_, err = conn.Exec(qctx, "SELECT 1")
	cancel()
	wantTimeout(t, "query on an open connection", err, time.Since(t0), d)

	// The same on a plain TCP connection, which survives the partition.
	if _, err := raw.Write(sslRequest()); err != nil {
		t.Fatalf("write while partitioned: %v", err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(d))
	t0 = time.Now()
	_, err = raw.Read(make([]byte, 1))
	wantTimeout(t, "read on an open connection", err, time.Since(t0), d)

	// A new connection: no answer at all, so the dial times out.
	t0 = time.Now()
	nc, err := net.DialTimeout("tcp", addr, d)
	if err == nil {
		nc.Close()
	}
	wantTimeout(t, "connect", err, time.Since(t0), d)

	// The unix socket, and so pgtest's own control, still works.
	if _, err := c.InRecovery(ctx); err != nil {
		t.Fatal(err)
	}

	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	// The request sent while partitioned arrives when TCP retransmits it,
	// and is answered on the same connection.
	_ = raw.SetReadDeadline(time.Now().Add(20 * time.Second))
	t0 = time.Now()
	b := make([]byte, 1)
	if _, err := raw.Read(b); err != nil || b[0] != 'N' {
		t.Fatalf("read after Heal: %q, %v", b, err)
	}
	t.Logf("answer on the old connection %v after Heal", time.Since(t0).Round(time.Millisecond))
	put(t, ctx, c, "INSERT INTO kv VALUES ('a', '1')")
	wantValue(t, ctx, c, "a", "1")

	// Partition and Heal again (Heal twice is fine), then Destroy removes
	// the namespace.
	for _, f := range []func() error{c.Partition, c.Heal, c.Heal} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	ns := c.ns.path()
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ns); !os.IsNotExist(err) {
		t.Fatalf("namespace %s still there: %v", ns, err)
	}
}

// socketExec runs sql in appdb over c's unix socket (which a partition
// does not cut): writes on an isolated primary.
func socketExec(t *testing.T, ctx context.Context, c *Cluster, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=appdb sslmode=disable", c.SocketDir, c.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

// TestNetNSFailover: a primary N in a namespace with standbys in the root
// namespace (R) and in a namespace (M); N is partitioned, keeps committing
// locally, M is promoted, R follows M, N is fenced, healed and rewound to
// follow M (namespace to namespace).
func TestNetNSFailover(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	n := RequireNetNS(t)
	setupApp(t, ctx, n)
	r := startStandby(t, ctx, n, StandbyOptions{})
	m := startStandby(t, ctx, n, StandbyOptions{NetNS: true})
	if r.Host != "127.0.0.1" || m.Host == n.Host || !strings.HasPrefix(m.Host, "10.") {
		t.Fatalf("hosts: primary %s, root standby %s, namespace standby %s", n.Host, r.Host, m.Host)
	}
	wantStreaming(t, ctx, n, r)
	wantStreaming(t, ctx, n, m)
	put(t, ctx, n, "INSERT INTO kv VALUES ('a', '1')")
	for _, s := range []*Cluster{r, m} {
		if err := n.WaitReplayed(ctx, s); err != nil {
			t.Fatal(err)
		}
		wantValue(t, ctx, s, "a", "1")
	}

	if err := n.Partition(); err != nil {
		t.Fatal(err)
	}
	socketExec(t, ctx, n, "INSERT INTO kv VALUES ('lost', 'x')")
	lsn, err := n.flushedLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Unpartitioned, this WAL would reach the standbys within milliseconds.
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	err = poll(wctx, "WAL to cross the partition", func(ctx context.Context) (bool, error) {
		var got bool
		err := m.adminQueryRow(ctx, "SELECT coalesce(pg_last_wal_receive_lsn() >= $1::pg_lsn, false)", []any{lsn}, &got)
		return got, err
	})
	cancel()
	if err == nil {
		t.Fatal("the standby received WAL from its partitioned primary")
	}

	if err := m.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, m, "INSERT INTO kv VALUES ('b', '2')")
	if err := r.Demote(ctx, m); err != nil { // root namespace -> namespace
		t.Fatal(err)
	}
	t.Logf("root standby follows the new primary (%s)", r.lastRejoin)

	if err := n.StopImmediate(); err != nil { // fence the old primary
		t.Fatal(err)
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := n.Demote(ctx, m); err != nil { // namespace -> namespace
		t.Fatal(err)
	}
	if n.lastRejoin != "pg_rewind" {
		t.Fatalf("old primary rejoined by %q, want pg_rewind\n%s", n.lastRejoin, n.rewindOutput)
	}
	wantStreaming(t, ctx, m, n)
	wantStreaming(t, ctx, m, r)
	put(t, ctx, m, "INSERT INTO kv VALUES ('c', '3')")
	for _, s := range []*Cluster{r, n} {
		if err := m.WaitReplayed(ctx, s); err != nil {
			t.Fatal(err)
		}
		wantMissing(t, ctx, s, "lost")
		wantValue(t, ctx, s, "b", "2")
		wantValue(t, ctx, s, "c", "3")
	}

	// Back: the root standby takes over, and the namespaces follow it at
	// the hub's root address.
	if err := m.Switchover(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := n.Demote(ctx, r); err != nil {
		t.Fatal(err)
	}
	wantStreaming(t, ctx, r, m)
	wantStreaming(t, ctx, r, n)

	// Teardown with a partitioned standby must not wait for it
	// (wal_sender_timeout): see how long the test's cleanup takes.
	if err := m.Partition(); err != nil {
		t.Fatal(err)
	}
}

// TestNetNSStandbyOfRootPrimary: a namespace cannot reach a cluster that
// listens on 127.0.0.1 only; StartStandby says so.
func TestNetNSStandbyOfRootPrimary(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	c := Require(t)
	s, err := c.StartStandby(ctx, StandbyOptions{NetNS: true})
	if errors.Is(err, ErrUnavailable) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err == nil {
		s.Destroy()
		t.Fatal("StartStandby in a namespace of a primary on 127.0.0.1 succeeded")
	}
	if !strings.Contains(err.Error(), "not reachable") {
		t.Fatalf("unexpected error: %v", err)
	}
}
