package cluster

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// MigrationLockKey is the pg_advisory_xact_lock key the tables are created
// under: the lease store's key, so every migration of lockpool's schema is
// serialised.
const MigrationLockKey int64 = 0x6c6f636b706f6f6c

// tables holds the quoted names of the cluster tables in one schema.
type tables struct {
	schema, instances, apps, slots string
}

func newTables(schema string) tables {
	return tables{
		schema:    pgx.Identifier{schema}.Sanitize(),
		instances: pgx.Identifier{schema, "cluster_instances"}.Sanitize(),
		apps:      pgx.Identifier{schema, "cluster_apps"}.Sanitize(),
		slots:     pgx.Identifier{schema, "cluster_slots"}.Sanitize(),
	}
}

// ddl creates the schema and the tables if they do not exist.
func (t tables) ddl() string {
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[2]s (
  cluster text NOT NULL,
  instance text NOT NULL,
  number int NOT NULL,
  address text NOT NULL DEFAULT '',
  coord_pid int NOT NULL,
  coord_start timestamptz NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (cluster, instance),
  UNIQUE (cluster, number)
);
ALTER TABLE %[2]s ADD COLUMN IF NOT EXISTS signal_key text NOT NULL DEFAULT '';
ALTER TABLE %[2]s ADD COLUMN IF NOT EXISTS coord_server timestamptz;
CREATE TABLE IF NOT EXISTS %[3]s (
  cluster text NOT NULL,
  app text NOT NULL,
  PRIMARY KEY (cluster, app)
);
CREATE TABLE IF NOT EXISTS %[4]s (
  cluster text NOT NULL,
  app text NOT NULL,
  instance text NOT NULL,
  usename text NOT NULL,
  slots int NOT NULL DEFAULT 0,
  pins int NOT NULL DEFAULT 0,
  demand int NOT NULL DEFAULT 0,
  pin_demand int NOT NULL DEFAULT 0,
  pids int[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (cluster, app, instance)
);`, t.schema, t.instances, t.apps, t.slots)
}

// migrate creates the tables, once per coordination connection. When they
// are there already (every start but the first) it changes nothing and
// takes no lock: the DDL's ALTER TABLE would queue for an exclusive lock
// behind any transaction that holds a row of cluster_instances, and every
// instance's heartbeat would queue behind it.
func (t tables) migrate(ctx context.Context, c *pgx.Conn) error {
	current, err := t.current(ctx, c)
	if err != nil || current {
		return err
	}
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", MigrationLockKey); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, t.ddl())
		return err
	})
}

// current reports whether the tables exist as ddl makes them, from the
// catalogs alone.
func (t tables) current(ctx context.Context, c *pgx.Conn) (bool, error) {
	var ok bool
	err := c.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1) IS NOT NULL AND pg_catalog.to_regclass($2) IS NOT NULL
  AND pg_catalog.to_regclass($3) IS NOT NULL
  AND (SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1) AND attname IN ('signal_key', 'coord_server') AND NOT attisdropped) = 2`,
		t.instances, t.apps, t.slots).Scan(&ok)
	return ok, err
}
