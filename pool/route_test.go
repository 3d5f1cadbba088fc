package pool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// TestDialRacingRoleChange: the monitor's check that finds the host a
// standby comes while a connection for target primary is being dialed to
// it (a switchover restarted the old primary as a standby within the last
// check interval). The new connection's in_hot_standby then agrees with
// the monitor's new view, but it was routed as the primary in a
// generation of the host that is gone: it must not be handed out, or the
// client's transaction runs on a standby. With no primary left, Acquire
// waits and then fails.
func TestDialRacingRoleChange(t *testing.T) {
	pc := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := pc.StartStandby(ctx, pgtest.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	addr := config.HostAddr{Host: sb.Host, Port: sb.Port}

	// The monitor's checks of addr reach the primary until stale is
	// cleared: it takes the standby for a primary, as it would when its
	// last check came before a switchover.
	var stale atomic.Bool
	stale.Store(true)
	var current atomic.Pointer[Manager] // the pool, once made; the monitor's OnChange runs on its own goroutine
	mon, err := hosts.New(hosts.Options{
		Hosts:    []config.HostAddr{addr},
		Interval: time.Hour, // checks only when asked
		Timeout:  5 * time.Second,
		Connect: func(ctx context.Context, a config.HostAddr) (*pgconn.PgConn, error) {
			c := sb
			if stale.Load() {
				c = pc
			}
			return pgconn.Connect(ctx, c.SuperuserDSN("postgres")+" application_name=pool_route_test_check")
		},
		OnChange: func(hosts.Change) {
			if m := current.Load(); m != nil {
				m.Revalidate()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mon.Start()
	defer mon.Close()
	if p, err := mon.Primary(ctx); err != nil || p != addr {
		t.Fatalf("monitor's primary = %v, %v; want %v", p, err, addr)
	}

	server := config.Server{Host: sb.Host, Port: sb.Port, MaxConnections: 5, IdleTimeout: time.Hour, MaxLifetime: time.Hour, ConnectTimeout: 5 * time.Second}
	apps := []AppConfig{{Name: "app", User: pgRole, Password: pgPassword, MaxConnections: 2, WaitTimeout: time.Second,
		Target: hosts.Target{Kind: config.TargetPrimary}}}
	m, err := New(Options{Server: server, Apps: apps, Hosts: mon, janitorInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	current.Store(m)

	// The first dial was routed to addr as the primary; before it
	// connects, the monitor checks again and finds the standby.
	var gated atomic.Int32
	m.DialGate(func(string) (time.Time, error) {
		if gated.Add(1) == 1 {
			stale.Store(false)
			// End the check connection to the primary: the next check
			// connects again, and reaches the standby.
			if err := pc.Exec(ctx, "postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pool_route_test_check'"); err != nil {
				t.Error(err)
			}
			mon.CheckNow()
			for mon.Hosts()[0].Status().Role != hosts.RoleStandby {
				if ctx.Err() != nil {
					t.Error("the monitor never found the standby")
					break
				}
				time.Sleep(time.Millisecond) // a test's gate may block
			}
		}
		return time.Time{}, nil
	})
	c, err := m.Acquire(ctx, "app", pgDB)
	if err == nil {
		rows, qerr := query(t, c, "SELECT pg_is_in_recovery()::text")
		m.Release(c)
		if qerr != nil || len(rows) != 1 || rows[0] != "false" {
			t.Fatalf("Acquire for target primary handed out a connection to a standby (pg_is_in_recovery %v, %v)", rows, qerr)
		}
		t.Fatal("Acquire found a primary where there is none")
	}
	t.Logf("Acquire: %v (after %d dial attempts)", err, gated.Load())
}

// TestPromotedStandbyKeepsSessions: a transaction of a target standby
// application is open on the standby when the primary stops and the
// standby is promoted. As on a direct connection to the standby, it goes
// on and commits: the pool does not end it, though the host changed role.
// Once back, the connection is closed (the host is no standby any more),
// and the next Acquire for target standby finds none and fails with 53300.
func TestPromotedStandbyKeepsSessions(t *testing.T) {
	pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pc, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Destroy()
	if err := pc.CreateRole(ctx, pgRole, pgPassword); err != nil {
		t.Fatal(err)
	}
	if err := pc.CreateDatabase(ctx, pgDB, pgRole); err != nil {
		t.Fatal(err)
	}
	sb, err := pc.StartStandby(ctx, pgtest.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	primary := config.HostAddr{Host: pc.Host, Port: pc.Port}
	standby := config.HostAddr{Host: sb.Host, Port: sb.Port}

	var current atomic.Pointer[Manager] // the pool, once made; the monitor's OnChange runs on its own goroutine
	mon, err := hosts.New(hosts.Options{
		Hosts:    []config.HostAddr{primary, standby},
		Interval: 50 * time.Millisecond,
		Timeout:  2 * time.Second,
		Connect: func(ctx context.Context, a config.HostAddr) (*pgconn.PgConn, error) {
			c := pc
			if a == standby {
				c = sb
			}
			return pgconn.Connect(ctx, c.SuperuserDSN("postgres"))
		},
		OnChange: func(hosts.Change) {
			if m := current.Load(); m != nil {
				m.Revalidate()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mon.Start()
	defer mon.Close()
	if p, err := mon.Primary(ctx); err != nil || p != primary {
		t.Fatalf("monitor's primary = %v, %v; want %v", p, err, primary)
	}

	server := config.Server{Host: pc.Host, Port: pc.Port, MaxConnections: 5, IdleTimeout: time.Hour, MaxLifetime: time.Hour, ConnectTimeout: 5 * time.Second}
	apps := []AppConfig{{Name: "reads", User: pgRole, Password: pgPassword, MaxConnections: 2, WaitTimeout: 500 * time.Millisecond,
		Target: hosts.Target{Kind: config.TargetStandby, MaxLag: time.Hour}}}
	m, err := New(Options{Server: server, Apps: apps, Hosts: mon, janitorInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	current.Store(m)

	c, err := m.Acquire(ctx, "reads", pgDB)
	if err != nil {
		t.Fatal(err)
	}
	if rows, status, err := exchange(t, c, "BEGIN; SELECT pg_is_in_recovery()::text"); err != nil || status != 'T' || len(rows) != 1 || rows[0] != "true" {
		t.Fatalf("BEGIN on the standby: %v %c %v", rows, status, err)
	}

	if err := pc.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		if p, ok := mon.KnownPrimary(); ok && p == standby {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the monitor never found the promoted standby")
		case <-time.After(10 * time.Millisecond):
		}
	}
	m.Revalidate() // as the monitor's OnChange does, now for certain

	rows, status, err := exchange(t, c, "SELECT pg_is_in_recovery()::text")
	if err != nil || status != 'T' || len(rows) != 1 || rows[0] != "false" {
		t.Fatalf("the transaction on the promoted standby: %v %c %v; want false in a transaction", rows, status, err)
	}
	if _, status, err := exchange(t, c, "COMMIT"); err != nil || status != 'I' {
		t.Fatalf("COMMIT: %c %v", status, err)
	}
	if c.Retired() {
		t.Fatal("the connection was retired")
	}
	m.Release(c)

	_, err = m.Acquire(ctx, "reads", pgDB)
	var pe *pgerr.Error
	if !errors.As(err, &pe) || pe.Code != pgerr.TooManyConnections {
		t.Fatalf("Acquire for target standby with no standby: %v; want 53300", err)
	}
}

// TestQueuedDialFollowsPrimary: with one dial at a time
// (server.dial_concurrency 1), a dial to the primary hangs (the host
// stopped answering) while a second client's dial, routed to the same
// primary, waits for its turn. Meanwhile another host becomes the primary.
// When its turn comes, the second dial goes to the new primary, not to the
// host it was routed to before the wait: a dial slot can take
// connect_timeout per dial ahead, and a client must not spend that again on
// a host lockpool has given up.
func TestQueuedDialFollowsPrimary(t *testing.T) {
	pc := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := config.HostAddr{Host: "127.0.0.1", Port: 1}
	b := config.HostAddr{Host: "127.0.0.1", Port: 2}
	var primary atomic.Pointer[config.HostAddr] // the host whose checks reach PostgreSQL; the other's are refused
	primary.Store(&a)
	mon, err := hosts.New(hosts.Options{
		Hosts:    []config.HostAddr{a, b},
		Interval: 20 * time.Millisecond,
		Timeout:  5 * time.Second,
		Connect: func(ctx context.Context, h config.HostAddr) (*pgconn.PgConn, error) {
			if h != *primary.Load() {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			return pgconn.Connect(ctx, pc.SuperuserDSN("postgres")+" application_name=pool_queued_dial_check")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mon.Start()
	defer mon.Close()
	if p, err := mon.Primary(ctx); err != nil || p != a {
		t.Fatalf("monitor's primary = %v, %v; want %v", p, err, a)
	}

	server := srv(5)
	server.DialConcurrency = 1
	api := app("api", 4, 1, 5*time.Second)
	api.Target = hosts.Target{Kind: config.TargetPrimary}
	f := newFakeServer()
	m, err := New(Options{Server: server, Apps: []AppConfig{api}, Hosts: mon, Dial: f.dial, janitorInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var mu sync.Mutex
	var dialed []int               // the port of every dial, in order
	hung := make(chan struct{})    // the first dial is under way
	release := make(chan struct{}) // ends the first dial
	m.dial = func(ctx context.Context, s config.Server, app AppConfig, db string) (*Conn, error) {
		mu.Lock()
		dialed = append(dialed, s.Port)
		first := len(dialed) == 1
		mu.Unlock()
		if first {
			close(hung)
			<-release
			return nil, fmt.Errorf("dial tcp %s: %w", s.Host, os.ErrDeadlineExceeded)
		}
		return f.dial(ctx, app, db)
	}

	type result struct {
		c   *Conn
		err error
	}
	results := make(chan result, 2)
	acquire := func() {
		c, err := m.Acquire(ctx, "api", "db")
		results <- result{c, err}
	}
	go acquire()
	<-hung
	go acquire() // routed to a, then waits for the dial slot
	for m.Stats("api").Dialing < 2 {
		if ctx.Err() != nil {
			t.Fatal("the second Acquire never began its dial")
		}
		time.Sleep(time.Millisecond) // polling the pool's state
	}
	primary.Store(&b)
	// End a's check connection: its next check connects again, and is
	// refused.
	if err := pc.Exec(ctx, "postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pool_queued_dial_check'"); err != nil {
		t.Fatal(err)
	}
	for {
		if p, ok := mon.KnownPrimary(); ok && p == b {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the monitor never found the new primary")
		}
		time.Sleep(5 * time.Millisecond) // polling the monitor's state
	}
	close(release)
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		m.Release(r.c)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) < 2 || dialed[0] != a.Port {
		t.Fatalf("dials to ports %v, want the first to %d", dialed, a.Port)
	}
	for _, p := range dialed[1:] {
		if p != b.Port {
			t.Errorf("dials to ports %v: a dial after the primary changed went to the old one (%d), want the new one (%d)", dialed, a.Port, b.Port)
			break
		}
	}
}
