package integration

import (
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

// hdTool finds a migration tool's binary: $env, else name on PATH. Without
// it the test skips (fails under CI).
func hdTool(t *testing.T, env, name, install string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		skipOrFail(t, fmt.Sprintf("%s is not installed (set %s or put it on PATH: %s)", name, env, install))
	}
	return p
}

// hdSampleMaxPinned runs fn and returns the most pinned sessions of app
// seen meanwhile (sampled every 10 ms).
func hdSampleMaxPinned(l *lp, app string, fn func()) int64 {
	var maxPinned atomic.Int64
	stop := lkSampler(10*time.Millisecond, func() {
		if g := int64(l.Pinned(app, "")); g > maxPinned.Load() {
			maxPinned.Store(g)
		}
	})
	fn()
	stop()
	return maxPinned.Load()
}

// hdRunAtOnce runs n commands made by mk at once, failing the test on any
// error; it returns the most pinned sessions of app seen meanwhile.
func hdRunAtOnce(t *testing.T, l *lp, app string, n int, mk func(i int) *exec.Cmd) int64 {
	t.Helper()
	outs := make([][]byte, n)
	errs := make([]error, n)
	maxPinned := hdSampleMaxPinned(l, app, func() {
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				outs[i], errs[i] = mk(i).CombinedOutput()
			}(i)
		}
		wg.Wait()
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("run %d: %v\n%s", i, err, outs[i])
		}
	}
	return maxPinned
}

// TestHoldGolangMigrate: six golang-migrate processes at once through
// lockpool on budget 2 under hold (its postgres driver serialises on a
// blocking pg_advisory_lock($1)).
func TestHoldGolangMigrate(t *testing.T) {
	t.Parallel()
	bin := hdTool(t, "LOCKPOOL_MIGRATE_BIN", "migrate", "go install -tags postgres github.com/golang-migrate/migrate/v4/cmd/migrate@v4.18.1")
	const app, steps = "hdgm", 4
	l := startLockpool(t, 10, "", lkApp(app, "app", 2, 1, "hold", "30s"))
	ctx := testenv.Context(t, 120*time.Second)
	dir := t.TempDir()
	prefix := uniqueName(t, "hdgm")
	hdDropTables(t, prefix)
	for i := 1; i <= steps; i++ {
		for dir2, sql := range map[string]string{"up": fmt.Sprintf("CREATE TABLE %s_%d (id int);", prefix, i), "down": fmt.Sprintf("DROP TABLE %s_%d;", prefix, i)} {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d_step.%s.sql", i, dir2)), []byte(sql), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	url := l.url("app", "appdb") + "&x-migrations-table=" + prefix + "_history"
	maxPinned := hdRunAtOnce(t, l, app, 6, func(int) *exec.Cmd {
		return exec.CommandContext(ctx, bin, "-path", dir, "-database", url, "up")
	})
	su := superConn(t, "appdb")
	var version int
	var dirty bool
	if err := su.QueryRow(ctx, "SELECT version, dirty FROM "+prefix+"_history").Scan(&version, &dirty); err != nil || version != steps || dirty {
		t.Fatalf("history = version %d dirty %v, %v; want %d clean", version, dirty, err, steps)
	}
	var tables int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename LIKE $1", prefix+"\\_%").Scan(&tables); err != nil || tables != steps+1 {
		t.Fatalf("tables = %d, %v; want %d", tables, err, steps+1)
	}
	if f := l.metric("lockpool_advisory_lock_fallbacks_total", map[string]string{"app": app}); f != 0 {
		t.Fatalf("fallbacks = %v: golang-migrate's lock calls were not held by lockpool", f)
	}
	if maxPinned != 0 {
		t.Fatalf("lockpool_pinned_sessions reached %d, want 0", maxPinned)
	}
	// golang-migrate's key: crc32 of schema, table and database, times its salt.
	aid := int64(crc32.ChecksumIEEE([]byte("public\x00"+prefix+"_history\x00appdb")) * 1486364155)
	eventually(t, time.Second, "no lock left", func() bool { return len(lkHolders(t, su, lkKey1(aid))) == 0 })
}
