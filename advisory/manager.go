package advisory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Defaults.
const (
	DefaultMaxConnections = 2
	DefaultMaxWaiters     = 16

	// opTimeout bounds one statement on a lock connection (key evaluation,
	// a try-lock, an unlock). A lock connection that cannot answer within it
	// is closed: its holders are told.
	opTimeout = 10 * time.Second
	// statementTimeout is the lock connections' statement_timeout, so a
	// slow key expression cannot keep a connection from the other keys.
	statementTimeout = 5 * time.Second
)

// Options configures a Manager.
type Options struct {
	// MaxConnections is the number of lock connections per database
	// (default 2).
	MaxConnections int
	// MaxWaiters bounds the acquires that wait behind a remote holder at
	// once, per database (default 16); more wait for a turn, in lockpool.
	MaxWaiters int
	// ConnConfig returns the pgx config for a database (host, port, user,
	// password). The manager copies it and sets application_name and the
	// connection's timeouts.
	ConnConfig func(database string) (*pgx.ConnConfig, error)
	Logger     *slog.Logger
	// WatchInterval is how often an idle lock connection that holds locks
	// is checked for its death (default 100ms).
	WatchInterval time.Duration
	// PollMax caps the backoff between try-locks of a wait behind a remote
	// holder (default 50ms).
	PollMax time.Duration
}

// Manager is one lockpool instance's advisory-lock holder: the lock
// connections and lock tables of every database.
type Manager struct {
	opts          Options
	log           *slog.Logger
	seed          maphash.Seed
	watchInterval time.Duration

	mu     sync.Mutex
	dbs    map[string]*database
	nextID uint64
	closed bool
}

// New validates opts and returns a Manager. No connection is opened until a
// database is first used.
func New(opts Options) (*Manager, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.MaxWaiters == 0 {
		opts.MaxWaiters = DefaultMaxWaiters
	}
	if opts.MaxConnections < 1 || opts.MaxWaiters < 1 {
		return nil, fmt.Errorf("advisory: locks.max_connections and locks.max_waiters must be at least 1 (got %d, %d)", opts.MaxConnections, opts.MaxWaiters)
	}
	if opts.ConnConfig == nil {
		return nil, errors.New("advisory: no ConnConfig")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.WatchInterval <= 0 {
		opts.WatchInterval = 100 * time.Millisecond
	}
	if opts.PollMax <= 0 {
		opts.PollMax = 50 * time.Millisecond
	}
	return &Manager{opts: opts, log: opts.Logger, seed: maphash.MakeSeed(), watchInterval: opts.WatchInterval, dbs: map[string]*database{}}, nil
}

func (m *Manager) connConfig(database string) (*pgx.ConnConfig, error) {
	cfg, err := m.opts.ConnConfig(database)
	if err != nil {
		return nil, fmt.Errorf("advisory: no connection config for database %q: %w", database, err)
	}
	cfg = cfg.Copy() // copies RuntimeParams too
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = ApplicationName
	cfg.RuntimeParams["lock_timeout"] = "0"
	cfg.RuntimeParams["statement_timeout"] = fmt.Sprintf("%dms", statementTimeout.Milliseconds())
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "0"
	cfg.RuntimeParams["idle_session_timeout"] = "0"
	cfg.RuntimeParams["default_transaction_read_only"] = "off"
	return cfg, nil
}

func (m *Manager) db(name string) (*database, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	d := m.dbs[name]
	if d == nil {
		d = newDatabase(m, name)
		m.dbs[name] = d
	}
	return d, nil
}

// NewSession returns the lock state of one client session of database.
// lost is called once when a lock connection holding one of the
// session's locks dies, before a replacement connection is dialled:
// PostgreSQL released the lock, and the client must be told and closed.
// It runs on whichever goroutine found the loss and must not block.
func (m *Manager) NewSession(database string, lost func()) *Session {
	m.mu.Lock()
	m.nextID++
	id := m.nextID
	m.mu.Unlock()
	return &Session{m: m, dbName: database, id: id, onLost: lost}
}

// Close releases every lock (closing the lock connections) and refuses
// later calls.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	for _, d := range m.databases() {
		d.close()
	}
}

// databases lists the databases used so far.
func (m *Manager) databases() []*database {
	m.mu.Lock()
	defer m.mu.Unlock()
	dbs := make([]*database, 0, len(m.dbs))
	for _, d := range m.dbs {
		dbs = append(dbs, d)
	}
	return dbs
}

// ClientLocks is one client session's entry in Snapshot.
type ClientLocks struct {
	Client   string     `json:"client"`
	Database string     `json:"database"`
	Held     []HeldLock `json:"held"`
	Waiting  *Waiting   `json:"waiting,omitempty"`
}

// HeldLock is a key a client holds in one mode.
type HeldLock struct {
	Key   Key    `json:"key"`
	Mode  string `json:"mode"` // "exclusive" or "shared"
	Count int    `json:"count"`
	PID   uint32 `json:"pid"` // the lock connection's backend pid
}

// Waiting is the key a client waits for.
type Waiting struct {
	Key    Key     `json:"key"`
	Mode   string  `json:"mode"`
	Behind string  `json:"behind"` // "local" (another lockpool client) or "remote"
	Since  float64 `json:"seconds"`
	PID    uint32  `json:"pid"`
}

// Snapshot lists every session that holds or waits for a lock.
func (m *Manager) Snapshot() []ClientLocks {
	var out []ClientLocks
	for _, d := range m.databases() {
		out = append(out, d.snapshot()...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Client < out[j].Client })
	return out
}

// opContext bounds one statement on a lock connection. It is never the
// client's context: a cancelled statement would close the connection and
// with it every client's locks.
func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}
