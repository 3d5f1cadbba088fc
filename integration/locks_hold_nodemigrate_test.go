package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

// TestHoldNodePgMigrate: six node-pg-migrate runners at once through
// lockpool on budget 2 under hold: every migration applied exactly once,
// nothing pinned, no lock left.
func TestHoldNodePgMigrate(t *testing.T) {
	t.Parallel()
	const app, migrations = "hdnm", 4
	l := startLockpool(t, 10, "", lkApp(app, "app", 2, 1, "hold", "30s"))
	ctx := testenv.Context(t, 120*time.Second)
	dir := t.TempDir()
	prefix := uniqueName(t, "hdnm")
	hdDropTables(t, prefix)
	for i := 1; i <= migrations; i++ {
		sql := fmt.Sprintf("-- Up Migration\nCREATE TABLE %s_%d (id int);\n-- Down Migration\nDROP TABLE %s_%d;\n", prefix, i, prefix, i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d_step%d.sql", 1700000000000+i, i)), []byte(sql), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := nodeCommand(ctx, t, "migrate.mjs", "DATABASE_URL="+l.url("app", "appdb"), "MIGRATIONS_DIR="+dir,
		"MIGRATIONS_TABLE="+prefix+"_history", "CONCURRENCY=6")
	if _, err := os.Stat(filepath.Join(cmd.Dir, "node_modules", "node-pg-migrate", "package.json")); err != nil {
		skipOrFail(t, "integration/node/node_modules/node-pg-migrate is missing (run: npm ci --prefix integration/node)")
	}
	var maxPinned atomic.Int64
	stop := lkSampler(10*time.Millisecond, func() {
		if g := int64(l.Pinned(app, "")); g > maxPinned.Load() {
			maxPinned.Store(g)
		}
	})
	out, err := cmd.CombinedOutput()
	stop()
	if err != nil {
		t.Fatalf("node-pg-migrate: %v\n%s", err, out)
	}
	var res struct{ Applied []int }
	line := strings.TrimSpace(string(out))
	if err := json.Unmarshal([]byte(line[strings.LastIndexByte(line, '\n')+1:]), &res); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	total := 0
	for _, n := range res.Applied {
		total += n
	}
	if len(res.Applied) != 6 || total != migrations {
		t.Fatalf("runners applied %v, want %d migrations in all over 6 runners", res.Applied, migrations)
	}
	su := superConn(t, "appdb")
	var rows int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM "+prefix+"_history").Scan(&rows); err != nil || rows != migrations {
		t.Fatalf("history rows = %d, %v; want %d", rows, err, migrations)
	}
	if f := l.metric("lockpool_advisory_lock_fallbacks_total", map[string]string{"app": app}); f != 0 {
		t.Fatalf("fallbacks = %v: node-pg-migrate's lock calls were not held by lockpool", f)
	}
	if m := maxPinned.Load(); m != 0 {
		t.Fatalf("lockpool_pinned_sessions reached %d, want 0", m)
	}
	eventually(t, time.Second, "no lock left", func() bool { return len(lkHolders(t, su, lkKey1(7241865325823964))) == 0 })
}
