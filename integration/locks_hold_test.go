package integration

// advisory_locks: hold — lockpool holds session-level advisory locks for
// its clients on its own lock connections: no pin, no application
// connection held, real locks in PostgreSQL.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// hdLockConnHolders returns the pids of lockpool's lock connections that
// hold key.
func hdLockConnHolders(t testing.TB, su *pgx.Conn, k lkKey) []uint32 {
	t.Helper()
	var pids []uint32
	rows, err := su.Query(context.Background(), `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = $3
		AND a.application_name = $4 ORDER BY l.pid`, int64(k.classid), int64(k.objid), k.objsubid, advisory.ApplicationName)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, uint32(pid))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// hdSimple makes a client use the simple protocol.
func hdSimple(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol }

// hdProtocols are the client protocols the held-lock tests run in: pgx's
// simple protocol and its default (extended, statements prepared).
var hdProtocols = []struct {
	name string
	edit func(*pgx.ConnConfig)
}{
	{"simple", hdSimple},
	{"extended", func(*pgx.ConnConfig) {}},
}

func TestHoldAnswersCalls(t *testing.T) {
	t.Parallel()
	const app = "hd1"
	l := startLockpool(t, 10, "", lkApp(app, "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	var h int32
	if err := su.QueryRow(context.Background(), "SELECT hashtext('job-x')").Scan(&h); err != nil {
		t.Fatal(err)
	}
	for pi, proto := range hdProtocols {
		tests := []struct {
			name, lock, unlock string
			args               []any
			key                lkKey
			directConflicts    string // a direct statement that must return false while held
		}{
			{"one key", "SELECT pg_try_advisory_lock(%d)", "SELECT pg_advisory_unlock(%d)", nil, lkKey1(int64(9100 + pi)), "SELECT pg_try_advisory_lock_shared(%d)"},
			{"two keys shared", "SELECT pg_try_advisory_lock_shared(7, %d)", "SELECT pg_advisory_unlock_shared(7, %d)", nil, lkKey2(7, int32(9200+pi)), "SELECT pg_try_advisory_lock(7, %d)"},
			{"expression with alias and cast", "SELECT pg_try_advisory_lock(%d + 0)::int AS got", "SELECT pg_advisory_unlock(%d + 0)::int", nil, lkKey1(int64(9300 + pi)), "SELECT pg_try_advisory_lock(%d)"},
		}
		for _, tt := range tests {
			t.Run(proto.name+"/"+tt.name, func(t *testing.T) {
				c := l.connectCfg(t, "app", "appdb", proto.edit)
				n := int64(tt.key.objid)
				if tt.key.objsubid == 2 {
					n = int64(int32(tt.key.objid))
				}
				var got any
				if err := c.QueryRow(context.Background(), fmt.Sprintf(tt.lock, n)).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != true && got != int32(1) {
					t.Fatalf("lock returned %v (%T), want true", got, got)
				}
				if hs := hdLockConnHolders(t, su, tt.key); len(hs) != 1 {
					t.Fatalf("lock connection holders of %v = %v, want one", tt.key, hs)
				}
				if lkMustBool(t, su, fmt.Sprintf(tt.directConflicts, n)) {
					t.Fatal("a direct session got a conflicting lock")
				}
				if g := l.Pinned(app, ""); g != 0 {
					t.Fatalf("lockpool_pinned_sessions = %v, want 0", g)
				}
				if err := c.QueryRow(context.Background(), fmt.Sprintf(tt.unlock, n)).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != true && got != int32(1) {
					t.Fatalf("unlock returned %v, want true", got)
				}
				if hs := hdLockConnHolders(t, su, tt.key); len(hs) != 0 {
					t.Fatalf("still held after unlock: %v", hs)
				}
			})
		}
		t.Run(proto.name+"/parameter key", func(t *testing.T) {
			c := l.connectCfg(t, "app", "appdb", proto.edit)
			if proto.name == "simple" {
				// pgx interpolates the argument client-side.
				if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(hashtext($1))", "job-x") {
					t.Fatal("try-lock false")
				}
			} else if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(hashtext($1))", "job-x") {
				t.Fatal("try-lock false")
			}
			if hs := hdLockConnHolders(t, su, lkKey1(int64(h))); len(hs) != 1 {
				t.Fatalf("lock connection holders of hashtext('job-x') = %v", hs)
			}
			lkMustExec(t, c, "SELECT pg_advisory_unlock_all()")
			if hs := hdLockConnHolders(t, su, lkKey1(int64(h))); len(hs) != 0 {
				t.Fatalf("held after unlock_all: %v", hs)
			}
		})
	}
}

func TestHoldUnlockNotHeldWarns(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd2", "app", 2, 1, "hold", "5s"))
	var notices []*pgconn.Notice
	var mu sync.Mutex
	c := l.connectCfg(t, "app", "appdb", func(cc *pgx.ConnConfig) {
		cc.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { mu.Lock(); notices = append(notices, n); mu.Unlock() }
	})
	tests := []struct {
		sql, msg string
	}{
		{"SELECT pg_advisory_unlock(9401)", "you don't own a lock of type ExclusiveLock"},
		{"SELECT pg_advisory_unlock_shared(9401)", "you don't own a lock of type ShareLock"},
	}
	for _, tt := range tests {
		mu.Lock()
		notices = nil
		mu.Unlock()
		if lkMustBool(t, c, tt.sql) {
			t.Fatalf("%s = true for a key not held", tt.sql)
		}
		mu.Lock()
		if len(notices) != 1 || notices[0].Severity != "WARNING" || notices[0].Code != "01000" || notices[0].Message != tt.msg {
			t.Fatalf("notices = %+v, want one WARNING %q", notices, tt.msg)
		}
		mu.Unlock()
	}
	// Another client's lock is not ours to unlock.
	other := l.connect(t, "app", "appdb")
	if !lkMustBool(t, other, "SELECT pg_try_advisory_lock(9402)") {
		t.Fatal("try-lock false")
	}
	if lkMustBool(t, c, "SELECT pg_advisory_unlock(9402)") {
		t.Fatal("a client unlocked another client's lock")
	}
	if lkMustBool(t, c, "SELECT pg_try_advisory_lock(9402)") {
		t.Fatal("a client got a lock another client of the same lockpool holds")
	}
}

func TestHoldInFailedTransaction(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd3", "app", 2, 1, "hold", "5s"))
	c := l.connectCfg(t, "app", "appdb", hdSimple)
	ctx := testenv.Context(t, 30*time.Second)
	lkMustExec(t, c, "BEGIN")
	if _, err := c.Exec(ctx, "SELECT 1/0"); sqlState(err) != "22012" {
		t.Fatalf("1/0 = %v", err)
	}
	if _, err := c.Exec(ctx, "SELECT pg_try_advisory_lock(9501)"); sqlState(err) != "25P02" {
		t.Fatalf("lock in a failed transaction = %v, want 25P02", err)
	}
	lkMustExec(t, c, "ROLLBACK")
	if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(9501)") {
		t.Fatal("try-lock after ROLLBACK false")
	}
	// A session lock taken inside a transaction outlives its rollback, as on PostgreSQL.
	lkMustExec(t, c, "BEGIN")
	lkMustExec(t, c, "SELECT pg_advisory_lock(9502)")
	lkMustExec(t, c, "ROLLBACK")
	if hs := hdLockConnHolders(t, superConn(t, "appdb"), lkKey1(9502)); len(hs) != 1 {
		t.Fatalf("lock taken in a rolled-back transaction: holders %v, want one", hs)
	}
}

func TestHoldReleasedWhenClientLeaves(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd4", "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	tests := []struct {
		name string
		end  func(c *pgx.Conn)
	}{
		{"terminate", func(c *pgx.Conn) { _ = c.Close(context.Background()) }},
		{"abrupt", func(c *pgx.Conn) { _ = c.PgConn().Conn().Close() }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := int64(9600 + i)
			c := l.connect(t, "app", "appdb")
			lkMustExec(t, c, "SELECT pg_advisory_lock($1)", k)
			lkMustExec(t, c, "SELECT pg_advisory_lock($1)", k) // stacked
			if hs := hdLockConnHolders(t, su, lkKey1(k)); len(hs) != 1 {
				t.Fatalf("holders %v", hs)
			}
			start := time.Now()
			tt.end(c)
			eventually(t, time.Second, "lock released", func() bool { return len(hdLockConnHolders(t, su, lkKey1(k))) == 0 })
			t.Logf("released %v after the client left", time.Since(start))
		})
	}
}

func TestHoldWaitEnds(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd5", "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	simple := pgx.QueryExecModeSimpleProtocol
	tests := []struct {
		name   string
		setup  []string
		cancel bool
		code   string
		msg    string
		mode   pgx.QueryExecMode // how pgx sends the call (its argument is $1)
	}{
		{"lock_timeout by SET", []string{"SET lock_timeout = '150ms'"}, false, "55P03", "canceling statement due to lock timeout", simple},
		{"lock_timeout by SET LOCAL", []string{"BEGIN", "SET LOCAL lock_timeout = 150"}, false, "55P03", "canceling statement due to lock timeout", simple},
		// pgx's extended modes: Bind, Execute, Sync for a statement prepared
		// before; Parse, Bind, Describe, Execute, Sync in one batch; and the
		// two that describe the statement first.
		{"lock_timeout by SET LOCAL, cache statement", []string{"BEGIN", "SET LOCAL lock_timeout = 150"}, false, "55P03", "canceling statement due to lock timeout", pgx.QueryExecModeCacheStatement},
		{"lock_timeout by SET LOCAL, exec", []string{"BEGIN", "SET LOCAL lock_timeout = 150"}, false, "55P03", "canceling statement due to lock timeout", pgx.QueryExecModeExec},
		{"lock_timeout by SET LOCAL, describe exec", []string{"BEGIN", "SET LOCAL lock_timeout = 150"}, false, "55P03", "canceling statement due to lock timeout", pgx.QueryExecModeDescribeExec},
		{"lock_timeout by SET LOCAL, cache describe", []string{"BEGIN", "SET LOCAL lock_timeout = 150"}, false, "55P03", "canceling statement due to lock timeout", pgx.QueryExecModeCacheDescribe},
		{"statement_timeout", []string{"SET statement_timeout = '150ms'"}, false, "57014", "canceling statement due to statement timeout", simple},
		{"statement_timeout by SET LOCAL, exec", []string{"BEGIN", "SET LOCAL statement_timeout = 150"}, false, "57014", "canceling statement due to statement timeout", pgx.QueryExecModeExec},
		{"cancel request", nil, true, "57014", "canceling statement due to user request", simple},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := int64(9700 + i)
			if !lkMustBool(t, su, "SELECT pg_try_advisory_lock($1)", k) {
				t.Fatal("direct try-lock false")
			}
			defer lkMustExec(t, su, "SELECT pg_advisory_unlock($1)", k)
			edit := func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = tt.mode }
			c := l.connectCfg(t, "app", "appdb", edit)
			for _, q := range tt.setup {
				lkMustExec(t, c, q)
			}
			ctx := context.Background()
			var cancel context.CancelFunc = func() {}
			if tt.cancel {
				ctx, cancel = context.WithTimeout(ctx, 150*time.Millisecond)
			}
			defer cancel()
			start := time.Now()
			_, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", k)
			took := time.Since(start)
			if tt.cancel {
				// pgx closes the connection after a cancelled query; the
				// server error is not read. The lock must not be taken.
				if err == nil || took > 2*time.Second {
					t.Fatalf("cancelled lock = %v after %v", err, took)
				}
				eventually(t, time.Second, "no lockpool holder", func() bool { return len(hdLockConnHolders(t, su, lkKey1(k))) == 0 })
				return
			}
			pe := pgErr(t, err, tt.code)
			if pe.Message != tt.msg {
				t.Fatalf("message %q, want %q", pe.Message, tt.msg)
			}
			if took < 140*time.Millisecond || took > 2*time.Second {
				t.Fatalf("wait took %v, want about 150ms", took)
			}
			if len(hdLockConnHolders(t, su, lkKey1(k))) != 0 {
				t.Fatal("lockpool holds the key after a failed wait")
			}
		})
	}
	// Every blocking call was timed, cancelled ones included (a cancelled
	// client does not wait for lockpool to finish its bookkeeping).
	eventually(t, time.Second, "every wait in lockpool_advisory_lock_wait_seconds", func() bool {
		return l.metric("lockpool_advisory_lock_wait_seconds", map[string]string{"app": "hd5"}) == float64(len(tests))
	})
}

// TestHoldTransactionBackendGone: a blocking held call inside a
// transaction block reads the block's lock_timeout from the client's
// server connection; when that backend was terminated, the call must end
// the session with a FATAL and take no lock (the transaction is gone; a
// grant would outlive it, and the next statement would read a stale reply).
func TestHoldTransactionBackendGone(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd9", "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	for i, proto := range hdProtocols {
		t.Run(proto.name, func(t *testing.T) {
			ctx := context.Background()
			k := int64(9950 + i) // 9901 and 9902 are TestHoldDeadlock's
			c := l.connectCfg(t, "app", "appdb", proto.edit)
			lkMustExec(t, c, "BEGIN")
			lkMustExec(t, c, "SET LOCAL lock_timeout = 5000")
			var pid int32
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if !lkMustBool(t, su, "SELECT pg_terminate_backend($1, 5000)", pid) {
				t.Fatalf("backend %d not terminated", pid)
			}
			// The server's own FATAL (57P01) when the call's Describe
			// went to the terminated backend, else lockpool's 57P01 (locks lost) or 08006.
			_, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", k)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "08006" && pe.Code != "57P01" {
				t.Fatalf("held call = %v, want FATAL 08006 or 57P01", err)
			}
			if !c.IsClosed() {
				t.Fatal("client still open")
			}
			if hs := hdLockConnHolders(t, su, lkKey1(k)); len(hs) != 0 {
				t.Fatalf("lockpool holds key %d for a client whose transaction is gone: %v", k, hs)
			}
			if l.metric("lockpool_advisory_locks_held", map[string]string{"app": "hd9"}) != 0 {
				t.Fatal("lockpool_advisory_locks_held not 0")
			}
			// No wait was even started (every blocking call is timed): the
			// call ended at the read of lock_timeout.
			if n := l.metric("lockpool_advisory_lock_wait_seconds", map[string]string{"app": "hd9"}); n != 0 {
				t.Fatalf("%v blocking calls ran", n)
			}
		})
	}
}

func TestHoldCancelRequestAnswers57014(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd6", "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	if !lkMustBool(t, su, "SELECT pg_try_advisory_lock(9801)") {
		t.Fatal("direct try-lock false")
	}
	defer lkMustExec(t, su, "SELECT pg_advisory_unlock(9801)")
	c := l.connectCfg(t, "app", "appdb", hdSimple)
	pid, secret := c.PgConn().PID(), binary.BigEndian.Uint32(c.PgConn().SecretKey())
	time.AfterFunc(150*time.Millisecond, func() { testenv.SendCancel(t, l.Addr, pid, secret) })
	_, err := c.Exec(context.Background(), "SELECT pg_advisory_lock(9801)")
	pe := pgErr(t, err, "57014")
	if pe.Message != "canceling statement due to user request" {
		t.Fatalf("message %q", pe.Message)
	}
	if !lkMustBool(t, c, "SELECT true") {
		t.Fatal("the session is not usable after the cancel")
	}
}

func TestHoldDeadlock(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd7", "app", 2, 1, "hold", "5s"))
	conns := []*pgx.Conn{l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")}
	keys := []int64{9901, 9902}
	for i, c := range conns {
		lkMustExec(t, c, "SELECT pg_advisory_lock($1)", keys[i])
	}
	type result struct {
		who int
		err error
	}
	results := make(chan result, 2)
	for i, c := range conns {
		go func() {
			_, err := c.Exec(context.Background(), "SELECT pg_advisory_lock($1)", keys[1-i])
			results <- result{i, err}
		}()
	}
	// PostgreSQL's victim: the wait whose deadlock_timeout (1s) runs out first.
	first := <-results
	pe := pgErr(t, first.err, "40P01")
	if pe.Message != "deadlock detected" {
		t.Fatalf("message %q", pe.Message)
	}
	lkMustExec(t, conns[first.who], "SELECT pg_advisory_unlock_all()")
	select {
	case r := <-results:
		if r.err != nil {
			t.Fatalf("the other lock: %v", r.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the other wait not granted after the victim gave up")
	}
}

// TestHoldUpgradeDeadlock: two sessions hold a key shared, and one waits
// for it exclusively. When the other asks for it exclusively too, each
// waits for the other's shared lock: PostgreSQL answers that request at
// once with 40P01, without waiting for deadlock_timeout. A client of
// lockpool gets the answer a direct connection gets, whether the waiter is
// a session of PostgreSQL's or another client of lockpool (the reference
// row checks PostgreSQL's own answer).
func TestHoldUpgradeDeadlock(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd10", "app", 3, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	direct := func(t *testing.T) *pgx.Conn { return superConn(t, "appdb") }
	simple := func(t *testing.T) *pgx.Conn { return l.connectCfg(t, "app", "appdb", hdSimple) }
	extended := func(t *testing.T) *pgx.Conn { return l.connect(t, "app", "appdb") }
	// waitsInPostgreSQL and waitsInLockpool report whether the waiter's
	// exclusive request is queued.
	waitsInPostgreSQL := func(t *testing.T, c *pgx.Conn, _ int64) bool {
		return lkMustBool(t, su, "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)", int32(c.PgConn().PID()))
	}
	waitsInLockpool := func(t *testing.T, _ *pgx.Conn, k int64) bool {
		for _, c := range hdDebugHeld(t, l) {
			if w := c.Waiting; w != nil && w.Key == advisory.OneKey(k) && w.Mode == "exclusive" {
				return true
			}
		}
		return false
	}
	tests := []struct {
		name          string
		waiter, asker func(t *testing.T) *pgx.Conn
		waits         func(t *testing.T, waiter *pgx.Conn, k int64) bool
	}{
		{"direct, direct waiter (reference)", direct, direct, waitsInPostgreSQL},
		{"lockpool simple, direct waiter", direct, simple, waitsInPostgreSQL},
		{"lockpool extended, direct waiter", direct, extended, waitsInPostgreSQL},
		{"lockpool simple, lockpool waiter", extended, simple, waitsInLockpool},
		{"lockpool extended, lockpool waiter", simple, extended, waitsInLockpool},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			k := int64(9960 + i)
			waiter, c := tt.waiter(t), tt.asker(t)
			lkMustExec(t, waiter, "SELECT pg_advisory_lock_shared($1)", k)
			lkMustExec(t, c, "SELECT pg_advisory_lock_shared($1)", k)
			lkMustExec(t, waiter, "SET lock_timeout = '10s'")
			waited := make(chan error, 1)
			go func() {
				_, err := waiter.Exec(ctx, "SELECT pg_advisory_lock($1)", k)
				waited <- err
			}()
			eventually(t, 5*time.Second, "the waiter's exclusive request is queued", func() bool { return tt.waits(t, waiter, k) })
			start := time.Now()
			_, err := c.Exec(testenv.Context(t, 5*time.Second), "SELECT pg_advisory_lock($1)", k)
			took := time.Since(start)
			if pe := pgErr(t, err, "40P01"); pe.Message != "deadlock detected" {
				t.Fatalf("message %q", pe.Message)
			}
			if took > 900*time.Millisecond {
				t.Fatalf("the deadlock took %v to report; PostgreSQL reports it at once", took)
			}
			// The shared lock stays; giving it back lets the waiter in.
			if !lkMustBool(t, c, "SELECT pg_advisory_unlock_shared($1)", k) {
				t.Fatal("the shared lock was lost with the failed upgrade")
			}
			if err := <-waited; err != nil {
				t.Fatalf("the waiter: %v", err)
			}
			lkMustExec(t, waiter, "SELECT pg_advisory_unlock_all()")
		})
	}
}

func TestHoldLockConnectionTerminated(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hd8", "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	const n = 4
	clients := make([]*pgx.Conn, n)
	for i := range clients {
		clients[i] = l.connect(t, "app", "appdb")
		lkMustExec(t, clients[i], "SELECT pg_advisory_lock($1)", int64(10000+i))
	}
	// Terminate this lockpool's lock connections (other tests run their own).
	pids := map[uint32]bool{}
	for _, c := range hdDebugHeld(t, l) {
		for _, h := range c.Held {
			pids[h.PID] = true
		}
	}
	if len(pids) == 0 {
		t.Fatal("/debug/locks shows no lock connection pid")
	}
	for pid := range pids {
		if _, err := su.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int32(pid)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	for i, c := range clients {
		var err error
		for time.Now().Before(deadline) {
			if _, err = c.Exec(context.Background(), "SELECT 1"); err != nil {
				break
			}
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			if pe.Code != "57P01" || pe.Severity != "FATAL" || !strings.Contains(pe.Message, "advisory locks were lost") {
				t.Fatalf("client %d: %v, want FATAL 57P01 (advisory locks were lost)", i, err)
			}
		} else if err == nil {
			t.Fatalf("client %d: statements still succeed 500ms after its lock connection died", i)
		}
		if !c.IsClosed() {
			t.Fatalf("client %d still open after %v", i, err)
		}
	}
	eventually(t, time.Second, "lockpool_advisory_locks_held back to 0", func() bool {
		return l.metric("lockpool_advisory_locks_held", map[string]string{"app": "hd8"}) == 0
	})
	// New clients can lock again.
	c := l.connect(t, "app", "appdb")
	if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(10000)") {
		t.Fatal("key not free after the lock connection died")
	}
}

// hdDebugHeld returns the held section of /debug/locks.
func hdDebugHeld(t testing.TB, l *lp) []advisory.ClientLocks {
	t.Helper()
	code, body := l.get("/debug/locks")
	if code != 200 {
		t.Fatalf("/debug/locks: HTTP %d: %s", code, body)
	}
	var d struct {
		Held []struct {
			Client   string `json:"client"`
			Database string `json:"database"`
			Held     []struct {
				Key   []int64 `json:"key"`
				Mode  string  `json:"mode"`
				Count int     `json:"count"`
				PID   uint32  `json:"pid"`
			} `json:"held"`
			Waiting *struct {
				Key    []int64 `json:"key"`
				Mode   string  `json:"mode"`
				Behind string  `json:"behind"`
			} `json:"waiting"`
		} `json:"held"`
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("/debug/locks: %v\n%s", err, body)
	}
	var out []advisory.ClientLocks
	for _, c := range d.Held {
		cl := advisory.ClientLocks{Client: c.Client, Database: c.Database}
		for _, h := range c.Held {
			k := advisory.OneKey(h.Key[0])
			if len(h.Key) == 2 {
				k = advisory.TwoKeys(int32(h.Key[0]), int32(h.Key[1]))
			}
			cl.Held = append(cl.Held, advisory.HeldLock{Key: k, Mode: h.Mode, Count: h.Count, PID: h.PID})
		}
		if w := c.Waiting; w != nil {
			k := advisory.OneKey(w.Key[0])
			if len(w.Key) == 2 {
				k = advisory.TwoKeys(int32(w.Key[0]), int32(w.Key[1]))
			}
			cl.Waiting = &advisory.Waiting{Key: k, Mode: w.Mode, Behind: w.Behind}
		}
		out = append(out, cl)
	}
	return out
}

func TestHoldFallbackPins(t *testing.T) {
	t.Parallel()
	const app = "hd9"
	l := startLockpool(t, 10, "", lkApp(app, "app", 3, 1, "hold", "5s"))
	c := l.connect(t, "app", "appdb")
	var a bool
	var b int
	if err := c.QueryRow(context.Background(), "SELECT pg_try_advisory_lock(10101), 1").Scan(&a, &b); err != nil || !a {
		t.Fatalf("two-column lock = %v, %v", a, err)
	}
	if g := l.Pinned(app, ""); g != 1 {
		t.Fatalf("lockpool_pinned_sessions = %v, want 1 (fallback to pin)", g)
	}
	if m := l.metric("lockpool_advisory_lock_fallbacks_total", map[string]string{"app": app}); m != 1 {
		t.Fatalf("fallbacks = %v, want 1", m)
	}
	// While pinned by the fallback, a whole unlock reaches the pinned
	// connection that holds the lock, and the session unpins.
	if !lkMustBool(t, c, "SELECT pg_advisory_unlock(10101)") {
		t.Fatal("unlock of the fallback's lock returned false")
	}
	if g := l.Pinned(app, ""); g != 0 {
		t.Fatalf("lockpool_pinned_sessions = %v after the unlock, want 0", g)
	}
	// Unpinned, whole calls are lockpool's again.
	if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(10102)") || l.Pinned(app, "") != 0 {
		t.Fatal("a whole try-lock after the unpin was not held by lockpool")
	}
	if hs := hdLockConnHolders(t, superConn(t, "appdb"), lkKey1(10102)); len(hs) != 1 {
		t.Fatalf("lock connection holders %v", hs)
	}
}

// TestHoldLockpoolKilled: when lockpool dies, PostgreSQL releases the
// locks it held with its lock connections.
func TestHoldLockpoolKilled(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	p := testenv.StartLockpoolProcess(t, func(port int) string {
		return testenv.AppsYAML(c, 10, fmt.Sprintf("listen: 127.0.0.1:%d", port),
			testenv.App{Name: "hdk", User: "app", DB: "appdb", Max: 2, Pinned: 1, Advisory: "hold", State: "pin", Wait: "5s"})
	})
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 30*time.Second)
	keys := []lkKey{lkKey1(23001), lkKey1(23002), lkKey2(23, 3)}
	stmts := []string{"SELECT pg_advisory_lock(23001)", "SELECT pg_advisory_lock_shared(23002)", "SELECT pg_try_advisory_lock(23, 3)"}
	for i, q := range stmts {
		cl, err := pgx.Connect(ctx, p.DSN("app", "appdb"))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close(context.Background())
		lkMustExec(t, cl, q)
		if hs := hdLockConnHolders(t, su, keys[i]); len(hs) != 1 {
			t.Fatalf("%s: lock connection holders %v", q, hs)
		}
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	start := time.Now()
	eventually(t, time.Second, "locks free after SIGKILL", func() bool {
		for _, k := range keys {
			if len(lkHolders(t, su, k)) != 0 {
				return false
			}
		}
		return true
	})
	t.Logf("free %v after lockpool died", time.Since(start))
}

// TestHoldWireFormats: Describe reports the parameter types PostgreSQL
// infers for the keys and the result column; results in text and binary
// format; a call in the middle of a pipeline keeps its place.
func TestHoldWireFormats(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hdw", "app", 2, 1, "hold", "5s"))
	c := l.connect(t, "app", "appdb")
	pc := c.PgConn()
	ctx := testenv.Context(t, 30*time.Second)
	describes := []struct {
		sql    string
		params []uint32
		col    string
		typ    uint32
	}{
		{"SELECT pg_try_advisory_lock($1)", []uint32{20}, "pg_try_advisory_lock", 16},
		{"SELECT pg_try_advisory_lock(hashtext($1)) AS got", []uint32{25}, "got", 16},
		{"SELECT pg_advisory_lock_shared($1, $2)", []uint32{23, 23}, "pg_advisory_lock_shared", 2278},
		{"SELECT pg_advisory_unlock($1)::int", []uint32{20}, "pg_advisory_unlock", 23},
		{"SELECT pg_advisory_unlock_all()", nil, "pg_advisory_unlock_all", 2278},
	}
	for i, d := range describes {
		sd, err := pc.Prepare(ctx, fmt.Sprintf("hdw%d", i), d.sql, nil)
		if err != nil {
			t.Fatalf("%s: %v", d.sql, err)
		}
		if fmt.Sprint(sd.ParamOIDs) != fmt.Sprint(d.params) || len(sd.Fields) != 1 || sd.Fields[0].Name != d.col || sd.Fields[0].DataTypeOID != d.typ {
			t.Fatalf("%s: params %v, fields %+v; want %v, %s of type %d", d.sql, sd.ParamOIDs, sd.Fields, d.params, d.col, d.typ)
		}
	}
	// PostgreSQL parses the key expressions at Parse, as it would the call.
	if _, err := pc.Prepare(ctx, "hdwbad", "SELECT pg_advisory_lock(1 +)", nil); sqlState(err) != "42601" {
		t.Fatalf("Parse of a bad key expression = %v, want 42601", err)
	}
	results := []struct {
		sql    string
		format int16
		want   string
	}{
		{"SELECT pg_try_advisory_lock(24001)", 0, "t"},
		{"SELECT pg_try_advisory_lock(24001)", 1, "\x01"},
		{"SELECT pg_try_advisory_lock(24001)::int", 1, "\x00\x00\x00\x01"},
		{"SELECT pg_try_advisory_lock(24001)::text", 0, "true"},
		{"SELECT pg_advisory_lock(24001)", 1, ""},
		{"SELECT pg_advisory_unlock(24001)::integer", 0, "1"},
		{"SELECT pg_advisory_lock(NULL)", 0, "<NULL>"},
	}
	for _, r := range results {
		res := pc.ExecParams(ctx, r.sql, nil, nil, nil, []int16{r.format}).Read()
		if res.Err != nil {
			t.Fatalf("%s: %v", r.sql, res.Err)
		}
		got := "<NULL>"
		if len(res.Rows) == 1 && res.Rows[0][0] != nil {
			got = string(res.Rows[0][0])
		}
		if len(res.Rows) != 1 || got != r.want || res.CommandTag.String() != "SELECT 1" {
			t.Fatalf("%s (format %d): rows %q tag %q, want %q", r.sql, r.format, res.Rows, res.CommandTag, r.want)
		}
	}
	// A pipeline: a server statement, a held call, a server statement.
	b := &pgconn.Batch{}
	b.ExecParams("SELECT 1", nil, nil, nil, nil)
	b.ExecParams("SELECT pg_try_advisory_lock(24002)", nil, nil, nil, nil)
	b.ExecParams("SELECT 3", nil, nil, nil, nil)
	rs, err := pc.ExecBatch(ctx, b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, string(r.Rows[0][0]))
	}
	if fmt.Sprint(got) != "[1 t 3]" {
		t.Fatalf("pipeline results %v, want [1 t 3]", got)
	}
}

// TestHoldShutdownEndsWaits: a client waiting for a held lock does not
// hold up lockpool's shutdown.
func TestHoldShutdownEndsWaits(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "", lkApp("hdsd", "app", 2, 1, "hold", "5s"))
	su := superConn(t, "appdb")
	if !lkMustBool(t, su, "SELECT pg_try_advisory_lock(25001)") {
		t.Fatal("direct try-lock false")
	}
	defer lkMustExec(t, su, "SELECT pg_advisory_unlock(25001)")
	c := l.connect(t, "app", "appdb")
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), "SELECT pg_advisory_lock(25001)")
		done <- err
	}()
	eventually(t, 2*time.Second, "the client waits", func() bool {
		for _, cl := range hdDebugHeld(t, l) {
			if cl.Waiting != nil {
				return true
			}
		}
		return false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := l.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("shutdown took %v with a held-lock wait", took)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the wait succeeded during shutdown")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting client was not ended")
	}
}
