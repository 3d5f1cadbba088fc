package pgtest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testCtx is a context for one test, cancelled when it ends.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startPrimary starts a private cluster (skipping like Require when
// PostgreSQL is unavailable) with role app and database appdb holding
// table kv, and destroys it when t ends.
func startPrimary(t *testing.T, ctx context.Context) *Cluster {
	t.Helper()
	Require(t)
	c, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, c)
	setupApp(t, ctx, c)
	return c
}

func setupApp(t *testing.T, ctx context.Context, c *Cluster) {
	t.Helper()
	if err := c.CreateRole(ctx, "app", "app pw"); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateDatabase(ctx, "appdb", "app"); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, c, "CREATE TABLE kv (k text PRIMARY KEY, v text)")
}

func destroyAtEnd(t *testing.T, c *Cluster) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- server log of %s ---\n%s", c.Name, tail(c.Log(), 3000))
		}
		if err := c.Destroy(); err != nil {
			t.Error(err)
		}
	})
}

func startStandby(t *testing.T, ctx context.Context, p *Cluster, opts StandbyOptions) *Cluster {
	t.Helper()
	s, err := p.StartStandby(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, s)
	t.Logf("standby %s of %s started in %v", s.Name, p.Name, s.StartupTime.Round(time.Millisecond))
	return s
}

// put runs sql as app in appdb over TCP (SCRAM).
func put(t *testing.T, ctx context.Context, c *Cluster, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.DSN("app", "app pw", "appdb"))
	if err != nil {
		t.Fatalf("connect to %s: %v", c.Name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %s: %v", c.Name, sql, err)
	}
}

// get reads kv[k] as app over TCP; ok is false when the row is missing.
func get(t *testing.T, ctx context.Context, c *Cluster, k string) (v string, ok bool) {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.DSN("app", "app pw", "appdb"))
	if err != nil {
		t.Fatalf("connect to %s: %v", c.Name, err)
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", k).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	if err != nil {
		t.Fatalf("%s: read %s: %v", c.Name, k, err)
	}
	return v, true
}

func wantValue(t *testing.T, ctx context.Context, c *Cluster, k, want string) {
	t.Helper()
	if v, ok := get(t, ctx, c, k); !ok || v != want {
		t.Fatalf("%s: kv[%s] = %q (present %v), want %q", c.Name, k, v, ok, want)
	}
}

func wantMissing(t *testing.T, ctx context.Context, c *Cluster, k string) {
	t.Helper()
	if v, ok := get(t, ctx, c, k); ok {
		t.Fatalf("%s: kv[%s] = %q, want no row", c.Name, k, v)
	}
}

func wantRecovery(t *testing.T, ctx context.Context, c *Cluster, want bool) {
	t.Helper()
	in, err := c.InRecovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in != want {
		t.Fatalf("%s: pg_is_in_recovery() = %v, want %v", c.Name, in, want)
	}
}

// streamsTo reports whether p's pg_stat_replication shows s streaming.
func wantStreaming(t *testing.T, ctx context.Context, p, s *Cluster) {
	t.Helper()
	var n int
	err := p.adminQueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
		WHERE application_name = $1 AND state = 'streaming'`, []any{s.Name}, &n)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%s does not stream from %s", s.Name, p.Name)
	}
}

func TestStandbyReplicates(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{})
	wantRecovery(t, ctx, s, true)
	wantRecovery(t, ctx, p, false)
	wantStreaming(t, ctx, p, s)

	// A role, database and row made on the primary after the base backup.
	if err := p.CreateRole(ctx, "late", "late pw"); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateDatabase(ctx, "latedb", "late"); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, p, "INSERT INTO kv VALUES ('a', '1')")
	if err := p.WaitReplayed(ctx, s); err != nil {
		t.Fatal(err)
	}
	wantValue(t, ctx, s, "a", "1")
	conn, err := pgx.Connect(ctx, s.DSN("late", "late pw", "latedb"))
	if err != nil {
		t.Fatalf("SCRAM login of a replicated role on the standby: %v", err)
	}
	conn.Close(ctx)
	if err := s.Exec(ctx, "appdb", "INSERT INTO kv VALUES ('b', '2')"); err == nil ||
		!strings.Contains(err.Error(), "read-only") {
		t.Fatalf("write on the standby: %v, want a read-only error", err)
	}
	if s.Port == p.Port || s.Dir == p.Dir || s.SocketDir == p.SocketDir {
		t.Fatalf("standby shares port or directories with its primary")
	}

	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.base); !os.IsNotExist(err) {
		t.Fatalf("standby's dir still there: %v", err)
	}
	put(t, ctx, p, "INSERT INTO kv VALUES ('c', '3')")
}

func TestPromote(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{})
	put(t, ctx, p, "INSERT INTO kv VALUES ('a', '1')")
	if err := p.WaitReplayed(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	wantRecovery(t, ctx, s, false)
	put(t, ctx, s, "INSERT INTO kv VALUES ('b', '2')")
	wantValue(t, ctx, s, "a", "1")
	wantValue(t, ctx, s, "b", "2")

	// Demote falls back to pg_basebackup when pg_rewind fails (here: the
	// old primary's pg_control is gone).
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p.Dir + "/global/pg_control"); err != nil {
		t.Fatal(err)
	}
	// While the new primary refuses replication connections the base
	// backup fails too, and the old data directory stays.
	noRepl := "local all all trust\nhost all all 127.0.0.1/32 trust\n"
	if err := s.writeFile(s.Dir+"/pg_hba.conf", noRepl, false); err != nil {
		t.Fatal(err)
	}
	if err := s.adminExec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	if err := p.Demote(ctx, s); err == nil || !strings.Contains(err.Error(), "pg_basebackup") {
		t.Fatalf("Demote with no way to copy the new primary: %v", err)
	}
	for _, f := range []string{p.Dir + "/PG_VERSION", p.Dir + ".new"} {
		if _, err := os.Stat(f); os.IsNotExist(err) != strings.HasSuffix(f, ".new") {
			t.Fatalf("after the failed Demote: %s: %v", f, err)
		}
	}
	if err := s.writeFile(s.Dir+"/pg_hba.conf", s.hba(), false); err != nil {
		t.Fatal(err)
	}
	if err := s.adminExec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	if err := p.Demote(ctx, s); err != nil {
		t.Fatal(err)
	}
	if p.lastRejoin != "pg_basebackup" {
		t.Fatalf("Demote rejoined by %q, want pg_basebackup", p.lastRejoin)
	}
	wantRecovery(t, ctx, p, true)
	wantStreaming(t, ctx, s, p)
	wantValue(t, ctx, p, "b", "2")
}

func TestSwitchover(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{})
	for i, step := range []struct{ from, to *Cluster }{{p, s}, {s, p}} {
		k := string(rune('a' + i))
		// No WaitReplayed: Switchover itself must not lose the commit.
		put(t, ctx, step.from, "INSERT INTO kv VALUES ($1, 'before')", k)
		t0 := time.Now()
		if err := step.from.Switchover(ctx, step.to); err != nil {
			t.Fatal(err)
		}
		t.Logf("switchover %s -> %s took %v (%s)", step.from.Name, step.to.Name,
			time.Since(t0).Round(time.Millisecond), step.from.lastRejoin)
		if step.from.lastRejoin != "none" {
			t.Errorf("old primary rejoined by %q, want none (no rewind needed)", step.from.lastRejoin)
		}
		wantRecovery(t, ctx, step.to, false)
		wantRecovery(t, ctx, step.from, true)
		wantStreaming(t, ctx, step.to, step.from)
		wantValue(t, ctx, step.to, k, "before")
		put(t, ctx, step.to, "UPDATE kv SET v = 'after' WHERE k = $1", k)
		if err := step.to.WaitReplayed(ctx, step.from); err != nil {
			t.Fatal(err)
		}
		wantValue(t, ctx, step.from, k, "after")
	}
}

func TestCrashPromoteDemote(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{})
	put(t, ctx, p, "INSERT INTO kv VALUES ('a', '1')")
	if err := p.WaitReplayed(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := p.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := p.Exec(ctx, "postgres", "SELECT 1"); err == nil {
		t.Fatal("crashed primary still answers")
	}
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, s, "INSERT INTO kv VALUES ('b', '2')")
	if err := p.Demote(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Logf("crashed primary rejoined by %s", p.lastRejoin)
	wantRecovery(t, ctx, p, true)
	wantStreaming(t, ctx, s, p)
	put(t, ctx, s, "INSERT INTO kv VALUES ('c', '3')")
	if err := s.WaitReplayed(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"a", "1"}, {"b", "2"}, {"c", "3"}} {
		wantValue(t, ctx, p, kv[0], kv[1])
	}
}

// receivedLSN waits until standby s has received (not necessarily replayed)
// all WAL primary p has written.
func waitReceived(t *testing.T, ctx context.Context, p, s *Cluster) {
	t.Helper()
	lsn, err := p.flushedLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, "WAL to be received", func(ctx context.Context) (bool, error) {
		var ok bool
		err := s.adminQueryRow(ctx, "SELECT coalesce(pg_last_wal_receive_lsn() >= $1::pg_lsn, false)", []any{lsn}, &ok)
		return ok, err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestPauseReplay(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{})
	if err := s.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, p, "INSERT INTO kv VALUES ('a', '1')")
	waitReceived(t, ctx, p, s)
	wantMissing(t, ctx, s, "a")
	if err := s.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReplayed(ctx, s); err != nil {
		t.Fatal(err)
	}
	wantValue(t, ctx, s, "a", "1")
}

// TestStopWALReceiver: a standby whose WAL receiver is stopped misses
// commits; started again it catches up. Promoted while it misses one after
// the primary crashed, the commit is lost, and Demote must rewind the old
// primary, which then lacks it too.
func TestStopWALReceiver(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{})

	if err := s.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, p, "INSERT INTO kv VALUES ('a', '1')")
	lsn, err := p.flushedLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var behind bool
	if err := s.adminQueryRow(ctx, "SELECT coalesce(pg_last_wal_receive_lsn() < $1::pg_lsn, true)", []any{lsn}, &behind); err != nil {
		t.Fatal(err)
	}
	if !behind {
		t.Fatal("standby received WAL while its receiver is stopped")
	}
	wantMissing(t, ctx, s, "a")
	if err := s.StartWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReplayed(ctx, s); err != nil {
		t.Fatal(err)
	}
	wantValue(t, ctx, s, "a", "1")

	if err := s.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, p, "INSERT INTO kv VALUES ('lost', 'x')")
	if _, err := p.flushedLSN(ctx); err != nil { // the commit reaches the primary's WAL files
		t.Fatal(err)
	}
	if err := p.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	wantMissing(t, ctx, s, "lost")
	put(t, ctx, s, "INSERT INTO kv VALUES ('b', '2')")
	if err := p.Demote(ctx, s); err != nil {
		t.Fatal(err)
	}
	if p.lastRejoin != "pg_rewind" {
		t.Fatalf("Demote rejoined by %q, want pg_rewind\n%s", p.lastRejoin, p.rewindOutput)
	}
	if err := s.WaitReplayed(ctx, p); err != nil {
		t.Fatal(err)
	}
	wantMissing(t, ctx, p, "lost")
	wantValue(t, ctx, p, "b", "2")
}

// TestSyncStandby: with a synchronous standby, a commit on the primary waits
// while the standby receives nothing.
func TestSyncStandby(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	p := startPrimary(t, ctx)
	s := startStandby(t, ctx, p, StandbyOptions{Sync: true})
	var state string
	if err := p.adminQueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
		[]any{s.Name}, &state); err != nil {
		t.Fatal(err)
	}
	if state != "quorum" {
		t.Fatalf("sync_state = %q, want quorum", state)
	}
	if err := s.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- p.Exec(ctx, "appdb", "INSERT INTO kv VALUES ('a', '1')")
	}()
	err := poll(ctx, "the commit to wait for the standby", func(ctx context.Context) (bool, error) {
		var n int
		err := p.adminQueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'", nil, &n)
		return n == 1, err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("commit returned (%v) while the synchronous standby receives nothing", err)
	default:
	}
	if err := s.StartWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// synchronous_commit = on: flushed on the standby, maybe not replayed.
	if err := p.WaitReplayed(ctx, s); err != nil {
		t.Fatal(err)
	}
	wantValue(t, ctx, s, "a", "1")
}
