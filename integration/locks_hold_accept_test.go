package integration

// Acceptance of advisory_locks: hold: the seed failure (lock holders on a
// small budget cost it nothing), the new-user case, and interop with a
// direct session and a second lockpool instance.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// TestHoldSeedFailure: holders of session locks, as many as or more than
// the budget, leave the budget to everyone else.
func TestHoldSeedFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		budget  int
		holders int
	}{
		{"four holders on budget 4", 4, 4},
		{"fifty holders on budget 2", 2, 50},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := fmt.Sprintf("hds%d", i)
			l := startLockpool(t, 60, "", lkApp(app, "app", tt.budget, 1, "hold", "5s"))
			su := superConn(t, "appdb")
			ctx := testenv.Context(t, 60*time.Second)
			table := uniqueName(t, "hold_seed")
			hdDropTables(t, table)
			lkMustExec(t, su, "CREATE TABLE "+table+" (id serial PRIMARY KEY, at timestamptz DEFAULT now())")
			lkMustExec(t, su, "GRANT ALL ON "+table+", "+table+"_id_seq TO PUBLIC")
			base := int64(20000 + 1000*i)
			holders := make([]*pgx.Conn, tt.holders)
			for h := range holders {
				holders[h] = l.connect(t, "app", "appdb")
				if !lkMustBool(t, holders[h], "SELECT pg_try_advisory_lock($1)", base+int64(h)) {
					t.Fatalf("holder %d: try-lock false", h)
				}
			}
			// The holders keep working while they hold their locks.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, c := range holders {
				wg.Add(1)
				go func(c *pgx.Conn) {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						case <-time.After(50 * time.Millisecond):
						}
						if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
							t.Errorf("holder statement: %v", err)
							return
						}
					}
				}(c)
			}
			defer func() { close(stop); wg.Wait() }()
			// The locks are real: on lockpool's lock connections.
			for h := range holders {
				if hs := hdLockConnHolders(t, su, lkKey1(base+int64(h))); len(hs) != 1 {
					t.Fatalf("key of holder %d: lock connection holders %v, want one", h, hs)
				}
			}
			fifth := l.connectCfg(t, "app", "appdb", hdSimple)
			for n := 0; n < 10; n++ {
				start := time.Now()
				if _, err := fifth.Exec(ctx, "BEGIN; INSERT INTO "+table+" DEFAULT VALUES; COMMIT"); err != nil {
					t.Fatalf("insert %d: %v", n, err)
				}
				if took := time.Since(start); took > time.Second {
					t.Fatalf("insert %d committed after %v, want within 1s", n, took)
				}
				if g := l.Pinned(app, ""); g != 0 {
					t.Fatalf("lockpool_pinned_sessions = %v, want 0", g)
				}
				time.Sleep(300 * time.Millisecond) // the acceptance's cadence: one insert every 300 ms
			}
			var rows int
			if err := su.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil || rows != 10 {
				t.Fatalf("rows = %d, %v; want 10", rows, err)
			}
			if m := l.metric("lockpool_advisory_locks_held", map[string]string{"app": app}); int(m) != tt.holders {
				t.Fatalf("lockpool_advisory_locks_held = %v, want %d", m, tt.holders)
			}
		})
	}
}

// TestHoldNewUserTryLock: with max_pinned 1, a try-lock on a key another
// session holds answers false at once (no pin slot involved). Its key is
// outside TestHoldSeedFailure's range (20000–21049): parallel tests share
// one database, so advisory keys must not overlap between tests.
func TestHoldNewUserTryLock(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hdn", "app", 4, 1, "hold", "5s"))
	a, b := l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")
	if !lkMustBool(t, a, "SELECT pg_try_advisory_lock(26001)") {
		t.Fatal("first try-lock false")
	}
	for i := 0; i < 3; i++ {
		start := time.Now()
		if lkMustBool(t, b, "SELECT pg_try_advisory_lock(26001)") {
			t.Fatal("second session got the lock")
		}
		if took := time.Since(start); took > 200*time.Millisecond {
			t.Fatalf("try-lock answered after %v, want within 200ms", took)
		}
	}
}

// TestHoldInterop: a direct session, a second lockpool instance and this
// one see each other's locks, both ways, in every form.
func TestHoldInterop(t *testing.T) {
	t.Parallel()
	l1 := startLockpool(t, 10, "", lkApp("hdi1", "app", 2, 1, "hold", "5s"))
	l2 := startLockpool(t, 10, "", lkApp("hdi2", "app", 2, 1, "hold", "5s"))
	type side struct {
		name string
		conn func(t *testing.T) *pgx.Conn
	}
	sides := []side{
		{"lockpool", func(t *testing.T) *pgx.Conn { return l1.connect(t, "app", "appdb") }},
		{"second lockpool", func(t *testing.T) *pgx.Conn { return l2.connect(t, "app", "appdb") }},
		{"direct", func(t *testing.T) *pgx.Conn { return superConn(t, "appdb") }},
	}
	forms := []struct {
		name                 string
		lock, try, unlock    string // holder's lock, other's try (must be false), holder's unlock
		block                string // other's blocking lock (must wait)
		otherUnlock          string
		compatibleTry        string // a try that must succeed while held ("" none)
		compatibleTryRelease string
	}{
		{"exclusive one key", "SELECT pg_advisory_lock(%d)", "SELECT pg_try_advisory_lock_shared(%d)", "SELECT pg_advisory_unlock(%d)",
			"SELECT pg_advisory_lock(%d)", "SELECT pg_advisory_unlock(%d)", "", ""},
		{"shared one key", "SELECT pg_advisory_lock_shared(%d)", "SELECT pg_try_advisory_lock(%d)", "SELECT pg_advisory_unlock_shared(%d)",
			"SELECT pg_advisory_lock(%d)", "SELECT pg_advisory_unlock(%d)", "SELECT pg_try_advisory_lock_shared(%d)", "SELECT pg_advisory_unlock_shared(%d)"},
		{"two keys", "SELECT pg_advisory_lock(3, %d)", "SELECT pg_try_advisory_lock(3, %d)", "SELECT pg_advisory_unlock(3, %d)",
			"SELECT pg_advisory_lock_shared(3, %d)", "SELECT pg_advisory_unlock_shared(3, %d)", "", ""},
	}
	n := 22000
	for _, holder := range sides {
		for _, other := range sides {
			if holder.name == other.name {
				continue
			}
			for _, f := range forms {
				n++
				key := n
				t.Run(holder.name+" holds, "+other.name+" asks/"+f.name, func(t *testing.T) {
					h, o := holder.conn(t), other.conn(t)
					ctx := testenv.Context(t, 30*time.Second)
					lkMustExec(t, h, fmt.Sprintf(f.lock, key))
					var ok bool
					if err := o.QueryRow(ctx, fmt.Sprintf(f.try, key)).Scan(&ok); err != nil || ok {
						t.Fatalf("%s = %v, %v; want false", f.try, ok, err)
					}
					if f.compatibleTry != "" {
						if err := o.QueryRow(ctx, fmt.Sprintf(f.compatibleTry, key)).Scan(&ok); err != nil || !ok {
							t.Fatalf("%s = %v, %v; want true", f.compatibleTry, ok, err)
						}
						lkMustExec(t, o, fmt.Sprintf(f.compatibleTryRelease, key))
					}
					done := make(chan error, 1)
					go func() {
						_, err := o.Exec(ctx, fmt.Sprintf(f.block, key))
						done <- err
					}()
					select {
					case err := <-done:
						t.Fatalf("blocking lock returned while held: %v", err)
					case <-time.After(200 * time.Millisecond):
					}
					lkMustExec(t, h, fmt.Sprintf(f.unlock, key))
					select {
					case err := <-done:
						if err != nil {
							t.Fatal(err)
						}
					case <-time.After(2 * time.Second):
						t.Fatal("blocking lock not granted after the unlock")
					}
					lkMustExec(t, o, fmt.Sprintf(f.otherUnlock, key))
				})
			}
		}
	}
}
