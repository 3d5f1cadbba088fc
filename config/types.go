package config

import (
	"net"
	"strconv"
	"strings"
	"time"
)

// Config is the whole parsed and validated configuration. Other packages
// receive the plain structs below; only this package reads YAML. Each
// field's comment names its key; the key's default, meaning and checks are
// declared in keys.go (and listed in docs/configuration.md).
type Config struct {
	Listen                 string        // listen: client-facing address
	AdminListen            string        // admin_listen: /metrics, /up, /health/ready, /debug/* ("" disables)
	AuthMethod             string        // auth_method: scram-sha-256 | md5 | trust
	InstanceID             string        // instance_id: default hostname + "-" + pid
	LeakCheckInterval      time.Duration // leak_check_interval (0 disables the sweep)
	ShutdownTimeout        time.Duration // shutdown_timeout: how long SIGTERM waits for running transactions
	HandoverSocket         string        // handover_socket: Unix socket path for listener handover ("" = off)
	ClientLoginTimeout     time.Duration // client_login_timeout: startup + auth must finish within this
	IdleTransactionTimeout time.Duration // idle_transaction_timeout: client idle inside a transaction (0 = off)
	MaxMessageSize         int           // max_message_size: bytes; a larger client message closes the client with 08P01
	MaxClientConnections   int           // max_client_connections: clients over all applications
	EventLoops             int           // event_loops: loops running the sessions (0: GOMAXPROCS)
	IOURing                bool          // io_uring: loops batch their sends through io_uring
	AdminToken             string        // admin_token: when set, /debug/* needs "Authorization: Bearer <token>"
	LogFormat              string        // log_format: text | json
	LogLevel               string        // log_level: debug | info | warn | error
	LogPinsOver            time.Duration // log_pins_over: a pin held longer than this is logged once (0 = off)
	AdminUsers             string        // admin_users: comma-separated users allowed on the admin console (database lockpool); a YAML list is joined
	TLS                    *TLS          // tls: nil when not configured
	Server                 Server
	Users                  []User
	Applications           []Application
	Leases                 Leases
	Locks                  Locks
	Notifications          Notifications
	Cluster                *Cluster   // cluster: nil when not configured
	AuthQuery              *AuthQuery // auth_query: nil when not configured

	// Path is the file the config was read from ("" when parsed from bytes).
	Path string
}

// TLS is the client-facing TLS configuration.
type TLS struct {
	CertFile string // cert_file
	KeyFile  string // key_file
	Required bool   // required: refuse clients that do not ask for TLS
}

// Server describes the PostgreSQL server behind the proxy.
type Server struct {
	Host            string        // host; a path starting with / is a Unix socket directory
	Port            int           // port
	MaxConnections  int           // max_connections: instance cap over all applications
	IdleTimeout     time.Duration // idle_timeout: idle server connections are closed after this
	MaxLifetime     time.Duration // max_lifetime: server connections are closed at their next release after this
	ConnectTimeout  time.Duration // connect_timeout: dialing + server login
	DialConcurrency int           // dial_concurrency: dials at once (read at start)
	TLS             string        // tls: disable | prefer | require | verify-full
	CAFile          string        // ca_file: CA bundle for tls verify-full
	// HostList is hosts as written: host:port entries, comma-separated
	// ("" when not written); Hosts reads it.
	HostList            string
	HealthCheckInterval time.Duration // health_check_interval: each host's role and replay lag are checked this often
	TCPUserTimeout      time.Duration // tcp_user_timeout: unacknowledged data (or unanswered keepalives) for this long ends a server connection (0: the OS default)
}

// HostAddr is one PostgreSQL host: a name or address (or a Unix socket
// directory starting with /) and a port.
type HostAddr struct {
	Host string
	Port int
}

// String is host:port (a socket directory as dir:port).
func (h HostAddr) String() string {
	if strings.HasPrefix(h.Host, "/") {
		return h.Host + ":" + strconv.Itoa(h.Port)
	}
	return net.JoinHostPort(h.Host, strconv.Itoa(h.Port))
}

// Hosts are the PostgreSQL hosts lockpool follows: hosts when written
// (checked by validation), else the one of host and port.
func (s Server) Hosts() []HostAddr {
	if s.HostList == "" {
		return []HostAddr{{Host: s.Host, Port: s.Port}}
	}
	var out []HostAddr
	for _, f := range strings.Split(s.HostList, ",") {
		if h, bad := parseHostAddr(strings.TrimSpace(f), s.Port); bad == "" {
			out = append(out, h)
		}
	}
	return out
}

// At returns s with Host and Port set to h: the server settings for a
// connection to that host.
func (s Server) At(h HostAddr) Server {
	s.Host, s.Port = h.Host, h.Port
	return s
}

// Targets of applications[].target: which hosts an application's server
// connections go to.
const (
	TargetPrimary       = "primary"        // the one host not in recovery
	TargetStandby       = "standby"        // standbys within max_lag only
	TargetPreferStandby = "prefer-standby" // standbys within max_lag, else the primary
	TargetAny           = "any"            // the primary and standbys within max_lag
)

// User is a login role: clients authenticate against Password and the proxy
// logs in to the server with the same name and password.
type User struct {
	Name     string // name
	Password string // password (after ${VAR} expansion)
}

// Application is a connection budget matched by user (and optionally database).
type Application struct {
	Name                  string        // name
	User                  string        // user: must name an entry of users
	Database              string        // database: "" matches any database
	PoolMode              string        // pool_mode: transaction | session
	MaxConnections        int           // max_connections
	MaxPinned             int           // max_pinned (must be < MaxConnections)
	AdvisoryLocks         string        // advisory_locks: pin | reject | allow | hold
	SessionState          string        // session_state: pin | reject | allow
	Listen                string        // listen: shared | pin | reject
	WaitTimeout           time.Duration // wait_timeout
	MaxPreparedStatements int           // max_prepared_statements: per server connection
	MaxClients            int           // max_clients: logged-in clients of this application (0 = no limit)
	BudgetScope           string        // budget_scope: instance | cluster
	MinShare              int           // min_share: connections each live instance keeps (budget_scope cluster)
	Target                string        // target: primary | standby | prefer-standby | any
	MaxLag                time.Duration // max_lag: a standby whose replay lags more is not used
}

// ClusterScoped reports whether the application's budgets are shared by
// the instances of the cluster (budget_scope: cluster).
func (a *Application) ClusterScoped() bool { return a.BudgetScope == "cluster" }

// Cluster configures the instances that share cluster budgets.
type Cluster struct {
	Name      string        // name: instances with the same name share budgets
	Database  string        // database: where the cluster tables live
	TTL       time.Duration // ttl: an instance silent this long is dead
	Heartbeat time.Duration // heartbeat: 0 means TTL/10
	Advertise string        // advertise: host:port for forwarded cancel and signal requests ("" = the listener's)
}

// HeartbeatEvery is the heartbeat interval in force: Heartbeat, or TTL/10
// when Heartbeat is 0.
func (c *Cluster) HeartbeatEvery() time.Duration {
	if c.Heartbeat > 0 {
		return c.Heartbeat
	}
	return c.TTL / 10
}

// Leases configures the lease store.
type Leases struct {
	Schema         string // schema
	MaxConnections int    // max_connections: lockpool's own lease connections, all databases together
}

// Notifications configures the delivery of notifications to clients of
// listen: shared applications.
type Notifications struct {
	MaxPending int // max_pending: bytes queued for one client before it is closed (53200)
}

// Locks configures lockpool's own lock connections (advisory_locks: hold).
type Locks struct {
	MaxConnections int // max_connections: lock connections per database, outside every application budget
	MaxWaiters     int // max_waiters: acquires waiting behind a holder outside lockpool at once, per database
}

// Match returns the application a client logging in as user to database
// belongs to: the first entry with that user and that database, else the
// first with that user and no database. ok is false when none matches.
func (c *Config) Match(user, database string) (app *Application, ok bool) {
	for i := range c.Applications {
		a := &c.Applications[i]
		if a.User == user && a.Database == database {
			return a, true
		}
	}
	for i := range c.Applications {
		a := &c.Applications[i]
		if a.User == user && a.Database == "" {
			return a, true
		}
	}
	return nil, false
}

// ConsoleDatabase is the virtual database of lockpool's admin console: a
// client that asks for it reaches the console, never an application.
const ConsoleDatabase = "lockpool"

// IsAdmin reports whether user is listed in admin_users.
func (c *Config) IsAdmin(user string) bool {
	for _, name := range c.AdminUserList() {
		if name == user {
			return true
		}
	}
	return false
}

// AdminUserList returns the names admin_users lists, without blanks.
func (c *Config) AdminUserList() []string {
	var out []string
	for _, f := range strings.Split(c.AdminUsers, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// UserByName returns the configured user with that name.
func (c *Config) UserByName(name string) (*User, bool) {
	for i := range c.Users {
		if c.Users[i].Name == name {
			return &c.Users[i], true
		}
	}
	return nil, false
}

// AuthQuery looks up SCRAM verifiers of users not listed under users from
// PostgreSQL, through a low-privilege role.
type AuthQuery struct {
	User     string        // user: the role lockpool logs in as to run the query
	Password string        // password: its password
	Database string        // database: where the lookup function lives
	Query    string        // query: returns (name, verifier) for $1
	CacheTTL time.Duration // cache_ttl: how long a looked-up verifier is reused
}
