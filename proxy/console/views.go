package console

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
)

// The admin views: one function gathers each, and the admin console (SHOW
// …) and the admin HTTP listener (/debug/…) both show what it returns. A
// row type's json tags are the column names in both.

// view is one SHOW command and its /debug path.
type view struct {
	name string // SHOW <NAME> (upper case) and /debug/<name> (lower case)
	rows func(ctx context.Context) (any, error)
}

// views lists the views in the order the console's help names them.
// SHOW LOCKS is served as /debug/locks by the existing handler, in its own
// nested form.
func views(src Source) []view {
	return []view{
		{"POOLS", func(context.Context) (any, error) { return poolRows(src), nil }},
		{"APPLICATIONS", func(context.Context) (any, error) { return applicationRows(src), nil }},
		{"CLIENTS", func(context.Context) (any, error) { return clientRows(src), nil }},
		{"SERVERS", func(context.Context) (any, error) { return serverRows(src), nil }},
		{"PINS", func(ctx context.Context) (any, error) { return pinRows(ctx, src), nil }},
		{"LOCKS", func(ctx context.Context) (any, error) { return lockRows(ctx, src) }},
		{"LEASES", func(context.Context) (any, error) { return leaseRows(src), nil }},
		{"LISTENERS", func(context.Context) (any, error) { return listenerRows(src), nil }},
		{"STATS", func(context.Context) (any, error) { return statsRows(src), nil }},
		{"CLUSTER", func(context.Context) (any, error) { return clusterRows(src), nil }},
		{"HOSTS", func(context.Context) (any, error) { return hostRows(src), nil }},
		{"CONFIG", func(context.Context) (any, error) { return src.Config().SettingsInForce(src.StartedConfig()), nil }},
		{"VERSION", func(context.Context) (any, error) { return []VersionRow{{Version: versionString()}}, nil }},
	}
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
func poolRows(src Source) []PoolRow {
	apps := src.Applications()
	pm := src.Pool()
	type key struct{ app, db string }
	rows := map[key]*PoolRow{}
	row := func(a *config.Application, db string) *PoolRow {
		k := key{a.Name, db}
		r := rows[k]
		if r == nil {
			r = &PoolRow{Database: db, User: a.User, Application: a.Name, PoolMode: a.PoolMode, Paused: pm.Paused(a.Name)}
			rows[k] = r
		}
		return r
	}
	for _, c := range src.Clients() {
		r := row(&c.App, c.Database)
		switch c.State {
		case "active":
			r.ClActive++
			if c.Pinned {
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
	for i := range apps {
		a := &apps[i].Config
		for _, d := range pm.DatabaseStats(a.Name) {
			r := row(a, d.Database)
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
			row(a, db)
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
func applicationRows(src Source) []ApplicationRow {
	apps := src.Applications()
	pm := src.Pool()
	out := make([]ApplicationRow, 0, len(apps))
	for _, as := range apps {
		a := as.Config
		st := pm.Stats(a.Name)
		r := ApplicationRow{Application: a.Name, User: a.User, Database: a.Database, PoolMode: a.PoolMode,
			MaxConnections: a.MaxConnections, Open: st.Open, InUse: st.InUse, Idle: st.Idle, Pinned: st.Pinned,
			MaxPinned: a.MaxPinned, Waiting: st.Waiting, PinWaiting: st.PinWaiting, MaxClients: a.MaxClients,
			AdvisoryLocks: a.AdvisoryLocks, SessionState: a.SessionState, WaitTimeout: a.WaitTimeout.String(),
			MaxPreparedStatements: a.MaxPreparedStatements, Paused: pm.Paused(a.Name), Clients: as.Clients}
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
func clientRows(src Source) []ClientRow {
	cs := src.Clients()
	out := make([]ClientRow, 0, len(cs))
	for _, c := range cs {
		r := ClientRow{ID: c.ID, User: c.User, Database: c.Database, Application: c.App.Name, State: c.State,
			Addr: c.Addr, Port: c.Port, ConnectTime: c.Connected, TLS: c.TLS,
			Pinned: c.Pinned, PinReason: c.PinReason}
		if c.Attached {
			pid := c.BackendPID
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
func serverRows(src Source) []ServerRow {
	var out []ServerRow
	for _, c := range src.Clients() {
		if !c.Attached {
			continue
		}
		id := c.ID
		st := "active"
		if c.Pinned {
			st = "pinned"
		}
		out = append(out, ServerRow{RemotePID: c.BackendPID, Application: c.App.Name, User: c.ServerUser,
			Database: c.ServerDatabase, State: st, ClientID: &id, ClientAddr: c.Remote, ConnectTime: c.ServerCreated})
	}
	for _, ic := range src.Pool().IdleConns() {
		since := ic.IdleSince
		out = append(out, ServerRow{RemotePID: ic.PID, Application: ic.App, User: ic.User, Database: ic.Database,
			State: "idle", ClientAddr: ic.LastClient, ConnectTime: ic.Created, IdleSince: &since})
	}
	for _, l := range src.ListenHub().Servers() {
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
func listenerRows(src Source) []ListenerRow {
	out := []ListenerRow{}
	for _, c := range src.ListenHub().Channels() {
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
func pinRows(ctx context.Context, src Source) []PinRow {
	out := []PinRow{}
	for _, c := range src.Clients() {
		if !c.Attached || !c.Pinned {
			continue
		}
		out = append(out, PinRow{ClientID: c.ID, Client: c.Remote, Application: c.App.Name, User: c.User, Database: c.Database,
			Reason: c.PinReason, Since: c.PinnedSince, PinnedSeconds: time.Since(c.PinnedSince).Seconds(),
			BackendPID: c.BackendPID, Keys: []string{}})
	}
	if len(out) == 0 {
		return out
	}
	rep, err := lockReport(ctx, src)
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
func lockRows(ctx context.Context, src Source) ([]LockRow, error) {
	rep, err := lockReport(ctx, src)
	if err != nil {
		return nil, &pgerr.Error{Code: "08006", Message: "lockpool: cannot query pg_locks: " + err.Error(), Hint: "Check that PostgreSQL is reachable."}
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

// leaseRows gathers SHOW LEASES from memory.
func leaseRows(src Source) []LeaseHeldRow {
	out := []LeaseHeldRow{}
	held := src.HeldLeases()
	if held == nil {
		return out
	}
	byID := map[uint32]Client{}
	for _, c := range src.Clients() {
		byID[c.ID] = c
	}
	for _, h := range held {
		r := LeaseHeldRow{Name: h.Name, Database: h.Database, Token: h.Token, Holder: h.Holder, ClientID: uint32(h.SessionID), TTLSeconds: h.TTL.Seconds()}
		if c, ok := byID[r.ClientID]; ok {
			r.Application, r.User = c.App.Name, c.User
		}
		out = append(out, r)
	}
	return out
}

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
func statsRows(src Source) []StatsRow {
	apps := src.Applications()
	pm := src.Pool()
	out := make([]StatsRow, 0, len(apps))
	for _, a := range apps {
		st := a.Traffic
		r := StatsRow{Application: a.Config.Name, TotalXactCount: st.Xacts, TotalQueryCount: st.Queries,
			TotalReceived: st.Received, TotalSent: st.Sent, StatsSince: st.Since}
		n, waited := pm.WaitTotals(a.Config.Name)
		r.TotalServerAssignment, r.TotalWaitTime = n, waited.Microseconds()
		if n > 0 {
			r.AvgWaitTime = r.TotalWaitTime / n
		}
		if secs := time.Since(st.Since).Seconds(); secs > 0 {
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
func viewNames(src Source) string {
	var b strings.Builder
	for i, v := range views(src) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "SHOW %s", v.name)
	}
	return b.String()
}

// HostRow is one line of SHOW HOSTS and /debug/hosts: a PostgreSQL host,
// its role and state at the last check, its replay lag and the pools'
// connections to it.
type HostRow struct {
	Host        string  `json:"host"`
	Role        string  `json:"role"`  // primary | standby | unknown (the role at the last answered check)
	State       string  `json:"state"` // primary | standby | refused | down | unknown | unchecked
	LagSeconds  float64 `json:"lag_seconds"`
	Connections int64   `json:"connections"`
	Since       string  `json:"since"`   // when the role, state or answering last changed (RFC 3339)
	Checked     string  `json:"checked"` // the last check's end
	Error       string  `json:"error"`   // the last failed check's error, while down
}

// hostRows gathers SHOW HOSTS. Without server.hosts lockpool does not
// check its one host: its row is "unchecked".
func hostRows(src Source) []HostRow {
	mon := src.Hosts()
	if mon == nil {
		srv := src.StartedConfig().Server
		return []HostRow{{Host: config.HostAddr{Host: srv.Host, Port: srv.Port}.String(), Role: "unknown", State: "unchecked"}}
	}
	hs, _, _, _ := mon.Snapshot()
	out := make([]HostRow, 0, len(hs))
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	for _, h := range hs {
		st := h.Status()
		out = append(out, HostRow{
			Host: h.Addr().String(), Role: st.Role.String(), State: st.State(0), LagSeconds: st.Lag.Seconds(),
			Connections: h.Conns(), Since: stamp(st.Since), Checked: stamp(st.Checked), Error: st.Err,
		})
	}
	return out
}
