package session

import (
	"context"
	"log/slog"
	"time"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/local"
)

// Shared is what every session of a server uses: built once by the
// server (package proxy) before its first session and not changed after.
// Each of its parts has its own lock.
type Shared struct {
	Log    *slog.Logger
	Pool   *pool.Manager
	Stmts  *backend.StmtCatalog // server statements known across sessions
	Leases local.LeaseStore     // nil without a lease store
	Locks  *advisory.Manager    // advisory_locks: hold
	Hub    *listen.Hub          // listen: shared
	Seen   *SeenPIDs            // which client last read each backend's pid
	Bufs   *wire.BufferPool     // client read buffers, lent while data flows
	Base   context.Context      // ends after every session has ended
	Host   Host                 // the server's side

	kinds [numLocalKinds]local.Kind // the statements lockpool answers itself, asked in this order
}

// NewShared returns the parts given, ready for sessions.
func NewShared(parts Shared) *Shared {
	sh := parts
	sh.kinds = localKinds()
	return &sh
}

// Host is what a session asks of the server that runs it. Its methods may
// be called from the session's coroutine and from offloaded waits, and
// must not block on the session.
type Host interface {
	// Config returns the configuration in force.
	Config() *config.Config
	// HandedOff reports whether the server's listening sockets live on in
	// a successor process (a session not yet served closes after its
	// first statement).
	HandedOff() bool
	// Unregister takes the session out of the server's registry (its key
	// pid names no client from then on); the first step of its cleanup.
	Unregister(s *Session)
	// Ended is the last step of a session's cleanup.
	Ended(s *Session)
	// Unadmit gives back the session's place in its application's client
	// limit, after Ended.
	Unadmit(app *appstate.App)
	// KeyPIDLive reports whether pid is the key pid of a client of this
	// server, or names another live instance of its cluster.
	KeyPIDLive(pid uint32) bool
	// Signal carries out pg_terminate_backend (terminate) or
	// pg_cancel_backend of key pid for a caller logged in as user (admin:
	// listed in admin_users); a terminate with a timeout waits that long
	// for the client to end, or until ctx ends.
	Signal(ctx context.Context, pid uint32, terminate bool, timeout time.Duration, user string, admin bool) (local.SignalResult, error)
	// ActivityView is the parenthesised query that stands for
	// pg_stat_activity for the client with key pid caller, as of now.
	ActivityView(caller uint32) string
}

// SetKey gives the session its backend key (the key pid that identifies
// it, and the secret of its cancel requests) as it logs in, before its
// client is told them; connected is now.
func (s *Session) SetKey(pid, secret uint32) {
	s.pid, s.secret = pid, secret
	s.connected = time.Now().UnixNano()
}

// Secret is the session's cancel-request secret.
func (s *Session) Secret() uint32 { return s.secret }

// DrainAfterTx marks a session accepted before the server handed its
// listening sockets to a successor: it is closed at the idle point after
// its first statement.
func (s *Session) DrainAfterTx() { s.drainAfterTx.Store(true) }
