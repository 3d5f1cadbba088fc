package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/lease"
)

// The admin views: one function gathers each, and the admin console (SHOW
// …) and the admin HTTP listener (/debug/…) both show what it returns. A
// row type's json tags are the column names in both.

// adminView is one SHOW command and its /debug path.
type adminView struct {
	name string // SHOW <NAME> (upper case) and /debug/<name> (lower case)
	rows func(ctx context.Context) (any, error)
}

// adminViews lists the views in the order the console's help names them.
// SHOW LOCKS is served as /debug/locks by the existing handler, in its own
// nested form.
func (s *Server) adminViews() []adminView {
	return []adminView{
		{"POOLS", func(context.Context) (any, error) { return s.poolRows(), nil }},
		{"APPLICATIONS", func(context.Context) (any, error) { return s.applicationRows(), nil }},
		{"CLIENTS", func(context.Context) (any, error) { return s.clientRows(), nil }},
		{"SERVERS", func(context.Context) (any, error) { return s.serverRows(), nil }},
		{"PINS", func(ctx context.Context) (any, error) { return s.pinRows(ctx), nil }},
		{"LOCKS", func(ctx context.Context) (any, error) { return s.lockRows(ctx) }},
		{"LEASES", func(context.Context) (any, error) { return s.leaseRows(), nil }},
		{"LISTENERS", func(context.Context) (any, error) { return s.listenerRows(), nil }},
		{"STATS", func(context.Context) (any, error) { return s.statsRows(), nil }},
		{"CLUSTER", func(context.Context) (any, error) { return s.clusterRows(), nil }},
		{"CONFIG", func(context.Context) (any, error) { return s.Config().SettingsInForce(s.started), nil }},
		{"VERSION", func(context.Context) (any, error) { return []VersionRow{{Version: versionString()}}, nil }},
	}
}

// clientSnapshot is one logged-in client as the views see it.
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

// PoolRow is one line of SHOW POOLS and /debug/pools: an application's
// clients and server connections for one database.
type PoolRow struct {
	Database    string `json:"database"`
	User        string `json:"user"`
	Application string `json:"application"`
	ClActive    int    `json:"cl_active"`
	ClWaiting   int    `json:"cl_waiting"`
	ClIdle      int    `json:"cl_idle"`
	SvActive    int    `json:"sv_active"`
	SvIdle      int    `json:"sv_idle"`
	SvPinned    int    `json:"sv_pinned"`
	MaxWait     int64  `json:"maxwait"`
	MaxWaitUs   int64  `json:"maxwait_us"`
	PoolMode    string `json:"pool_mode"`
	Paused      bool   `json:"paused"`
}

// poolRows gathers SHOW POOLS: a row per application and database that has
// clients, idle server connections or waiters, and one per application
// with none of them (its configured database, or "*" for any).
func (s *Server) poolRows() []PoolRow {
	rc := s.rc.Load()
	type key struct{ app, db string }
	rows := map[key]*PoolRow{}
	row := func(a *appState, db string) *PoolRow {
		k := key{a.cfg.Name, db}
		r := rows[k]
		if r == nil {
			r = &PoolRow{Database: db, User: a.cfg.User, Application: a.cfg.Name, PoolMode: a.cfg.PoolMode, Paused: s.pool.Paused(a.cfg.Name)}
			rows[k] = r
		}
		return r
	}
	for _, c := range s.clients() {
		r := row(c.app, c.database)
		switch c.state {
		case "active":
			r.ClActive++
			if c.link.pinned {
				r.SvPinned++
			} else {
				r.SvActive++
			}
		case "waiting":
			r.ClWaiting++
		default:
			r.ClIdle++
		}
	}
	for _, a := range rc.cfg.Applications {
		as := rc.apps[a.Name]
		for _, d := range s.pool.DatabaseStats(a.Name) {
			r := row(as, d.Database)
			r.SvIdle = d.Idle
			r.MaxWait = int64(d.MaxWait / time.Second)
			r.MaxWaitUs = int64(d.MaxWait%time.Second) / 1000
		}
		has := false
		for k := range rows {
			has = has || k.app == a.Name
		}
		if !has {
			db := a.Database
			if db == "" {
				db = "*"
			}
			row(as, db)
		}
	}
	out := make([]PoolRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Application != out[j].Application {
			return out[i].Application < out[j].Application
		}
		return out[i].Database < out[j].Database
	})
	return out
}

// ApplicationRow is one line of SHOW APPLICATIONS and /debug/applications.
type ApplicationRow struct {
	Application           string `json:"application"`
	User                  string `json:"user"`
	Database              string `json:"database"`
	PoolMode              string `json:"pool_mode"`
	MaxConnections        int    `json:"max_connections"`
	Open                  int    `json:"open"`
	InUse                 int    `json:"in_use"`
	Idle                  int    `json:"idle"`
	Pinned                int    `json:"pinned"`
	MaxPinned             int    `json:"max_pinned"`
	Waiting               int    `json:"waiting"`
	PinWaiting            int    `json:"pin_waiting"`
	Clients               int64  `json:"clients"`
	MaxClients            int    `json:"max_clients"`
	AdvisoryLocks         string `json:"advisory_locks"`
	SessionState          string `json:"session_state"`
	WaitTimeout           string `json:"wait_timeout"`
	MaxPreparedStatements int    `json:"max_prepared_statements"`
	Paused                bool   `json:"paused"`
}

// applicationRows gathers SHOW APPLICATIONS, in configuration order.
func (s *Server) applicationRows() []ApplicationRow {
	rc := s.rc.Load()
	out := make([]ApplicationRow, 0, len(rc.cfg.Applications))
	for _, a := range rc.cfg.Applications {
		st := s.pool.Stats(a.Name)
		r := ApplicationRow{Application: a.Name, User: a.User, Database: a.Database, PoolMode: a.PoolMode,
			MaxConnections: a.MaxConnections, Open: st.Open, InUse: st.InUse, Idle: st.Idle, Pinned: st.Pinned,
			MaxPinned: a.MaxPinned, Waiting: st.Waiting, PinWaiting: st.PinWaiting, MaxClients: a.MaxClients,
			AdvisoryLocks: a.AdvisoryLocks, SessionState: a.SessionState, WaitTimeout: a.WaitTimeout.String(),
			MaxPreparedStatements: a.MaxPreparedStatements, Paused: s.pool.Paused(a.Name)}
		if as := rc.apps[a.Name]; as != nil {
			r.Clients = as.clientCount.Load()
		}
		out = append(out, r)
	}
	return out
}

// ClientRow is one line of SHOW CLIENTS and /debug/clients.
type ClientRow struct {
	ID          uint32    `json:"id"`
	User        string    `json:"user"`
	Database    string    `json:"database"`
	Application string    `json:"application"`
	State       string    `json:"state"`
	Addr        string    `json:"addr"`
	Port        int       `json:"port"`
	ConnectTime time.Time `json:"connect_time"`
	TLS         bool      `json:"tls"`
	BackendPID  *uint32   `json:"backend_pid"`
	Pinned      bool      `json:"pinned"`
	PinReason   string    `json:"pin_reason"`
}

// clientRows gathers SHOW CLIENTS, by id.
func (s *Server) clientRows() []ClientRow {
	cs := s.clients()
	out := make([]ClientRow, 0, len(cs))
	for _, c := range cs {
		r := ClientRow{ID: c.id, User: c.user, Database: c.database, Application: c.app.cfg.Name, State: c.state,
			Addr: c.clientAddr, Port: c.clientPort, ConnectTime: c.connected, TLS: c.tls,
			Pinned: c.link.pinned, PinReason: c.link.pinReason}
		if c.link.attached {
			pid := c.link.backendPID
			r.BackendPID = &pid
		}
		out = append(out, r)
	}
	return out
}

// ServerRow is one line of SHOW SERVERS and /debug/servers.
type ServerRow struct {
	// RemotePID is the server backend's pid, pg_backend_pid() on that
	// connection (PgBouncer's SHOW SERVERS calls it remote_pid too).
	RemotePID   uint32     `json:"remote_pid"`
	Application string     `json:"application"`
	User        string     `json:"user"`
	Database    string     `json:"database"`
	State       string     `json:"state"`
	ClientID    *uint32    `json:"client_id"`
	ClientAddr  string     `json:"client_addr"`
	ConnectTime time.Time  `json:"connect_time"`
	IdleSince   *time.Time `json:"idle_since"`
}

// serverRows gathers SHOW SERVERS: the connections clients hold (active or
// pinned), then the idle ones. Connections being dialed, checked or closed
// are not listed.
func (s *Server) serverRows() []ServerRow {
	var out []ServerRow
	for _, c := range s.clients() {
		if !c.link.attached {
			continue
		}
		id := c.id
		st := "active"
		if c.link.pinned {
			st = "pinned"
		}
		out = append(out, ServerRow{RemotePID: c.link.backendPID, Application: c.app.cfg.Name, User: c.link.serverUser,
			Database: c.link.serverDB, State: st, ClientID: &id, ClientAddr: c.remote, ConnectTime: c.link.serverCreated})
	}
	for _, ic := range s.pool.IdleConns() {
		since := ic.IdleSince
		out = append(out, ServerRow{RemotePID: ic.PID, Application: ic.App, User: ic.User, Database: ic.Database,
			State: "idle", ClientAddr: ic.LastClient, ConnectTime: ic.Created, IdleSince: &since})
	}
	for _, l := range s.hub.Servers() {
		out = append(out, ServerRow{RemotePID: l.PID, Application: "lockpool listener", Database: l.Database,
			State: "listener " + l.State, ConnectTime: l.Since})
	}
	return out
}

// ListenerRow is one line of SHOW LISTENERS and /debug/listen: a channel
// lockpool's listener connection of a database listens on for its clients
// (listen: shared).
type ListenerRow struct {
	Database string `json:"database"`
	Channel  string `json:"channel"`
	Clients  int    `json:"clients"`
}

// listenerRows gathers SHOW LISTENERS.
func (s *Server) listenerRows() []ListenerRow {
	out := []ListenerRow{}
	for _, c := range s.hub.Channels() {
		out = append(out, ListenerRow{Database: c.Database, Channel: c.Channel, Clients: c.Clients})
	}
	return out
}

// PinRow is one line of SHOW PINS and /debug/pins: a session pinned to its
// server connection.
type PinRow struct {
	ClientID      uint32    `json:"client_id"`
	Client        string    `json:"client"`
	Application   string    `json:"application"`
	User          string    `json:"user"`
	Database      string    `json:"database"`
	Reason        string    `json:"reason"`
	Since         time.Time `json:"since"`
	PinnedSeconds float64   `json:"pinned_seconds"`
	BackendPID    uint32    `json:"backend_pid"`
	Keys          []string  `json:"keys"`
}

// pinRows gathers SHOW PINS; keys are the advisory locks each pinned
// backend holds (from pg_locks; empty when PostgreSQL does not answer).
func (s *Server) pinRows(ctx context.Context) []PinRow {
	out := []PinRow{}
	for _, c := range s.clients() {
		if !c.link.attached || !c.link.pinned {
			continue
		}
		out = append(out, PinRow{ClientID: c.id, Client: c.remote, Application: c.app.cfg.Name, User: c.user, Database: c.database,
			Reason: c.link.pinReason, Since: c.link.pinnedSince, PinnedSeconds: time.Since(c.link.pinnedSince).Seconds(),
			BackendPID: c.link.backendPID, Keys: []string{}})
	}
	if len(out) == 0 {
		return out
	}
	rep, err := s.lockReport(ctx)
	if err != nil {
		return out
	}
	for i := range out {
		for _, h := range rep.Holders {
			if h.BackendPID == out[i].BackendPID {
				for _, k := range h.Locks {
					out[i].Keys = append(out[i].Keys, k.Key)
				}
			}
		}
	}
	return out
}

// LockRow is one line of SHOW LOCKS: a held advisory lock (type holder) or
// a wait for one (type waiter), as /debug/locks reports them.
type LockRow struct {
	Type           string     `json:"type"`
	BackendPID     int        `json:"backend_pid"`
	Application    string     `json:"application"`
	Client         string     `json:"client"`
	Key            string     `json:"key"`
	Mode           string     `json:"mode"`
	Granted        bool       `json:"granted"`
	Reason         string     `json:"reason"`
	PinnedSince    *time.Time `json:"pinned_since"`
	WaitingSeconds float64    `json:"waiting_seconds"`
	BlockedBy      []int      `json:"blocked_by"`
}

// lockRows flattens the /debug/locks report.
func (s *Server) lockRows(ctx context.Context) ([]LockRow, error) {
	rep, err := s.lockReport(ctx)
	if err != nil {
		return nil, &pgError{Code: "08006", Message: "lockpool: cannot query pg_locks: " + err.Error(), Hint: "Check that PostgreSQL is reachable."}
	}
	out := []LockRow{}
	for _, h := range rep.Holders {
		for _, k := range h.Locks {
			r := LockRow{Type: "holder", BackendPID: int(h.BackendPID), Application: h.App, Client: h.Client, Key: k.Key, Mode: k.Mode,
				Granted: true, Reason: h.Reason, BlockedBy: []int{}}
			if !h.PinnedSince.IsZero() {
				since := h.PinnedSince
				r.PinnedSince = &since
			}
			out = append(out, r)
		}
	}
	for _, w := range rep.Waiters {
		out = append(out, LockRow{Type: "waiter", BackendPID: w.BackendPID, Application: w.App, Client: w.Client, Key: w.Key,
			WaitingSeconds: w.WaitingSecs, BlockedBy: w.BlockedBy})
	}
	return out, nil
}

// LeaseHeldRow is one line of SHOW LEASES and /debug/leases: a lease a
// client of this instance holds.
type LeaseHeldRow struct {
	Name        string  `json:"name"`
	Database    string  `json:"database"`
	Token       int64   `json:"token"`
	Holder      string  `json:"holder"`
	ClientID    uint32  `json:"client_id"`
	Application string  `json:"application"`
	User        string  `json:"user"`
	TTLSeconds  float64 `json:"ttl_seconds"`
}

// heldLister is a lease store that can list its held leases (lockpool's
// own; a store given in Options may not).
type heldLister interface{ Held() []lease.HeldLease }

// leaseRows gathers SHOW LEASES from memory.
func (s *Server) leaseRows() []LeaseHeldRow {
	out := []LeaseHeldRow{}
	hl, ok := s.leases.(heldLister)
	if !ok {
		return out
	}
	byID := map[uint32]clientSnapshot{}
	for _, c := range s.clients() {
		byID[c.id] = c
	}
	for _, h := range hl.Held() {
		r := LeaseHeldRow{Name: h.Name, Database: h.Database, Token: h.Token, Holder: h.Holder, ClientID: uint32(h.SessionID), TTLSeconds: h.TTL.Seconds()}
		if c, ok := byID[r.ClientID]; ok {
			r.Application, r.User = c.app.cfg.Name, c.user
		}
		out = append(out, r)
	}
	return out
}

// Held lists the leases of lockpool's own store.
func (a leaseAdapter) Held() []lease.HeldLease { return a.st.Held() }

// StatsRow is one line of SHOW STATS and /debug/stats: an application's
// traffic since lockpool started (or the application was added).
type StatsRow struct {
	Application           string    `json:"application"`
	TotalXactCount        int64     `json:"total_xact_count"`
	TotalQueryCount       int64     `json:"total_query_count"`
	TotalReceived         int64     `json:"total_received"`
	TotalSent             int64     `json:"total_sent"`
	TotalWaitTime         int64     `json:"total_wait_time"`
	TotalServerAssignment int64     `json:"total_server_assignment_count"`
	AvgXactCount          float64   `json:"avg_xact_count"`
	AvgQueryCount         float64   `json:"avg_query_count"`
	AvgRecv               float64   `json:"avg_recv"`
	AvgSent               float64   `json:"avg_sent"`
	AvgWaitTime           int64     `json:"avg_wait_time"`
	StatsSince            time.Time `json:"stats_since"`
}

// statsRows gathers SHOW STATS, in configuration order.
func (s *Server) statsRows() []StatsRow {
	rc := s.rc.Load()
	out := make([]StatsRow, 0, len(rc.cfg.Applications))
	for _, a := range rc.cfg.Applications {
		as := rc.apps[a.Name]
		if as == nil {
			continue
		}
		st := as.stats
		r := StatsRow{Application: a.Name, TotalXactCount: st.xacts.Load(), TotalQueryCount: st.queries.Load(),
			TotalReceived: st.received.Load(), TotalSent: st.sent.Load(), StatsSince: st.since}
		n, waited := s.pool.WaitTotals(a.Name)
		r.TotalServerAssignment, r.TotalWaitTime = n, waited.Microseconds()
		if n > 0 {
			r.AvgWaitTime = r.TotalWaitTime / n
		}
		if secs := time.Since(st.since).Seconds(); secs > 0 {
			r.AvgXactCount = float64(r.TotalXactCount) / secs
			r.AvgQueryCount = float64(r.TotalQueryCount) / secs
			r.AvgRecv = float64(r.TotalReceived) / secs
			r.AvgSent = float64(r.TotalSent) / secs
		}
		out = append(out, r)
	}
	return out
}

// VersionRow is SHOW VERSION's one line.
type VersionRow struct {
	Version string `json:"version"`
}

// viewNames lists the SHOW commands, for help and errors.
func (s *Server) viewNames() string {
	var b strings.Builder
	for i, v := range s.adminViews() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "SHOW %s", v.name)
	}
	return b.String()
}
