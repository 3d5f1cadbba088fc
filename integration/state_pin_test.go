package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/testenv"
)

// State that cannot be carried between server
// connections pins the session (session_state: pin) or is refused
// (session_state: reject); a pinned session that ends leaves nothing behind.

func stPinApp(name string) appYAML {
	a := defaultApp()
	a.name, a.max, a.pinned, a.state, a.wait = name, 3, 1, "pin", "10s"
	a.extra = "    listen: pin\n" // LISTEN as session state (listen: shared answers it without a pin)
	return a
}

// stExec runs sql (simple protocol when no args) and fails the test on error.
func stExec(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// stCommitted runs sql inside a transaction and commits it.
func stCommitted(t testing.TB, c *pgx.Conn, sql string) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// stStart starts a lockpool with app and connects a first client to it
// (role app, appdb).
func stStart(t *testing.T, app appYAML) (*lp, *pgx.Conn) {
	t.Helper()
	l := startLockpool(t, 10, "", app)
	return l, l.connect(t, "app", "appdb")
}

// stCommittedNoPin runs sql on c in a transaction that commits, which
// must leave no session of app pinned; what names sql in the failure.
func stCommittedNoPin(t testing.TB, l *lp, app string, c *pgx.Conn, sql, what string) {
	t.Helper()
	stCommitted(t, c, sql)
	if p := l.Pinned(app, ""); p != 0 {
		t.Fatalf("%s pinned the session (gauge %v)", what, p)
	}
}

// stNotification waits up to d for a notification on c.
func stNotification(c *pgx.Conn, d time.Duration) (*pgconn.Notification, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.WaitForNotification(ctx)
}

// stAlternate is the query options of round i when the rounds alternate
// protocols: the simple protocol in even rounds, pgx's default in odd ones.
func stAlternate(i int) []any {
	if i%2 == 0 {
		return []any{pgx.QueryExecModeSimpleProtocol}
	}
	return nil
}

// stSettingsSQL reads the settings a pinned session changes.
const stSettingsSQL = "SELECT current_setting('search_path'), current_setting('statement_timeout'), current_setting('DateStyle')"

func TestStatePinListenNotify(t *testing.T) {
	t.Parallel()
	app := stPinApp("stlisten")
	l, listener := stStart(t, app)
	ctx := context.Background()
	ch := uniqueName(t, "lp_ch")
	notifier := l.connect(t, "app", "appdb")

	stExec(t, listener, "LISTEN "+ch)
	l.wantPinned(t, app.name, "listen", 1)
	pid := testenv.BackendPID(t, listener)

	for i := 0; i < 3; i++ {
		payload := fmt.Sprintf("hello-%d", i)
		// From another client through lockpool, via both protocols.
		if i%2 == 0 {
			stExec(t, notifier, fmt.Sprintf("NOTIFY %s, '%s'", ch, payload))
		} else {
			var one int
			if err := notifier.QueryRow(ctx, "SELECT 1 FROM pg_notify($1, $2)", ch, payload).Scan(&one); err != nil {
				t.Fatalf("pg_notify: %v", err)
			}
		}
		// The listener is idle: the notification must reach it without it
		// sending anything.
		n, err := stNotification(listener, 5*time.Second)
		if err != nil {
			t.Fatalf("notification %d not delivered to the idle listener: %v", i, err)
		}
		if n.Channel != ch || n.Payload != payload {
			t.Fatalf("notification %d: got %s/%q, want %s/%q", i, n.Channel, n.Payload, ch, payload)
		}
		// The listener keeps working between notifications, on its backend.
		if got := testenv.BackendPID(t, listener); got != pid {
			t.Fatalf("listening session moved from backend %d to %d", pid, got)
		}
	}
	// A notification sent within a transaction arrives after its commit.
	stCommitted(t, notifier, fmt.Sprintf("NOTIFY %s, 'in-tx'", ch))
	n, err := stNotification(listener, 5*time.Second)
	if err != nil || n.Payload != "in-tx" {
		t.Fatalf("notification after commit: %v, %v", n, err)
	}

	stExec(t, listener, "UNLISTEN *")
	l.wantPinned(t, app.name, "", 0)
	// No longer listening: nothing arrives.
	stExec(t, notifier, fmt.Sprintf("NOTIFY %s, 'late'", ch))
	n, err = stNotification(listener, 300*time.Millisecond)
	if err == nil {
		t.Fatalf("notification after UNLISTEN *: %+v", n)
	}
}

func TestStatePinTempTable(t *testing.T) {
	t.Parallel()
	app := stPinApp("sttemp")
	l, c := stStart(t, app)
	ctx := context.Background()
	tbl := uniqueName(t, "lp_tmp")
	other := l.connect(t, "app", "appdb")

	// ON COMMIT DROP lives only in its transaction: no pin.
	stCommittedNoPin(t, l, app.name, c, "CREATE TEMP TABLE "+tbl+"_x (i int) ON COMMIT DROP", "ON COMMIT DROP temp table")

	stExec(t, c, "CREATE TEMP TABLE "+tbl+" (i int)")
	l.wantPinned(t, app.name, "temp_table", 1)
	pid := testenv.BackendPID(t, c)
	for i := 1; i <= 5; i++ {
		if _, err := c.Exec(ctx, "INSERT INTO "+tbl+" VALUES ($1)", i); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		// Other clients keep running meanwhile, on other connections.
		var one int
		if err := other.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
	}
	var n, sum int
	if err := c.QueryRow(ctx, "SELECT count(*), sum(i) FROM "+tbl).Scan(&n, &sum); err != nil || n != 5 || sum != 15 {
		t.Fatalf("temp table across transactions: count %d sum %d, %v; want 5, 15", n, sum, err)
	}
	if got := testenv.BackendPID(t, c); got != pid {
		t.Fatalf("session with a temp table moved from backend %d to %d", pid, got)
	}
	// Nobody else sees it.
	if err := other.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = $1 AND relnamespace = pg_my_temp_schema()", tbl).Scan(&n); err != nil || n != 0 {
		t.Fatalf("another client sees the temp table: %d, %v", n, err)
	}

	stExec(t, c, "DROP TABLE "+tbl)
	l.wantPinned(t, app.name, "", 0)
}

func TestStatePinHoldCursor(t *testing.T) {
	t.Parallel()
	app := stPinApp("stcursor")
	l, c := stStart(t, app)
	ctx := context.Background()
	cur := uniqueName(t, "lp_cur")

	// A cursor without HOLD ends with its transaction: no pin.
	stCommittedNoPin(t, l, app.name, c, "DECLARE "+cur+"_x CURSOR FOR SELECT 1", "a cursor without HOLD")

	stCommitted(t, c, "DECLARE "+cur+" CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 10) AS g")
	l.wantPinned(t, app.name, "cursor", 1)
	next := 1
	for round := 0; round < 3; round++ {
		// Each FETCH in its own transaction, alternating protocols.
		rows, err := c.Query(ctx, "FETCH 3 FROM "+cur, stAlternate(round)...)
		if err != nil {
			t.Fatalf("fetch round %d: %v", round, err)
		}
		for rows.Next() {
			var g int
			if err := rows.Scan(&g); err != nil {
				t.Fatal(err)
			}
			if g != next {
				t.Fatalf("fetch round %d: got %d, want %d", round, g, next)
			}
			next++
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("fetch round %d: %v", round, err)
		}
	}
	if next != 10 {
		t.Fatalf("fetched up to %d, want 9", next-1)
	}
	stExec(t, c, "CLOSE "+cur)
	l.wantPinned(t, app.name, "", 0)
}

func TestStatePinPrepare(t *testing.T) {
	t.Parallel()
	app := stPinApp("stprepare")
	l, c := stStart(t, app)
	ctx := context.Background()
	name := uniqueName(t, "lp_p")

	stExec(t, c, "PREPARE "+name+"(int) AS SELECT $1 + 1")
	l.wantPinned(t, app.name, "prepare", 1)
	for i := 0; i < 5; i++ {
		var v int
		err := c.QueryRow(ctx, fmt.Sprintf("EXECUTE %s(%d)", name, 40+i), stAlternate(i)...).Scan(&v)
		if err != nil || v != 41+i {
			t.Fatalf("EXECUTE %d: %d, %v; want %d", i, v, err, 41+i)
		}
	}
	stExec(t, c, "DEALLOCATE "+name)
	l.wantPinned(t, app.name, "", 0)
	// Gone for real.
	if _, err := c.Exec(ctx, fmt.Sprintf("EXECUTE %s(1)", name)); err == nil {
		t.Fatal("EXECUTE after DEALLOCATE succeeded")
	}

	// DEALLOCATE ALL ends the pin too.
	stExec(t, c, "PREPARE "+name+"_a AS SELECT 1; PREPARE "+name+"_b AS SELECT 2")
	l.wantPinned(t, app.name, "prepare", 1)
	stExec(t, c, "DEALLOCATE ALL")
	l.wantPinned(t, app.name, "", 0)
	// And the client's protocol-level statements still work after it.
	for i := 0; i < 3; i++ {
		var v int
		if err := c.QueryRow(ctx, "SELECT $1::int * 2", i).Scan(&v); err != nil || v != 2*i {
			t.Fatalf("protocol-level statement after DEALLOCATE ALL: %d, %v", v, err)
		}
	}
}

func TestStateReject(t *testing.T) {
	t.Parallel()
	app := stPinApp("streject")
	app.state = "reject"
	l, c := stStart(t, app)
	ctx := context.Background()
	n := uniqueName(t, "lp_rej")

	_, err := c.Exec(ctx, "LISTEN "+n)
	stWantReject(t, "LISTEN", err)

	_, err = c.Exec(ctx, "CREATE TEMP TABLE "+n+" (i int)")
	stWantReject(t, "CREATE TEMP TABLE", err)

	_, err = c.Exec(ctx, "CREATE TEMPORARY TABLE "+n+"_q (i int)", pgx.QueryExecModeCacheStatement)
	stWantReject(t, "CREATE TEMPORARY TABLE (extended protocol)", err)

	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "DECLARE "+n+" CURSOR WITH HOLD FOR SELECT 1")
	stWantReject(t, "DECLARE … WITH HOLD", err)
	_ = tx.Rollback(ctx)

	_, err = c.Exec(ctx, "PREPARE "+n+" AS SELECT 1")
	stWantReject(t, "PREPARE", err)

	// Nothing of it exists on the server, nothing is pinned, and the client
	// goes on normally.
	if p := l.Pinned(app.name, ""); p != 0 {
		t.Errorf("pinned gauge %v after refusals", p)
	}
	var listening, prepared int
	if err := c.QueryRow(ctx, "SELECT (SELECT count(*) FROM pg_listening_channels()), (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)").Scan(&listening, &prepared); err != nil {
		t.Fatal(err)
	}
	if listening != 0 || prepared != 0 {
		t.Errorf("refused state exists anyway: %d channels, %d SQL prepared statements", listening, prepared)
	}

	// What lives only inside a transaction stays allowed.
	tx, err = c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE "+n+"_d (i int) ON COMMIT DROP"); err != nil {
		t.Errorf("ON COMMIT DROP temp table under reject: %v", err)
	}
	if _, err := tx.Exec(ctx, "DECLARE "+n+"_c CURSOR FOR SELECT 1"); err != nil {
		t.Errorf("cursor without HOLD under reject: %v", err)
	}
	_ = tx.Rollback(ctx)
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after refusals: %d, %v", one, err)
	}
}

// TestStateCleanReturn: a pinned session holding a listener, a temp table,
// a WITH HOLD cursor, an SQL prepared statement, settings and an advisory
// lock ends; the next client on that server connection finds none of it.
func TestStateCleanReturn(t *testing.T) {
	t.Parallel()
	app := stPinApp("stclean")
	app.max, app.pinned = 2, 1
	l := startLockpool(t, 10, "", app)
	ctx := context.Background()
	n := uniqueName(t, "lp_cl")
	const lockKey = 0x5e55_0005

	super := superConn(t, "appdb")
	var defPath, defTimeout, defDateStyle string
	{
		fresh := l.connect(t, "app", "appdb")
		if err := fresh.QueryRow(ctx, stSettingsSQL).Scan(&defPath, &defTimeout, &defDateStyle); err != nil {
			t.Fatal(err)
		}
		_ = fresh.Close(ctx)
	}

	cfg, err := pgx.ParseConfig(l.dsn("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	prev, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close(ctx)
	stExec(t, prev, "SET search_path = "+n+"_schema, public")
	stExec(t, prev, "SET statement_timeout = '4321ms'")
	stExec(t, prev, "SELECT set_config('DateStyle', 'SQL, DMY', false)")
	stExec(t, prev, "LISTEN "+n)
	l.wantPinned(t, app.name, "", 1)
	pid := testenv.BackendPID(t, prev)
	stExec(t, prev, "CREATE TEMP TABLE "+n+" (i int)")
	stExec(t, prev, "BEGIN; DECLARE "+n+"_cur CURSOR WITH HOLD FOR SELECT 1; COMMIT")
	stExec(t, prev, "PREPARE "+n+"_stmt AS SELECT 1")
	var locked bool
	if err := prev.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(lockKey)).Scan(&locked); err != nil || !locked {
		t.Fatalf("pg_try_advisory_lock: %v, %v", locked, err)
	}
	// Everything is really there, on one backend.
	var listening, temps, cursors, stmts, locks int
	const stateSQL = `SELECT (SELECT count(*) FROM pg_listening_channels()),
		(SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()),
		(SELECT count(*) FROM pg_cursors WHERE name <> ''),
		(SELECT count(*) FROM pg_prepared_statements WHERE from_sql),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted)`
	if err := prev.QueryRow(ctx, stateSQL).Scan(&listening, &temps, &cursors, &stmts, &locks); err != nil {
		t.Fatal(err)
	}
	if listening != 1 || temps == 0 || cursors != 1 || stmts != 1 || locks != 1 {
		t.Fatalf("set-up incomplete: %d channels, %d temp relations, %d cursors, %d SQL statements, %d advisory locks", listening, temps, cursors, stmts, locks)
	}
	if got := testenv.BackendPID(t, prev); got != pid {
		t.Fatalf("pinned session moved from backend %d to %d", pid, got)
	}
	if err := prev.Close(ctx); err != nil {
		t.Fatal(err)
	}
	l.wantPinned(t, app.name, "", 0)

	// The next client on that server connection. The pool hands out its
	// most recently returned connection; retry briefly in case the reset
	// is still running.
	var next *pgx.Conn
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := l.connect(t, "app", "appdb")
		if testenv.BackendPID(t, c) == pid {
			next = c
			break
		}
		_ = c.Close(ctx)
		if time.Now().After(deadline) {
			var alive bool
			_ = super.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive)
			t.Fatalf("no new client got backend %d back within 5s (backend still alive: %v)", pid, alive)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := next.QueryRow(ctx, stateSQL).Scan(&listening, &temps, &cursors, &stmts, &locks); err != nil {
		t.Fatal(err)
	}
	if listening != 0 {
		t.Errorf("next client is listening on %d channels", listening)
	}
	if temps != 0 {
		t.Errorf("next client finds %d relations in its temp schema", temps)
	}
	var tmpReg *string
	if err := next.QueryRow(ctx, "SELECT to_regclass($1)::text", "pg_temp."+n).Scan(&tmpReg); err != nil {
		t.Fatal(err)
	}
	if tmpReg != nil {
		t.Errorf("next client sees the temp table %s", *tmpReg)
	}
	if cursors != 0 {
		t.Errorf("next client finds %d open cursors", cursors)
	}
	if stmts != 0 {
		t.Errorf("next client finds %d SQL-level prepared statements", stmts)
	}
	if locks != 0 {
		t.Errorf("next client's backend holds %d advisory locks", locks)
	}
	var path, timeout, dateStyle string
	if err := next.QueryRow(ctx, stSettingsSQL).Scan(&path, &timeout, &dateStyle); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ name, got, want string }{
		{"search_path", path, defPath}, {"statement_timeout", timeout, defTimeout}, {"DateStyle", dateStyle, defDateStyle},
	} {
		if s.got != s.want {
			t.Errorf("next client sees %s = %q, want the default %q", s.name, s.got, s.want)
		}
	}
	var show string
	if err := next.QueryRow(ctx, "SHOW statement_timeout", pgx.QueryExecModeSimpleProtocol).Scan(&show); err != nil || show != defTimeout {
		t.Errorf("SHOW statement_timeout = %q, %v; want %q", show, err, defTimeout)
	}
	// The lock is free for anybody.
	if err := super.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(lockKey)).Scan(&locked); err != nil || !locked {
		t.Errorf("previous session's advisory lock is still held: %v, %v", locked, err)
	} else {
		_, _ = super.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(lockKey))
	}
	// A notification on the old channel reaches nobody through this client.
	stExec(t, super, "NOTIFY "+n+", 'stale'")
	if nt, err := stNotification(next, 300*time.Millisecond); err == nil {
		t.Errorf("next client received the previous session's notification %+v", nt)
	}
	// And the next client can itself do everything again.
	stExec(t, next, "CREATE TEMP TABLE "+n+" (i int)")
	stExec(t, next, "PREPARE "+n+"_stmt AS SELECT 1")
	stExec(t, next, "DEALLOCATE ALL")
	stExec(t, next, "DROP TABLE "+n)
	l.wantPinned(t, app.name, "", 0)
}

// TestStatePinListenWhileBusy: a pinned listener that keeps running
// statements gets every notification, also those that arrive while
// lockpool runs its own exchanges on its connection (the probe after each
// statement, a settings read-back).
func TestStatePinListenWhileBusy(t *testing.T) {
	t.Parallel()
	app := stPinApp("stlistenbusy")
	_, listener := stStart(t, app)
	ctx := testenv.Context(t, time.Minute)
	ch := uniqueName(t, "lp_busy")
	stExec(t, listener, "LISTEN "+ch)
	sender := superConn(t, "appdb")
	const n = 400
	sent := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if _, err := sender.Exec(ctx, fmt.Sprintf("NOTIFY %s, '%d'", ch, i)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	got := map[string]int{}
	busy := true
	for busy {
		select {
		case err := <-sent:
			if err != nil {
				t.Fatal(err)
			}
			busy = false
		default:
		}
		stExec(t, listener, "SET application_name = 'busy'") // a read-back and a probe after each
		for {
			wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			nt, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				break
			}
			got[nt.Payload]++
		}
	}
	for len(got) < n {
		nt, err := stNotification(listener, 5*time.Second)
		if err != nil {
			t.Fatalf("%d of %d notifications arrived: %v", len(got), n, err)
		}
		got[nt.Payload]++
	}
	for p, k := range got {
		if k != 1 {
			t.Errorf("notification %s arrived %d times", p, k)
		}
	}
}
