package proxy

import (
	"context"
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/cluster"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/lease"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/proxy/console"
	"github.com/lockpool/lockpool/proxy/session"
)

// *Server is the admin console's console.Source: the methods below are
// what the console's views read and its commands act through.

// AdminHandler serves the admin HTTP listener (console.Handler): /metrics
// (from g), /up, /health/ready, and under /debug/ the lock report, the
// admin console's views as JSON and Go's profiles.
func (s *Server) AdminHandler(g prometheus.Gatherer) http.Handler { return console.Handler(s, g) }

// StartedConfig returns the configuration New was given: what the
// listeners, TLS and the lease store keep using until a restart.
func (s *Server) StartedConfig() *config.Config { return s.started }

// ListenHub returns the shared listener connections (listen: shared).
func (s *Server) ListenHub() *listen.Hub { return s.hub }

// Cluster returns the coordinator of cluster budgets; nil without a
// cluster.
func (s *Server) Cluster() *cluster.Coordinator { return s.cluster }

// Hosts returns the monitor of server.hosts; nil with one host and port.
func (s *Server) Hosts() *hosts.Monitor { return s.hosts }

// HeldLocks lists the advisory locks lockpool holds for its clients on
// its lock connections (advisory_locks: hold), per client.
func (s *Server) HeldLocks() []advisory.ClientLocks { return s.locks.Snapshot() }

// heldLister is a lease store that can list its held leases (lockpool's
// own; a store given in Options may not).
type heldLister interface{ Held() []lease.HeldLease }

// HeldLeases lists the leases this instance's clients hold; nil when the
// lease store cannot list them.
func (s *Server) HeldLeases() []lease.HeldLease {
	hl, ok := s.leases.(heldLister)
	if !ok {
		return nil
	}
	return hl.Held()
}

// Held lists the leases of lockpool's own store.
func (a leaseAdapter) Held() []lease.HeldLease { return a.st.Held() }

// AdminQuery runs sql on lockpool's own connection (the health probe's)
// and returns its rows as text.
func (s *Server) AdminQuery(ctx context.Context, sql string) ([][]string, error) {
	return s.health.query(ctx, s, sql)
}

// Ready reports whether PostgreSQL answers SELECT 1 on lockpool's own
// connection.
func (s *Server) Ready(ctx context.Context) error { return s.health.check(ctx, s) }

// KillClient ends the session of client id (its backend pid) with the
// FATAL why, as shutdown ends a session, and returns the client's
// address; ok is false when no client has id.
func (s *Server) KillClient(id uint32, why *pgerr.Error) (remote string, ok bool) {
	s.mu.Lock()
	ss := s.sessions[id]
	s.mu.Unlock()
	if ss == nil {
		return "", false
	}
	ss.Kill(why)
	return ss.Remote(), true
}

// Applications returns the configured applications, in configuration
// order, with their logged-in clients and traffic counters.
func (s *Server) Applications() []console.Application {
	rc := s.rc.Load()
	out := make([]console.Application, 0, len(rc.cfg.Applications))
	for _, a := range rc.cfg.Applications {
		r := console.Application{Config: a}
		if as := rc.apps[a.Name]; as != nil {
			t := as.Traffic()
			r.Clients = as.Clients()
			r.Traffic = console.Traffic{Since: t.Since, Xacts: t.Xacts, Queries: t.Queries, Received: t.Received, Sent: t.Sent}
		}
		out = append(out, r)
	}
	return out
}

// Clients returns every logged-in client, by id.
func (s *Server) Clients() []console.Client {
	cs := s.clients()
	out := make([]console.Client, 0, len(cs))
	for _, c := range cs {
		out = append(out, console.Client{ID: c.ID, App: c.App, User: c.User, Database: c.Database, Remote: c.Remote,
			Addr: c.Addr, Port: c.Port, Connected: c.Connected, TLS: c.TLS, State: c.State,
			Waiting: c.Link.Waiting, Attached: c.Link.Attached, BackendPID: c.Link.BackendPID,
			ServerDatabase: c.Link.ServerDB, ServerUser: c.Link.ServerUser, ServerCreated: c.Link.ServerCreated,
			Pinned: c.Link.Pinned, PinReason: c.Link.PinReason, PinnedSince: c.Link.PinnedSince})
	}
	return out
}

// clients returns every logged-in client, by id.
func (s *Server) clients() []session.ClientView {
	s.mu.Lock()
	list := make([]*session.Session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	s.mu.Unlock()
	out := make([]session.ClientView, 0, len(list))
	for _, ss := range list {
		out = append(out, ss.View())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
