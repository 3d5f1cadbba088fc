package listen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// connState is the state of a listener connection's life.
type connState uint8

const (
	stateConnecting connState = iota // dialling and logging in; subscriptions wait
	stateListening                   // open: runs commands, receives notifications
	stateClosing                     // dead or closed by the hub: no longer current, being closed
)

// String returns the state's name as the console shows it.
func (s connState) String() string {
	switch s {
	case stateConnecting:
		return "connecting"
	case stateListening:
		return "listening"
	default:
		return "closing"
	}
}

// conn is one listener connection's life. Its goroutine (database.run)
// owns the pgconn.PgConn; every field but ctx and cancel is guarded by the
// database's mutex.
type conn struct {
	ctx    context.Context // cancelled when the connection is no longer current
	cancel context.CancelFunc

	state    connState
	since    time.Time // when it entered state
	pid      uint32    // the listener's server backend pid, once connected
	pending  []*subscription
	barriers []*barrier
	todo     []*channel         // channels whose LISTEN or UNLISTEN may be due, in order
	nextPing time.Time          // a barrier is sent when idle until then
	stopWait context.CancelFunc // ends the goroutine's wait for notifications; nil when it does not wait
}

func (c *conn) setState(s connState) {
	c.state = s
	c.since = time.Now()
}

// kick makes the goroutine look for a command to send: it ends its wait
// for notifications, if it waits.
func (c *conn) kick() {
	if c.stopWait != nil {
		c.stopWait()
		c.stopWait = nil
	}
}

func (c *conn) todoLocked(ch *channel) {
	if !ch.queued {
		ch.queued = true
		c.todo = append(c.todo, ch)
	}
}

// openLocked starts a new connection for the database and makes it the
// current one (connecting).
func (d *database) openLocked() *conn {
	c := &conn{state: stateConnecting, since: time.Now()}
	c.ctx, c.cancel = context.WithCancel(d.hub.ctx)
	d.conn = c
	d.lives[c] = struct{}{}
	d.hub.conns.Add(1)
	d.hub.m.conns.Inc()
	d.hub.wg.Add(1)
	go d.run(c)
	return c
}

// run is the goroutine of connection c: it connects, serves until the
// connection dies or is no longer current, ends it, and closes it.
func (d *database) run(c *conn) {
	defer d.hub.wg.Done()
	pgc, err := d.connect(c)
	if err == nil {
		err = d.serve(c, pgc)
	}
	d.end(c, err, pgc != nil)
	if pgc != nil {
		closeConn(pgc)
	}
	d.mu.Lock()
	delete(d.lives, c)
	d.mu.Unlock()
	d.hub.conns.Add(-1)
	d.hub.m.conns.Dec()
}

// closeConn closes a listener connection: with a Terminate when it is
// still open. One that pgconn closed itself (an interrupted command) is
// being closed by a goroutine of pgconn's, which sends a CancelRequest and
// then drains the socket until the server closes it (up to 15 s): closing
// the socket here ends that drain at once, and the wait for pgconn's
// cleanup is bounded.
func closeConn(pgc *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = pgc.Close(ctx)
	_ = pgc.Conn().Close()
	select {
	case <-pgc.CleanupDone():
	case <-ctx.Done():
	}
}

// minConnectTimeout bounds the login of a listener connection when its
// configuration sets no connect_timeout (nor a longer PingInterval).
const minConnectTimeout = 10 * time.Second

// listenerConfig returns the pgconn configuration of a listener connection:
// cc's, with lockpool's application_name and onNotification, a context
// watcher that interrupts a wait by a read deadline only (never a
// CancelRequest, which could hit the next command), FATAL errors closing
// the connection, and a connect timeout when cc sets none.
func listenerConfig(cc *pgx.ConnConfig, ping time.Duration, onNotification pgconn.NotificationHandler) *pgconn.Config {
	cfg := cc.Config.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = ApplicationName
	cfg.OnNotification = onNotification
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	cfg.OnPgError = func(_ *pgconn.PgConn, pe *pgconn.PgError) bool {
		return !strings.EqualFold(pe.Severity, "FATAL") && !strings.EqualFold(pe.Severity, "PANIC")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = max(ping, minConnectTimeout)
	}
	return cfg
}

// connect opens the listener connection of c.
func (d *database) connect(c *conn) (*pgconn.PgConn, error) {
	h := d.hub
	if h.connConfig == nil {
		return nil, errors.New("listen: no ConnConfig")
	}
	cc, err := h.connConfig(d.name)
	if err != nil {
		return nil, err
	}
	if cc == nil {
		return nil, errors.New("listen: ConnConfig returned no configuration")
	}
	cfg := listenerConfig(cc, h.pingInterval, func(_ *pgconn.PgConn, n *pgconn.Notification) { d.deliver(c, n) })
	pgc, err := pgconn.ConnectConfig(c.ctx, cfg)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.conn == c {
		c.setState(stateListening)
		c.pid = pgc.PID()
		c.nextPing = time.Now().Add(h.pingInterval)
	}
	d.mu.Unlock()
	h.task.OK()
	h.log.Info("listen: listener connection open", "database", d.name, "pid", pgc.PID())
	return pgc, nil
}

// serve runs commands as they become due and otherwise waits for
// notifications, until the connection dies (its error is returned) or is no
// longer current.
func (d *database) serve(c *conn, pgc *pgconn.PgConn) error {
	for {
		d.mu.Lock()
		if d.conn != c {
			d.mu.Unlock()
			return ErrClosed
		}
		c.stopWait = nil
		cmd := d.nextLocked(c, time.Now())
		var wait context.Context
		var stop context.CancelFunc
		if cmd == nil {
			wait, stop = context.WithDeadline(c.ctx, c.nextPing)
			c.stopWait = stop
		}
		d.mu.Unlock()

		if cmd != nil {
			if err := d.exec(c, pgc, cmd); err != nil {
				return err
			}
			continue
		}
		var err error
		for err == nil {
			// Each notification went through OnNotification already.
			err = pgc.WaitForNotification(wait)
		}
		stop()
		if pgc.IsClosed() || !interrupted(err) {
			return err
		}
	}
}

// exec sends cmd and records its completion.
func (d *database) exec(c *conn, pgc *pgconn.PgConn, cmd *command) error {
	h := d.hub
	if h.hooks.beforeCommand != nil {
		h.hooks.beforeCommand(d.name, cmd.sql)
	}
	ctx, cancel := context.WithTimeout(c.ctx, h.pingInterval)
	err := pgc.Exec(ctx, cmd.sql).Close()
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && c.ctx.Err() == nil {
		err = fmt.Errorf("%w (%s, %s): %w", ErrNoAnswer, cmd.sql, h.pingInterval, err)
	}
	cancel()
	d.mu.Lock()
	if d.conn != c {
		d.mu.Unlock()
		return ErrClosed
	}
	ferr := d.completeLocked(c, cmd, err, pgc.IsClosed())
	d.mu.Unlock()
	if cmd.kind != cmdBarrier {
		h.log.Debug("listen: listener command", "database", d.name, "sql", cmd.sql, "err", err)
	}
	if h.hooks.afterCommand != nil {
		h.hooks.afterCommand(d.name, cmd.sql, err)
	}
	return ferr
}

// interrupted reports an error of a wait that ended because its context
// did (a command became due, a ping is due, or the connection closes).
func interrupted(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)
}
