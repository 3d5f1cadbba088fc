package proxy

import (
	"context"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/cluster"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/bgtask"
)

// Cluster budgets (budget_scope: cluster): the proxy builds the cluster
// package's Coordinator when the configuration has a cluster section and a
// cluster application, and serves SHOW CLUSTER, /debug/cluster and the
// cancel and signal forwarding (clustercancel.go, clustersignal.go) from it.

// startCluster registers the cluster metrics (always, so
// lockpool_cluster_instances reads 0 without a cluster) and, when the
// configuration asks for it, starts the Coordinator. It runs in New, after
// the pool is built and before any client is served: the cluster
// applications' pool limits are 0 until this instance holds slots.
func (s *Server) startCluster(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) error {
	names := make([]string, 0, len(cfg.Applications))
	for _, a := range cfg.Applications {
		names = append(names, a.Name)
	}
	m := cluster.NewMetrics(reg, names...)
	if cfg.Cluster == nil || len(clusterApps(cfg, cfg)) == 0 {
		return nil
	}
	cc := cfg.Cluster
	connCfg := ownConnConfig(cfg, s.Config, s.hosts, s.scramKeys)
	s.signalKey = newSignalKey()
	c, err := cluster.New(cluster.Options{
		Cluster:    cc.Name,
		Schema:     cfg.Leases.Schema,
		InstanceID: cfg.InstanceID,
		TTL:        cc.TTL,
		Heartbeat:  cc.HeartbeatEvery(),
		Advertise:  s.clusterAdvertise,
		SignalKey:  hex.EncodeToString(s.signalKey),
		Task:       s.tasks.Task(bgtask.Cluster),
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			pc, err := connCfg(cc.Database)
			if err != nil {
				return nil, err
			}
			if pc.RuntimeParams == nil {
				pc.RuntimeParams = map[string]string{}
			}
			pc.RuntimeParams["application_name"] = cluster.AppName
			// A statement whose context ends (a tick's timeout) is
			// cancelled on the server too: a backend blocked on a lock
			// would otherwise wait on after lockpool closed its
			// connection, and keep its locks and its place in the lock
			// queue.
			pc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Second}
			}
			return pgx.ConnectConfig(ctx, pc)
		},
		Apps:    func() []cluster.App { return clusterApps(s.started, s.Config()) },
		Pool:    s.pool,
		Logger:  log,
		Metrics: m,
	})
	if err != nil {
		return err
	}
	s.cluster = c
	c.Start()
	return nil
}

// clusterApps lists the applications that were cluster-scoped when lockpool
// started (budget_scope is read at start), with their budgets as the
// configuration in force declares them.
func clusterApps(started, cur *config.Config) []cluster.App {
	var out []cluster.App
	for _, a := range started.Applications {
		if !a.ClusterScoped() {
			continue
		}
		ca := cluster.App{Name: a.Name, User: a.User, Budget: a.MaxConnections, Pins: a.MaxPinned, MinShare: a.MinShare}
		for _, n := range cur.Applications {
			if n.Name == a.Name {
				ca.User, ca.Budget, ca.Pins, ca.MinShare = n.User, n.MaxConnections, n.MaxPinned, n.MinShare
			}
		}
		out = append(out, ca)
	}
	return out
}

// clusterAdvertise is the address other instances forward cancel and signal requests
// for this instance's clients to: cluster.advertise, else the client
// listener's address.
func (s *Server) clusterAdvertise() string {
	if a := s.started.Cluster.Advertise; a != "" {
		return a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// stopCluster stops the Coordinator after the pool closed. When no
// connection of a cluster application is open any more it removes this
// instance's rows, so the others take its slots at once; otherwise the
// others reclaim them after cluster.ttl.
func (s *Server) stopCluster() {
	if s.cluster == nil {
		return
	}
	empty := true
	for _, a := range clusterApps(s.started, s.Config()) {
		if s.pool.Stats(a.Name).Open > 0 {
			empty = false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.cluster.Close(ctx, empty)
}
