package advisory

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/pgtest"
)

const (
	appUser = "app"
	appPW   = "app pw"
	appDB   = "appdb"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.RunMain(m, func(c *pgtest.Cluster) error {
		ctx := context.Background()
		if err := c.CreateRole(ctx, appUser, appPW); err != nil {
			return err
		}
		return c.CreateDatabase(ctx, appDB, appUser)
	}))
}

func newManager(t *testing.T, edit ...func(*Options)) *Manager {
	t.Helper()
	c := pgtest.Require(t)
	opts := Options{
		ConnConfig: func(db string) (*pgx.ConnConfig, error) { return pgx.ParseConfig(c.DSN(appUser, appPW, db)) },
	}
	for _, e := range edit {
		e(&opts)
	}
	m, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Every session the test opened is closed by now: nothing of
		// them may stay in a lock table.
		if left := tableLeftovers(m); len(left) > 0 {
			t.Errorf("lock table not empty after the test:\n%s", strings.Join(left, "\n"))
		}
		m.Close()
	})
	return m
}

// tableLeftovers describes every key and session left in m's lock tables.
func tableLeftovers(m *Manager) []string {
	var out []string
	for _, d := range m.databases() {
		d.mu.Lock()
		for k, ks := range d.table {
			out = append(out, fmt.Sprintf("%s: key %s: %d holders, %d waiters, pg %v, busy %v", d.name, k, len(ks.holders), len(ks.waiters), ks.pg, ks.busy))
		}
		for s := range d.sessions {
			out = append(out, fmt.Sprintf("%s: %v still recorded", d.name, s))
		}
		d.mu.Unlock()
	}
	return out
}

// direct is a superuser session on appdb, not through the manager (this
// package cannot use internal/testenv: testenv imports the proxy, which
// imports this package).
func direct(t *testing.T) *pgx.Conn {
	t.Helper()
	c := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.SuperuserDSN(appDB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// eventually polls cond every 10ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

func directTry(t *testing.T, c *pgx.Conn, k Key, mode Mode) bool {
	t.Helper()
	fn := "pg_try_advisory_lock"
	if mode == Shared {
		fn = "pg_try_advisory_lock_shared"
	}
	var ok bool
	if err := c.QueryRow(context.Background(), pgSQL(fn, k)).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func directUnlockAll(t *testing.T, c *pgx.Conn) {
	t.Helper()
	if _, err := c.Exec(context.Background(), "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
}

// lockRows counts pg_locks rows of lockpool's lock connections for k.
func lockRows(t *testing.T, k Key) int {
	t.Helper()
	cls, obj, sub := k.ClassObj()
	var n int
	err := direct(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 AND l.objsubid = $3
		AND a.application_name = $4`, cls, obj, sub, ApplicationName).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waiters counts the sessions of m's snapshot that wait as match says.
func waiters(m *Manager, match func(*Waiting) bool) int {
	n := 0
	for _, c := range m.Snapshot() {
		if c.Waiting != nil && match(c.Waiting) {
			n++
		}
	}
	return n
}

func mustLock(t *testing.T, s *Session, k Key, mode Mode, try bool) bool {
	t.Helper()
	ok, err := s.Lock(context.Background(), k, mode, try, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func code(err error) string {
	if pe, ok := pgerr.As(err); ok {
		return pe.Code
	}
	return ""
}

func TestConflictsAmongClients(t *testing.T) {
	m := newManager(t)
	tests := []struct {
		name         string
		key          Key
		first, other Mode
		want         bool // other's try succeeds
	}{
		{"exclusive then exclusive", OneKey(101), Exclusive, Exclusive, false},
		{"exclusive then shared", OneKey(102), Exclusive, Shared, false},
		{"shared then exclusive", OneKey(103), Shared, Exclusive, false},
		{"shared then shared", OneKey(104), Shared, Shared, true},
		{"two keys exclusive", TwoKeys(1, 105), Exclusive, Exclusive, false},
		{"two keys shared", TwoKeys(1, 106), Shared, Shared, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := m.NewSession(appDB, nil), m.NewSession(appDB, nil)
			defer a.Close()
			defer b.Close()
			if !mustLock(t, a, tt.key, tt.first, true) {
				t.Fatal("first try-lock failed")
			}
			if got := mustLock(t, b, tt.key, tt.other, true); got != tt.want {
				t.Fatalf("second session's try-lock = %v, want %v", got, tt.want)
			}
			// A session never conflicts with itself.
			if !mustLock(t, a, tt.key, tt.other, true) {
				t.Fatal("the holder's own second lock failed")
			}
			if got := lockRows(t, tt.key); got < 1 {
				t.Fatalf("pg_locks rows on the lock connection = %d, want at least 1", got)
			}
			a.Close()
			b.Close()
			eventually(t, time.Second, "locks released", func() bool { return lockRows(t, tt.key) == 0 })
		})
	}
}

func TestInteropWithDirectSession(t *testing.T) {
	m := newManager(t)
	d := direct(t)
	tests := []struct {
		name  string
		key   Key
		ours  Mode
		their Mode
		want  bool // compatible
	}{
		{"exclusive/exclusive", OneKey(201), Exclusive, Exclusive, false},
		{"shared/exclusive", OneKey(202), Shared, Exclusive, false},
		{"shared/shared", OneKey(203), Shared, Shared, true},
		{"two keys", TwoKeys(2, 204), Exclusive, Exclusive, false},
		{"negative bigint", OneKey(-5_000_000_000), Exclusive, Shared, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := m.NewSession(appDB, nil)
			defer s.Close()
			// Ours first: the direct session sees it.
			if !mustLock(t, s, tt.key, tt.ours, true) {
				t.Fatal("try-lock failed")
			}
			if got := directTry(t, d, tt.key, tt.their); got != tt.want {
				t.Fatalf("direct try-lock = %v, want %v", got, tt.want)
			}
			directUnlockAll(t, d)
			if ok, _, err := s.Unlock(tt.key, tt.ours); err != nil || !ok {
				t.Fatalf("unlock = %v, %v", ok, err)
			}
			// Theirs first: we see it.
			if !directTry(t, d, tt.key, tt.their) {
				t.Fatal("direct try-lock failed")
			}
			if got := mustLock(t, s, tt.key, tt.ours, true); got != tt.want {
				t.Fatalf("our try-lock = %v, want %v", got, tt.want)
			}
			if !tt.want {
				// A blocking lock waits for the direct session.
				done := make(chan error, 1)
				go func() {
					_, err := s.Lock(context.Background(), tt.key, tt.ours, false, Limits{})
					done <- err
				}()
				select {
				case err := <-done:
					t.Fatalf("blocking lock returned while the direct session holds the key: %v", err)
				case <-time.After(150 * time.Millisecond):
				}
				directUnlockAll(t, d)
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(2 * time.Second):
					t.Fatal("blocking lock not granted after the direct session unlocked")
				}
				if directTry(t, d, tt.key, tt.their) {
					t.Fatal("direct session got the key we hold")
				}
			}
			directUnlockAll(t, d)
		})
	}
}

func TestStackingAndUnlock(t *testing.T) {
	m := newManager(t)
	d := direct(t)
	s := m.NewSession(appDB, nil)
	defer s.Close()
	k := OneKey(301)
	for i := 0; i < 3; i++ {
		mustLock(t, s, k, Exclusive, false)
	}
	if got := s.Held(); got != 3 {
		t.Fatalf("Held = %d, want 3", got)
	}
	for i := 0; i < 3; i++ {
		if directTry(t, d, k, Exclusive) {
			t.Fatalf("after %d of 3 unlocks the direct session got the key", i)
		}
		ok, warn, err := s.Unlock(k, Exclusive)
		if err != nil || !ok || warn != nil {
			t.Fatalf("unlock %d = %v, %v, %v", i, ok, warn, err)
		}
	}
	if !directTry(t, d, k, Exclusive) {
		t.Fatal("the key is still held after the last unlock")
	}
	directUnlockAll(t, d)
	tests := []struct {
		mode Mode
		want string
	}{
		{Exclusive, "you don't own a lock of type ExclusiveLock"},
		{Shared, "you don't own a lock of type ShareLock"},
	}
	for _, tt := range tests {
		ok, warn, err := s.Unlock(k, tt.mode)
		if err != nil || ok {
			t.Fatalf("unlock of a key not held = %v, %v", ok, err)
		}
		if warn == nil || warn.Message != tt.want || warn.Code != pgerr.Warning || warn.Severity != pgerr.SeverityWarning {
			t.Fatalf("warning = %+v, want %q", warn, tt.want)
		}
	}
}

// TestExclusiveReleasedKeepsShared gives back the exclusive hold of a
// session that also holds the key shared: the lock connection must go on
// holding it shared, also when a direct session waits for the key
// exclusively (PostgreSQL refuses the try form of the shared lock then).
func TestExclusiveReleasedKeepsShared(t *testing.T) {
	var logged syncBuffer
	m := newManager(t, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	tests := []struct {
		name   string
		key    Key
		waiter bool // a direct session waits for the key exclusively
	}{
		{"no waiter", OneKey(302), false},
		{"direct waiter", OneKey(303), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, w := direct(t), direct(t)
			s := m.NewSession(appDB, nil)
			defer s.Close()
			k := tt.key
			mustLock(t, s, k, Exclusive, true)
			mustLock(t, s, k, Shared, true)
			var granted <-chan error
			if tt.waiter {
				granted = directWaiter(t, w, k)
			}
			mustUnlock(t, s, k, Exclusive)
			// PostgreSQL grants a waiter within the unlock that frees
			// the key, so pg_locks is up to date here.
			if got := lockModes(t, k); len(got) != 1 || got[0] != "ShareLock" {
				t.Fatalf("lock connection holds %v after the exclusive unlock, want [ShareLock]", got)
			}
			if tt.waiter {
				if !waiting(t, k, w.PgConn().PID()) {
					t.Fatal("the direct waiter got the key we still hold shared")
				}
				mustUnlock(t, s, k, Shared)
				mustBeGranted(t, granted, w)
				return
			}
			if directTry(t, d, k, Exclusive) {
				t.Fatal("direct exclusive got a key we hold shared")
			}
			if !directTry(t, d, k, Shared) {
				t.Fatal("direct shared refused while we hold only shared")
			}
			directUnlockAll(t, d)
		})
	}
	if logged.String() != "" {
		t.Errorf("the manager logged errors:\n%s", logged.String())
	}
}

// TestUpgradeAheadOfWaiter takes the exclusive lock of a key a session
// holds shared while a direct session waits for it exclusively. PostgreSQL
// puts the holder's blocking request ahead of the waiter (who waits for
// the holder anyway) and grants it unless another session holds the key;
// its try form is refused while anyone waits.
func TestUpgradeAheadOfWaiter(t *testing.T) {
	m := newManager(t)
	tests := []struct {
		name   string
		key    Key
		try    bool
		other  bool // another direct session holds the key shared
		wantOK bool
		code   string
	}{
		{"blocking", OneKey(320), false, false, true, ""},
		{"blocking, another holder", OneKey(321), false, true, false, "55P03"},
		{"try", OneKey(322), true, false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tt.key
			s := m.NewSession(appDB, nil)
			defer s.Close()
			mustLock(t, s, k, Shared, true)
			other, w := direct(t), direct(t)
			if tt.other && !directTry(t, other, k, Shared) {
				t.Fatal("direct shared refused")
			}
			granted := directWaiter(t, w, k)
			ok, err := s.Lock(context.Background(), k, Exclusive, tt.try, Limits{LockTimeout: 300 * time.Millisecond})
			if ok != tt.wantOK || code(err) != tt.code {
				t.Fatalf("Lock(exclusive) = %v, %v; want %v, %q", ok, err, tt.wantOK, tt.code)
			}
			want := []string{"ShareLock"}
			if ok {
				want = []string{"ExclusiveLock", "ShareLock"}
			}
			if got := lockModes(t, k); !slices.Equal(got, want) {
				t.Fatalf("lock connection holds %v, want %v", got, want)
			}
			if !waiting(t, k, w.PgConn().PID()) {
				t.Fatal("the direct waiter got the key")
			}
			directUnlockAll(t, other)
			if ok {
				mustUnlock(t, s, k, Exclusive)
			}
			mustUnlock(t, s, k, Shared)
			mustBeGranted(t, granted, w)
		})
	}
}

// TestNewSharedHolderQueuesBehindDirectWaiter: while lockpool holds a key
// shared and a direct session waits for it exclusively, a session that
// holds nothing of the key is refused (try) or queued behind the waiter
// (blocking), as PostgreSQL answers a new session; a session that holds it
// shared already stacks at once, as PostgreSQL grants a holder.
func TestNewSharedHolderQueuesBehindDirectWaiter(t *testing.T) {
	m := newManager(t)
	k := OneKey(330)
	a, b := m.NewSession(appDB, nil), m.NewSession(appDB, nil)
	defer a.Close()
	defer b.Close()
	d, w := direct(t), direct(t)
	if !mustLock(t, a, k, Shared, true) {
		t.Fatal("shared try refused on a free key")
	}
	granted := directWaiter(t, w, k)
	if directTry(t, d, k, Shared) {
		t.Fatal("PostgreSQL granted a new session's shared request ahead of the waiter")
	}
	if ok, err := b.Lock(context.Background(), k, Shared, true, Limits{}); ok || err != nil {
		t.Fatalf("a new holder's try = %v, %v; want false, as PostgreSQL's", ok, err)
	}
	if !mustLock(t, a, k, Shared, true) {
		t.Fatal("a holder's shared request refused (PostgreSQL grants it)")
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.Lock(context.Background(), k, Shared, false, Limits{})
		got <- err
	}()
	eventually(t, 5*time.Second, "b waits behind a remote session", func() bool {
		return waiters(m, func(w *Waiting) bool { return w.Behind == "remote" }) > 0
	})
	mustUnlock(t, a, k, Shared)
	mustUnlock(t, a, k, Shared)
	select {
	case err := <-granted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the direct waiter was not granted the key after a's last unlock")
	}
	select {
	case err := <-got:
		t.Fatalf("b was granted while the direct session holds the key exclusively (%v)", err)
	default:
	}
	directUnlockAll(t, w)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b was not granted after the direct session let the key go")
	}
	if got := lockModes(t, k); !slices.Equal(got, []string{"ShareLock"}) {
		t.Fatalf("lock connection holds %v, want [ShareLock]", got)
	}
}

// directWaiter starts a blocking pg_advisory_lock(k) on the direct session
// w and returns once PostgreSQL shows it waiting; the channel gets its end.
func directWaiter(t *testing.T, w *pgx.Conn, k Key) <-chan error {
	t.Helper()
	granted := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done }) // before w is closed: a failed test leaves no call running on it
	go func() {
		defer close(done)
		_, err := w.Exec(ctx, pgSQL("pg_advisory_lock", k))
		granted <- err
	}()
	eventually(t, 5*time.Second, "direct session waiting", func() bool { return waiting(t, k, w.PgConn().PID()) })
	return granted
}

// mustBeGranted requires the directWaiter's lock within 5 s, then
// releases it.
func mustBeGranted(t *testing.T, granted <-chan error, w *pgx.Conn) {
	t.Helper()
	select {
	case err := <-granted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the direct waiter was not granted the key after our last unlock")
	}
	directUnlockAll(t, w)
}

// mustUnlock gives back one hold of k in mode, which s must have.
func mustUnlock(t *testing.T, s *Session, k Key, mode Mode) {
	t.Helper()
	if ok, _, err := s.Unlock(k, mode); !ok || err != nil {
		t.Fatalf("unlock %v = %v, %v", mode, ok, err)
	}
}

// waiting reports whether backend pid waits for k (a pg_locks row not granted).
func waiting(t *testing.T, k Key, pid uint32) bool {
	t.Helper()
	cls, obj, sub := k.ClassObj()
	var n int
	err := direct(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND classid = $1 AND objid = $2 AND objsubid = $3 AND pid = $4`,
		cls, obj, sub, int32(pid)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// lockModes lists the modes lockpool's lock connections hold k in.
func lockModes(t *testing.T, k Key) []string {
	t.Helper()
	cls, obj, sub := k.ClassObj()
	rows, err := direct(t).Query(context.Background(), `SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 AND l.objsubid = $3
		AND a.application_name = $4 ORDER BY 1`, cls, obj, sub, ApplicationName)
	if err != nil {
		t.Fatal(err)
	}
	modes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return modes
}

// syncBuffer is a bytes.Buffer for a logger written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestUnlockAll(t *testing.T) {
	m := newManager(t)
	s := m.NewSession(appDB, nil)
	defer s.Close()
	keys := []Key{OneKey(401), OneKey(402), TwoKeys(4, 403)}
	for _, k := range keys {
		mustLock(t, s, k, Exclusive, false)
		mustLock(t, s, k, Shared, false)
	}
	if err := s.UnlockAll(); err != nil {
		t.Fatal(err)
	}
	if s.Held() != 0 {
		t.Fatalf("Held = %d after unlock_all", s.Held())
	}
	for _, k := range keys {
		if n := lockRows(t, k); n != 0 {
			t.Fatalf("key %s still has %d pg_locks rows", k, n)
		}
	}
}

func TestWaitBehindLocalHolder(t *testing.T) {
	m := newManager(t)
	a, b := m.NewSession(appDB, nil), m.NewSession(appDB, nil)
	defer a.Close()
	defer b.Close()
	k := OneKey(501)
	mustLock(t, a, k, Exclusive, false)
	got := make(chan error, 1)
	go func() {
		_, err := b.Lock(context.Background(), k, Exclusive, false, Limits{})
		got <- err
	}()
	eventually(t, time.Second, "b waits", func() bool {
		return waiters(m, func(w *Waiting) bool { return w.Behind == "local" }) > 0
	})
	select {
	case err := <-got:
		t.Fatalf("b got the lock a holds: %v", err)
	default:
	}
	if ok, _, _ := a.Unlock(k, Exclusive); !ok {
		t.Fatal("unlock failed")
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("b not granted")
	}
	if b.Held() != 1 || lockRows(t, k) != 1 {
		t.Fatalf("b holds %d, pg_locks rows %d; want 1, 1", b.Held(), lockRows(t, k))
	}
}

func TestWaitEnds(t *testing.T) {
	m := newManager(t)
	d := direct(t)
	tests := []struct {
		name   string
		remote bool
		lim    Limits
		cancel time.Duration
		want   string
		msg    string
	}{
		{"lock_timeout behind local", false, Limits{LockTimeout: 100 * time.Millisecond}, 0, "55P03", "canceling statement due to lock timeout"},
		{"lock_timeout behind remote", true, Limits{LockTimeout: 100 * time.Millisecond}, 0, "55P03", "canceling statement due to lock timeout"},
		{"statement_timeout", true, Limits{StatementTimeout: 100 * time.Millisecond, LockTimeout: time.Second}, 0, "57014", "canceling statement due to statement timeout"},
		{"cancel", false, Limits{}, 100 * time.Millisecond, "57014", "canceling statement due to user request"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := OneKey(int64(600 + i))
			holder := m.NewSession(appDB, nil)
			defer holder.Close()
			if tt.remote {
				directTry(t, d, k, Exclusive)
				defer directUnlockAll(t, d)
			} else {
				mustLock(t, holder, k, Exclusive, false)
			}
			s := m.NewSession(appDB, nil)
			defer s.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel > 0 {
				time.AfterFunc(tt.cancel, cancel)
			}
			start := time.Now()
			ok, err := s.Lock(ctx, k, Exclusive, false, tt.lim)
			took := time.Since(start)
			pe, isPG := pgerr.As(err)
			if ok || !isPG || pe.Code != tt.want || pe.Message != tt.msg {
				t.Fatalf("Lock = %v, %v; want %s %q", ok, err, tt.want, tt.msg)
			}
			if took < 90*time.Millisecond || took > time.Second {
				t.Fatalf("wait took %v, want about 100ms", took)
			}
			if s.Held() != 0 {
				t.Fatalf("Held = %d after a failed wait", s.Held())
			}
			for _, c := range m.Snapshot() {
				if c.Waiting != nil {
					t.Fatalf("a waiter is left: %+v", c)
				}
			}
		})
	}
}

// TestUpgradeDeadlockAmongClients: two sessions hold a key shared and the
// first waits for it exclusively; the second's exclusive request closes a
// cycle PostgreSQL reports at once to the later request, not after
// deadlock_timeout to the earlier wait.
func TestUpgradeDeadlockAmongClients(t *testing.T) {
	m := newManager(t)
	a, b := m.NewSession(appDB, nil), m.NewSession(appDB, nil)
	defer a.Close()
	defer b.Close()
	k := OneKey(703)
	mustLock(t, a, k, Shared, false)
	mustLock(t, b, k, Shared, false)
	lim := Limits{DeadlockTimeout: 10 * time.Second}
	got := make(chan error, 1)
	go func() {
		_, err := a.Lock(context.Background(), k, Exclusive, false, lim)
		got <- err
	}()
	eventually(t, time.Second, "a waits", func() bool {
		return waiters(m, func(w *Waiting) bool { return w.Mode == "exclusive" }) > 0
	})
	start := time.Now()
	ok, err := b.Lock(context.Background(), k, Exclusive, false, lim)
	if ok || code(err) != pgerr.DeadlockDetected {
		t.Fatalf("b's upgrade = %v, %v; want 40P01", ok, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("deadlock reported after %v, want at once (deadlock_timeout is 10s)", took)
	}
	if b.Held() != 1 {
		t.Fatalf("b holds %d after the refused upgrade, want its shared hold", b.Held())
	}
	if ok, _, err := b.Unlock(k, Shared); !ok || err != nil {
		t.Fatalf("b's unlock = %v, %v", ok, err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("a's upgrade = %v, want the lock", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a's upgrade not granted after b gave its shared hold back")
	}
}

func TestDeadlockAmongClients(t *testing.T) {
	m := newManager(t)
	sessions := []*Session{m.NewSession(appDB, nil), m.NewSession(appDB, nil)}
	keys := []Key{OneKey(701), OneKey(702)}
	for i, s := range sessions {
		defer s.Close()
		mustLock(t, s, keys[i], Exclusive, false)
	}
	type result struct {
		who int
		err error
	}
	results := make(chan result, 2)
	start := time.Now()
	for i, s := range sessions {
		go func() {
			_, err := s.Lock(context.Background(), keys[1-i], Exclusive, false, Limits{DeadlockTimeout: 200 * time.Millisecond})
			results <- result{i, err}
		}()
	}
	// One wait is chosen as the victim, as in PostgreSQL: the one whose
	// deadlock_timeout runs out first (not before it).
	first := <-results
	if code(first.err) != pgerr.DeadlockDetected {
		t.Fatalf("first result = %v, want 40P01", first.err)
	}
	if took := time.Since(start); took < 190*time.Millisecond || took > 2*time.Second {
		t.Fatalf("deadlock reported after %v, want after deadlock_timeout (200ms)", took)
	}
	if err := sessions[first.who].UnlockAll(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-results:
		if r.err != nil {
			t.Fatalf("the other wait = %v, want the lock", r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the other wait not granted after the victim gave up")
	}
}

func TestBlockedKeyLetsOthersMove(t *testing.T) {
	m := newManager(t, func(o *Options) { o.MaxConnections = 1 })
	d := direct(t)
	blocked := OneKey(801)
	directTry(t, d, blocked, Exclusive)
	defer directUnlockAll(t, d)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	for i := 0; i < 4; i++ {
		s := m.NewSession(appDB, nil)
		defer s.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = s.Lock(ctx, blocked, Exclusive, false, Limits{})
		}()
	}
	s := m.NewSession(appDB, nil)
	defer s.Close()
	start := time.Now()
	for i := 0; i < 50; i++ {
		k := OneKey(int64(810 + i))
		mustLock(t, s, k, Exclusive, false)
		if ok, _, err := s.Unlock(k, Exclusive); !ok || err != nil {
			t.Fatalf("unlock %v %v", ok, err)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("50 lock/unlock pairs took %v while 4 waits were blocked", took)
	}
	cancel()
	wg.Wait()
}

func TestConnectionLost(t *testing.T) {
	m := newManager(t)
	d := direct(t)
	told := make(chan struct{}, 2)
	a := m.NewSession(appDB, func() { told <- struct{}{} })
	defer a.Close()
	k := OneKey(901)
	mustLock(t, a, k, Exclusive, false)
	var pid int
	if err := d.QueryRow(context.Background(), `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.objid = 901 AND a.application_name = $1`, ApplicationName).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var held HeldLock
	for _, c := range m.Snapshot() {
		held = c.Held[0]
	}
	if held.PID != uint32(pid) || held.Count != 1 || held.Mode != "exclusive" {
		t.Fatalf("snapshot = %+v, want pid %d", held, pid)
	}
	start := time.Now()
	if _, err := d.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-told:
	case <-time.After(time.Second):
		t.Fatal("the holder was not told of the loss")
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("told after %v, want within 500ms", took)
	}
	if _, err := a.Lock(context.Background(), OneKey(902), Exclusive, true, Limits{}); code(err) != pgerr.AdminShutdown {
		t.Fatalf("next call = %v, want 57P01 (locks lost)", err)
	}
	// Others go on with a new lock connection.
	b := m.NewSession(appDB, nil)
	defer b.Close()
	if !mustLock(t, b, k, Exclusive, true) {
		t.Fatal("the key is not free after its connection died")
	}
}

// TestConnectionClosedBeforeReported lets a lock connection die under an
// operation that has not reported the loss yet (pgx has closed it), and has
// another session use the same connection slot first: the slot's next
// connection must not be dialled before the dead one's holders are told and
// its locks forgotten, or a shared request would be granted from the table
// with nothing in PostgreSQL.
func TestConnectionClosedBeforeReported(t *testing.T) {
	m := newManager(t, func(o *Options) { o.WatchInterval = time.Hour }) // no watch: the redial must notice
	told := make(chan struct{}, 1)
	a := m.NewSession(appDB, func() { told <- struct{}{} })
	defer a.Close()
	k := OneKey(340)
	mustLock(t, a, k, Shared, true)
	d, err := m.db(appDB)
	if err != nil {
		t.Fatal(err)
	}
	lc := d.conns[d.home(k)]
	other := OneKey(341)
	for d.home(other) != d.home(k) {
		other.A++
	}
	lc.mu.Lock()
	_ = lc.c.PgConn().Close(context.Background()) // PostgreSQL releases the lock
	lc.mu.Unlock()
	b := m.NewSession(appDB, nil)
	defer b.Close()
	if !mustLock(t, b, other, Exclusive, true) {
		t.Fatal("a free key refused on the slot's next connection")
	}
	select {
	case <-told:
	case <-time.After(2 * time.Second):
		t.Fatal("the holder of a lock on the dead connection was not told")
	}
	if !mustLock(t, b, k, Shared, true) {
		t.Fatal("shared lock refused")
	}
	if got := lockModes(t, k); !slices.Equal(got, []string{"ShareLock"}) {
		t.Fatalf("after a grant of %v, the lock connections hold %v, want [ShareLock]", k, got)
	}
}

// TestReleaseWhenNoServerAnswers: a release meets a dead lock connection
// and no new one can be dialled (the primary is stopping: a switchover, a
// failover). PostgreSQL released the lock with the connection, so the
// table must not keep a record of it: the next grant of the key is taken
// in PostgreSQL, where another session may hold it meanwhile, not from the
// stale record.
func TestReleaseWhenNoServerAnswers(t *testing.T) {
	var refuse atomic.Bool
	m := newManager(t, func(o *Options) {
		o.WatchInterval = time.Hour // the release meets the dead connection
		base := o.ConnConfig
		o.ConnConfig = func(db string) (*pgx.ConnConfig, error) {
			cfg, err := base(db)
			if err == nil && refuse.Load() {
				cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) {
					return nil, errors.New("connection refused: the primary is stopping")
				}
			}
			return cfg, err
		}
	})
	a := m.NewSession(appDB, nil)
	defer a.Close()
	k := OneKey(360)
	mustLock(t, a, k, Exclusive, true)
	d, err := m.db(appDB)
	if err != nil {
		t.Fatal(err)
	}
	lc := d.conns[d.home(k)]
	lc.mu.Lock()
	_ = lc.c.PgConn().Close(context.Background()) // PostgreSQL releases the lock
	lc.mu.Unlock()
	refuse.Store(true)
	ok, _, err := a.Unlock(k, Exclusive)
	if !ok || err != nil {
		t.Fatalf("Unlock = %v, %v; want true (the session held the key)", ok, err)
	}
	refuse.Store(false)
	other := direct(t)
	if !directTry(t, other, k, Exclusive) {
		t.Fatal("a direct session cannot take the key: PostgreSQL still holds it")
	}
	b := m.NewSession(appDB, nil)
	defer b.Close()
	if mustLock(t, b, k, Exclusive, true) {
		t.Fatal("the key was granted while a direct session holds it (from a stale record of the dead connection's lock)")
	}
	directUnlockAll(t, other)
}

// TestLockAfterConnectionDied: a lock call whose lock connection's backend
// was terminated while it held nothing is carried out on a new connection;
// the session, which held nothing there, is not told it lost anything (a
// client holding nothing on a dead lock connection is not disconnected).
func TestLockAfterConnectionDied(t *testing.T) {
	m := newManager(t, func(o *Options) { o.WatchInterval = time.Hour }) // no watch: the call meets the dead connection
	tests := []struct {
		name string
		key  Key
		mode Mode
		try  bool
	}{
		{"try exclusive", OneKey(350), Exclusive, true},
		{"blocking exclusive", OneKey(351), Exclusive, false},
		{"try shared", OneKey(352), Shared, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			told := make(chan struct{}, 1)
			s := m.NewSession(appDB, func() { told <- struct{}{} })
			defer s.Close()
			if !mustLock(t, s, tt.key, tt.mode, true) {
				t.Fatal("a free key refused")
			}
			mustUnlock(t, s, tt.key, tt.mode)
			var n int
			if err := direct(t).QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid, 5000))
				FROM pg_stat_activity WHERE application_name = $1`, ApplicationName).Scan(&n); err != nil || n == 0 {
				t.Fatalf("terminated %d lock connections: %v", n, err)
			}
			ok, err := s.Lock(context.Background(), tt.key, tt.mode, tt.try, Limits{})
			if !ok || err != nil {
				t.Fatalf("Lock after the connection died = %v, %v; want true", ok, err)
			}
			if s.Lost() {
				t.Fatal("the session is marked lost")
			}
			select {
			case <-told:
				t.Fatal("the session was told it lost its locks; it held none")
			default:
			}
			if got := lockModes(t, tt.key); !slices.Equal(got, []string{tt.mode.lockName()}) {
				t.Fatalf("lock connections hold %v, want [%s]", got, tt.mode.lockName())
			}
		})
	}
}

// TestTryIgnoresLockTimeout: a try that finds lockpool's own work in
// progress on its key (another call's statement, here one that takes
// longer than the try's lock_timeout) waits for it and answers; it never
// ends with 55P03, as PostgreSQL's try never waits for a lock.
func TestTryIgnoresLockTimeout(t *testing.T) {
	m := newManager(t)
	s := m.NewSession(appDB, nil)
	defer s.Close()
	k := OneKey(360)
	d, err := m.db(appDB)
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	ks := d.keyLocked(k)
	ks.busy = true // a statement of another call on the key is in flight
	d.mu.Unlock()
	type result struct {
		ok  bool
		err error
	}
	got := make(chan result, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		ok, err := s.Lock(context.Background(), k, Exclusive, true, Limits{LockTimeout: 20 * time.Millisecond})
		got <- result{ok, err}
	}()
	<-started
	time.Sleep(100 * time.Millisecond) // the other statement's duration: five times the try's lock_timeout, from the try's start
	d.mu.Lock()
	ks.busy = false
	ks.broadcast()
	d.mu.Unlock()
	select {
	case r := <-got:
		if !r.ok || r.err != nil {
			t.Fatalf("try = %v, %v; want true once the other statement ended", r.ok, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the try did not answer")
	}
}

func TestCloseReleases(t *testing.T) {
	m := newManager(t)
	s := m.NewSession(appDB, nil)
	k := OneKey(1001)
	mustLock(t, s, k, Exclusive, false)
	mustLock(t, s, k, Exclusive, false)
	s.Close()
	if n := lockRows(t, k); n != 0 {
		t.Fatalf("pg_locks rows after Close = %d", n)
	}
	if len(m.Snapshot()) != 0 {
		t.Fatalf("snapshot after Close = %+v", m.Snapshot())
	}
}

func TestEvalKeys(t *testing.T) {
	m := newManager(t)
	s := m.NewSession(appDB, nil)
	defer s.Close()
	var want int64
	if err := direct(t).QueryRow(context.Background(), "SELECT hashtext('job-a')::int8").Scan(&want); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		exprs []string
		p     Params
		want  Key
		null  bool
		code  string
	}{
		{"literal", []string{"42"}, Params{}, OneKey(42), false, ""},
		{"hashtext param", []string{"hashtext($1)"}, Params{Values: [][]byte{[]byte("job-a")}, OIDs: []uint32{25}}, OneKey(want), false, ""},
		{"untyped param", []string{"$1"}, Params{Values: [][]byte{[]byte("-7")}, OIDs: []uint32{0}}, OneKey(-7), false, ""},
		{"two keys", []string{"1", "$1"}, Params{Values: [][]byte{[]byte("9")}, OIDs: []uint32{0}}, TwoKeys(1, 9), false, ""},
		{"null", []string{"NULL"}, Params{}, Key{}, true, ""},
		{"bad expression", []string{"no_such_column"}, Params{}, Key{}, false, "42703"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, null, err := s.EvalKeys(context.Background(), tt.exprs, tt.p)
			if code(err) != tt.code || (tt.code == "" && err != nil) {
				t.Fatalf("EvalKeys = %v, want code %q", err, tt.code)
			}
			if k != tt.want || null != tt.null {
				t.Fatalf("EvalKeys = %v null %v, want %v null %v", k, null, tt.want, tt.null)
			}
		})
	}
}

func TestLiteralKey(t *testing.T) {
	tests := []struct {
		exprs []string
		want  Key
		ok    bool
	}{
		{[]string{"42"}, OneKey(42), true},
		{[]string{"-9223372036854775808"}, OneKey(-9223372036854775808), true},
		{[]string{" - 3"}, OneKey(-3), true},
		{[]string{"1", "2"}, TwoKeys(1, 2), true},
		{[]string{"1", "3000000000"}, Key{}, false},
		{[]string{"9223372036854775808"}, Key{}, false},
		{[]string{"1.5"}, Key{}, false},
		{[]string{"$1"}, Key{}, false},
		{[]string{"'1'"}, Key{}, false},
		{[]string{""}, Key{}, false},
	}
	for _, tt := range tests {
		k, ok := LiteralKey(tt.exprs)
		if k != tt.want || ok != tt.ok {
			t.Errorf("LiteralKey(%q) = %v, %v; want %v, %v", tt.exprs, k, ok, tt.want, tt.ok)
		}
	}
}

func TestClosedManager(t *testing.T) {
	m := newManager(t)
	m.Close()
	s := m.NewSession(appDB, nil)
	_, err := s.Lock(context.Background(), OneKey(1), Exclusive, true, Limits{})
	if code(err) != pgerr.AdminShutdown {
		t.Fatalf("Lock on a closed manager = %v", err)
	}
}

func TestMaxWaitersQueue(t *testing.T) {
	m := newManager(t, func(o *Options) { o.MaxWaiters = 1 })
	d := direct(t)
	keys := []Key{OneKey(1101), OneKey(1102), OneKey(1103)}
	for _, k := range keys {
		directTry(t, d, k, Exclusive)
	}
	errs := make(chan error, len(keys))
	for _, k := range keys {
		s := m.NewSession(appDB, nil)
		defer s.Close()
		go func() {
			_, err := s.Lock(context.Background(), k, Exclusive, false, Limits{})
			errs <- err
		}()
	}
	eventually(t, time.Second, "three waiters", func() bool {
		return waiters(m, func(*Waiting) bool { return true }) == 3
	})
	directUnlockAll(t, d)
	for range keys {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("a waiter beyond max_waiters was not granted")
		}
	}
	for _, k := range keys {
		if n := lockRows(t, k); n != 1 {
			t.Fatalf("key %s: %d pg_locks rows, want 1", k, n)
		}
	}
}

// TestKeyExpressionsIsolated: a key expression runs where no client's lock
// lives, and what it does to advisory locks does not stay.
func TestKeyExpressionsIsolated(t *testing.T) {
	m := newManager(t)
	s := m.NewSession(appDB, nil)
	defer s.Close()
	held := OneKey(1201)
	mustLock(t, s, held, Exclusive, false)
	tests := []struct {
		name string
		expr string
		want int64
	}{
		{"unlock_all inside", "(SELECT 6 FROM (SELECT pg_advisory_unlock_all()) x)", 6},
		{"a lock inside", "(SELECT 7 FROM (SELECT pg_advisory_lock(1202)) x)", 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, _, err := s.EvalKeys(context.Background(), []string{tt.expr}, Params{})
			if err != nil || k != OneKey(tt.want) {
				t.Fatalf("EvalKeys = %v, %v; want %d", k, err, tt.want)
			}
			if n := lockRows(t, held); n != 1 {
				t.Fatalf("the held key has %d pg_locks rows after the expression, want 1", n)
			}
			if n := lockRows(t, OneKey(1202)); n != 0 {
				t.Fatalf("the expression's own lock stayed (%d rows)", n)
			}
		})
	}
}

func TestParamKey(t *testing.T) {
	bin8 := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}
	tests := []struct {
		name  string
		exprs []string
		p     Params
		want  Key
		ok    bool
	}{
		{"int8 text", []string{"$1"}, Params{Values: [][]byte{[]byte("42")}, OIDs: []uint32{20}}, OneKey(42), true},
		{"int8 binary", []string{"$1"}, Params{Values: [][]byte{bin8}, OIDs: []uint32{20}, Formats: []int16{1}}, OneKey(-2), true},
		{"int4 for one key", []string{"$1"}, Params{Values: [][]byte{{0, 0, 0, 9}}, OIDs: []uint32{23}, Formats: []int16{1}}, OneKey(9), true},
		{"two int4", []string{"$2", "$1"}, Params{Values: [][]byte{[]byte("1"), []byte("-3")}, OIDs: []uint32{23, 23}}, TwoKeys(-3, 1), true},
		{"int8 for two keys", []string{"$1", "$1"}, Params{Values: [][]byte{[]byte("1")}, OIDs: []uint32{20}}, Key{}, false},
		{"text type", []string{"$1"}, Params{Values: [][]byte{[]byte("1")}, OIDs: []uint32{25}}, Key{}, false},
		{"NULL", []string{"$1"}, Params{Values: [][]byte{nil}, OIDs: []uint32{20}}, Key{}, false},
		{"spaces for PostgreSQL", []string{"$1"}, Params{Values: [][]byte{[]byte(" 1")}, OIDs: []uint32{20}}, Key{}, false},
		{"expression", []string{"$1 + 1"}, Params{Values: [][]byte{[]byte("1")}, OIDs: []uint32{20}}, Key{}, false},
		{"missing parameter", []string{"$2"}, Params{Values: [][]byte{[]byte("1")}, OIDs: []uint32{20}}, Key{}, false},
		{"short binary", []string{"$1"}, Params{Values: [][]byte{{1}}, OIDs: []uint32{20}, Formats: []int16{1}}, Key{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, ok := ParamKey(tt.exprs, tt.p)
			if k != tt.want || ok != tt.ok {
				t.Fatalf("ParamKey = %v, %v; want %v, %v", k, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestRandomizedTable runs lockpool sessions and two direct sessions
// against a few keys at once — try and blocking locks in both modes,
// stacking, unlocks of held and unheld keys, unlock_all, lock_timeout,
// cancels, deadlocks among the sessions, sessions closed and opened — and
// checks with an oracle: no two holders (lockpool's or direct) ever hold a
// key in conflicting modes, every unlock's answer is what the session's
// own record of its holds says, and after the run nothing is left in
// PostgreSQL or in the lock table (newManager's cleanup).
// LOCKPOOL_TABLE_SEED replays a run.
func TestRandomizedTable(t *testing.T) {
	seed := time.Now().UnixNano()
	if v := os.Getenv("LOCKPOOL_TABLE_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (LOCKPOOL_TABLE_SEED)", seed)
	m := newManager(t)
	const (
		sessions = 6
		keyBase  = 940
		keyN     = 4
		run      = 2 * time.Second
	)
	o := &tableOracle{held: map[Key]map[string][2]int{}}
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	var ops, errs sync.Map // op name -> *atomic.Int64
	count := func(mp *sync.Map, name string) {
		v, _ := mp.LoadOrStore(name, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	for i := 0; i < sessions; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(id)))
			name := fmt.Sprintf("session %d", id)
			s := m.NewSession(appDB, nil)
			mine := map[Key][2]int{}
			defer func() { o.forgetAll(name, mine); s.Close() }()
			for time.Now().Before(stop) && !t.Failed() {
				k := OneKey(int64(keyBase + rng.Intn(keyN)))
				mode := Mode(rng.Intn(2))
				switch r := rng.Intn(20); {
				case r < 8: // lock
					try := rng.Intn(2) == 0
					ctx, cancel := context.WithCancel(context.Background())
					if rng.Intn(5) == 0 {
						time.AfterFunc(time.Duration(rng.Intn(30))*time.Millisecond, cancel)
					}
					lim := Limits{LockTimeout: time.Duration(10+rng.Intn(60)) * time.Millisecond, DeadlockTimeout: 20 * time.Millisecond}
					ok, err := s.Lock(ctx, k, mode, try, lim)
					cancel()
					o.note("%s lock %s %v try %v = %v %v", name, k, mode, try, ok, err)
					switch {
					case err != nil:
						if c := code(err); c != pgerr.LockNotAvailable && c != pgerr.QueryCanceled && c != pgerr.DeadlockDetected {
							t.Errorf("%s: Lock(%v, %v, try %v): %v", name, k, mode, try, err)
						}
						count(&errs, code(err))
					case ok:
						h := mine[k]
						h[mode]++
						mine[k] = h
						o.add(t, name, k, mode)
						count(&ops, fmt.Sprintf("lock %v try %v", mode, try))
					case !try:
						t.Errorf("%s: blocking Lock(%v, %v) = false with no error", name, k, mode)
					}
				case r < 15: // unlock, mostly of a key held
					if rng.Intn(4) != 0 {
						k, mode = pickHeld(rng, mine, k, mode)
					}
					h := mine[k]
					if h[mode] > 0 {
						o.remove(name, k, mode) // before PostgreSQL can give the key to anyone else
					}
					ok, _, err := s.Unlock(k, mode)
					o.note("%s unlock %s %v = %v %v", name, k, mode, ok, err)
					if err != nil {
						t.Errorf("%s: Unlock(%v, %v): %v", name, k, mode, err)
						continue
					}
					if ok != (h[mode] > 0) {
						t.Errorf("%s: Unlock(%v, %v) = %v, but it holds it %d times", name, k, mode, ok, h[mode])
					}
					if ok {
						h[mode]--
						mine[k] = h
					}
					count(&ops, fmt.Sprintf("unlock %v = %v", mode, ok))
				case r < 17:
					o.forgetAll(name, mine)
					o.note("%s unlock_all %v", name, mine)
					if err := s.UnlockAll(); err != nil {
						t.Errorf("%s: UnlockAll: %v", name, err)
					}
					mine = map[Key][2]int{}
					count(&ops, "unlock_all")
				case r < 18:
					o.forgetAll(name, mine)
					o.note("%s close %v", name, mine)
					s.Close()
					s, mine = m.NewSession(appDB, nil), map[Key][2]int{}
					count(&ops, "close")
				default:
					time.Sleep(time.Duration(rng.Intn(5)) * time.Millisecond)
				}
			}
		}(i)
	}
	for i := 0; i < 2; i++ {
		wg.Add(1)
		c := direct(t)
		go func(id int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed - int64(id) - 1))
			name := fmt.Sprintf("direct %d", id)
			mine := map[Key][2]int{}
			var trail []string
			ctx := context.Background()
			defer func() {
				o.forgetAll(name, mine)
				_, _ = c.Exec(ctx, "SELECT pg_advisory_unlock_all()")
			}()
			if _, err := c.Exec(ctx, "SET lock_timeout = 40"); err != nil {
				t.Error(err)
				return
			}
			for time.Now().Before(stop) && !t.Failed() {
				k := OneKey(int64(keyBase + rng.Intn(keyN)))
				mode := Mode(rng.Intn(2))
				r := rng.Intn(10)
				if r >= 4 {
					k, mode = pickHeld(rng, mine, k, mode)
				}
				suffix := ""
				if mode == Shared {
					suffix = "_shared"
				}
				h := mine[k]
				trail = append(trail, fmt.Sprintf("%d:%v:%v", r, k, mode))
				switch {
				case r < 2: // try
					var ok bool
					if err := c.QueryRow(ctx, pgSQL("pg_try_advisory_lock"+suffix, k)).Scan(&ok); err != nil {
						t.Errorf("%s: %v", name, err)
						return
					}
					if ok {
						if !directHolds(t, c, k, mode) {
							t.Errorf("%s: try %v %v true but pg_locks disagrees", name, k, mode)
						}
						h[mode]++
						mine[k] = h
						o.add(t, name, k, mode)
					}
				case r < 4: // blocking, bounded by lock_timeout
					_, err := c.Exec(ctx, pgSQL("pg_advisory_lock"+suffix, k))
					var pe *pgconn.PgError
					if err != nil && (!errors.As(err, &pe) || pe.Code != pgerr.LockNotAvailable && pe.Code != pgerr.DeadlockDetected) {
						t.Errorf("%s: %v", name, err)
						return
					}
					if err != nil && !directHolds(t, c, k, mode) {
						continue // timed out or a deadlock victim (PostgreSQL may grant it as the timeout fires: asked)
					}
					h[mode]++
					mine[k] = h
					o.add(t, name, k, mode)
				default:
					if h[mode] == 0 {
						continue
					}
					o.remove(name, k, mode)
					var ok bool
					if err := c.QueryRow(ctx, pgSQL("pg_advisory_unlock"+suffix, k)).Scan(&ok); err != nil || !ok {
						t.Errorf("%s: unlock of a held key (%v %v) = %v, %v; holds %v; last operations (r:key:mode) %v", name, k, mode, ok, err, mine, trail)
						return
					}
					h[mode]--
					mine[k] = h
				}
			}
		}(i)
	}
	wg.Wait()
	for i := 0; i < keyN; i++ {
		if got := lockModes(t, OneKey(int64(keyBase+i))); len(got) > 0 {
			t.Errorf("key %d: lock connections still hold %v after every session closed", keyBase+i, got)
		}
	}
	var summary []string
	for _, mp := range []*sync.Map{&ops, &errs} {
		mp.Range(func(k, v any) bool {
			summary = append(summary, fmt.Sprintf("%v=%d", k, v.(*atomic.Int64).Load()))
			return true
		})
	}
	slices.Sort(summary)
	t.Logf("%s", strings.Join(summary, " "))
}

// tableOracle is what every holder of TestRandomizedTable believes it
// holds. A holder adds a hold after its call returned and removes it
// before its unlock runs, so a conflict between two entries is a conflict
// in PostgreSQL or in lockpool's table.
type tableOracle struct {
	mu   sync.Mutex
	held map[Key]map[string][2]int
	log  []string // the last operations, for a violation's report
}

// note records an operation's outcome.
func (o *tableOracle) note(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = append(o.log, time.Now().Format("05.000000")+" "+fmt.Sprintf(format, args...))
	if len(o.log) > 400 {
		o.log = o.log[200:]
	}
}

func (o *tableOracle) add(t *testing.T, who string, k Key, mode Mode) {
	o.mu.Lock()
	defer o.mu.Unlock()
	hs := o.held[k]
	if hs == nil {
		hs = map[string][2]int{}
		o.held[k] = hs
	}
	for other, h := range hs {
		if other != who && (h[Exclusive] > 0 || mode == Exclusive && h[Shared] > 0) {
			var last []string
			for _, l := range o.log {
				if strings.Contains(l, " "+k.String()+" ") || strings.Contains(l, k.String()+":") { // an operation, or a map of holds
					last = append(last, l)
				}
			}
			if len(last) > 60 {
				last = last[len(last)-60:]
			}
			t.Errorf("%s got %v %v while %s holds it (exclusive %d, shared %d); the key's last operations:\n%s", who, k, mode, other, h[Exclusive], h[Shared], strings.Join(last, "\n"))
		}
	}
	h := hs[who]
	h[mode]++
	hs[who] = h
}

func (o *tableOracle) remove(who string, k Key, mode Mode) {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := o.held[k][who]
	h[mode]--
	o.held[k][who] = h
}

func (o *tableOracle) forgetAll(who string, mine map[Key][2]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range mine {
		delete(o.held[k], who)
	}
}

// pickHeld returns one of the holds in mine at random, or k and mode when
// there is none.
func pickHeld(rng *rand.Rand, mine map[Key][2]int, k Key, mode Mode) (Key, Mode) {
	type hold struct {
		k Key
		m Mode
	}
	var hs []hold
	for hk, h := range mine {
		for m := Exclusive; m <= Shared; m++ {
			if h[m] > 0 {
				hs = append(hs, hold{hk, m})
			}
		}
	}
	if len(hs) == 0 {
		return k, mode
	}
	slices.SortFunc(hs, func(a, b hold) int { return cmp.Or(cmp.Compare(a.k.A, b.k.A), cmp.Compare(a.m, b.m)) })
	h := hs[rng.Intn(len(hs))]
	return h.k, h.m
}

// directHolds reports whether the direct session c holds k in mode.
func directHolds(t *testing.T, c *pgx.Conn, k Key, mode Mode) bool {
	t.Helper()
	cls, obj, sub := k.ClassObj()
	want := mode.lockName()
	var n int
	err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1 AND objid = $2 AND objsubid = $3 AND mode = $4 AND pid = pg_backend_pid()`, cls, obj, sub, want).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}
