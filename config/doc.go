// Package config owns lockpool's configuration: the YAML schema, the
// defaults, and the validation. It is the only package that reads YAML;
// every other package receives the plain structs of types.go.
//
// Every key is declared once, in the table keys (keys.go): its path, kind,
// default, one-line meaning, value check, the struct field it fills, and
// whether a reload applies it (restart). The parser reads sections and keys
// by walking that table and applies the defaults from it; [RestartNeeded]
// (the reload's restart_needed keys), [Config.SettingsInForce] (the admin
// console's SHOW CONFIG and its changeable column) and [Reference] (the
// configuration reference, docs/configuration.md) are derived from it.
// `go generate ./config` rewrites docs/configuration.md; a test fails when
// it differs. Rules that involve several keys are in validate.go.
//
// Entry points: [Load] reads a file, expanding ${VAR} from the process
// environment; [Parse] does the same from bytes with an injected getenv, for
// tests and for config reloads.
//
// # Format
//
//   - Keys are the snake_case names declared in keys.go. Unknown keys,
//     duplicate keys, YAML merge keys (<<) and more than one YAML document
//     are errors. Anchors and aliases are resolved.
//   - Every scalar value may contain ${NAME} (NAME = [A-Za-z_][A-Za-z0-9_]*),
//     replaced by that environment variable's value; an unset variable is an
//     error (a variable set to "" expands to ""). ${NAME:-default} takes
//     default when NAME is unset or empty, as in the shell (default may not
//     contain }). Write $${ for a literal ${.
//     Keys are never expanded. Expansion happens before the value is
//     converted, so `port: ${PGPORT}` works.
//   - Durations use Go syntax with a unit: 250ms, 5s, 1m, 1h30m; a bare 0 is
//     also accepted. A plain number such as 5 is an error (no unit).
//   - max_message_size takes a plain integer (bytes) or an integer with a
//     unit: B, kB (or KB, KiB), MB (MiB), GB (GiB). As in postgresql.conf the
//     units are powers of 1024: 64MB = 64 MiB = 67108864 bytes.
//   - admin_users takes a YAML list of names or a comma-separated string;
//     the list is stored comma-separated.
//   - A key written with an empty value (`key:` or `key: ~`) means "" for
//     string keys (instance_id: "" means the default) and is an error for
//     numbers, durations and the tls section.
//
// # Errors
//
// Parse and Load return either a valid *Config or a nil *Config and an error.
// The error joins (errors.Join, one per line) every problem found, sorted by
// line, each an [*Error] whose text is "path:line: message", so
// `lockpool -check` can print them all at once. The line is that of the
// offending key, or of the enclosing section/list item when the offending
// value is a default. Error messages never contain a password; a bad value
// is quoted as written in the file (before ${VAR} expansion), so the value
// of an environment variable is never printed either. YAML syntax errors
// carry the line yaml.v3 reports, which for some errors is the line where
// the enclosing block starts.
//
// # Invariants of a *Config returned without error
//
//   - Every field holds either the written value or its documented default;
//     InstanceID is never "" (default: host name + "-" + pid).
//   - AuthMethod ∈ {scram-sha-256, md5, trust}; every user has a password
//     unless AuthMethod is trust. User names are unique and non-empty.
//   - len(Users) ≥ 1 and len(Applications) ≥ 1. Application names are unique;
//     every Application.User names an entry of Users; no two applications
//     share the same (User, Database) pair, so [Config.Match] is unambiguous.
//   - PoolMode ∈ {transaction, session}; AdvisoryLocks ∈ {pin, reject,
//     allow, hold}; SessionState ∈ {pin, reject, allow}.
//   - Locks.MaxConnections ≥ 1 and Locks.MaxWaiters ≥ 1 (lock connections
//     are per database and outside every budget and the pin reservation).
//   - Every MaxConnections ≥ 1, 0 ≤ MaxPinned < the application's
//     MaxConnections, MaxPreparedStatements ≥ 1.
//   - Σ Applications[i].MaxPinned + Leases.MaxConnections <
//     Server.MaxConnections: pins and lease connections together can never
//     take every server connection of the instance. (Budgets, MaxConnections,
//     may add up to more than Server.MaxConnections; that cap is enforced at
//     run time.)
//   - Server.Port ∈ [1, 65535]; Server.Host ≠ "". Listen is a host:port
//     address; AdminListen is "" (disabled) or a host:port address different
//     from Listen. AdminToken is set whenever AdminListen is not a loopback
//     address (127.0.0.0/8, ::1, localhost).
//   - LogFormat ∈ {text, json}; LogLevel ∈ {debug, info, warn, error};
//     LogPinsOver ≥ 0 (0 = pins are not logged).
//   - TLS is nil or has both CertFile and KeyFile (paths are kept as written,
//     not checked for existence and not resolved against the config's
//     directory).
//   - Leases.Schema is a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most
//     63 bytes, not a reserved key word, not starting with pg_), safe to
//     splice into SQL unquoted.
//   - Durations: ClientLoginTimeout, Server.IdleTimeout, Server.MaxLifetime,
//     Server.ConnectTimeout and every WaitTimeout are > 0;
//     LeakCheckInterval (0 = sweep off), ShutdownTimeout (0 = do not wait) and
//     IdleTransactionTimeout (0 = off) are ≥ 0.
//   - MaxMessageSize ∈ [1 KiB, 1 GiB].
//   - Cluster is nil or has a Name and a Database (when not written: the
//     database the budget_scope cluster applications name, postgres when
//     none names one; an error when they name different ones).
package config
