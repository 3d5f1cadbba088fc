// Package pool owns lockpool's server connections, per application.
//
// A Manager keeps, for every configured application, the PostgreSQL server
// connections that application may use: the idle set, the budget
// (max_connections of the application), the instance cap (server.max_connections
// over all applications), a FIFO wait queue with a timeout, the pin slots
// (max_pinned), the idle timeout, the maximum lifetime, liveness checks of
// idle connections and the eviction of idle connections when another
// application or database needs the room. It does not speak the relay
// protocol: the proxy reads and writes Conn.Net / Conn.Reader itself.
//
// An idle connection handed out after more than a millisecond idle is
// checked first: nothing may have arrived on it (an idle server sends
// nothing; a FATAL or the end means it is gone). A caller on an event loop
// passes a Liveness that answers from what epoll reported, with no system
// call; otherwise the pool peeks at the socket (MSG_PEEK|MSG_DONTWAIT).
//
// # Ownership
//
// A *Conn handed out by Acquire belongs to exactly one holder until that
// holder gives it back with Release (only at a safe point: ReadyForQuery 'I',
// every Sync answered, no COPY open, no session state left behind) or with
// Destroy (any other moment, or after an I/O error). After either call the
// holder must not touch the Conn again. Idle connections belong to the
// Manager; nobody else reads or writes them.
//
// # Invariants
//
//   - An application never has more than its MaxConnections server
//     connections open (idle + in use + being dialed + being closed). A
//     connection is counted from the moment its slot is reserved (before
//     dialing) until its socket has been closed, so the server never sees
//     more than the budget even for a moment.
//   - The instance never has more than server.max_connections connections
//     opened by its pools.
//   - A connection is handed to exactly one holder at a time.
//   - Waiters of one application are served in FIFO order, within the
//     order of waits below; a slot freed at the instance level goes to the
//     oldest waiter, across applications, that is below its application's
//     budget.
//   - The order of waits: pin slots and connections are never waited for
//     in a cycle. A caller holding a connection waits for a pin slot only
//     (AcquirePin); a caller holding neither waits for both holding neither
//     (AcquireWithPin) and is granted them together, under the lock. A free
//     slot is never kept for a waiter that cannot get a connection: it goes
//     to an AcquirePin caller, or waits for the connection that serves an
//     AcquireWithPin caller with it. So slot waiters wait only for slot
//     holders, which hold their connection and wait for neither; connection
//     waiters wait for holders that wait for nothing in the pool or only for
//     a slot; and a pin wait times out only when the slots are held (pinned)
//     that long.
//   - Release is only called at a safe point; Destroy otherwise.
//   - A waiter is touched by a grant only under the lock; AcquireParked
//     keeps a finished one for the next wait (so a parked wait allocates
//     nothing) and clears it under the lock.
//   - The manager's single mutex is never held while dialing, closing a
//     socket or doing any other I/O.
//
// When budgets shrink (Reconfigure) the invariants hold again once the excess
// in-use connections are released: idle excess is closed at once, in-use
// excess at its Release.
//
// # Hosts
//
// With Options.Hosts (server.hosts) every dial asks the hosts.Monitor
// where the application's target is, waiting for a host within its
// wait_timeout, and a connection to the wrong role (in_hot_standby at
// login) is refused and the monitor asked to check again. A connection
// remembers its host and the host's generation; it is handed out, and
// kept idle, only while the monitor finds it usable for its application's
// target. Revalidate, which the monitor's changes call, closes the idle
// connections that are not, and shuts down the sockets of connections in
// use on a host whose generation changed (Conn.Retired then tells their
// sessions why), except on a standby that is now the primary, where a
// session goes on as a direct one does. The leak sweep checks only connections to the primary
// (route.go).
//
// # Run-time limits
//
// SetLimit (limit.go) caps an application's MaxConnections and MaxPinned
// below the configured values, for package cluster, which shares budgets
// between instances; a reconfiguration keeps the cap. It works like a
// lowered budget, and after it returns the application's open count never
// rises above max(its count then, the cap): a slot is only reserved below
// the budget, and taking over one of its own idle connections keeps the
// count. DialGate is asked before every dial attempt (it may refuse it, or
// bound it with a deadline), and OnDial after every successful dial, before
// the connection is handed out (an error closes it and fails the dial).
//
// # Pause and the admin views
//
// Pause (the admin console's PAUSE) makes a paused application's Acquire
// wait, before it queues, until Resume, its WaitTimeout or its context;
// connections already handed out are untouched, and an Acquire of an
// application that is not paused pays one atomic load for the check
// (pause.go). DatabaseStats, IdleConns and WaitTotals (snapshot.go) give
// the console's SHOW POOLS, SHOW SERVERS and SHOW STATS their numbers.
//
// # Metrics
//
// When Options.Registerer is non-nil the Manager registers
//
//   - lockpool_server_connections{app,state} (gauge, state idle|active; read
//     under the lock at scrape time, so Acquire/Release pay nothing for it;
//     active = open - idle, i.e. in use, being dialed, checked or closed),
//   - lockpool_pool_wait_seconds{app} (histogram of the time each Acquire
//     spent queued behind other clients; observed for every Acquire that
//     reaches the queue decision, 0 when it did not have to wait, so the
//     _count is the number of acquires and the low bucket the share served
//     at once; dial time is not included; an AcquireWithPin's wait counts
//     from the moment a pin slot was free for it),
//   - lockpool_pin_waits_total{app,outcome} (counter, outcome
//     immediate|waited|timeout|canceled: one per AcquirePin or
//     AcquireWithPin call; an AcquireWithPin that timed out for a connection
//     with a slot free counts as a timeout here and in
//     lockpool_pool_wait_timeouts_total),
//   - lockpool_pool_wait_timeouts_total{app} (counter: Acquires that gave
//     up after wait_timeout),
//   - lockpool_pool_max_connections{app} and lockpool_pool_max_pinned{app}
//     (gauges: the budgets as configured now, read at scrape time, so alerts
//     can compare use with them),
//   - lockpool_server_unreachable (gauge: 1 from a dial that found
//     PostgreSQL unreachable until one succeeds; see [Manager.ServerReached],
//     which also logs the start and the end of such an outage once each).
//
// Per-application metric children are looked up once, when the application
// is added, never on the hot path.
package pool
