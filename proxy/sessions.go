package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/proxy/session"
)

// The server's side of its sessions: what package session asks of the
// server (session.Host, served by sessionHost), the key-pid signals it
// carries out for them and the pg_stat_activity view they read.

// sessionHost is the Server as its sessions' session.Host.
type sessionHost struct{ s *Server }

func (h sessionHost) Config() *config.Config            { return h.s.rc.Load().cfg }
func (h sessionHost) HandedOff() bool                   { return h.s.handedOff.Load() }
func (h sessionHost) Unregister(ss *session.Session)    { h.s.unregister(ss) }
func (h sessionHost) Ended(ss *session.Session)         { h.s.sessionEnded(ss) }
func (h sessionHost) Unadmit(as *appstate.App)          { h.s.unadmit(as) }
func (h sessionHost) KeyPIDLive(pid uint32) bool        { return h.s.keyPIDLive(pid) }
func (h sessionHost) ActivityView(caller uint32) string { return h.s.activityView(caller) }

// Signal sends the request to the instance whose number pid carries, or
// carries it out here.
func (h sessionHost) Signal(ctx context.Context, pid uint32, terminate bool, timeout time.Duration, user string, admin bool) (local.SignalResult, error) {
	r := signalRequest{pid: pid, terminate: terminate, timeout: timeout, user: user, admin: admin}
	if n := pidNumber(pid); n != 0 && h.s.cluster != nil && n != h.s.cluster.Number() {
		return h.s.forwardSignal(ctx, n, r)
	}
	return h.s.signalClient(ctx, r), nil
}

// signalRequest is one pg_terminate_backend or pg_cancel_backend of a key
// pid, as the calling session asks it (or another instance of the cluster
// on its behalf, clustersignal.go).
type signalRequest struct {
	pid       uint32
	terminate bool          // pg_terminate_backend, else pg_cancel_backend
	timeout   time.Duration // terminate: how long to wait for the client to end (0: no wait)
	user      string        // the caller's login user
	admin     bool          // the caller's user is in admin_users
}

// allows reports whether the caller may signal a client that logged in as
// user.
func (r signalRequest) allows(user string) bool { return r.admin || r.user == user }

// activityView is the parenthesised query that stands for
// pg_stat_activity (activityViewSQL), as of now.
func (s *Server) activityView(caller uint32) string {
	idle := s.pool.IdleConns()
	pids := make([]uint32, len(idle))
	for i, c := range idle {
		pids[i] = c.PID
	}
	return activityViewSQL(pids, s.clients(), caller)
}

// keyPIDLive reports whether pid is the key pid of a client of this
// instance, or carries the number of another live instance of the cluster
// (which may or may not serve such a client).
func (s *Server) keyPIDLive(pid uint32) bool {
	if n := pidNumber(pid); n != 0 && s.cluster != nil && n != s.cluster.Number() {
		_, ok := s.cluster.PeerInfo(n)
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[pid]
	return ok
}

// signalClient carries out r for a client of this instance, whose key pid
// is not the caller's own: a terminate kills the session and, with a
// timeout, waits for it to have ended; a cancel is the cancel request of
// its key.
func (s *Server) signalClient(ctx context.Context, r signalRequest) local.SignalResult {
	s.mu.Lock()
	t := s.sessions[r.pid]
	switch {
	case t == nil:
		s.mu.Unlock()
		return local.SignalNoClient
	case !r.allows(t.User()):
		s.mu.Unlock()
		return local.SignalDenied
	}
	var ended chan struct{}
	if r.terminate && r.timeout > 0 {
		// Made while t is registered: its sessionEnded has not run yet.
		ended = s.watchEndLocked(t)
	}
	s.mu.Unlock()
	if !r.terminate {
		s.cancelSession(t.PID(), t.Secret())
		return local.SignalSent
	}
	s.log.Info("pg_terminate_backend: client terminated", "client", t.Remote(), "id", t.PID(), "app", t.App().Name, "by_user", r.user)
	t.Kill(local.ErrTerminated())
	if ended == nil {
		return local.SignalSent
	}
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	select {
	case <-ended:
		return local.SignalSent
	case <-timer.C:
		return local.SignalStillRunning
	case <-ctx.Done():
		return local.SignalCanceled
	}
}

// watchEndLocked returns a channel closed when ss has ended and cleaned up
// (sessionEnded); s.mu is held and ss registered.
func (s *Server) watchEndLocked(ss *session.Session) chan struct{} {
	if s.ends == nil {
		s.ends = make(map[*session.Session]chan struct{})
	}
	ch := s.ends[ss]
	if ch == nil {
		ch = make(chan struct{})
		s.ends[ss] = ch
	}
	return ch
}

// sessionEnded runs at the end of a session's cleanup: whoever waits for
// it to end (watchEndLocked) is told.
func (s *Server) sessionEnded(ss *session.Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.ends[ss]; ch != nil {
		close(ch)
		delete(s.ends, ss)
	}
}

// activityViewSQL is the parenthesised query that stands for
// pg_stat_activity (package session: activity.go), given the pids of the server's
// idle pooled connections and its clients; caller is the key pid of the
// client whose statement reads it.
func activityViewSQL(idle []uint32, clients []session.ClientView, caller uint32) string {
	var b strings.Builder
	b.WriteString("(SELECT a.* FROM pg_catalog.pg_stat_activity a")
	if len(idle) > 0 {
		// The statement runs on one of them, taken from the pool after
		// this text was made: its own row stays.
		b.WriteString(" WHERE a.pid = pg_catalog.pg_backend_pid() OR a.pid <> ALL ('{")
		for i, c := range idle {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, c)
		}
		b.WriteString("}'::pg_catalog.int4[])")
	}
	n := 0
	for _, c := range clients {
		if c.Link.Attached || c.ID == caller {
			continue // the caller's row is its server connection's
		}
		if n == 0 {
			b.WriteString(" UNION ALL SELECT * FROM pg_catalog.jsonb_populate_recordset(NULL::pg_catalog.pg_stat_activity, " +
				"(SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('datid', d.oid, 'datname', c.datname, 'pid', c.pid, " +
				"'usesysid', r.oid, 'usename', c.usename) || CASE WHEN r.oid IS NOT NULL AND (pg_catalog.pg_has_role(r.oid, 'USAGE') OR " +
				"pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')) THEN pg_catalog.jsonb_build_object('client_addr', c.addr, " +
				"'client_port', c.port, 'backend_start', c.started, 'backend_type', 'client backend', 'state', c.state, 'query', '') " +
				"ELSE '{\"query\": \"<insufficient privilege>\"}' END ORDER BY c.pid) FROM (VALUES ")
		} else {
			b.WriteString(", ")
		}
		n++
		state := "idle"
		if c.Link.Waiting {
			state = "active"
		}
		addr, port := "NULL", "-1" // a Unix socket, as PostgreSQL shows it
		if ip := net.ParseIP(c.Addr); ip != nil {
			addr, port = backend.EscapedLiteral(ip.String()), fmt.Sprint(c.Port)
		}
		fmt.Fprintf(&b, "(%d, %s, %s, %s::pg_catalog.inet, %s, pg_catalog.to_timestamp(%d / 1e6), %s)",
			c.ID, backend.EscapedLiteral(c.Database), backend.EscapedLiteral(c.User), addr, port, c.Connected.UnixMicro(), backend.EscapedLiteral(state))
	}
	if n > 0 {
		b.WriteString(") c(pid, datname, usename, addr, port, started, state) " +
			"LEFT JOIN pg_catalog.pg_roles r ON r.rolname = c.usename LEFT JOIN pg_catalog.pg_database d ON d.datname = c.datname))")
	}
	b.WriteByte(')')
	return b.String()
}
