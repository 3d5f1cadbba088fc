package console

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"time"

	"github.com/lockpool/lockpool/advisory"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the admin HTTP listener: /metrics (from g, when not
// nil), /up, /health/ready, /debug/locks, the views as JSON under /debug/
// (http.go) and /debug/pprof/. Everything under /debug/ requires
// admin_token when one is set.
func Handler(src Source, g prometheus.Gatherer) http.Handler {
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
		if err := src.Ready(ctx); err != nil {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: PostgreSQL did not answer\n"))
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/debug/locks", guard(src, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		rep, err := lockReport(ctx, src)
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
	handleViews(mux, src)
	mux.HandleFunc("/debug/pprof/", guard(src, pprof.Index))
	mux.HandleFunc("/debug/pprof/profile", guard(src, pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", guard(src, pprof.Symbol))
	mux.HandleFunc("/debug/pprof/trace", guard(src, pprof.Trace))
	return mux
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
func lockReport(ctx context.Context, src Source) (*LockReport, error) {
	rows, err := src.AdminQuery(ctx, lockReportSQL)
	if err != nil {
		return nil, err
	}
	type who struct {
		app, client, reason string
		since               time.Time
	}
	byPID := map[uint32]who{}
	for _, c := range src.Clients() {
		if c.Attached {
			byPID[c.BackendPID] = who{c.App.Name, c.Remote, c.PinReason, c.PinnedSince}
		}
	}
	rep := &LockReport{Holders: []LockHolder{}, Waiters: []LockWaiter{}, Held: src.HeldLocks()}
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
func guard(src Source, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok := src.Config().AdminToken
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
