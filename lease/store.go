package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/bgtask"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults.
const (
	DefaultSchema         = "lockpool"
	DefaultMaxConnections = 2

	// MaxNameLength bounds a lease name (it is also the NOTIFY payload).
	MaxNameLength = 1024
	// MinTTL and MaxTTL bound a lease's ttl.
	MinTTL = 100 * time.Millisecond
	MaxTTL = 7 * 24 * time.Hour

	lockTimeout      = 300 * time.Millisecond
	statementTimeout = 30 * time.Second
)

// Options configures a Store.
type Options struct {
	// Schema is where the lease table lives in each database (default "lockpool").
	Schema string
	// MaxConnections caps the store's own connections across all databases
	// (default 2). The LISTEN connections (one per database with waiters)
	// come on top.
	MaxConnections int
	// InstanceID is the first part of every holder ("instance:session:random").
	// Default: host name + "-" + pid.
	InstanceID string
	// ConnConfig returns the pgx connection config for a database (built by
	// the proxy from the server host/port and the application's user and
	// password, e.g. with pgx.ParseConfig). The store copies it and sets
	// application_name (when empty), lock_timeout, statement_timeout and
	// default_transaction_isolation=read committed.
	ConnConfig func(database string) (*pgx.ConnConfig, error)
	Logger     *slog.Logger
	// Registerer receives the lease metrics; nil = not registered.
	Registerer prometheus.Registerer
	// RenewTask and ListenTask count failed renewals and failed LISTEN
	// connections, and say when to log them at WARN (nil: every renewal
	// failure, and the first of a run of LISTEN failures).
	RenewTask, ListenTask *bgtask.Task
}

// Error is an error with a SQLSTATE for the client, a message starting with
// "lockpool:" and a hint.
type Error struct {
	Code    string
	Message string
	Hint    string
	Err     error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Store is one lockpool instance's lease store.
type Store struct {
	opts   Options
	names  *names
	log    *slog.Logger
	m      *metrics
	pool   *connPool
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	dbs      map[string]*dbState
	sessions map[*Session]struct{}
	closed   bool

	keeper *keeper

	// pollCap bounds any single sleep of a waiting acquire (a safety net for
	// missed notifications; tests raise it to prove NOTIFY wakes waiters).
	pollCap time.Duration
}

type dbState struct {
	name string

	migMu    sync.Mutex
	migrated atomic.Bool

	started bool // LISTEN goroutine started (guarded by Store.mu)
	// lost: the LISTEN connection was lost and is not back yet. Only the
	// LISTEN goroutine uses it (one at a time: started orders them).
	lost bool

	lmu     sync.Mutex
	waiters map[string]map[*waiter]struct{}
	ready   bool // LISTEN established
}

type waiter struct{ ch chan struct{} }

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// New validates opts and returns a Store. No connection is opened until a
// database is first used.
func New(opts Options) (*Store, error) {
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if len(opts.Schema) > 63-len("_lease_released") {
		return nil, fmt.Errorf("lockpool: leases.schema %q is too long (at most %d bytes)", opts.Schema, 63-len("_lease_released"))
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.MaxConnections < 1 {
		return nil, fmt.Errorf("lockpool: leases.max_connections must be at least 1, got %d", opts.MaxConnections)
	}
	if opts.ConnConfig == nil {
		return nil, errors.New("lockpool: lease store needs a ConnConfig function")
	}
	if opts.InstanceID == "" {
		h, _ := os.Hostname()
		if h == "" {
			h = "lockpool"
		}
		opts.InstanceID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		opts:     opts,
		names:    newNames(opts.Schema),
		log:      opts.Logger,
		m:        m,
		ctx:      ctx,
		cancel:   cancel,
		dbs:      map[string]*dbState{},
		sessions: map[*Session]struct{}{},
		pollCap:  5 * time.Second,
	}
	s.pool = newConnPool(opts.MaxConnections, s.dial)
	s.keeper = newKeeper(s)
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.keeper.run() }()
	return s, nil
}

// FenceFunction is the schema-qualified name of the real lease_fence
// function, e.g. `"lockpool"."lease_fence"` (quoted, ready to splice into SQL).
func (s *Store) FenceFunction() string { return s.names.fence }

// Schema returns the configured schema.
func (s *Store) Schema() string { return s.opts.Schema }

// InstanceID returns the instance part of holders.
func (s *Store) InstanceID() string { return s.opts.InstanceID }

func (s *Store) connConfig(database string) (*pgx.ConnConfig, error) {
	cfg, err := s.opts.ConnConfig(database)
	if err != nil {
		return nil, &Error{Code: "08006", Message: fmt.Sprintf("lockpool: lease store: no connection config for database %q: %v", database, err), Err: err}
	}
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "lockpool-lease"
	}
	cfg.RuntimeParams["lock_timeout"] = fmt.Sprintf("%dms", lockTimeout.Milliseconds())
	cfg.RuntimeParams["statement_timeout"] = fmt.Sprintf("%dms", statementTimeout.Milliseconds())
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "60000"
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
	cfg.RuntimeParams["default_transaction_read_only"] = "off"
	return cfg, nil
}

func (s *Store) dial(ctx context.Context, database string) (*pgx.Conn, error) {
	cfg, err := s.connConfig(database)
	if err != nil {
		return nil, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, s.wrapPg(err, fmt.Sprintf("connecting to database %q", database))
	}
	return c, nil
}

// wrapPg turns a driver error into an *Error with a SQLSTATE.
func (s *Store) wrapPg(err error, what string) error {
	var le *Error
	if errors.As(err, &le) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return &Error{Code: pe.Code, Message: fmt.Sprintf("lockpool: lease store: %s: %s", what, pe.Message), Hint: pe.Hint, Err: err}
	}
	if errors.Is(err, errPoolClosed) {
		return &Error{Code: "57P01", Message: "lockpool: lease store is shutting down", Err: err}
	}
	return &Error{Code: "08006", Message: fmt.Sprintf("lockpool: lease store: %s: %v", what, err), Hint: "lockpool could not reach PostgreSQL for the lease table.", Err: err}
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func isLockTimeout(err error) bool { return pgCode(err) == "55P03" }

// db returns the state for a database, migrating it at first use.
func (s *Store) db(ctx context.Context, database string) (*dbState, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, s.wrapPg(errPoolClosed, "")
	}
	d := s.dbs[database]
	if d == nil {
		d = &dbState{name: database, waiters: map[string]map[*waiter]struct{}{}}
		s.dbs[database] = d
	}
	s.mu.Unlock()

	if d.migrated.Load() {
		return d, nil
	}
	d.migMu.Lock()
	defer d.migMu.Unlock()
	if d.migrated.Load() {
		return d, nil
	}
	err := s.withConn(ctx, database, func(c *pgx.Conn) error { return s.migrate(ctx, c, database) })
	if err != nil {
		return nil, s.wrapPg(err, "preparing the lease table")
	}
	d.migrated.Store(true)
	return d, nil
}

// withConn runs fn on one of the store's connections for database,
// retrying serialization failures (40001), deadlocks (40P01) and broken
// connections. Every lease statement is idempotent for its holder, so a
// retry after a lost connection is safe. A connection is broken also when
// the server ended it with a FATAL error (57P01 after a shutdown or a
// failover, 57P02 after a crash of another backend): every idle connection
// of a server that went away fails like that at its next use, so each is
// retried on the next one, and then on a new connection.
func (s *Store) withConn(ctx context.Context, database string, fn func(c *pgx.Conn) error) error {
	backoff := 5 * time.Millisecond
	for attempt := 0; ; attempt++ {
		c, err := s.pool.get(ctx, database)
		if err != nil {
			return err
		}
		err = fn(c)
		broken := c.IsClosed()
		s.pool.put(database, c)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		code := pgCode(err)
		retry := false
		switch {
		case code == "40001" || code == "40P01":
			retry = attempt < 8
		case broken:
			retry = attempt < s.opts.MaxConnections+1
		}
		if !retry {
			return err
		}
		d := backoff + time.Duration(rand.Int64N(int64(backoff)))
		backoff *= 2
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

// Close releases every session's leases (best effort, a few seconds), stops
// the keeper and the LISTEN connections and closes all connections.
func (s *Store) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	var sess []*Session
	for ss := range s.sessions {
		sess = append(sess, ss)
	}
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	var wg sync.WaitGroup
	for _, ss := range sess {
		wg.Add(1)
		go func() { defer wg.Done(); ss.Close(ctx) }()
	}
	wg.Wait()
	cancel()

	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.pool.close()
}
