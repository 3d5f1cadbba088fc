package console

import (
	"context"
	"time"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/cluster"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/lease"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/pool"
)

// Source is the lockpool server as the console sees it: what the views
// read and what the commands act through (*proxy.Server implements it).
// Each method takes the locks it needs itself; the console holds none of
// the server's locks.
type Source interface {
	// Config returns the configuration in force.
	Config() *config.Config
	// StartedConfig returns the configuration lockpool started with: what
	// the keys a reload cannot apply keep using until a restart.
	StartedConfig() *config.Config
	// Pool returns the server connections' manager (SHOW POOLS,
	// APPLICATIONS, SERVERS, STATS; PAUSE and RESUME).
	Pool() *pool.Manager
	// ListenHub returns the shared listener connections (SHOW LISTENERS,
	// SERVERS).
	ListenHub() *listen.Hub
	// Cluster returns the coordinator of cluster budgets; nil without a
	// cluster.
	Cluster() *cluster.Coordinator
	// Hosts returns the monitor of server.hosts; nil with one host and
	// port (SHOW HOSTS).
	Hosts() *hosts.Monitor
	// HeldLocks lists the advisory locks lockpool holds for its clients
	// on its lock connections (advisory_locks: hold).
	HeldLocks() []advisory.ClientLocks
	// HeldLeases lists the leases this instance's clients hold; nil when
	// the lease store cannot list them.
	HeldLeases() []lease.HeldLease
	// Clients returns every logged-in client, by id.
	Clients() []Client
	// Applications returns the configured applications in configuration
	// order, with their counters.
	Applications() []Application
	// AdminQuery runs sql on lockpool's own connection to PostgreSQL
	// (never an application's pool) and returns its rows as text.
	AdminQuery(ctx context.Context, sql string) ([][]string, error)
	// Ready reports whether PostgreSQL answers on that connection.
	Ready(ctx context.Context) error
	// KillClient ends the session of client id with the FATAL why and
	// returns the client's address; ok is false when no client has id.
	KillClient(id uint32, why *pgerr.Error) (remote string, ok bool)
	// Reload applies a new configuration, as SIGHUP does.
	Reload(cfg *config.Config) ([]string, error)
	// Shutdown shuts lockpool down, as SIGTERM does.
	Shutdown(ctx context.Context) error
}

// Client is one logged-in client: its session's fields, read under the
// server's lock, and its server link, read under the link's lock.
type Client struct {
	ID        uint32             // lockpool's backend pid for the client: KILL_CLIENT's id
	App       config.Application // the application as configured when the client logged in
	User      string
	Database  string
	Remote    string // the client's address
	Addr      string // Remote's host
	Port      int    // Remote's port; 0 when it has none
	Connected time.Time
	TLS       bool
	State     string // active (holds a server connection), waiting (in lockpool) or idle

	Waiting        bool // waits in lockpool (connection, pin slot, lease)
	Attached       bool // holds a server connection, which the next four fields describe
	BackendPID     uint32
	ServerDatabase string
	ServerUser     string
	ServerCreated  time.Time
	Pinned         bool
	PinReason      string
	PinnedSince    time.Time
}

// Application is a configured application and its counters.
type Application struct {
	Config  config.Application
	Clients int64 // logged-in clients
	Traffic Traffic
}

// Traffic is an application's traffic since Since: when lockpool started
// or the application was added.
type Traffic struct {
	Since    time.Time
	Xacts    int64 // transactions ended
	Queries  int64 // simple queries and extended batches up to Sync
	Received int64 // bytes of client messages written to the server
	Sent     int64 // bytes written to clients
}
