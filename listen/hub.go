package listen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/bgtask"
	"github.com/prometheus/client_golang/prometheus"
)

// ApplicationName is the application_name of every listener connection.
const ApplicationName = "lockpool listener"

// MaxChannelLen is the longest channel name in bytes (PostgreSQL's
// NAMEDATALEN - 1; a longer identifier would be truncated by PostgreSQL).
const MaxChannelLen = 63

// expectTTL is how long an unmatched expectation is kept.
const expectTTL = time.Minute

var (
	// ErrClosed is returned by Listen and Sync after (or while) the hub
	// closes.
	ErrClosed = errors.New("listen: hub closed")
	// ErrListenerLost wraps the error a subscriber's Lost gets and the
	// error a Listen or Sync returns when the listener connection died
	// under it; the cause (a *pgconn.PgError such as 57P01, a network
	// error, ErrNoAnswer) is wrapped too.
	ErrListenerLost = errors.New("listen: listener connection lost")
	// ErrNoAnswer is the cause when the listener connection did not answer
	// a command or ping within Config.PingInterval.
	ErrNoAnswer = errors.New("listen: listener connection did not answer in time")
	// ErrUnlistened is returned by a Listen whose subscription was ended by
	// Unlisten or UnlistenAll before it became active.
	ErrUnlistened = errors.New("listen: unlistened before the subscription was active")
	// ErrChannelName is returned by Listen for a channel name PostgreSQL
	// cannot hold as it is (longer than MaxChannelLen bytes, or with a NUL).
	ErrChannelName = errors.New("listen: invalid channel name")
)

// Notification is one notification as one subscriber gets it.
type Notification struct {
	Channel string
	Payload string
	PID     uint32 // the sending server backend's pid, as PostgreSQL reported it
	Own     bool   // an expectation this subscriber registered (Expect) matched it: the subscriber sent it
}

// Subscriber is one client listening through a Hub. The hub calls its methods
// on its own goroutine; they must not block (queue and return).
//
// They are called with the database's state locked (that is what makes
// Unlisten take effect at once), so they must not call the Hub either: a
// subscriber that wants to end its subscriptions from Notify or Lost (say,
// over max_pending) hands that to its own goroutine. A Subscriber is a map
// key: use a comparable type, in practice a pointer.
type Subscriber interface {
	Notify(n Notification)
	// Lost: the database's listener connection died; notifications may have been missed.
	// Afterwards the subscriber is subscribed to nothing in that database.
	Lost(err error)
}

// KeyPIDer is a Subscriber with a pid of its own: the key pid the proxy
// gave its client. A notification an expectation of it matched (Expect)
// carries that pid to every subscriber, not the server backend's.
type KeyPIDer interface {
	KeyPID() uint32
}

// Config configures a Hub.
type Config struct {
	ConnConfig   func(database string) (*pgx.ConnConfig, error) // how to log in to a database (pgx v5); the hub sets application_name
	Logger       *slog.Logger
	Registerer   prometheus.Registerer // may be nil
	PingInterval time.Duration         // 0: 10s. A listener that does not answer a ping within PingInterval is dead (Lost to all)
	Task         *bgtask.Task          // counts listener connections that could not open or were lost; nil: none
}

// ChannelRow is one channel with listening clients, for the admin console.
type ChannelRow struct {
	Database, Channel string
	Clients           int
}

// ServerRow is one listener connection, for the admin console.
type ServerRow struct {
	Database string
	PID      uint32 // the listener's server backend pid; 0 while connecting
	State    string // connecting, listening, closing
	Channels int    // channels the connection LISTENs on
	Since    time.Time
}

// Stats are the hub's counts, for metrics and the console.
type Stats struct {
	Clients     int    // listening clients: subscribers with at least one channel (in any database)
	Channels    int    // channels with at least one subscriber, counted per database
	Connections int    // listener connections open (connecting, listening or closing)
	Delivered   uint64 // notifications delivered: one per subscriber and notification
	Lost        uint64 // Lost calls
}

// Hub is lockpool's set of listener connections, one per database, and the
// subscriptions of its clients. Its methods are safe for concurrent use.
type Hub struct {
	connConfig   func(string) (*pgx.ConnConfig, error)
	log          *slog.Logger
	pingInterval time.Duration
	task         *bgtask.Task
	m            *metrics
	now          func() time.Time // the clock of expectations
	hooks        hooks

	ctx    context.Context // cancelled by Close: ends every connection's work
	cancel context.CancelFunc
	wg     sync.WaitGroup // the connections' goroutines

	mu     sync.Mutex
	closed bool
	dbs    map[string]*database

	clients clientSet

	channels  atomic.Int64
	conns     atomic.Int64
	delivered atomic.Uint64
	lost      atomic.Uint64
}

// hooks let tests act at points of a connection's life; all nil in
// production. They run on the connection's goroutine with no lock held.
type hooks struct {
	beforeCommand func(database, sql string)
	afterCommand  func(database, sql string, err error)
}

// New returns a hub. No connection is opened before the first Listen.
func New(cfg Config) *Hub {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ping := cfg.PingInterval
	if ping <= 0 {
		ping = 10 * time.Second
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		log.Warn("listen: metrics not registered", "err", err)
	}
	h := &Hub{
		connConfig:   cfg.ConnConfig,
		log:          log,
		pingInterval: ping,
		task:         cfg.Task,
		m:            m,
		now:          time.Now,
		dbs:          map[string]*database{},
	}
	h.clients.n = map[Subscriber]int{}
	h.clients.gauge = m.clients
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h
}

// database returns the state of database name, made when create is set
// (else nil when there is none). It fails once the hub is closed.
func (h *Hub) database(name string, create bool) (*database, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	d := h.dbs[name]
	if d == nil && create {
		d = newDatabase(h, name)
		h.dbs[name] = d
	}
	return d, nil
}

// databases returns every database's state, sorted by name.
func (h *Hub) databases() []*database {
	h.mu.Lock()
	out := make([]*database, 0, len(h.dbs))
	for _, d := range h.dbs {
		out = append(out, d)
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b *database) int { return strings.Compare(a.name, b.name) })
	return out
}

// checkChannel rejects names PostgreSQL would not keep as they are. The
// empty name goes to PostgreSQL, whose error (42601) Listen returns.
func checkChannel(name string) error {
	if len(name) > MaxChannelLen {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrChannelName, len(name), MaxChannelLen)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("%w: contains a NUL byte", ErrChannelName)
	}
	return nil
}

// Listen subscribes sub to channel in database and returns once the subscription is active: the
// database's listener connection is LISTENing on channel, every notification committed after Listen
// returned reaches sub, and none committed before Listen was called does. Opens (or reopens) the
// listener connection on first use. Idempotent for a subscriber already listening on the channel. Honours ctx.
//
// On an error sub is not subscribed to channel (its other subscriptions
// stay): ctx's error, ErrClosed, ErrChannelName, ErrUnlistened, the
// connection's error when it could not be opened or died (ErrListenerLost),
// or PostgreSQL's error for the LISTEN (a *pgconn.PgError).
func (h *Hub) Listen(ctx context.Context, database, channel string, sub Subscriber) error {
	if err := checkChannel(channel); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := h.database(database, true)
	if err != nil {
		return err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	s := d.subscribeLocked(channel, sub)
	if s.active {
		d.mu.Unlock()
		return nil
	}
	s.waiters++
	d.mu.Unlock()

	select {
	case <-s.done:
	case <-ctx.Done():
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	s.waiters--
	switch {
	case s.active:
		return nil // it became active (perhaps as ctx ended): the subscription stands
	case s.settled:
		return s.err
	}
	if s.waiters == 0 {
		d.removeLocked(s)
	}
	return ctx.Err()
}

// Unlisten ends sub's subscription at once (no notification reaches it for that channel afterwards);
// never blocks on the network: the listener's own UNLISTEN when the last subscriber leaves runs later.
// A Listen of sub on the channel still waiting returns ErrUnlistened.
func (h *Hub) Unlisten(database, channel string, sub Subscriber) {
	d, _ := h.database(database, false)
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.subs[sub][channel]; s != nil {
		d.removeLocked(s)
	}
}

// UnlistenAll ends every subscription of sub in database at once, as
// Unlisten does for one.
func (h *Hub) UnlistenAll(database string, sub Subscriber) {
	d, _ := h.database(database, false)
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.subs[sub] {
		d.removeLocked(s)
	}
}

// Sync returns once every notification committed before the call has been
// handed to the subscribers that were active then and still are: a barrier
// command on the database's listener connection. A caller that wants
// UNLISTEN to keep what PostgreSQL would have sent before it calls Sync and
// then Unlisten. Without a listener connection there is nothing to wait
// for. It returns ctx's error, ErrClosed, or the connection's error when
// it died (ErrListenerLost).
func (h *Hub) Sync(ctx context.Context, database string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := h.database(database, false)
	if err != nil || d == nil {
		return err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	c := d.conn
	if c == nil {
		d.mu.Unlock()
		return nil
	}
	b := &barrier{done: make(chan struct{})}
	c.barriers = append(c.barriers, b)
	c.kick()
	d.mu.Unlock()
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return ctx.Err() // the barrier still runs; no one waits for it
	}
}

// Expect registers that sub's transaction on server backend serverPID sends (or sent) a notification on
// channel (payload given, or any payload when anyPayload): the first matching notification from that pid is
// delivered to sub with Own=true (to other subscribers Own=false). Register before the transaction
// commits, whether or not anyone listens yet: a LISTEN may reach the listener connection before the
// commit. Then Withdraw (the transaction rolled back) or Committed; Forget drops every unmatched
// expectation of sub for serverPID. Expectations older than a minute are dropped.
//
// Expectations of one pid match in the order they were registered, each at
// most one notification, and are used up by a matching notification even
// when sub does not listen on its channel. PostgreSQL folds identical
// notifications of one transaction into one: register one expectation per
// distinct (channel, payload) of a transaction.
func (h *Hub) Expect(database string, serverPID uint32, sub Subscriber, channel, payload string, anyPayload bool) {
	d, _ := h.database(database, true)
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	now := h.now()
	d.pruneLocked(now)
	d.expects[serverPID] = append(d.expects[serverPID], &expectation{sub: sub, channel: channel, payload: payload, any: anyPayload, at: now})
}

// Withdraw drops the latest unmatched expectation of sub for serverPID
// with exactly these channel, payload and anyPayload (its transaction
// rolled back); expectations of sub's earlier, committed transactions stay.
func (h *Hub) Withdraw(database string, serverPID uint32, sub Subscriber, channel, payload string, anyPayload bool) {
	h.drop(database, serverPID, sub, channel, payload, anyPayload, false)
}

// Committed tells the hub that the transaction of sub's latest unmatched
// expectation for serverPID with these channel, payload and anyPayload
// committed. The expectation stays while its notification may still
// reach the listener connection (the channel has subscribers, or its
// UNLISTEN is not done); otherwise it is dropped, since the connection
// will never receive it. Expect registers before anyone may listen (a
// LISTEN may reach the listener connection before the sender commits), and
// Committed keeps what that leaves behind bounded by the channels in use.
func (h *Hub) Committed(database string, serverPID uint32, sub Subscriber, channel, payload string, anyPayload bool) {
	h.drop(database, serverPID, sub, channel, payload, anyPayload, true)
}

// drop removes the latest unmatched expectation of sub for serverPID that
// has these channel, payload and anyPayload; with unlistenedOnly only when
// no LISTEN of channel is in place or under way.
func (h *Hub) drop(database string, serverPID uint32, sub Subscriber, channel, payload string, anyPayload, unlistenedOnly bool) {
	d, _ := h.database(database, false)
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if unlistenedOnly && d.channels[channel] != nil {
		return
	}
	list := d.expects[serverPID]
	for i := len(list) - 1; i >= 0; i-- {
		if e := list[i]; e.sub == sub && e.channel == channel && e.payload == payload && e.any == anyPayload {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(d.expects, serverPID)
	} else {
		d.expects[serverPID] = list
	}
}

// Forget drops sub's unmatched expectations for serverPID in database.
func (h *Hub) Forget(database string, serverPID uint32, sub Subscriber) {
	d, _ := h.database(database, false)
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	list := slices.DeleteFunc(d.expects[serverPID], func(e *expectation) bool { return e.sub == sub })
	if len(list) == 0 {
		delete(d.expects, serverPID)
	} else {
		d.expects[serverPID] = list
	}
}

// Channels returns the channels with at least one subscriber (pending or
// active), sorted by database, channel.
func (h *Hub) Channels() []ChannelRow {
	var out []ChannelRow
	for _, d := range h.databases() {
		d.mu.Lock()
		for name, ch := range d.channels {
			if len(ch.subs) > 0 {
				out = append(out, ChannelRow{Database: d.name, Channel: name, Clients: len(ch.subs)})
			}
		}
		d.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ChannelRow) int {
		return cmp.Or(strings.Compare(a.Database, b.Database), strings.Compare(a.Channel, b.Channel))
	})
	return out
}

// Servers returns the listener connections (connecting, listening, or
// closing), sorted by database and pid.
func (h *Hub) Servers() []ServerRow {
	var out []ServerRow
	for _, d := range h.databases() {
		d.mu.Lock()
		for c := range d.lives {
			r := ServerRow{Database: d.name, PID: c.pid, State: c.state.String(), Since: c.since}
			if c == d.conn {
				for _, ch := range d.channels {
					if ch.server == listening || ch.server == unlistenSent {
						r.Channels++
					}
				}
			}
			out = append(out, r)
		}
		d.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ServerRow) int {
		return cmp.Or(strings.Compare(a.Database, b.Database), cmp.Compare(a.PID, b.PID))
	})
	return out
}

// Stats returns the hub's counts.
func (h *Hub) Stats() Stats {
	return Stats{
		Clients:     h.clients.len(),
		Channels:    int(h.channels.Load()),
		Connections: int(h.conns.Load()),
		Delivered:   h.delivered.Load(),
		Lost:        h.lost.Load(),
	}
}

// CountClosed counts a subscriber the proxy closed for another reason (reason "max_pending"); it shows in
// lockpool_listen_clients_closed_total.
func (h *Hub) CountClosed(reason string) {
	h.m.closed.WithLabelValues(reason).Inc()
}

// Close closes every listener connection and waits until they are closed
// (a second at most for one whose close does not complete); subscribers get
// nothing more (no Lost). Listen and Sync calls waiting return ErrClosed,
// and so do later ones.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	dbs := make([]*database, 0, len(h.dbs))
	for _, d := range h.dbs {
		dbs = append(dbs, d)
	}
	h.mu.Unlock()
	for _, d := range dbs {
		d.close()
	}
	h.cancel()
	h.wg.Wait()
}

// clientSet counts, per subscriber, the databases it has a subscription
// in: its size is the listening clients. Its mutex is taken last.
type clientSet struct {
	mu    sync.Mutex
	n     map[Subscriber]int
	gauge prometheus.Gauge
}

func (s *clientSet) add(sub Subscriber) {
	s.mu.Lock()
	s.n[sub]++
	if s.n[sub] == 1 {
		s.gauge.Inc()
	}
	s.mu.Unlock()
}

func (s *clientSet) remove(sub Subscriber) {
	s.mu.Lock()
	s.n[sub]--
	if s.n[sub] <= 0 {
		delete(s.n, sub)
		s.gauge.Dec()
	}
	s.mu.Unlock()
}

func (s *clientSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.n)
}
