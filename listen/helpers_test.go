package listen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// This package cannot use internal/testenv: testenv imports the proxy,
// which imports this package.

const (
	appUser = "app"
	appPW   = "app pw"
	appDB   = "appdb"
	otherDB = "otherdb"
	randDB  = "randdb"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.RunMain(m, func(c *pgtest.Cluster) error {
		ctx := context.Background()
		if err := c.CreateRole(ctx, appUser, appPW); err != nil {
			return err
		}
		for _, db := range []string{appDB, otherDB, randDB} {
			if err := c.CreateDatabase(ctx, db, appUser); err != nil {
				return err
			}
		}
		return nil
	}))
}

// testCtx is a context for one step of a test: 30 s at most.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testLogWriter sends the hub's log to the test's log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newHub returns a hub logging in as the app role, with its own registry.
// At the test's end it is closed, and no goroutine of it may remain.
func newHub(t *testing.T, edit ...func(*Config)) (*Hub, *prometheus.Registry) {
	t.Helper()
	c := pgtest.Require(t)
	before := goleak.IgnoreCurrent()
	reg := prometheus.NewRegistry()
	cfg := Config{
		ConnConfig: func(db string) (*pgx.ConnConfig, error) { return pgx.ParseConfig(c.DSN(appUser, appPW, db)) },
		Logger:     slog.New(slog.NewTextHandler(testLogWriter{t}, nil)),
		Registerer: reg,
	}
	for _, e := range edit {
		e(&cfg)
	}
	h := New(cfg)
	t.Cleanup(func() {
		h.Close()
		if s := h.Stats(); s.Clients != 0 || s.Channels != 0 || s.Connections != 0 {
			t.Errorf("after Close: %+v", s)
		}
		goleak.VerifyNone(t, before)
	})
	return h, reg
}

// recorder is a Subscriber that keeps everything it gets.
type recorder struct {
	name string

	mu   sync.Mutex
	got  []Notification
	at   []time.Time // when each notification came
	lost []error
	wake chan struct{} // closed (and replaced) at every call
}

func newRecorder(name string) *recorder {
	return &recorder{name: name, wake: make(chan struct{})}
}

func (r *recorder) String() string { return r.name }

func (r *recorder) Notify(n Notification) {
	now := time.Now()
	r.mu.Lock()
	r.got = append(r.got, n)
	r.at = append(r.at, now)
	close(r.wake)
	r.wake = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) Lost(err error) {
	r.mu.Lock()
	r.lost = append(r.lost, err)
	close(r.wake)
	r.wake = make(chan struct{})
	r.mu.Unlock()
}

// snapshot returns copies of what r got so far.
func (r *recorder) snapshot() ([]Notification, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Notification(nil), r.got...), append([]error(nil), r.lost...)
}

// waitUntil waits until cond holds for what r got (cond is called with
// r's mutex held).
func (r *recorder) waitUntil(t *testing.T, ctx context.Context, what string, cond func(got []Notification, lost []error) bool) {
	t.Helper()
	for {
		r.mu.Lock()
		ok := cond(r.got, r.lost)
		w := r.wake
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w:
		case <-ctx.Done():
			got, lost := r.snapshot()
			t.Fatalf("%s: %s: not within the test's time; got %s, lost %v", r.name, what, describe(got), lost)
		}
	}
}

// waitPayload waits until r got a notification with payload on channel
// and returns what r got up to and including it.
func (r *recorder) waitPayload(t *testing.T, ctx context.Context, channel, payload string) []Notification {
	t.Helper()
	var upTo []Notification
	r.waitUntil(t, ctx, fmt.Sprintf("notification %q on %q", short(payload), channel), func(got []Notification, _ []error) bool {
		for i, n := range got {
			if n.Channel == channel && n.Payload == payload {
				upTo = append([]Notification(nil), got[:i+1]...)
				return true
			}
		}
		return false
	})
	return upTo
}

// waitLost waits until r got at least one Lost and returns the first.
func (r *recorder) waitLost(t *testing.T, ctx context.Context) error {
	t.Helper()
	var err error
	r.waitUntil(t, ctx, "Lost", func(_ []Notification, lost []error) bool {
		if len(lost) > 0 {
			err = lost[0]
		}
		return len(lost) > 0
	})
	return err
}

func short(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%s…(%d bytes)", s[:40], len(s))
	}
	return s
}

func describe(ns []Notification) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		own := ""
		if n.Own {
			own = " own"
		}
		parts[i] = fmt.Sprintf("%s:%s%s", n.Channel, short(n.Payload), own)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func payloads(ns []Notification) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.Payload
	}
	return out
}

// sender opens a session as the app role on db, for NOTIFY.
func sender(t *testing.T, db string) *pgx.Conn {
	t.Helper()
	c := pgtest.Require(t)
	conn, err := pgx.Connect(testCtx(t), c.DSN(appUser, appPW, db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// superuser opens a superuser session on db.
func superuser(t *testing.T, db string) *pgx.Conn {
	t.Helper()
	c := pgtest.Require(t)
	conn, err := pgx.Connect(testCtx(t), c.SuperuserDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// notify commits one notification (pg_notify takes the channel name as
// it is).
func notify(t *testing.T, conn *pgx.Conn, channel, payload string) {
	t.Helper()
	if _, err := conn.Exec(testCtx(t), "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatal(err)
	}
}

func mustListen(t *testing.T, h *Hub, db, channel string, sub Subscriber) {
	t.Helper()
	if err := h.Listen(testCtx(t), db, channel, sub); err != nil {
		t.Fatalf("Listen(%s, %q, %v): %v", db, channel, sub, err)
	}
}

// listenerPID is the pid of db's listener backend, from pg_stat_activity.
func listenerPID(t *testing.T, su *pgx.Conn, db string) uint32 {
	t.Helper()
	var pids []uint32
	rows, err := su.Query(testCtx(t), "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = $2", ApplicationName, db)
	if err != nil {
		t.Fatal(err)
	}
	pids, err = pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) != 1 {
		t.Fatalf("listener backends of %s: %v, want one", db, pids)
	}
	return pids[0]
}

// terminate ends backend pid with pg_terminate_backend.
func terminate(t *testing.T, su *pgx.Conn, pid uint32) {
	t.Helper()
	var ok bool
	if err := su.QueryRow(testCtx(t), "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

// sqlState returns the SQLSTATE of the PostgreSQL error in err's chain.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// eventually polls cond every 10ms until it holds or d passes (for state
// outside the hub, such as pg_stat_activity, that nothing signals).
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// commandLog collects the commands the hub's connections completed (the
// afterCommand hook) and wakes waiters.
type commandLog struct {
	mu   sync.Mutex
	cmds []string
	wake chan struct{}
}

func newCommandLog(h *Hub) *commandLog {
	l := &commandLog{wake: make(chan struct{})}
	h.hooks.afterCommand = func(db, sql string, err error) {
		l.mu.Lock()
		s := db + ": " + sql
		if err != nil {
			s += " -> " + err.Error()
		}
		l.cmds = append(l.cmds, s)
		close(l.wake)
		l.wake = make(chan struct{})
		l.mu.Unlock()
	}
	return l
}

// waitFor waits until a completed command equals want (db + ": " + sql)
// after index from; it returns the index after it.
func (l *commandLog) waitFor(t *testing.T, ctx context.Context, from int, want string) int {
	t.Helper()
	for {
		l.mu.Lock()
		for i := from; i < len(l.cmds); i++ {
			if l.cmds[i] == want {
				l.mu.Unlock()
				return i + 1
			}
		}
		w := l.wake
		l.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("command %q not completed; completed: %q", want, l.cmds[from:])
		}
	}
}

func (l *commandLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cmds)
}

// gate blocks the hub's connection before it sends a command matching
// sql, until released (the beforeCommand hook).
type gate struct {
	sql     string
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate(h *Hub, sql string) *gate {
	g := &gate{sql: sql, reached: make(chan struct{}), release: make(chan struct{})}
	h.hooks.beforeCommand = func(_, s string) {
		if s != g.sql {
			return
		}
		g.once.Do(func() { close(g.reached) })
		<-g.release
	}
	return g
}

// pausable is a TCP forwarder to PostgreSQL that can stop passing bytes
// without closing anything, so a connection through it stops answering.
type pausable struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	paused   chan struct{} // non-nil while paused; closed on resume
	conns    []net.Conn
	wg       sync.WaitGroup
	shutdown bool
}

func newPausable(t *testing.T, target string) *pausable {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pausable{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *pausable) addr() string { return p.ln.Addr().String() }

func (p *pausable) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.shutdown {
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

func (p *pausable) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			w := p.paused
			p.mu.Unlock()
			if w != nil {
				<-w
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = src.Close()
			}
			return
		}
	}
}

func (p *pausable) pause() {
	p.mu.Lock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
	p.mu.Unlock()
}

func (p *pausable) resume() {
	p.mu.Lock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
	p.mu.Unlock()
}

func (p *pausable) close() {
	p.resume()
	p.mu.Lock()
	p.shutdown = true
	conns := p.conns
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}
