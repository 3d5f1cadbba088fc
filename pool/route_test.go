package pool

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
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
	var m *Manager
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
			if m != nil {
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
	m, err = New(Options{Server: server, Apps: apps, Hosts: mon, janitorInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

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
