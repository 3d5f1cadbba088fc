package integration

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// SET search_path / statement_timeout / TimeZone by
// one client are never visible to other clients, and the setter always sees
// its own values, over interleaved transactions on a budget of 2.

type stSettings struct{ searchPath, timeout, tz string }

func (s stSettings) String() string {
	return fmt.Sprintf("search_path=%q statement_timeout=%q TimeZone=%q", s.searchPath, s.timeout, s.tz)
}

// stShow reads the three settings with SHOW, in the given query mode
// (pgx's default, or the simple protocol), through q (a conn or a tx).
func stShow(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, simple bool) (stSettings, error) {
	var s stSettings
	args := []any{}
	if simple {
		args = append(args, pgx.QueryExecModeSimpleProtocol)
	}
	if err := q.QueryRow(ctx, "SHOW search_path", args...).Scan(&s.searchPath); err != nil {
		return s, fmt.Errorf("SHOW search_path: %w", err)
	}
	if err := q.QueryRow(ctx, "SHOW statement_timeout", args...).Scan(&s.timeout); err != nil {
		return s, fmt.Errorf("SHOW statement_timeout: %w", err)
	}
	if err := q.QueryRow(ctx, "SHOW TimeZone", args...).Scan(&s.tz); err != nil {
		return s, fmt.Errorf("SHOW TimeZone: %w", err)
	}
	return s, nil
}

var stZones = []string{"Pacific/Chatham", "Asia/Kathmandu", "America/St_Johns", "Australia/Eucla", "Asia/Kolkata", "Pacific/Marquesas"}

func TestStateSettingsIsolation(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "stsettings", 2, 1, "60s"
	l := startLockpool(t, 10, "", app)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The defaults, read on a direct connection as the same role.
	direct, err := pgx.Connect(ctx, pgtest.Require(t).DSN("app", appPassword, "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := stShow(ctx, direct, false)
	_ = direct.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, z := range stZones {
		if z == defaults.tz {
			t.Fatalf("default TimeZone %q is one the test sets", z)
		}
	}
	t.Logf("defaults: %v", defaults)

	const setters, plain, opsPerClient = 2, 3, 200 // 1,000 interleaved operations
	var wg sync.WaitGroup
	errs := make(chan error, setters+plain)
	for i := 0; i < setters+plain; i++ {
		c := l.connect(t, "app", "appdb")
		wg.Add(1)
		go func(i int, c *pgx.Conn) {
			defer wg.Done()
			var err error
			if i < setters {
				err = stSetter(ctx, c, i, opsPerClient, defaults)
			} else {
				err = stPlain(ctx, c, i, opsPerClient, defaults)
			}
			if err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
			}
		}(i, c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// stPlain never sets anything and must always see the defaults.
func stPlain(ctx context.Context, c *pgx.Conn, id, ops int, want stSettings) error {
	for i := 0; i < ops; i++ {
		var got stSettings
		var err error
		switch i % 3 {
		case 0:
			got, err = stShow(ctx, c, false)
		case 1:
			got, err = stShow(ctx, c, true)
		case 2: // inside one transaction
			var tx pgx.Tx
			tx, err = c.Begin(ctx)
			if err != nil {
				return err
			}
			got, err = stShow(ctx, tx, i%2 == 0)
			if err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			err = tx.Commit(ctx)
		}
		if err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
		if got != want {
			return fmt.Errorf("op %d: another client's setting is visible: got %v, want the defaults %v", i, got, want)
		}
	}
	return nil
}

// stSetter changes its settings in every way the issue lists and checks
// after each step that it sees exactly what PostgreSQL would show it.
func stSetter(ctx context.Context, c *pgx.Conn, id, ops int, defaults stSettings) error {
	rng := rand.New(rand.NewSource(int64(id) + 1))
	exp := defaults
	newPath := func(i int) string { return fmt.Sprintf("lp_sp_%d_%d, public", id, i) }
	// Odd millisecond counts ≥ 50s: SHOW prints them as "<n>ms", and they
	// never fire.
	newTimeout := func() string { return fmt.Sprintf("%dms", 50001+2*rng.Intn(100000)) }
	newZone := func() string { return stZones[(id*3+rng.Intn(len(stZones)))%len(stZones)] }
	check := func(i int, what string, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, want stSettings) error {
		got, err := stShow(ctx, q, rng.Intn(2) == 0)
		if err != nil {
			return fmt.Errorf("op %d (%s): %w", i, what, err)
		}
		if got != want {
			return fmt.Errorf("op %d (%s): setter sees %v, want %v", i, what, got, want)
		}
		return nil
	}
	for i := 0; i < ops; i++ {
		op := rng.Intn(9)
		var what string
		switch op {
		case 0, 1: // plain SET of all three (simple protocol)
			what = "SET"
			n := stSettings{newPath(i), newTimeout(), newZone()}
			if _, err := c.Exec(ctx, fmt.Sprintf("SET search_path = %s; SET statement_timeout = '%s'; SET TimeZone = '%s'", n.searchPath, n.timeout, n.tz)); err != nil {
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			exp = n
		case 2: // SET LOCAL does not outlive its transaction
			what = "SET LOCAL"
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			in := exp
			in.timeout, in.tz = newTimeout(), newZone()
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = '%s'", in.timeout)); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL TimeZone = '%s'", in.tz)); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			if err := check(i, what+" inside", tx, in); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return fmt.Errorf("op %d (%s): commit: %w", i, what, err)
			}
		case 3: // SET in a transaction that rolls back does not persist
			what = "SET + ROLLBACK"
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			in := exp
			in.searchPath, in.timeout = newPath(i), newTimeout()
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET search_path = %s", in.searchPath)); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, false)", in.timeout); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			if err := check(i, what+" inside", tx, in); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if err := tx.Rollback(ctx); err != nil {
				return fmt.Errorf("op %d (%s): rollback: %w", i, what, err)
			}
		case 4: // SET in a transaction that commits persists
			what = "SET + COMMIT"
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			n := exp
			n.tz = newZone()
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET TimeZone = '%s'", n.tz)); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			if err := tx.Commit(ctx); err != nil {
				return fmt.Errorf("op %d (%s): commit: %w", i, what, err)
			}
			exp = n
		case 5: // set_config(..., false), extended protocol with a parameter
			what = "set_config"
			n := exp
			n.timeout = newTimeout()
			var got string
			if err := c.QueryRow(ctx, "SELECT set_config('statement_timeout', $1, false)", n.timeout).Scan(&got); err != nil {
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			exp = n
		case 6: // RESET one
			what = "RESET"
			switch rng.Intn(3) {
			case 0:
				what += " search_path"
				exp.searchPath = defaults.searchPath
				if _, err := c.Exec(ctx, "RESET search_path"); err != nil {
					return fmt.Errorf("op %d (%s): %w", i, what, err)
				}
			case 1:
				what += " statement_timeout"
				exp.timeout = defaults.timeout
				if _, err := c.Exec(ctx, "RESET statement_timeout"); err != nil {
					return fmt.Errorf("op %d (%s): %w", i, what, err)
				}
			case 2:
				what = "SET TimeZone TO DEFAULT"
				exp.tz = defaults.tz
				if _, err := c.Exec(ctx, "SET TimeZone TO DEFAULT"); err != nil {
					return fmt.Errorf("op %d (%s): %w", i, what, err)
				}
			}
		case 7: // RESET ALL
			what = "RESET ALL"
			if _, err := c.Exec(ctx, "RESET ALL"); err != nil {
				return fmt.Errorf("op %d (%s): %w", i, what, err)
			}
			exp = defaults
		case 8: // just a transaction that reads
			what = "read in transaction"
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			if err := check(i, what, tx, exp); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
		}
		if err := check(i, "after "+what, c, exp); err != nil {
			return err
		}
	}
	return nil
}
