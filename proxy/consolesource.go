package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/cluster"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/lease"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/proxy/console"
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
	ss.kill(why)
	return ss.remote, true
}

// Applications returns the configured applications, in configuration
// order, with their logged-in clients and traffic counters.
func (s *Server) Applications() []console.Application {
	rc := s.rc.Load()
	out := make([]console.Application, 0, len(rc.cfg.Applications))
	for _, a := range rc.cfg.Applications {
		r := console.Application{Config: a}
		if as := rc.apps[a.Name]; as != nil {
			st := as.stats
			r.Clients = as.clientCount.Load()
			r.Traffic = console.Traffic{Since: st.since, Xacts: st.xacts.Load(), Queries: st.queries.Load(),
				Received: st.received.Load(), Sent: st.sent.Load()}
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
		out = append(out, console.Client{ID: c.id, App: c.app.cfg, User: c.user, Database: c.database, Remote: c.remote,
			Addr: c.clientAddr, Port: c.clientPort, Connected: c.connected, TLS: c.tls, State: c.state,
			Waiting: c.link.waiting, Attached: c.link.attached, BackendPID: c.link.backendPID,
			ServerDatabase: c.link.serverDB, ServerUser: c.link.serverUser, ServerCreated: c.link.serverCreated,
			Pinned: c.link.pinned, PinReason: c.link.pinReason, PinnedSince: c.link.pinnedSince})
	}
	return out
}

// clientSnapshot is one logged-in client as the admin console (Clients)
// and lockpool's pg_stat_activity (activity.go) see it.
type clientSnapshot struct {
	id                     uint32
	app                    *appState
	user, database, remote string
	connected              time.Time
	tls                    bool
	link                   linkAdmin
	clientAddr             string
	clientPort             int
	state                  string // active (holds a server connection), waiting (in lockpool) or idle
}

// linkAdmin is the part of a session's server link the views show.
type linkAdmin struct {
	waiting       bool
	attached      bool
	backendPID    uint32
	serverDB      string
	serverUser    string
	serverCreated time.Time
	pinned        bool
	pinReason     string
	pinnedSince   time.Time
}

// adminView reads the link under its lock.
func (l *serverLink) adminView() linkAdmin {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := linkAdmin{waiting: l.waiting, pinned: l.pinned, pinReason: l.pinReason, pinnedSince: l.pinnedSince}
	if l.sc != nil {
		v.attached, v.backendPID, v.serverDB, v.serverUser, v.serverCreated = true, l.sc.PID, l.sc.Database, l.sc.User, l.sc.Created()
	}
	return v
}

// clients returns every logged-in client, by id.
func (s *Server) clients() []clientSnapshot {
	s.mu.Lock()
	list := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	s.mu.Unlock()
	out := make([]clientSnapshot, 0, len(list))
	for _, ss := range list {
		c := clientSnapshot{id: ss.pid, app: ss.app, user: ss.user, database: ss.database, remote: ss.remote,
			connected: time.Unix(0, ss.connected), link: ss.link.adminView()}
		_, c.tls = ss.conn.(*tls.Conn)
		host, port, err := net.SplitHostPort(ss.remote)
		if err != nil {
			host = ss.remote
		}
		c.clientAddr = host
		c.clientPort, _ = strconv.Atoi(port)
		switch {
		case c.link.attached:
			c.state = "active"
		case c.link.waiting:
			c.state = "waiting"
		default:
			c.state = "idle"
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}
