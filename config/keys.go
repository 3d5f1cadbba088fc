package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

//go:generate go run ./cmd/keytable -out ../docs/configuration.md

// kind is how a key's value is written and stored.
type kind uint8

const (
	kindString   kind = iota // any text; stored in a *string
	kindBool                 // true/false (also yes/no, on/off); *bool
	kindInt                  // a decimal integer; *int
	kindDuration             // Go syntax with a unit (250ms, 5s, 1h30m) or 0; *time.Duration
	kindSize                 // bytes, or a number with B, kB, MB, GB (1024-based); *int
	kindEnum                 // one of key.options; *string
	kindNames                // names, comma-separated or as a YAML list of values; *string, comma-separated
	kindSection              // a mapping of keys; key.at returns the struct they fill
	kindList                 // a list of mappings; key.at appends an item and returns it
)

// key declares one configuration key: how it is parsed, its default, how its
// value is checked, whether a reload applies it, and its row in the
// configuration reference (docs/configuration.md). The table keys is the
// only place a key is declared; the parser, the defaults, the reload's
// restart check, SHOW CONFIG and the reference
// are all driven by it (like PgBouncer's bouncer_params).
type key struct {
	// path is the key's name as the reference shows it: "listen",
	// "server.max_connections", "applications[].max_pinned". The part
	// before the last dot names the section or list (a kindSection or
	// kindList entry) the key belongs to; "[]" marks a list's items.
	path string
	kind kind
	// def is the default, written as in the YAML file and converted like a
	// written value: it is applied to every section or list item before the
	// written keys are read. "" means "" for strings, and is not allowed
	// for other kinds (a test checks that every default converts).
	def string
	// shown replaces `def` in the reference's default column when the default is
	// not a value one could write (instance_id's is computed) or when there
	// is none ("—": the key is required, or optional with no effect
	// unless written). config.yaml may then show an example value.
	shown string
	// meaning is the reference's one-line description (Markdown, no |).
	meaning string
	// options are the values a kindEnum key accepts, in the order error
	// messages list them; meaning must name each of them in backquotes.
	options []string
	// check validates the key's final value (written or default) after its
	// section is read; nil accepts every value of the kind. Rules that
	// involve more than one key are in validate.go.
	check check
	// at returns where the key is stored, given the struct its section
	// fills: a pointer to the field for value kinds (the pointer type must
	// match the kind), the struct to fill for kindSection, and a new item
	// appended to the slice for kindList.
	at func(parent any) any
	// optional: a kindSection that is left nil when not written (tls,
	// auth_query); other sections are always filled, with defaults.
	optional bool
	// empty, when set, is the error for a kindSection written with no value
	// (tls:); otherwise an empty section is filled with defaults.
	empty string
	// restart: a reload (SIGHUP, the console's RELOAD) does not apply a new
	// value, or not fully: what was built from the old one at start (the
	// listeners, client TLS, the logger's format, the event loops, the
	// lease store, lockpool's own lock connections, the cluster
	// coordinator, the address of lockpool's own connections) keeps it
	// until a restart. The reload names such keys in its log line
	// ([RestartNeeded]), SHOW CONFIG shows them as not changeable and the
	// configuration reference marks them. On a section, adding or removing
	// the section needs a restart, a change inside it is reported under the
	// section's name, and every key of the section must be marked too.
	restart bool
}

// keys declares every configuration key, in the order of the reference
// and of "known keys" in messages. Sections come before their keys.
var keys = []key{
	{path: "listen", restart: true, kind: kindString, def: "127.0.0.1:6432", check: hostPort(false),
		meaning: "client-facing address",
		at:      func(c any) any { return &c.(*Config).Listen }},
	{path: "admin_listen", restart: true, kind: kindString, def: "127.0.0.1:9930", check: hostPort(true),
		meaning: "`/metrics`, `/up`, `/health/ready`, `/debug/locks`, the admin views (`/debug/pools`, …), `/debug/pprof/`; `\"\"` turns it off",
		at:      func(c any) any { return &c.(*Config).AdminListen }},
	{path: "auth_method", kind: kindEnum, def: "scram-sha-256", options: []string{"scram-sha-256", "md5", "trust"},
		meaning: "`scram-sha-256`, `md5` or `trust` (trust only when written here)",
		at:      func(c any) any { return &c.(*Config).AuthMethod }},
	{path: "instance_id", restart: true, kind: kindString, def: "", shown: "host name + `-` + pid",
		meaning: "this instance's name in lease holders; `\"\"` means the default",
		at:      func(c any) any { return &c.(*Config).InstanceID }},
	{path: "leak_check_interval", kind: kindDuration, def: "10s", check: nonNegative,
		meaning: "how often idle server connections are checked for hidden advisory locks; `0` turns the sweep off",
		at:      func(c any) any { return &c.(*Config).LeakCheckInterval }},
	{path: "shutdown_timeout", kind: kindDuration, def: "30s", check: nonNegative,
		meaning: "on SIGTERM, how long running transactions may finish before clients get 57P01",
		at:      func(c any) any { return &c.(*Config).ShutdownTimeout }},
	{path: "handover_socket", restart: true, kind: kindString, def: "", check: socketPath,
		meaning: "a Unix socket path (mode 0600) on which a running lockpool hands its listening sockets to a new lockpool started with the same `listen` and `admin_listen`, for restarts that refuse no connection (see [restarts](restarts.md)); `\"\"` turns it off",
		at:      func(c any) any { return &c.(*Config).HandoverSocket }},
	{path: "client_login_timeout", kind: kindDuration, def: "15s", check: positive,
		meaning: "startup and authentication must finish within this, counted from the accept: a connection still waiting for a place in the login pipeline when it passes gets 53300, a login under way 57014 (see [performance](performance.md#logins)). On Linux a TCP connection is accepted only once its first bytes arrive (`TCP_DEFER_ACCEPT`, as PgBouncer's `tcp_defer_accept`): one that sends nothing is dropped by the kernel after about a minute without reaching lockpool",
		at:      func(c any) any { return &c.(*Config).ClientLoginTimeout }},
	{path: "idle_transaction_timeout", kind: kindDuration, def: "0s", check: nonNegative,
		meaning: "a client idle inside a transaction longer than this is closed (25P03); `0` turns it off",
		at:      func(c any) any { return &c.(*Config).IdleTransactionTimeout }},
	{path: "max_message_size", kind: kindSize, def: "64MB", check: sizeBetween(minMessageSize, maxMessageSize),
		meaning: "a larger client message closes that client with 08P01 (bytes, or kB/MB/GB, 1024-based; 1kB to 1GB)",
		at:      func(c any) any { return &c.(*Config).MaxMessageSize }},
	{path: "max_client_connections", kind: kindInt, def: "10000", check: atLeast(1),
		meaning: "logged-in clients over all applications; more get 53300 at login",
		at:      func(c any) any { return &c.(*Config).MaxClientConnections }},
	{path: "event_loops", restart: true, kind: kindInt, def: "0", check: atLeast(0),
		meaning: "event loops that run the client sessions (each an epoll loop on its own thread driving its sessions as coroutines); `0` is one per four CPUs, at least one (see [performance](performance.md))",
		at:      func(c any) any { return &c.(*Config).EventLoops }},
	{path: "io_uring", restart: true, kind: kindBool, def: "true",
		meaning: "each event loop sends the replies and queries of one turn with one io_uring submission, and receives for all the sessions waiting in a read whose sockets became readable together with one more (Linux 5.19 or later; where the kernel refuses io_uring, as under seccomp filters that block it, the loop logs that and sends and receives one by one); `false` always does",
		at:      func(c any) any { return &c.(*Config).IOURing }},
	{path: "admin_token", kind: kindString, def: "",
		meaning: "when set, `/debug/*` needs `Authorization: Bearer <token>` (`/metrics`, `/up`, `/health/ready` stay open); required when `admin_listen` is not a loopback address",
		at:      func(c any) any { return &c.(*Config).AdminToken }},
	{path: "log_format", restart: true, kind: kindEnum, def: "text", options: []string{"text", "json"},
		meaning: "`text` (logfmt, `key=value`) or `json` (one JSON object per line); see [logs](logs.md)",
		at:      func(c any) any { return &c.(*Config).LogFormat }},
	{path: "log_level", kind: kindEnum, def: "info", options: []string{"debug", "info", "warn", "error"},
		meaning: "the least severe level logged: `debug`, `info`, `warn` or `error` (`-debug` forces `debug`)",
		at:      func(c any) any { return &c.(*Config).LogLevel }},
	{path: "log_pins_over", kind: kindDuration, def: "1m", check: nonNegative,
		meaning: "a pin held longer than this is logged once, with its reason (see [logs](logs.md)); `0` turns it off",
		at:      func(c any) any { return &c.(*Config).LogPinsOver }},
	{path: "admin_users", kind: kindNames, def: "",
		meaning: "users (each listed under `users`) who may log in to the admin console, the virtual database `lockpool` on the client port: a YAML list (`[ops, alice]`) or a comma-separated string (`ops,alice`)",
		at:      func(c any) any { return &c.(*Config).AdminUsers }},

	{path: "tls", restart: true, kind: kindSection, optional: true,
		empty:   "tls is empty: set cert_file and key_file, or remove tls to serve without TLS",
		meaning: "optional client-facing TLS",
		at:      func(c any) any { c.(*Config).TLS = &TLS{}; return c.(*Config).TLS }},
	{path: "tls.cert_file", restart: true, kind: kindString, shown: "—",
		meaning: "certificate (PEM) for client-facing TLS: lockpool answers SSLRequest with a real handshake; required when `tls` is set",
		at:      func(t any) any { return &t.(*TLS).CertFile }},
	{path: "tls.key_file", restart: true, kind: kindString, shown: "—",
		meaning: "its private key (PEM); required when `tls` is set",
		at:      func(t any) any { return &t.(*TLS).KeyFile }},
	{path: "tls.required", restart: true, kind: kindBool, def: "false",
		meaning: "refuse clients that do not ask for TLS (28000)",
		at:      func(t any) any { return &t.(*TLS).Required }},

	{path: "server", kind: kindSection,
		meaning: "the PostgreSQL behind the proxy",
		at:      func(c any) any { return &c.(*Config).Server }},
	{path: "server.host", restart: true, kind: kindString, def: "127.0.0.1",
		check:   notEmpty("a host name, an IP address, or a Unix socket directory starting with /"),
		meaning: "PostgreSQL host, or a Unix socket directory starting with `/`",
		at:      func(s any) any { return &s.(*Server).Host }},
	{path: "server.port", restart: true, kind: kindInt, def: "5432", check: between(1, 65535),
		meaning: "PostgreSQL port",
		at:      func(s any) any { return &s.(*Server).Port }},
	{path: "server.max_connections", kind: kindInt, def: "20", check: atLeast(1),
		meaning: "this instance's server connections, all applications together (first come, first served)",
		at:      func(s any) any { return &s.(*Server).MaxConnections }},
	{path: "server.idle_timeout", kind: kindDuration, def: "10m", check: positive,
		meaning: "idle server connections are closed after this (PgBouncer's `server_idle_timeout` default too); the connection that replaces one costs a dial, a login and a backend that starts cold",
		at:      func(s any) any { return &s.(*Server).IdleTimeout }},
	{path: "server.max_lifetime", kind: kindDuration, def: "1h", check: positive,
		meaning: "server connections are closed at their next release after this",
		at:      func(s any) any { return &s.(*Server).MaxLifetime }},
	{path: "server.connect_timeout", kind: kindDuration, def: "5s", check: positive,
		meaning: "dialing plus server login",
		at:      func(s any) any { return &s.(*Server).ConnectTimeout }},
	{path: "server.dial_concurrency", restart: true, kind: kindInt, def: "4", check: atLeast(1),
		meaning: "server connections being opened (dial and login) at once; more wait their turn (within the client's `wait_timeout`), so a burst of clients does not make every login time out; a dial that fails for a connection error, a timeout, 53300 or 57P03 is retried for a waiting client within its `wait_timeout`",
		at:      func(s any) any { return &s.(*Server).DialConcurrency }},
	{path: "server.tls", restart: true, kind: kindEnum, def: "prefer", options: []string{"disable", "prefer", "require", "verify-full"},
		meaning: "TLS to PostgreSQL: `disable`, `prefer`, `require` or `verify-full` (as libpq's sslmode)",
		at:      func(s any) any { return &s.(*Server).TLS }},
	{path: "server.ca_file", restart: true, kind: kindString, shown: "—",
		meaning: "CA bundle that verifies the server's certificate (`require` or `verify-full`)",
		at:      func(s any) any { return &s.(*Server).CAFile }},
	{path: "server.hosts", restart: true, kind: kindNames, shown: "—",
		meaning: "several PostgreSQL hosts, a YAML list of `host:port` (a primary and its standbys, in any order); lockpool checks each one's role and follows the primary (see [failover](failover.md)); instead of `host` and `port`",
		at:      func(s any) any { return &s.(*Server).HostList }},
	{path: "server.health_check_interval", restart: true, kind: kindDuration, def: "1s", check: positive,
		meaning: "how often each host's role (`pg_is_in_recovery()`) and replay lag are checked, on a connection of lockpool's own; every 50 ms while a client waits for a host (no primary, or no standby within `max_lag`)",
		at:      func(s any) any { return &s.(*Server).HealthCheckInterval }},
	{path: "server.tcp_user_timeout", restart: true, kind: kindDuration, def: "15s", check: nonNegative,
		meaning: "a server connection whose sent data (or keepalive probes) stay unacknowledged this long is closed, so a host that stops answering without a reset (a network partition) is given up within it; `0` keeps the OS default",
		at:      func(s any) any { return &s.(*Server).TCPUserTimeout }},

	{path: "users", kind: kindList,
		meaning: "who may log in, and as whom lockpool logs in to PostgreSQL",
		at: func(c any) any {
			cfg := c.(*Config)
			cfg.Users = append(cfg.Users, User{})
			return &cfg.Users[len(cfg.Users)-1]
		}},
	{path: "users[].name", kind: kindString, shown: "—",
		meaning: "a role clients log in as; lockpool logs in to PostgreSQL with the same name",
		at:      func(u any) any { return &u.(*User).Name }},
	{path: "users[].password", kind: kindString, shown: "—",
		meaning: "its password (usually `${VAR}`), or a SCRAM verifier `SCRAM-SHA-256$4096:…` copied from `pg_authid.rolpassword`; required unless `auth_method: trust`",
		at:      func(u any) any { return &u.(*User).Password }},

	{path: "applications", kind: kindList,
		meaning: "the connection budgets; a client is matched by its user (and database)",
		at: func(c any) any {
			cfg := c.(*Config)
			cfg.Applications = append(cfg.Applications, Application{})
			return &cfg.Applications[len(cfg.Applications)-1]
		}},
	{path: "applications[].name", kind: kindString, shown: "—",
		meaning: "the budget's name (metrics label `app`); unique, with no control characters",
		at:      func(a any) any { return &a.(*Application).Name }},
	{path: "applications[].user", kind: kindString, shown: "—",
		meaning: "clients logging in as this user belong to this application",
		at:      func(a any) any { return &a.(*Application).User }},
	{path: "applications[].database", kind: kindString, shown: "any",
		meaning: "optional: only clients of this database (not `lockpool`, the admin console's)",
		at:      func(a any) any { return &a.(*Application).Database }},
	{path: "applications[].pool_mode", kind: kindEnum, def: "transaction", options: []string{"transaction", "session"},
		meaning: "`transaction` or `session` (the client keeps its connection)",
		at:      func(a any) any { return &a.(*Application).PoolMode }},
	{path: "applications[].max_connections", kind: kindInt, def: "4", check: atLeast(1),
		meaning: "server connections this application may have open at once",
		at:      func(a any) any { return &a.(*Application).MaxConnections }},
	{path: "applications[].max_pinned", kind: kindInt, def: "1",
		meaning: "of those, how many may be pinned at once (must be less than `max_connections`)",
		at:      func(a any) any { return &a.(*Application).MaxPinned }},
	{path: "applications[].advisory_locks", kind: kindEnum, def: "hold", options: []string{"pin", "reject", "allow", "hold"},
		meaning: "`hold`, `pin`, `reject` or `allow` (see [locks](locks.md))",
		at:      func(a any) any { return &a.(*Application).AdvisoryLocks }},
	{path: "applications[].session_state", kind: kindEnum, def: "pin", options: []string{"pin", "reject", "allow"},
		meaning: "`pin`, `reject` or `allow` for LISTEN (under `listen: pin`), temp tables, WITH HOLD cursors, SQL PREPARE, SET ROLE, LOAD",
		at:      func(a any) any { return &a.(*Application).SessionState }},
	{path: "applications[].listen", kind: kindEnum, def: "shared", options: []string{"shared", "pin", "reject"},
		meaning: "`shared`: LISTEN, UNLISTEN and `pg_listening_channels()` are answered by lockpool, and notifications come from one listener connection per database (see [LISTEN and NOTIFY](listen.md)); `pin`: LISTEN pins like other session state; `reject`: LISTEN fails with 0A000",
		at:      func(a any) any { return &a.(*Application).Listen }},
	{path: "applications[].wait_timeout", kind: kindDuration, def: "5s", check: positive,
		meaning: "how long a client waits for a connection or a pin slot (then 53300)",
		at:      func(a any) any { return &a.(*Application).WaitTimeout }},
	{path: "applications[].max_prepared_statements", kind: kindInt, def: "200", check: atLeast(1),
		meaning: "protocol-level prepared statements kept per server connection (LRU)",
		at:      func(a any) any { return &a.(*Application).MaxPreparedStatements }},
	{path: "applications[].budget_scope", restart: true, kind: kindEnum, def: "instance", options: []string{"instance", "cluster"},
		meaning: "`instance`: `max_connections` and `max_pinned` are this instance's; `cluster`: they are shared by every instance of `cluster.name` (see [several instances](cluster.md))",
		at:      func(a any) any { return &a.(*Application).BudgetScope }},
	{path: "applications[].min_share", kind: kindInt, def: "1", check: atLeast(0),
		meaning: "with `budget_scope: cluster`: server connections each live instance keeps even when others wait, so it can always serve",
		at:      func(a any) any { return &a.(*Application).MinShare }},
	{path: "applications[].target", kind: kindEnum, def: "primary", options: []string{"primary", "standby", "prefer-standby", "any"},
		meaning: "where its server connections go: `primary` (the host not in recovery), `standby` (standbys within `max_lag` only; 53300 when none), `prefer-standby` (standbys, else the primary) or `any` (all of them); see [failover](failover.md)",
		at:      func(a any) any { return &a.(*Application).Target }},
	{path: "applications[].max_lag", kind: kindDuration, def: "10s", check: positive,
		meaning: "a standby whose replay lags the primary by more than this is not used by this application",
		at:      func(a any) any { return &a.(*Application).MaxLag }},
	{path: "applications[].max_clients", kind: kindInt, def: "0", check: atLeast(0),
		meaning: "logged-in clients of this application; more get 53300 at login; `0` means no limit",
		at:      func(a any) any { return &a.(*Application).MaxClients }},

	{path: "auth_query", kind: kindSection, optional: true,
		meaning: "optional SCRAM verifier lookup for users not listed under `users`",
		at:      func(c any) any { c.(*Config).AuthQuery = &AuthQuery{}; return c.(*Config).AuthQuery }},
	{path: "auth_query.user", kind: kindString, shown: "—",
		meaning: "a low-privilege role lockpool logs in as to look up SCRAM verifiers of users not listed under `users` (then no password list is needed); required when `auth_query` is set",
		at:      func(q any) any { return &q.(*AuthQuery).User }},
	{path: "auth_query.password", kind: kindString, shown: "—",
		meaning: "its password (usually `${VAR}`)",
		at:      func(q any) any { return &q.(*AuthQuery).Password }},
	{path: "auth_query.database", kind: kindString, def: "postgres",
		meaning: "where the lookup function lives",
		at:      func(q any) any { return &q.(*AuthQuery).Database }},
	{path: "auth_query.query", kind: kindString, def: "SELECT usename, passwd FROM lockpool.user_lookup($1)",
		meaning: "returns (name, verifier) for `$1`",
		at:      func(q any) any { return &q.(*AuthQuery).Query }},
	{path: "auth_query.cache_ttl", kind: kindDuration, def: "60s",
		meaning: "how long a looked-up verifier (or a miss) is reused",
		at:      func(q any) any { return &q.(*AuthQuery).CacheTTL }},

	{path: "leases", kind: kindSection,
		meaning: "the lease store",
		at:      func(c any) any { return &c.(*Config).Leases }},
	{path: "leases.schema", restart: true, kind: kindString, def: "lockpool", check: sqlIdentifier,
		meaning: "where the lease table lives, in each database that uses leases (a lowercase SQL identifier)",
		at:      func(l any) any { return &l.(*Leases).Schema }},
	{path: "leases.max_connections", restart: true, kind: kindInt, def: "2", check: atLeast(1),
		meaning: "lockpool's own lease connections (plus one LISTEN connection per database with waiters)",
		at:      func(l any) any { return &l.(*Leases).MaxConnections }},

	{path: "cluster", restart: true, kind: kindSection, optional: true,
		empty:   "cluster is empty: set cluster.name, or remove cluster to keep every budget per instance",
		meaning: "optional: the lockpool instances that share `budget_scope: cluster` budgets through PostgreSQL",
		at:      func(c any) any { c.(*Config).Cluster = &Cluster{}; return c.(*Config).Cluster }},
	{path: "cluster.name", restart: true, kind: kindString, shown: "—",
		meaning: "instances with the same name share their cluster budgets; required when `cluster` is set",
		at:      func(k any) any { return &k.(*Cluster).Name }},
	{path: "cluster.database", restart: true, kind: kindString, def: "", shown: "the cluster applications' database, else `postgres`",
		meaning: "the database whose `leases.schema` holds the cluster tables (`cluster_instances`, `cluster_slots`); an application must be configured for it (or for any database): its user logs in. When not set: the database the `budget_scope: cluster` applications name, when they all name the same one (`postgres` when none names one); it must be set when they name different ones",
		at:      func(k any) any { return &k.(*Cluster).Database }},
	{path: "cluster.ttl", restart: true, kind: kindDuration, def: "5s", check: positive,
		meaning: "an instance that has not heartbeaten for this long is dead: the others reclaim its slots once its backends are gone",
		at:      func(k any) any { return &k.(*Cluster).TTL }},
	{path: "cluster.heartbeat", restart: true, kind: kindDuration, def: "0s", shown: "`ttl` / 10", check: nonNegative,
		meaning: "how often an instance heartbeats and rebalances its slots; `0` means `ttl` / 10; must be less than `ttl` / 2",
		at:      func(k any) any { return &k.(*Cluster).Heartbeat }},
	{path: "cluster.advertise", restart: true, kind: kindString, def: "", shown: "the client listener's address", check: hostPort(true),
		meaning: "host:port other instances forward cancel and signal requests for this instance's clients to",
		at:      func(k any) any { return &k.(*Cluster).Advertise }},

	{path: "notifications", kind: kindSection,
		meaning: "notifications for clients of `listen: shared` applications",
		at:      func(c any) any { return &c.(*Config).Notifications }},
	{path: "notifications.max_pending", kind: kindSize, def: "1MB", check: sizeBetween(minMessageSize, maxMessageSize),
		meaning: "bytes of notifications queued for one client that does not read them; over it that client alone gets FATAL 53200 and is closed",
		at:      func(n any) any { return &n.(*Notifications).MaxPending }},

	{path: "locks", kind: kindSection,
		meaning: "lockpool's own lock connections, for applications with `advisory_locks: hold`",
		at:      func(c any) any { return &c.(*Config).Locks }},
	{path: "locks.max_connections", restart: true, kind: kindInt, def: "2", check: atLeast(1),
		meaning: "lock connections per database (`application_name` `lockpool locks`; one more evaluates key expressions), outside every application budget",
		at:      func(l any) any { return &l.(*Locks).MaxConnections }},
	{path: "locks.max_waiters", restart: true, kind: kindInt, def: "16", check: atLeast(1),
		meaning: "blocking acquires per database that wait behind a holder outside lockpool at once (more queue in lockpool)",
		at:      func(l any) any { return &l.(*Locks).MaxWaiters }},
}

const (
	minMessageSize = 1 << 10
	maxMessageSize = 1 << 30
)

// name is the key's own name, the last part of its path.
func (k *key) name() string { return k.path[strings.LastIndexByte(k.path, '.')+1:] }

// parent is the path of the section or list k belongs to ("" for the top
// level), without the "[]" of list items.
func (k *key) parent() string {
	i := strings.LastIndexByte(k.path, '.')
	if i < 0 {
		return ""
	}
	return strings.TrimSuffix(k.path[:i], "[]")
}

// isValue reports whether k holds a value (not a section or a list).
func (k *key) isValue() bool { return k.kind != kindSection && k.kind != kindList }

// children returns the keys declared directly in the section or list with
// that path ("" for the top level), in table order.
func children(path string) []*key {
	var out []*key
	for i := range keys {
		if keys[i].parent() == path {
			out = append(out, &keys[i])
		}
	}
	return out
}

// set converts text, the value written for k (null: written empty), and
// stores it in dst, which k.at returned. problem says what is wrong with the
// value, for a message after "name: "; it quotes the value only as shown.
func (k *key) set(dst any, text string, null bool, shown string) (problem string) {
	switch k.kind {
	case kindString, kindNames:
		*dst.(*string) = text
	case kindEnum:
		if null || !contains(k.options, text) {
			return fmt.Sprintf("%s is not one of %s", shown, strings.Join(k.options, ", "))
		}
		*dst.(*string) = text
	case kindBool:
		switch strings.ToLower(strings.TrimSpace(text)) {
		case "true", "yes", "on":
			*dst.(*bool) = true
		case "false", "no", "off":
			*dst.(*bool) = false
		default:
			return shown + " is not true or false"
		}
	case kindInt:
		if null {
			return "missing value (an integer)"
		}
		n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 0)
		if err != nil {
			return shown + " is not an integer"
		}
		*dst.(*int) = int(n)
	case kindDuration:
		if null {
			return "missing value (a duration such as 250ms, 5s, 1m)"
		}
		d, err := time.ParseDuration(strings.TrimSpace(text))
		if err != nil {
			return shown + " is not a duration (write a number with a unit: 250ms, 5s, 1m, 1h)"
		}
		*dst.(*time.Duration) = d
	case kindSize:
		if null {
			return "missing value (bytes, or a size such as 64MB)"
		}
		n, ok := parseSize(text)
		if !ok {
			return shown + " is not a size (write bytes, or a number with kB, MB or GB: 64MB)"
		}
		*dst.(*int) = n
	default:
		panic("config: set on " + k.path + ", which holds no value")
	}
	return ""
}

// setDefault stores k's default in dst. A default that does not convert is
// a bug in the table (a test converts every one).
func (k *key) setDefault(dst any) {
	if p := k.set(dst, k.def, false, strconv.Quote(k.def)); p != "" {
		panic("config: default of " + k.path + ": " + p)
	}
}

// load returns the value dst (from k.at) points to.
func load(dst any) any {
	switch d := dst.(type) {
	case *string:
		return *d
	case *bool:
		return *d
	case *int:
		return *d
	case *time.Duration:
		return *d
	}
	panic(fmt.Sprintf("config: no value behind %T", dst))
}

// check validates one key's final value. name is the key as messages show
// it ("applications[0].max_connections"), v its value (string, bool, int or
// time.Duration as its kind stores it) and quoted, for strings, the value as
// written in the file, quoted (never the expansion of a ${VAR}). It returns
// the whole message, or "" when v is valid.
type check func(name string, v any, quoted string) string

func positive(name string, v any, _ string) string {
	if d := v.(time.Duration); d <= 0 {
		return fmt.Sprintf("%s must be greater than 0 (got %s)", name, d)
	}
	return ""
}

func nonNegative(name string, v any, _ string) string {
	if d := v.(time.Duration); d < 0 {
		return fmt.Sprintf("%s must not be negative (got %s; 0 turns it off)", name, d)
	}
	return ""
}

func atLeast(min int) check {
	return func(name string, v any, _ string) string {
		if n := v.(int); n < min {
			return fmt.Sprintf("%s must be at least %d (got %d)", name, min, n)
		}
		return ""
	}
}

func between(lo, hi int) check {
	return func(name string, v any, _ string) string {
		if n := v.(int); n < lo || n > hi {
			return fmt.Sprintf("%s must be between %d and %d (got %d)", name, lo, hi, n)
		}
		return ""
	}
}

func sizeBetween(lo, hi int) check {
	return func(name string, v any, _ string) string {
		if n := v.(int); n < lo || n > hi {
			return fmt.Sprintf("%s must be between %s and %s (got %d bytes)", name, sizeText(lo), sizeText(hi), n)
		}
		return ""
	}
}

// sizeText writes n bytes with the largest unit that divides it.
func sizeText(n int) string {
	for _, u := range []struct {
		name string
		mult int
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.Itoa(n/u.mult) + u.name
		}
	}
	return strconv.Itoa(n) + "B"
}

func notEmpty(hint string) check {
	return func(name string, v any, _ string) string {
		if v.(string) == "" {
			return fmt.Sprintf("%s must not be empty (%s)", name, hint)
		}
		return ""
	}
}

// hostPort accepts a host:port address; "" only when mayBeEmpty.
func hostPort(mayBeEmpty bool) check {
	return func(name string, v any, quoted string) string {
		addr := v.(string)
		if addr == "" {
			if mayBeEmpty {
				return ""
			}
			return name + " must not be empty (host:port, e.g. 127.0.0.1:6432)"
		}
		_, port, err := net.SplitHostPort(addr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 0 || n > 65535 {
			return fmt.Sprintf("%s: %s is not a host:port address (e.g. 127.0.0.1:6432)", name, quoted)
		}
		return ""
	}
}

// maxSocketPath is the longest handover_socket: a Unix socket path has
// at most 107 bytes, and the socket is first bound beside it under the
// path + "." + pid.
const maxSocketPath = 96

func socketPath(name string, v any, quoted string) string {
	if p := v.(string); len(p) > maxSocketPath {
		return fmt.Sprintf("%s: %s is %d bytes long; a Unix socket path may have at most %d here", name, quoted, len(p), maxSocketPath)
	}
	return ""
}

func sqlIdentifier(name string, v any, quoted string) string {
	if msg := checkIdentifier(v.(string)); msg != "" {
		return name + ": " + quoted + " " + msg
	}
	return ""
}
