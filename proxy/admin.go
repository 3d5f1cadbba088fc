package proxy

import (
	"crypto/subtle"
	"strings"

	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/config"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AdminHandler serves /metrics (from g), /up, /health/ready and
// /debug/locks.
func (s *Server) AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	if g != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/up", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/health/ready", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := s.health.check(ctx, s); err != nil {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: PostgreSQL did not answer\n"))
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/debug/locks", s.guard(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		rep, err := s.lockReport(ctx)
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "cannot query PostgreSQL"})
			return
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	}))
	s.handleViews(mux)
	mux.HandleFunc("/debug/pprof/", s.guard(pprof.Index))
	mux.HandleFunc("/debug/pprof/profile", s.guard(pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", s.guard(pprof.Symbol))
	mux.HandleFunc("/debug/pprof/trace", s.guard(pprof.Trace))
	return mux
}

// healthProbe keeps lockpool's own connection for /health/ready and the
// leak sweep: never an application's pool.
type healthProbe struct {
	mu   sync.Mutex
	conn *pgconn.PgConn
}

// adminConn returns the probe connection, dialing it when needed. The
// caller holds h.mu.
func (h *healthProbe) adminConn(ctx context.Context, s *Server) (*pgconn.PgConn, error) {
	if h.conn != nil && !h.conn.IsClosed() {
		return h.conn, nil
	}
	cfg := s.rc.Load().cfg
	if len(cfg.Applications) == 0 {
		return nil, context.Canceled
	}
	// lockpool's own login: the first application user with a plaintext
	// password, else the auth_query role.
	user, pw, db := cfg.Applications[0].User, "", cfg.Applications[0].Database
	found := false
	for _, a := range cfg.Applications {
		if u, ok := cfg.UserByName(a.User); ok && u.Password != "" && !strings.HasPrefix(u.Password, "SCRAM-SHA-256$") {
			user, pw, db, found = a.User, u.Password, a.Database, true
			break
		}
	}
	if !found && cfg.AuthQuery != nil {
		user, pw, db = cfg.AuthQuery.User, cfg.AuthQuery.Password, cfg.AuthQuery.Database
	}
	if db == "" {
		db = user
	}
	pc, err := pgconn.ParseConfig(serverTLSConnString(cfg))
	if err != nil {
		return nil, err
	}
	pc.Host = cfg.Server.Host
	pc.Port = uint16(cfg.Server.Port)
	pc.User = user
	pc.Password = pw
	pc.Database = db
	pc.ConnectTimeout = time.Second
	pc.RuntimeParams = map[string]string{"application_name": "lockpool-admin"}
	c, err := pgconn.ConnectConfig(ctx, pc)
	if ctx.Err() == nil {
		s.pool.ServerReached("lockpool", err)
	}
	if err != nil {
		return nil, err
	}
	h.conn = c
	return c, nil
}

func (h *healthProbe) check(ctx context.Context, s *Server) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, err := h.adminConn(ctx, s)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, "SELECT 1").ReadAll()
	if err != nil {
		_ = c.Close(context.Background())
		h.conn = nil
	}
	return err
}

// query runs sql on the admin connection and returns its text rows.
func (h *healthProbe) query(ctx context.Context, s *Server, sql string) ([][]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, err := h.adminConn(ctx, s)
	if err != nil {
		return nil, err
	}
	res := c.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		if c.IsClosed() {
			h.conn = nil
		}
		return nil, res.Err
	}
	out := make([][]string, 0, len(res.Rows))
	for _, r := range res.Rows {
		row := make([]string, len(r))
		for i, v := range r {
			row[i] = string(v)
		}
		out = append(out, row)
	}
	return out, nil
}

func (h *healthProbe) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		_ = h.conn.Close(context.Background())
		h.conn = nil
	}
}

// LockHolder is one session holding advisory locks through lockpool.
type LockHolder struct {
	App         string    `json:"application"`
	Client      string    `json:"client"`
	BackendPID  uint32    `json:"backend_pid"`
	PinnedSince time.Time `json:"pinned_since,omitempty"`
	Reason      string    `json:"reason"`
	Locks       []LockKey `json:"locks"`
}

// LockKey is one advisory lock as pg_locks shows it.
type LockKey struct {
	Key     string `json:"key"` // "classid:objid:objsubid"; objsubid 1 = bigint key, 2 = two int4 keys
	Mode    string `json:"mode"`
	Granted bool   `json:"granted"`
}

// LockWaiter is a backend waiting on an advisory lock.
type LockWaiter struct {
	BackendPID  int      `json:"backend_pid"`
	App         string   `json:"application,omitempty"`
	Client      string   `json:"client,omitempty"`
	Key         string   `json:"key"`
	WaitingSecs float64  `json:"waiting_seconds"`
	BlockedBy   []int    `json:"blocked_by"`
	Query       string   `json:"-"`
	BlockerApps []string `json:"blocked_by_applications,omitempty"`
}

// LockReport is the /debug/locks answer.
type LockReport struct {
	Holders []LockHolder `json:"holders"`
	Waiters []LockWaiter `json:"waiters"`
	// Held: the locks lockpool holds for its clients on its lock
	// connections (advisory_locks: hold), per client, with its waits.
	Held []advisory.ClientLocks `json:"held"`
}

const lockReportSQL = `SELECT l.pid, l.classid::text || ':' || l.objid::text || ':' || l.objsubid::text, l.mode, l.granted,
  COALESCE(EXTRACT(EPOCH FROM (now() - COALESCE(a.state_change, now()))), 0)::text,
  array_to_string(pg_blocking_pids(l.pid), ',')
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' ORDER BY l.pid`

// lockReport joins pg_locks with lockpool's sessions.
func (s *Server) lockReport(ctx context.Context) (*LockReport, error) {
	rows, err := s.health.query(ctx, s, lockReportSQL)
	if err != nil {
		return nil, err
	}
	type who struct {
		app, client, reason string
		since               time.Time
	}
	byPID := map[uint32]who{}
	s.mu.Lock()
	for _, ss := range s.sessions {
		if v := ss.link.view(); v.attached {
			byPID[v.backendPID] = who{ss.app.cfg.Name, ss.remote, v.pinReason, v.pinnedSince}
		}
	}
	s.mu.Unlock()
	rep := &LockReport{Holders: []LockHolder{}, Waiters: []LockWaiter{}, Held: s.locks.Snapshot()}
	if rep.Held == nil {
		rep.Held = []advisory.ClientLocks{}
	}
	holders := map[uint32]int{}
	for _, r := range rows {
		pid64, _ := strconv.ParseUint(r[0], 10, 32)
		pid := uint32(pid64)
		granted := r[3] == "t"
		w := byPID[pid]
		if granted {
			i, ok := holders[pid]
			if !ok {
				rep.Holders = append(rep.Holders, LockHolder{App: w.app, Client: w.client, BackendPID: pid, PinnedSince: w.since, Reason: w.reason})
				i = len(rep.Holders) - 1
				holders[pid] = i
			}
			rep.Holders[i].Locks = append(rep.Holders[i].Locks, LockKey{Key: r[1], Mode: r[2], Granted: true})
			continue
		}
		secs, _ := strconv.ParseFloat(r[4], 64)
		lw := LockWaiter{BackendPID: int(pid), App: w.app, Client: w.client, Key: r[1], WaitingSecs: secs, BlockedBy: []int{}}
		for _, b := range splitInts(r[5]) {
			lw.BlockedBy = append(lw.BlockedBy, b)
			if bw, ok := byPID[uint32(b)]; ok && bw.app != "" {
				lw.BlockerApps = append(lw.BlockerApps, bw.app)
			}
		}
		rep.Waiters = append(rep.Waiters, lw)
	}
	sort.Slice(rep.Holders, func(i, j int) bool { return rep.Holders[i].BackendPID < rep.Holders[j].BackendPID })
	return rep, nil
}

func splitInts(s string) []int {
	var out []int
	n, in := 0, false
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] >= '0' && s[i] <= '9' {
			n = n*10 + int(s[i]-'0')
			in = true
			continue
		}
		if in {
			out = append(out, n)
		}
		n, in = 0, false
	}
	return out
}

// guard requires "Authorization: Bearer <admin_token>" when admin_token is set.
func (s *Server) guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok := s.rc.Load().cfg.AdminToken
		if tok != "" {
			got := r.Header.Get("Authorization")
			if subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+tok)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="lockpool"`)
				http.Error(w, "admin_token required", http.StatusUnauthorized)
				return
			}
		}
		h(w, r)
	}
}

// serverTLSConnString is the sslmode part of a connection string for
// lockpool's own connections (health probe, leases), from server.tls.
func serverTLSConnString(cfg *config.Config) string {
	mode := cfg.Server.TLS
	switch mode {
	case "prefer", "require", "verify-full":
	default:
		mode = "disable"
	}
	cs := "sslmode=" + mode
	if cfg.Server.CAFile != "" {
		cs += " sslrootcert='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(cfg.Server.CAFile) + "'"
	}
	return cs
}
