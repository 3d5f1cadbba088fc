// Package pgtest starts throw-away PostgreSQL clusters for tests.
//
// A cluster is created with initdb in a fresh temporary directory, tuned for
// speed (fsync and synchronous_commit off, small shared_buffers) and started
// on a free TCP port on 127.0.0.1, with its unix socket in a private
// directory. Authentication:
//
//	local all         all                   trust
//	local replication postgres              trust
//	host  all         postgres 127.0.0.1/32 trust
//	host  replication postgres 127.0.0.1/32 trust
//	host  all         all      127.0.0.1/32 scram-sha-256
//
// so the superuser "postgres" connects over TCP without a password, while
// roles made with [Cluster.CreateRole] must authenticate with SCRAM.
//
// # Standbys and failover
//
// Every cluster is ready to be a primary (wal_level = replica, wal_log_hints
// and full_page_writes on for pg_rewind, wal_keep_size = 256MB).
// [Cluster.StartStandby] makes a streaming standby of it with pg_basebackup;
// [Cluster.Promote], [Cluster.StopImmediate] (a crash), [Cluster.Demote]
// (pg_rewind, or a new base backup, and follow the new primary) and
// [Cluster.Switchover] move the primary role around ([Cluster.SwitchoverTimed]
// also says when the old primary stopped and the new one was promoted, and
// [Cluster.AddSyncStandby] makes the new pair synchronous again).
// [Cluster.WaitReplayed], [Cluster.PauseReplay] and
// [Cluster.StopWALReceiver] control what a standby has seen:
//
//	p := ... // a cluster from Start
//	s, err := p.StartStandby(ctx, pgtest.StandbyOptions{Sync: true})
//	defer s.Destroy()
//	_ = p.WaitReplayed(ctx, s)  // s shows everything committed on p so far
//	_ = p.Switchover(ctx, s)    // s is the primary, p streams from it
//
// Each node has its own directory, port, watchdog and [Cluster.Name] (its
// cluster_name and the application_name it streams under). The settings
// that belong to a node (listen_addresses, port, unix_socket_directories,
// cluster_name) live in pgtest_node.conf, and pg_hba.conf is the node's own,
// so the copies pg_basebackup and pg_rewind make are rewritten; a copied
// synchronous_standby_names is dropped, so a promoted standby commits
// without waiting for anyone. The package's control queries (InRecovery,
// WaitReplayed and the like) use the unix socket.
//
// # Network partitions
//
// [StartInNetNS] (or [RequireNetNS] in a test) starts a cluster in a network
// namespace of its own, reachable at its Host (10.R.x.y) through a veth
// pair; StartStandby with [StandbyOptions].NetNS makes standbys there too.
// [Cluster.Partition] silently drops every packet to and from it: open
// connections hang, new ones time out (never "refused" or "unreachable");
// [Cluster.Heal] lets packets through again. This needs root and the ip and
// tc tools (the kernel's blackhole queueing discipline); without them
// StartInNetNS returns an error wrapping [ErrUnavailable].
//
// The server binaries are found via $PGTEST_BINDIR, then `pg_config
// --bindir`, then the highest /usr/lib/postgresql/*/bin. PostgreSQL refuses
// to run as root; when the test runs as root every server command runs as the
// "postgres" system user and the cluster directory is owned by it.
//
// Typical use, one cluster per test package:
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.RunMain(m, func(c *pgtest.Cluster) error {
//			return c.CreateRole(context.Background(), "app", "secret")
//		}))
//	}
//
//	func TestSomething(t *testing.T) {
//		c := pgtest.Require(t) // skips locally, fails under $CI, if PostgreSQL is missing
//		conn, err := pgx.Connect(ctx, c.DSN("app", "secret", "postgres"))
//		...
//	}
//
// Each cluster is watched by a small helper process that stops the server and
// removes its directory (and network namespace) if the test binary dies
// (panic, timeout, kill) without calling [Cluster.Destroy].
package pgtest
