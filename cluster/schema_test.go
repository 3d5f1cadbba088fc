package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// TestMigrateTakesNoLockWhenCurrent: once the tables exist, migrating
// again (every coordination connection does) returns at once while
// another transaction holds a row of cluster_instances and a lock on each
// table; it must not queue for the exclusive lock its DDL would take, which
// every heartbeat would then queue behind.
func TestMigrateTakesNoLockWhenCurrent(t *testing.T) {
	pg := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pg.SuperuserDSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	tb := newTables("lockpool_schema_test")
	first := connect()
	if current, err := tb.current(ctx, first); err != nil || current {
		t.Fatalf("before the first migration: current = %v, %v", current, err)
	}
	if err := tb.migrate(ctx, first); err != nil {
		t.Fatal(err)
	}
	if current, err := tb.current(ctx, first); err != nil || !current {
		t.Fatalf("after the first migration: current = %v, %v", current, err)
	}

	holder := connect()
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+tb.instances+", "+tb.apps+", "+tb.slots+" IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", MigrationLockKey); err != nil {
		t.Fatal(err)
	}
	again := connect()
	mctx, mcancel := context.WithTimeout(ctx, 3*time.Second)
	defer mcancel()
	if err := tb.migrate(mctx, again); err != nil {
		t.Fatalf("migrating tables that are current, while another transaction holds their locks: %v", err)
	}
}
