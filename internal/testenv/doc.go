// Package testenv is what lockpool's end-to-end tests (package integration)
// and load tools (tools/bench, tools/soak) share to stand up PostgreSQL and
// lockpool and to talk to them. It is an ordinary package so that the tools
// can import it; only tests and tools do.
//
// It owns:
//
//   - lockpool in-process against the shared test cluster
//     (internal/pgtest): from a list of applications ([Start], [App],
//     [DefaultApp], [AppsYAML]), from a parsed configuration
//     ([StartConfig]) or from a whole YAML text with its log captured
//     ([StartYAML], [UserYAML]); and what a test does with a running one
//     ([Lockpool]: DSN, URL, Connect, ConnectConfig, PsqlCmd, Metric,
//     Pinned, Get);
//   - failover: a primary and its standby ([StartPair], [StartPairWith],
//     [Pair]; the primary in a network namespace to partition it), a
//     configuration over both ([HostsYAML]) and lockpool's view of them
//     ([Lockpool.Hosts], [HostRow], [Addr]);
//   - the admin console: a configuration with an admin user ([AdminUser],
//     [ConsoleYAML], [WithConsole], [StartConsole]) and its commands from pgx and psql
//     ([Lockpool.ConsoleConnect], [ConsoleQuery], [Lockpool.PsqlConsole],
//     [ConsoleResult]);
//   - the password of every test role and user ([Password]), connection
//     strings and psql commands for a port ([DSN], [PsqlCmd]);
//   - the lockpool binary, built once per test process ([LockpoolBinary],
//     [BuildLockpool], [ModuleRoot], [RemoveLockpoolBinary]), and programs run as processes
//     ([Process], [StartProcess], [StartLogged], [WaitReady],
//     [StartLockpoolProcess], and another beside it with the same
//     configuration for a restart: [StartLockpoolBeside]; which of them
//     took a connection: [ServedBy]);
//   - the stack the load tools run: a cluster with a role, a database and
//     pgbench tables, and a lockpool process ([StartStack]);
//   - docs/metrics.md's metric table ([DocumentedMetrics]), which the tests of
//     the metrics and of the Grafana dashboard compare with;
//   - a TCP forwarder that makes PostgreSQL unreachable and reachable again
//     for a lockpool placed behind it ([Forwarder]);
//   - the cluster side: a superuser connection ([SuperConn]), roles and
//     databases made on demand ([EnsureRole], [EnsureDatabase]), backends
//     and processes ([CountBackends], [CountServerConns], [BackendPID],
//     [ClusterPIDs]), a process's CPU and memory ([ProcCPUTicks],
//     [ProcRSSKB]);
//   - PostgreSQL errors ([Code], [PgError], [RequireCode]) and the raw
//     CancelRequest ([SendCancel]);
//   - waiting, naming and logging ([Eventually], [Context],
//     [SettleGoroutines], [UniqueName], [FreePort], [UnusedPort],
//     [LogBuffer], [SkipOrFail], [Long], [DumpGoroutines]);
//   - the model of the advisory locks clients believe they hold, which the
//     randomized lock test and the soak compare pg_locks with ([LockLog]).
//
// Helpers of one subject (the lease SQL functions, pg_locks queries for a
// key, session-state checks) stay with the tests of that subject.
package testenv
