package listen

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// database is the hub's state for one database. mu guards every field but
// hub and name, the fields of its channels, subscriptions and barriers, and
// the fields of its connections that the doc of conn says it guards.
type database struct {
	hub  *Hub
	name string

	mu       sync.Mutex
	closed   bool                                    // the hub closed: no new connection
	conn     *conn                                   // the current connection (connecting or listening); nil: none
	lives    map[*conn]struct{}                      // every connection whose goroutine runs: the current one and closing ones
	channels map[string]*channel                     // channels with subscribers, or still known to the connection
	subs     map[Subscriber]map[string]*subscription // each subscriber's subscriptions, by channel
	expects  map[uint32][]*expectation               // unmatched expectations by sending backend pid, oldest first
	pruned   time.Time                               // when expired expectations were last dropped
}

func newDatabase(h *Hub, name string) *database {
	return &database{
		hub:      h,
		name:     name,
		lives:    map[*conn]struct{}{},
		channels: map[string]*channel{},
		subs:     map[Subscriber]map[string]*subscription{},
		expects:  map[uint32][]*expectation{},
	}
}

// serverState is what the current connection has done about a channel.
type serverState uint8

const (
	unlistened   serverState = iota // not listening (or no connection yet)
	listenSent                      // LISTEN in flight
	listening                       // LISTEN completed
	unlistenSent                    // UNLISTEN in flight: still listening until it completes
)

// channel is one channel of a database.
type channel struct {
	name   string
	server serverState
	subs   map[Subscriber]*subscription
	queued bool // in the connection's todo list
}

// subscription is one subscriber on one channel: pending until a command
// sent after it was made completes with its channel LISTENed, then active.
type subscription struct {
	sub     Subscriber
	ch      *channel
	active  bool
	removed bool          // ended: by Unlisten, UnlistenAll, a failed or cancelled Listen, Lost, Close
	settled bool          // done is closed
	done    chan struct{} // closed when it becomes active or fails
	err     error         // why it failed; set before done is closed
	waiters int           // Listen calls waiting for done
}

// barrier is a Sync waiting for a command sent after its call.
type barrier struct {
	done chan struct{}
	err  error // set before done is closed
}

// expectation is one Expect: sub's transaction on a backend notifies
// channel (with payload, or any payload).
type expectation struct {
	sub     Subscriber
	channel string
	payload string
	any     bool
	at      time.Time
}

func (s *subscription) settle(err error) {
	if s.settled {
		return
	}
	s.settled = true
	s.err = err
	close(s.done)
}

func (b *barrier) settle(err error) {
	b.err = err
	close(b.done)
}

// subscribeLocked returns sub's subscription to channel name, making a
// pending one (and, if needed, the connection and the channel's LISTEN)
// when there is none.
func (d *database) subscribeLocked(name string, sub Subscriber) *subscription {
	c := d.conn
	if c == nil {
		c = d.openLocked()
	}
	ch := d.channels[name]
	if ch == nil {
		ch = &channel{name: name, subs: map[Subscriber]*subscription{}}
		d.channels[name] = ch
	}
	if s := ch.subs[sub]; s != nil {
		return s
	}
	s := &subscription{sub: sub, ch: ch, done: make(chan struct{})}
	if len(ch.subs) == 0 {
		d.hub.channels.Add(1)
		d.hub.m.channels.Inc()
	}
	ch.subs[sub] = s
	m := d.subs[sub]
	if m == nil {
		m = map[string]*subscription{}
		d.subs[sub] = m
		d.hub.clients.add(sub)
	}
	m[name] = s
	c.pending = append(c.pending, s)
	if ch.server == unlistened {
		c.todoLocked(ch)
	}
	c.kick()
	return s
}

// removeLocked ends subscription s; a Listen still waiting for it returns
// ErrUnlistened. When its channel is left without subscribers, the
// connection's UNLISTEN is queued (or the channel forgotten).
func (d *database) removeLocked(s *subscription) {
	if s.removed {
		return
	}
	s.removed = true
	s.settle(ErrUnlistened)
	ch := s.ch
	delete(ch.subs, s.sub)
	if m := d.subs[s.sub]; m != nil {
		delete(m, ch.name)
		if len(m) == 0 {
			delete(d.subs, s.sub)
			d.hub.clients.remove(s.sub)
		}
	}
	if len(ch.subs) > 0 {
		return
	}
	d.hub.channels.Add(-1)
	d.hub.m.channels.Dec()
	switch ch.server {
	case listening:
		if c := d.conn; c != nil {
			c.todoLocked(ch)
			c.kick()
		}
	case unlistened:
		if d.channels[ch.name] == ch {
			delete(d.channels, ch.name)
		}
	}
	// listenSent, unlistenSent: the completion decides.
}

// quoteIdent quotes a channel name as a PostgreSQL identifier.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// commandKind is what a command of the connection does.
type commandKind uint8

const (
	cmdListen commandKind = iota
	cmdUnlisten
	cmdBarrier // also the ping
)

// command is one statement the connection sends, with the subscriptions
// and barriers it settles at its ReadyForQuery: those made before it was
// sent.
type command struct {
	kind     commandKind
	ch       *channel // cmdListen, cmdUnlisten
	sql      string
	take     []*subscription
	barriers []*barrier
}

// barrierSQL is the barrier and ping: an empty statement.
const barrierSQL = "-- lockpool listener barrier"

// nextLocked returns the command c should send now, or nil: a LISTEN or
// UNLISTEN that became due, else a barrier for waiting subscriptions and
// Syncs or for a ping that is due. The command takes every pending
// subscription and barrier: they were made before it is sent.
func (d *database) nextLocked(c *conn, now time.Time) *command {
	var cmd *command
	for cmd == nil && len(c.todo) > 0 {
		ch := c.todo[0]
		c.todo = c.todo[1:]
		ch.queued = false
		if d.channels[ch.name] != ch {
			continue
		}
		switch {
		case len(ch.subs) > 0 && ch.server == unlistened:
			ch.server = listenSent
			cmd = &command{kind: cmdListen, ch: ch, sql: "LISTEN " + quoteIdent(ch.name)}
		case len(ch.subs) == 0 && ch.server == listening:
			ch.server = unlistenSent
			cmd = &command{kind: cmdUnlisten, ch: ch, sql: "UNLISTEN " + quoteIdent(ch.name)}
		}
		// Otherwise nothing is due, or a command in flight decides at its
		// completion (none is in flight now: commands run one at a time).
	}
	pending := c.pending[:0]
	for _, s := range c.pending {
		if !s.removed {
			pending = append(pending, s)
		}
	}
	clear(c.pending[len(pending):])
	c.pending = pending
	if cmd == nil && (len(c.pending) > 0 || len(c.barriers) > 0 || !now.Before(c.nextPing)) {
		cmd = &command{kind: cmdBarrier, sql: barrierSQL}
	}
	if cmd != nil {
		cmd.take, c.pending = c.pending, nil
		cmd.barriers, c.barriers = c.barriers, nil
	}
	return cmd
}

// completeLocked records the completion of cmd (err: its error, nil when
// it succeeded). It returns the error that ends the connection, or nil.
func (d *database) completeLocked(c *conn, cmd *command, err error, broken bool) error {
	c.nextPing = time.Now().Add(d.hub.pingInterval)
	if err != nil && (broken || cmd.kind != cmdListen || !isStatementError(err)) {
		return err
	}
	switch cmd.kind {
	case cmdListen:
		ch := cmd.ch
		if err != nil {
			// PostgreSQL refused the LISTEN (the connection stays usable):
			// every subscription to the channel fails with its error.
			ch.server = unlistened
			d.hub.log.Warn("listen: LISTEN failed", "database", d.name, "err", err)
			for _, s := range ch.subs {
				s.settle(err)
				d.removeLocked(s)
			}
			if len(ch.subs) == 0 && d.channels[ch.name] == ch {
				delete(d.channels, ch.name)
			}
			break
		}
		ch.server = listening
		if len(ch.subs) == 0 {
			c.todoLocked(ch)
		}
	case cmdUnlisten:
		ch := cmd.ch
		ch.server = unlistened
		if len(ch.subs) > 0 {
			c.todoLocked(ch)
		} else if d.channels[ch.name] == ch {
			delete(d.channels, ch.name)
		}
	}
	// The cut: subscriptions made before cmd was sent are active from here
	// on, once their channel is LISTENed (else they wait for the next
	// command after that LISTEN).
	for _, s := range cmd.take {
		if s.removed || s.settled {
			continue
		}
		if s.ch.server == listening {
			s.active = true
			s.settle(nil)
		} else {
			c.pending = append(c.pending, s)
		}
	}
	for _, b := range cmd.barriers {
		b.settle(nil)
	}
	return nil
}

// isStatementError reports an error of the statement that leaves the
// connection usable (a PostgreSQL ERROR, not FATAL or PANIC).
func isStatementError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC"
}

// deliver hands notification n, received on connection c, to every active
// subscription of its channel, with Own for the subscriber whose
// expectation it matches.
func (d *database) deliver(c *conn, n *pgconn.Notification) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != c {
		return // closing: nothing more reaches anyone
	}
	owner := d.matchLocked(n.PID, n.Channel, n.Payload)
	ch := d.channels[n.Channel]
	if ch == nil {
		return
	}
	pid := n.PID
	if k, ok := owner.(KeyPIDer); ok {
		pid = k.KeyPID() // sent by a client of the proxy: every subscriber sees its pid
	}
	// Counted before the subscribers hear of it: whoever saw a delivery
	// sees it in the counts.
	var count uint64
	for _, s := range ch.subs {
		if s.active {
			count++
		}
	}
	if count == 0 {
		return
	}
	d.hub.delivered.Add(count)
	d.hub.m.delivered.Add(float64(count))
	for sub, s := range ch.subs {
		if s.active {
			sub.Notify(Notification{Channel: n.Channel, Payload: n.Payload, PID: pid, Own: owner != nil && sub == owner})
		}
	}
}

// matchLocked uses up the oldest live expectation of pid that matches
// channel and payload and returns its subscriber (nil: none).
func (d *database) matchLocked(pid uint32, channel, payload string) Subscriber {
	list := d.expects[pid]
	if len(list) == 0 {
		return nil
	}
	cutoff := d.hub.now().Add(-expectTTL)
	i := 0
	for i < len(list) && list[i].at.Before(cutoff) {
		i++
	}
	list = list[i:]
	var owner Subscriber
	for j, e := range list {
		if e.channel == channel && (e.any || e.payload == payload) {
			owner = e.sub
			list = append(list[:j:j], list[j+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(d.expects, pid)
	} else {
		d.expects[pid] = list
	}
	return owner
}

// pruneLocked drops expired expectations, at most every quarter of their
// lifetime.
func (d *database) pruneLocked(now time.Time) {
	if now.Sub(d.pruned) < expectTTL/4 {
		return
	}
	d.pruned = now
	cutoff := now.Add(-expectTTL)
	for pid, list := range d.expects {
		i := 0
		for i < len(list) && list[i].at.Before(cutoff) {
			i++
		}
		if i == len(list) {
			delete(d.expects, pid)
		} else if i > 0 {
			d.expects[pid] = list[i:]
		}
	}
}

// clearLocked ends every subscription and barrier of the current
// connection c, which is no longer current: waiting Listen and Sync calls
// get err; subscribers with an active subscription get Lost(err) when lost
// is set. The channels are forgotten.
func (d *database) clearLocked(c *conn, err error, lost bool) int {
	n := 0
	for sub, m := range d.subs {
		active := false
		for _, s := range m {
			active = active || s.active
			s.removed = true
			s.settle(err)
		}
		d.hub.clients.remove(sub)
		if active && lost {
			sub.Lost(err)
			n++
		}
	}
	for _, ch := range d.channels {
		if len(ch.subs) > 0 {
			d.hub.channels.Add(-1)
			d.hub.m.channels.Dec()
		}
	}
	for _, b := range c.barriers {
		b.settle(err)
	}
	c.barriers, c.pending, c.todo = nil, nil, nil
	d.channels = map[string]*channel{}
	d.subs = map[Subscriber]map[string]*subscription{}
	return n
}

// end ends connection c, which died of cause (or could not be opened), if
// it is still the current one: every subscriber with an active
// subscription gets Lost once, waiting calls get the error, and the state
// is cleared; the next Listen opens a new connection.
func (d *database) end(c *conn, cause error, connected bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != c {
		return // the hub closed it
	}
	d.conn = nil
	c.setState(stateClosing)
	c.cancel()
	var err error
	if connected {
		err = fmt.Errorf("%w: database %q: %w", ErrListenerLost, d.name, cause)
	} else {
		err = fmt.Errorf("listen: cannot open the listener connection to database %q: %w", d.name, cause)
	}
	lost := d.clearLocked(c, err, true)
	if lost > 0 {
		d.hub.lost.Add(uint64(lost))
		d.hub.m.closed.WithLabelValues(ReasonListenerLost).Add(float64(lost))
	}
	warn := d.hub.task.Failed()
	switch {
	case connected:
		d.hub.log.Warn("listen: listener connection lost", "database", d.name, "pid", c.pid, "clients_lost", lost, "err", cause)
	case warn:
		d.hub.log.Warn("listen: cannot open a listener connection", "database", d.name, "err", cause)
	default:
		d.hub.log.Debug("listen: cannot open a listener connection", "database", d.name, "err", cause)
	}
}

// close ends the database's connection for Hub.Close: waiting calls get
// ErrClosed, no one gets Lost, and no connection opens again.
func (d *database) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if c := d.conn; c != nil {
		d.conn = nil
		c.setState(stateClosing)
		c.cancel()
		d.clearLocked(c, ErrClosed, false)
	}
	d.expects = map[uint32][]*expectation{}
}
