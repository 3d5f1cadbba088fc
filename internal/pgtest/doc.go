// Package pgtest starts throw-away PostgreSQL clusters for tests.
//
// A cluster is created with initdb in a fresh temporary directory, tuned for
// speed (fsync, synchronous_commit and full_page_writes off, small
// shared_buffers) and started on a free TCP port on 127.0.0.1, with its unix
// socket in a private directory. Authentication:
//
//	local all all                trust
//	host  all postgres 127.0.0.1/32 trust
//	host  all all      127.0.0.1/32 scram-sha-256
//
// so the superuser "postgres" connects over TCP without a password, while
// roles made with [Cluster.CreateRole] must authenticate with SCRAM.
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
// removes its directory if the test binary dies (panic, timeout, kill)
// without calling [Cluster.Destroy].
package pgtest
