package integration

// Migrators that serialise on a session advisory lock with the statements
// of goose's session locker (v3.24 lock/postgres.go: a retried
// SELECT pg_try_advisory_lock($1), then SELECT pg_advisory_unlock($1);
// goose's CLI takes no lock, only its library does) and of golang-migrate
// (a blocking SELECT pg_advisory_lock($1)) run at once through lockpool on
// a budget of 2 under advisory_locks: hold. The real golang-migrate and
// node-pg-migrate run in locks_hold_gomigrate_test.go and
// locks_hold_nodemigrate_test.go.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

func TestHoldMigratorsSerialise(t *testing.T) {
	t.Parallel()
	const app, migrators, steps = "hdm", 6, 5
	l := startLockpool(t, 10, "", lkApp(app, "app", 2, 1, "hold", "10s"))
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 120*time.Second)
	prefix := uniqueName(t, "hdm")
	hdDropTables(t, prefix)
	history := prefix + "_versions"
	lkMustExec(t, su, "CREATE TABLE "+history+" (version int PRIMARY KEY, by int NOT NULL); GRANT ALL ON "+history+" TO PUBLIC")
	const lockKey = int64(-7241865325823964) // one key for every migrator, as the tools use

	// migrate applies the missing steps under the lock; each step is a
	// transaction that creates a table and records its version.
	migrate := func(id int, c *pgx.Conn) error {
		for v := 1; v <= steps; v++ {
			var done bool
			if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+history+" WHERE version = $1)", v).Scan(&done); err != nil {
				return err
			}
			if done {
				continue
			}
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TABLE %s_%d (id int)", prefix, v)); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("step %d applied twice? %w", v, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+history+" VALUES ($1, $2)", v, id); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	var maxPinned atomic.Int64
	stop := lkSampler(10*time.Millisecond, func() {
		if g := int64(l.Pinned(app, "")); g > maxPinned.Load() {
			maxPinned.Store(g)
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, migrators)
	for i := 0; i < migrators; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			c, err := pgx.Connect(ctx, l.dsn("app", "appdb"))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(context.Background())
			if id%2 == 0 {
				// golang-migrate: block on the lock.
				if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
					errs <- err
					return
				}
			} else {
				// goose's session locker: retry the try-lock.
				for {
					var ok bool
					if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lockKey).Scan(&ok); err != nil {
						errs <- err
						return
					}
					if ok {
						break
					}
					time.Sleep(20 * time.Millisecond) // the tool's retry interval
				}
			}
			if err := migrate(id, c); err != nil {
				errs <- err
				return
			}
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", lockKey).Scan(&ok); err != nil || !ok {
				errs <- fmt.Errorf("unlock = %v, %v", ok, err)
			}
		}(i)
	}
	wg.Wait()
	stop()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var n int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM "+history).Scan(&n); err != nil || n != steps {
		t.Fatalf("versions recorded = %d, %v; want %d", n, err, steps)
	}
	if m := maxPinned.Load(); m != 0 {
		t.Fatalf("lockpool_pinned_sessions reached %d, want 0", m)
	}
	eventually(t, time.Second, "no lock left", func() bool { return len(lkHolders(t, su, lkKey1(lockKey))) == 0 })
}

// hdDropTables drops the tables whose names start with prefix (left by an
// earlier run of the test, -count), now and when t ends.
func hdDropTables(t *testing.T, prefix string) {
	t.Helper()
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		su := testenv.SuperConn(t, "appdb")
		_, err := su.Exec(ctx, `DO $$DECLARE r record; BEGIN
			FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND starts_with(tablename, '`+prefix+`') LOOP
				EXECUTE format('DROP TABLE %I CASCADE', r.tablename);
			END LOOP; END$$`)
		return err
	}
	if err := drop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop() })
}
