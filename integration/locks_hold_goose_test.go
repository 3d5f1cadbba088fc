package integration

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/lockpool/lockpool/internal/testenv"
)

// TestHoldGoose: six goose providers at once, through goose's own library
// with its Postgres session locker (a retried pg_try_advisory_lock($1) on
// one connection, pg_advisory_unlock($1) at the end), through lockpool on
// budget 2 under hold: each migration applied once, nothing pinned, no lock
// left.
func TestHoldGoose(t *testing.T) {
	t.Parallel()
	const app, migrators, steps = "hdgs", 6, 4
	const lockID = int64(-5887940537704921) // goose's key, in this test only
	l := startLockpool(t, 10, "", lkApp(app, "app", 2, 1, "hold", "30s"))
	ctx := testenv.Context(t, 120*time.Second)
	prefix := uniqueName(t, "hdgs")
	hdDropTables(t, prefix)
	applied := prefix + "_applied"
	su := superConn(t, "appdb")
	lkMustExec(t, su, "CREATE TABLE "+applied+" (version int PRIMARY KEY); GRANT ALL ON "+applied+" TO PUBLIC")
	fsys := fstest.MapFS{}
	for v := 1; v <= steps; v++ {
		fsys[fmt.Sprintf("%05d_step.sql", v)] = &fstest.MapFile{Data: []byte(fmt.Sprintf(
			"-- +goose Up\nCREATE TABLE %s_%d (id int);\nINSERT INTO %s VALUES (%d);\n-- +goose Down\nDROP TABLE %s_%d;\n",
			prefix, v, applied, v, prefix, v))}
	}

	up := func(ctx context.Context) error {
		db, err := sql.Open("pgx", l.dsn("app", "appdb"))
		if err != nil {
			return err
		}
		defer db.Close()
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 120))
		if err != nil {
			return err
		}
		p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
			goose.WithSessionLocker(locker), goose.WithTableName(prefix+"_goose"), goose.WithDisableGlobalRegistry(true))
		if err != nil {
			return err
		}
		_, err = p.Up(ctx)
		return err
	}
	maxPinned := hdSampleMaxPinned(l, app, func() {
		var wg sync.WaitGroup
		for i := 0; i < migrators; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				if err := up(ctx); err != nil {
					t.Errorf("goose %d: %v", i, err)
				}
			}(i)
		}
		wg.Wait()
	})
	var versions, maxVersion int
	if err := su.QueryRow(ctx, "SELECT count(*), max(version) FROM "+applied).Scan(&versions, &maxVersion); err != nil || versions != steps || maxVersion != steps {
		t.Fatalf("applied: %d rows up to %d, %v; want %d", versions, maxVersion, err, steps)
	}
	var recorded int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM "+prefix+"_goose WHERE version_id > 0 AND is_applied").Scan(&recorded); err != nil || recorded != steps {
		t.Fatalf("goose recorded %d applied versions, %v; want %d", recorded, err, steps)
	}
	if f := l.metric("lockpool_advisory_lock_fallbacks_total", map[string]string{"app": app}); f != 0 {
		t.Fatalf("fallbacks = %v: goose's lock calls were not held by lockpool", f)
	}
	if maxPinned != 0 {
		t.Fatalf("lockpool_pinned_sessions reached %d, want 0", maxPinned)
	}
	eventually(t, time.Second, "no lock left", func() bool { return len(lkHolders(t, su, lkKey1(lockID))) == 0 })
}
