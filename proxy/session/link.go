package session

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/backend"
)

// linkState is the life cycle of a session's server link.
type linkState uint8

const (
	linkDetached linkState = iota // no server connection
	linkAttached                  // a server connection, nothing of the client's running on it
	linkRelaying                  // the client's messages are on the server; replies are owed
	linkProbing                   // lockpool's own statements run (lock probe, setting read-back)
	linkWatched                   // the client is idle and pinned, or idle in a transaction block: watchIdle waits on both sockets
	linkLost                      // the server connection died
	linkClosing                   // the session is ending
)

var linkStateNames = [...]string{"detached", "attached", "relaying", "probing", "watched", "lost", "closing"}

func (st linkState) String() string {
	if int(st) < len(linkStateNames) {
		return linkStateNames[st]
	}
	return fmt.Sprintf("linkState(%d)", uint8(st))
}

// linkMoves lists the legal transitions: linkMoves[from] has bit to set.
var linkMoves = [...]uint8{
	linkDetached: 1<<linkAttached | 1<<linkClosing,
	linkAttached: 1<<linkRelaying | 1<<linkProbing | 1<<linkWatched | 1<<linkDetached | 1<<linkLost | 1<<linkClosing,
	linkRelaying: 1<<linkAttached | 1<<linkProbing | 1<<linkLost | 1<<linkClosing,
	linkProbing:  1<<linkAttached | 1<<linkLost | 1<<linkClosing,
	linkWatched:  1<<linkAttached | 1<<linkLost | 1<<linkClosing,
	linkLost:     1<<linkDetached | 1<<linkClosing,
	linkClosing:  1 << linkClosing,
}

// serverLink is a session's hold on a server connection. The session
// coroutine owns it and is the only writer; the fields other goroutines
// read (state, sc, the pin, the coroutine) change under mu, so a cancel
// request, shutdown or the admin server sees a consistent view.
type serverLink struct {
	mu    sync.Mutex
	state linkState
	sc    *pool.Conn
	st    *backend.State
	loop  *evloop.Loop // the session's loop, once it runs there (kill posts to it)

	// The session's pin: whether it is pinned, why, since when. The
	// session is their only writer (setPin) and reads them without mu.
	pinned      bool
	pinReason   string
	pinnedSince time.Time
	// watchedInTx: watched while idle inside a transaction block, which a
	// drain lets end as it does a running statement's.
	watchedInTx bool

	draining bool               // shutdown: end the session at its next idle point
	waiting  bool               // the session waits in lockpool (connection, pin slot, lease)
	waitCtx  context.Context    // the context of such waits, reused until a cancel request ends it
	waitStop context.CancelFunc // ends waitCtx
	waitCo   *evloop.Co         // the session's coroutine while it waits: woken when waitCtx ends (stopWaitLocked)
	killErr  *pgError           // the FATAL of a kill (session.kill), set before it cancels the waits
	// cancelling is closed when the cancel request in flight for the
	// client's statement has been delivered to PostgreSQL (or failed); nil
	// when none is. The session gives the connection back (or probes it)
	// only after that, so a cancel never reaches the next holder's work.
	cancelling chan struct{}
}

// to moves the link to next and returns an error for a move the life
// cycle does not allow (a bug: the session ends with it).
func (l *serverLink) to(next linkState) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.toLocked(next)
}

func (l *serverLink) toLocked(next linkState) error {
	if l.state == next {
		return nil
	}
	if linkMoves[l.state]&(1<<next) == 0 {
		return fmt.Errorf("lockpool: internal error: server link cannot go from %s to %s", l.state, next)
	}
	l.state = next
	return nil
}

// watch moves the link to watched; inTx says the client is idle inside a
// transaction block.
func (l *serverLink) watch(inTx bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.toLocked(linkWatched); err != nil {
		return err
	}
	l.watchedInTx = inTx
	return nil
}

// attach records a newly acquired connection. It refuses when the server
// is shutting down, atomically with drain's check, so a drained session
// never starts new work.
func (l *serverLink) attach(sc *pool.Conn, st *backend.State) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining {
		return errShutdown()
	}
	if err := l.toLocked(linkAttached); err != nil {
		return err
	}
	l.sc, l.st = sc, st
	return nil
}

// settle moves the link from relaying to attached (the server owes
// nothing) and returns, under the same lock, the cancel in flight (nil:
// none), which the session waits for before it gives the connection back
// or probes it.
func (l *serverLink) settle() (cancelling chan struct{}, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.toLocked(linkAttached); err != nil {
		return nil, err
	}
	return l.cancelling, nil
}

// cancelInFlight returns the channel closed when the cancel request in
// flight ends, or nil when none is.
func (l *serverLink) cancelInFlight() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cancelling
}

// detach forgets the connection (given back, destroyed or lost).
func (l *serverLink) detach() *pool.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	sc := l.sc
	if l.state != linkClosing {
		l.state = linkDetached
	}
	l.sc, l.st = nil, nil
	return sc
}

// setPin records the pin state shown by the admin server.
func (l *serverLink) setPin(pinned bool, reason string) {
	l.mu.Lock()
	l.pinned, l.pinReason = pinned, reason
	if pinned {
		l.pinnedSince = time.Now()
	} else {
		l.pinnedSince = time.Time{}
	}
	l.mu.Unlock()
}

// pinSlot is a pin slot taken from the pool; Release is idempotent.
type pinSlot struct {
	pool     *pool.Manager
	app      string
	released atomic.Bool
}

// Release gives the slot back (once, however often it is called).
func (p *pinSlot) Release() {
	if p != nil && p.released.CompareAndSwap(false, true) {
		p.pool.ReleasePin(p.app)
	}
}

// clientOut is the one road to the client's socket. The session coroutine
// writes replies through it (and, before the coroutine runs, a kill writes
// its FATAL through it), so writes never interleave. Once a FATAL went out
// nothing else does.
type clientOut struct {
	mu     sync.Mutex
	conn   net.Conn
	closed bool
}

// write writes b. A failed write closes the client.
func (c *clientOut) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	var err error
	if d, ok := c.conn.(*evloop.Conn); ok {
		_, err = d.WriteDeferred(b) // written with the loop turn's other replies
	} else {
		_, err = c.conn.Write(b)
	}
	if err != nil {
		c.closed = true
		_ = c.conn.Close()
		return err
	}
	return nil
}

// copyFrom streams n bytes from r to the client after head (a large
// message relayed without holding it in memory).
func (c *clientOut) copyFrom(head []byte, r io.Reader, n int) (clientErr, srcErr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed, nil
	}
	if _, err := c.conn.Write(head); err != nil {
		c.closed = true
		_ = c.conn.Close()
		return err, nil
	}
	w := &errWriter{w: c.conn}
	_, err := io.CopyN(w, r, int64(n))
	if w.err != nil {
		c.closed = true
		_ = c.conn.Close()
		return w.err, nil
	}
	return nil, err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// end writes pending, then pe (when not nil: the FATAL that ends the
// session), and closes the client. Nothing is written after it.
func (c *clientOut) end(pending []byte, pe *pgError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	if pe != nil {
		pending = appendError(pending, 'E', pe.Fatal())
	}
	if len(pending) > 0 {
		_ = c.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.conn.Write(pending)
	}
	_ = c.conn.Close()
}

// stopWaitLocked ends the context of the session's waits (a new one is made
// for the next wait) and wakes the session's coroutine should it be parked
// in the pool (it then sees the context ended: parkedWait). Call it with mu
// held.
func (k *serverLink) stopWaitLocked() {
	if k.waitStop == nil {
		return
	}
	k.waitStop()
	k.waitCtx, k.waitStop = nil, nil
	if k.waitCo != nil {
		k.waitCo.Unpark()
	}
}
