package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/bgtask"
	"github.com/lockpool/lockpool/lease"
	"github.com/lockpool/lockpool/proxy/local"
)

// LeaseStore is what the lease kind needs from the lease package
// (local.LeaseStore).
type LeaseStore = local.LeaseStore

// LeaseSession is one client session's leases (local.LeaseSession).
type LeaseSession = local.LeaseSession

// LeaseRow is one row of lease_list() (local.LeaseRow).
type LeaseRow = local.LeaseRow

// leaseAdapter serves LeaseStore from the lease package.
type leaseAdapter struct{ st *lease.Store }

type leaseSessionAdapter struct{ ss *lease.Session }

func (a leaseAdapter) NewSession(database string, id uint64) LeaseSession {
	return leaseSessionAdapter{a.st.NewSession(database, id)}
}
func (a leaseAdapter) Schema() string { return a.st.Schema() }
func (a leaseAdapter) Close()         { a.st.Close() }

func (l leaseSessionAdapter) Acquire(ctx context.Context, name string, ttl, wait time.Duration) (int64, bool, error) {
	return l.ss.Acquire(ctx, name, ttl, wait)
}
func (l leaseSessionAdapter) Renew(ctx context.Context, name string) (bool, error) {
	return l.ss.Renew(ctx, name)
}
func (l leaseSessionAdapter) Release(ctx context.Context, name string) (bool, error) {
	return l.ss.Release(ctx, name)
}
func (l leaseSessionAdapter) TakeWarnings() []string    { return l.ss.TakeWarnings() }
func (l leaseSessionAdapter) Close(ctx context.Context) { l.ss.Close(ctx) }
func (l leaseSessionAdapter) List(ctx context.Context) ([]LeaseRow, error) {
	rows, err := l.ss.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]LeaseRow, len(rows))
	for i, r := range rows {
		out[i] = LeaseRow{Name: r.Name, Holder: r.Holder, Token: r.Token, TakenAt: r.TakenAt, ExpiresAt: r.ExpiresAt, Mine: r.Mine}
	}
	return out, nil
}

// newLeaseStore builds the lease store lockpool serves lease_* from. Its
// connections log in as the first application user configured for the
// database (or any database).
func newLeaseStore(cfg *config.Config, current func() *config.Config, mon *hosts.Monitor, keys scramKeysFunc, tasks *bgtask.Set, log *slog.Logger, reg prometheus.Registerer) (LeaseStore, error) {
	st, err := lease.New(lease.Options{
		Schema:         cfg.Leases.Schema,
		MaxConnections: cfg.Leases.MaxConnections,
		InstanceID:     cfg.InstanceID,
		Logger:         log,
		Registerer:     reg,
		ConnConfig:     ownConnConfig(cfg, current, mon, keys),
		RenewTask:      tasks.Task(bgtask.LeaseRenewal),
		ListenTask:     tasks.Task(bgtask.LeaseListen),
	})
	if err != nil {
		return nil, err
	}
	return leaseAdapter{st}, nil
}

// ownConnConfig returns the pgx config of lockpool's own connections
// (leases, held advisory locks, LISTEN, the cluster) to a database: they
// log in as the first application user configured for the database (or any
// database). The server's address and TLS are started's (keys a reload
// does not apply); the user, its password and connect_timeout are those
// of the configuration in force, current(), so that a reload that changes
// a password reaches these connections too. A user with a SCRAM verifier
// only logs in with the keys a client's login proved (ownAuth).
//
// With server.hosts they go to the primary the monitor follows (routeOwn).
func ownConnConfig(started *config.Config, current func() *config.Config, mon *hosts.Monitor, keys scramKeysFunc) func(database string) (*pgx.ConnConfig, error) {
	return func(database string) (*pgx.ConnConfig, error) {
		cfg := current()
		var app *config.Application
		for i := range cfg.Applications {
			a := &cfg.Applications[i]
			if a.Database == database || (app == nil && a.Database == "") {
				app = a
				if a.Database == database {
					break
				}
			}
		}
		if app == nil {
			return nil, fmt.Errorf("lockpool: no application is configured for database %q", database)
		}
		pc, err := pgx.ParseConfig(serverTLSConnString(started))
		if err != nil {
			return nil, err
		}
		pc.Host = started.Server.Host
		pc.Port = uint16(started.Server.Port)
		pw := ""
		if u, ok := cfg.UserByName(app.User); ok {
			pw = u.Password
		}
		ownAuth(&pc.Config, app.User, pw, keys)
		pc.Database = database
		pc.ConnectTimeout = cfg.Server.ConnectTimeout
		routeOwn(&pc.Config, mon, started.Server)
		return pc, nil
	}
}

// newLockManager builds the holder of advisory_locks: hold. Its lock
// connections log in as lockpool's lease connections do (ownConnConfig).
func newLockManager(cfg *config.Config, current func() *config.Config, mon *hosts.Monitor, keys scramKeysFunc, log *slog.Logger) (*advisory.Manager, error) {
	return advisory.New(advisory.Options{
		MaxConnections: cfg.Locks.MaxConnections,
		MaxWaiters:     cfg.Locks.MaxWaiters,
		ConnConfig:     ownConnConfig(cfg, current, mon, keys),
		Logger:         log,
	})
}
