package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/pool"
)

// newHostMonitor returns the monitor of server.hosts, or nil when the
// configuration names its one server with host and port (then lockpool
// dials it as it is, whatever its role). onChange runs after every change
// the monitor finds (the Server's onHostChange).
func newHostMonitor(cfg *config.Config, keys scramKeysFunc, log *slog.Logger, reg prometheus.Registerer, onChange func(hosts.Change)) (*hosts.Monitor, error) {
	if cfg.Server.HostList == "" {
		return nil, nil
	}
	srv := cfg.Server
	dialer := hosts.Dialer(srv.TCPUserTimeout)
	return hosts.New(hosts.Options{
		Hosts:       srv.Hosts(),
		Interval:    srv.HealthCheckInterval,
		Timeout:     srv.ConnectTimeout,
		UserTimeout: srv.TCPUserTimeout,
		OnChange:    onChange,
		Logger:      log,
		Registerer:  reg,
		Connect: func(ctx context.Context, addr config.HostAddr) (*pgconn.PgConn, error) {
			pc, err := pgconn.ParseConfig(serverTLSConnString(cfg))
			if err != nil {
				return nil, err
			}
			pc.Host, pc.Port = addr.Host, uint16(addr.Port)
			user, pw, db := ownLogin(cfg)
			ownAuth(pc, user, pw, keys)
			pc.Database = db
			pc.ConnectTimeout = srv.ConnectTimeout
			pc.RuntimeParams = map[string]string{"application_name": "lockpool-health"}
			pc.DialFunc = dialer.DialContext
			return pgconn.ConnectConfig(ctx, pc)
		},
	})
}

// ownLogin is lockpool's own login for its checks: the first application
// user with a plaintext password, else the auth_query role, else the first
// application's user (with its verifier: see ownAuth).
func ownLogin(cfg *config.Config) (user, password, database string) {
	user, database = cfg.Applications[0].User, cfg.Applications[0].Database
	found := false
	for _, a := range cfg.Applications {
		if u, ok := cfg.UserByName(a.User); ok && u.Password != "" && !strings.HasPrefix(u.Password, "SCRAM-SHA-256$") {
			user, password, database, found = a.User, u.Password, a.Database, true
			break
		}
	}
	if !found && cfg.AuthQuery != nil && cfg.AuthQuery.Password != "" {
		user, password, database = cfg.AuthQuery.User, cfg.AuthQuery.Password, cfg.AuthQuery.Database
	}
	if database == "" {
		database = user
	}
	return user, password, database
}

// routeOwn makes one of lockpool's own connections (leases, held locks,
// LISTEN, the cluster, the health probe, auth_query) go to the primary the
// monitor follows: dialed there (waiting for one within the connect
// timeout), checked not to be in recovery at login, and closed when that
// host stops being the primary. Without a monitor it keeps pc's host.
func routeOwn(pc *pgconn.Config, mon *hosts.Monitor, srv config.Server) {
	if mon == nil {
		pc.DialFunc = hosts.Dialer(srv.TCPUserTimeout).DialContext
		return
	}
	pc.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	pc.DialFunc = mon.DialPrimary
	pc.ValidateConnect = mon.ValidatePrimary
	pc.Fallbacks = nil
	if a, ok := mon.KnownPrimary(); ok {
		pc.Host, pc.Port = a.Host, uint16(a.Port) // the name TLS checks
	}
}

// onHostChange is the monitor's OnChange: connections the change made
// unusable are closed (held locks on the old primary are lost with
// lockpool's lock connections, which the monitor closed already, and their
// holders were told before any new lock connection could be dialled).
func (s *Server) onHostChange(ch hosts.Change) {
	if s.pool != nil {
		s.pool.Revalidate()
	}
}

// scramKeysFunc returns the SCRAM pass-through keys learned for a user
// from a client's login (Server.scramKeys).
type scramKeysFunc func(user string) (pool.SCRAMKeys, bool)

// ownAuth sets how one of lockpool's own connections logs in as user: with
// password when it is one, else (a SCRAM verifier, or none configured)
// answering the server's SCRAM request with the keys a client's SCRAM
// login as user proved. Before any client has logged in as user, such a
// login fails with an error that says so.
func ownAuth(pc *pgconn.Config, user, password string, keys scramKeysFunc) {
	pc.User = user
	if password != "" && !strings.HasPrefix(password, "SCRAM-SHA-256$") {
		pc.Password = password
		return
	}
	pc.Password = ""
	next := pc.AfterNetConnect
	pc.AfterNetConnect = func(ctx context.Context, cfg *pgconn.Config, nc net.Conn) (net.Conn, error) {
		if next != nil {
			var err error
			if nc, err = next(ctx, cfg, nc); err != nil {
				return nil, err
			}
		}
		return pool.PassThroughLogin(nc, func() (pool.SCRAMKeys, error) {
			if k, ok := keys(user); ok {
				return k, nil
			}
			return pool.SCRAMKeys{}, fmt.Errorf("lockpool: user %q is configured with a SCRAM verifier, not a password, and no client has logged in as it yet: "+
				"lockpool's own connections log in with what a client's SCRAM login proves (give the user a password for them to work before that)", user)
		}), nil
	}
}
