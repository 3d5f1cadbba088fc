package integration

// A killed client leaves no lock behind, and
// the sweep finds locks the lexer cannot see.

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

// SIGKILL of a pinned client process.
func TestLocksSIGKILLPinnedClient(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/psql"); err != nil {
		skipOrFail(t, "no /usr/bin/psql")
	}
	const app = "lk7"
	const k = 7000001
	l := startLockpool(t, 10, "", lkApp(app, "app", 3, 1, "pin", "5s"))
	su := superConn(t, "appdb")
	key := lkKey1(k)

	cmd := exec.Command("/usr/bin/psql", "-X", "-q", "-d", l.dsn("app", "appdb"))
	cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PSQLRC=/dev/null")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out testenv.LogBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	if _, err := io.WriteString(stdin, fmt.Sprintf("SELECT pg_advisory_lock(%d), pg_advisory_lock(7, 1);\n", k)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(lkHolders(t, su, key)) == 0 || l.Pinned(app, "") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("psql's lock never showed up (pinned %v); psql output:\n%s", l.Pinned(app, ""), out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	pid := lkHolders(t, su, key)[0]

	// Attribution while it is held.
	d := lkGetDebugLocks(t, l)
	found := false
	for _, h := range d.Holders {
		if h.BackendPID != pid {
			continue
		}
		found = true
		if h.Application != app || h.Reason != "advisory_lock" || h.PinnedSince.IsZero() || !strings.HasPrefix(h.Client, "127.0.0.1:") {
			t.Errorf("/debug/locks holder %+v: want application %s, reason advisory_lock, pinned_since, client address", h, app)
		}
		keys := map[string]bool{}
		for _, lk := range h.Locks {
			keys[lk.Key] = lk.Granted
		}
		for _, want := range []string{key.String(), lkKey2(7, 1).String()} {
			if !keys[want] {
				t.Errorf("/debug/locks holder %d: locks %+v lack %s", pid, h.Locks, want)
			}
		}
	}
	if !found {
		t.Errorf("/debug/locks has no holder for backend %d: %+v", pid, d)
	}

	t0 := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	eventually(t, time.Second, "the killed client's locks to leave pg_locks and its pin to end", func() bool {
		return len(lkHolders(t, su, key)) == 0 && len(lkHolders(t, su, lkKey2(7, 1))) == 0 &&
			l.Pinned(app, "") == 0 && l.srv.Pool().Stats(app).Pinned == 0
	})
	t.Logf("locks gone %v after SIGKILL", time.Since(t0))
	c := l.connect(t, "app", "appdb")
	if !lkMustBool(t, c, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", k)) {
		t.Fatal("the key cannot be taken after the holder was killed")
	}
	lkMustExec(t, c, "SELECT pg_advisory_unlock_all()")
}

// A lock taken inside a PL/pgSQL function is found by the
// sweep, its connection closed and counted, and nobody ever gets it.
func TestLocksLeakSweep(t *testing.T) {
	t.Parallel()
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 60*time.Second)
	if _, err := su.Exec(ctx, `CREATE OR REPLACE FUNCTION public.locks8_take(k bigint) RETURNS int
		LANGUAGE plpgsql AS $f$BEGIN PERFORM pg_advisory_lock(k); RETURN pg_backend_pid(); END$f$`); err != nil {
		t.Fatal(err)
	}
	// The function's name has no advisory function in it: the lexer
	// cannot see the lock.
	takeHidden := func(t *testing.T, l *lp, k int64) uint32 {
		t.Helper()
		c := l.connect(t, "app", "appdb")
		var pid int32
		if err := c.QueryRow(ctx, "SELECT locks8_take($1)", k).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 1 || hs[0] != uint32(pid) {
			t.Fatalf("hidden lock %d: holders %v, want [%d]", k, hs, pid)
		}
		return uint32(pid)
	}
	backendGone := func(pid uint32) bool {
		var n int
		if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	}

	t.Run("SweepLeaks", func(t *testing.T) {
		const app = "lk8"
		l := startLockpool(t, 10, "", lkApp(app, "app", 4, 2, "pin", "5s"))
		// A pinned session with a visible lock: the sweep leaves it alone.
		p := l.connect(t, "app", "appdb")
		lkMustExec(t, p, "SELECT pg_advisory_lock(8000002)")
		pidP := testenv.BackendPID(t, p)

		pid := takeHidden(t, l, 8000001)
		if g := l.Pinned(app, ""); g != 1 {
			t.Fatalf("lockpool_pinned_sessions = %v, want 1 (the lexer cannot see the hidden lock)", g)
		}
		n, err := l.srv.SweepLeaks(ctx)
		if err != nil {
			t.Fatalf("SweepLeaks: %v", err)
		}
		if n != 1 {
			t.Errorf("SweepLeaks closed %d connections, want 1", n)
		}
		eventually(t, 2*time.Second, "the leaked lock and its backend to be gone", func() bool {
			return len(lkHolders(t, su, lkKey1(8000001))) == 0 && backendGone(pid)
		})
		if v := l.metric("lockpool_leaked_locks_total", map[string]string{"app": app}); v != 1 {
			t.Errorf("lockpool_leaked_locks_total = %v, want 1", v)
		}
		// The pinned session kept its backend and its lock.
		if hs := lkHolders(t, su, lkKey1(8000002)); len(hs) != 1 || hs[0] != pidP {
			t.Errorf("the pinned session's lock: holders %v, want [%d]", hs, pidP)
		}
		if got := testenv.BackendPID(t, p); got != pidP {
			t.Errorf("the pinned session moved from backend %d to %d", pidP, got)
		}
		// Later clients never hold the leaked lock; the key is free.
		for i := 0; i < 3; i++ {
			c := l.connect(t, "app", "appdb")
			for j := 0; j < 5; j++ {
				var n int64
				if err := c.QueryRow(ctx, lkOwnAdvisorySQL).Scan(&n); err != nil || n != 0 {
					t.Fatalf("a later client's backend holds %d advisory locks (%v)", n, err)
				}
			}
		}
		q := l.connect(t, "app", "appdb")
		if !lkMustBool(t, q, "SELECT pg_try_advisory_lock(8000001)") {
			t.Fatal("the leaked key cannot be taken after the sweep")
		}
		lkMustExec(t, q, "SELECT pg_advisory_unlock_all()")
		if n, err := l.srv.SweepLeaks(ctx); err != nil || n != 0 {
			t.Errorf("a second sweep closed %d connections (%v), want 0", n, err)
		}
		if v := l.metric("lockpool_leaked_locks_total", map[string]string{"app": app}); v != 1 {
			t.Errorf("lockpool_leaked_locks_total = %v after the second sweep, want 1", v)
		}
		lkMustExec(t, p, "SELECT pg_advisory_unlock_all()")
	})

	t.Run("interval", func(t *testing.T) {
		const app = "lk8i"
		const iv = 300 * time.Millisecond
		l := startLockpool(t, 10, "leak_check_interval: "+iv.String(), lkApp(app, "app", 3, 1, "pin", "5s"))
		pid := takeHidden(t, l, 8000003)
		t0 := time.Now()
		eventually(t, iv+time.Second, "the sweep to close the leaked connection within one interval", func() bool {
			return len(lkHolders(t, su, lkKey1(8000003))) == 0 && backendGone(pid) &&
				l.metric("lockpool_leaked_locks_total", map[string]string{"app": app}) == 1
		})
		t.Logf("leak swept %v after the call (interval %v)", time.Since(t0), iv)
		c := l.connect(t, "app", "appdb")
		if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(8000003)") {
			t.Fatal("the leaked key cannot be taken after the sweep")
		}
		lkMustExec(t, c, "SELECT pg_advisory_unlock(8000003)")
	})
}
