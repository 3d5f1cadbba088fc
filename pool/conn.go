package pool

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/wire"
)

// readerSize is the size of the read buffer every Conn's Reader keeps.
const readerSize = 16 << 10

// livenessAfter is how long a connection must have been idle before it is
// checked (one non-blocking peek) when handed out. Connections handed over
// within a millisecond (a busy pool) skip the syscall; anything idle longer
// (long enough for a terminated backend to have said so) is checked.
const livenessAfter = time.Millisecond

// terminateTimeout bounds the write of the Terminate message when a
// connection is closed at a safe point.
const terminateTimeout = time.Second

// Conn is one server connection, logged in and idle at the protocol level
// when handed out (ReadyForQuery 'I' already consumed).
type Conn struct {
	Net           net.Conn          // raw socket (after login, TLS if negotiated); the proxy reads/writes it directly
	Reader        *wire.Reader      // 16 KiB reader on Net owned by this conn; all server messages are read through it (it never sets a read deadline: whoever sets one on Net clears it)
	PID           uint32            // backend process id
	SecretKey     []byte            // cancel key from BackendKeyData
	App           string            // application name
	Database      string            // database the connection is logged in to
	User          string            // role the connection is logged in as
	StartupParams map[string]string // ParameterStatus at login (read-only, may be shared)
	LastClient    string            // set by the proxy for attribution
	Broken        bool              // set by the proxy on I/O error: Release then destroys
	// Gone, set by the proxy, says the server ended this connection (the
	// FATAL's "SQLSTATE message", or the read error): Destroy and Release
	// count it as lost (Manager.ServerLost).
	Gone string
	// Aux is the proxy's own bookkeeping for this connection (parameter
	// values, prepared statements); the pool never looks at it.
	Aux any

	pool      *appPool
	state     connState
	created   time.Time
	idleSince time.Time
	gen       uint64        // appPool.gen at dial time (login credentials)
	srvGen    uint64        // Manager.srvGen at dial time (server address)
	srv       config.Server // the server it was dialed to (for Cancel)
	// keepInstSlot: closing this conn frees its application slot only; its
	// instance slot was handed to another application's dial.
	keepInstSlot bool
	// early holds what a dial read past the login's ReadyForQuery; the
	// Reader returns it first.
	early []byte

	ep      hosts.Endpoint // the host it was dialed to (Options.Hosts; route.go)
	retired atomic.Bool    // ended by Revalidate: its host was replaced
	kill    *killSwitch    // shuts the socket down from another goroutine (nil: not a socket of ours)
	gone    bool           // closeSocket ran
}

type connState uint8

const (
	stateNew      connState = iota // returned by Dial, not yet registered
	stateIdle                      // in an idle stack
	stateInUse                     // handed out to a holder (or to a waiter in flight)
	stateChecking                  // taken out of idle by SweepIdle
	stateClosing                   // removed, socket being closed, still counted
	stateClosed                    // gone (or its slot was transferred to a dialer)
)

// newReader returns a server connection's Reader: it keeps its buffer for
// the life of the connection (no release delay, so it never touches the
// read deadline) and starts with early, bytes already read from nc.
func newReader(nc net.Conn, bufs *wire.BufferPool, early []byte) *wire.Reader {
	r := wire.NewReader(nc, bufs, early)
	r.SetReleaseAfter(0)
	r.Borrow()
	return r
}

var terminateMsg = []byte{'X', 0, 0, 0, 4}

// closeSocket closes the socket. graceful sends Terminate first (only at a
// safe point: the server is waiting for a new message).
func (c *Conn) closeSocket(graceful bool) {
	if c.gone {
		return
	}
	c.gone = true
	c.kill.close()
	if c.ep.Host != nil {
		c.ep.Closed()
	}
	if c.Net == nil {
		return
	}
	if graceful {
		_ = c.Net.SetWriteDeadline(time.Now().Add(terminateTimeout))
		_, _ = c.Net.Write(terminateMsg)
	}
	_ = c.Net.Close()
}

// alive reports whether an idle connection still looks usable: no byte is
// waiting to be read (an idle server sends nothing; a FATAL before a restart
// or an EOF means it is gone) and the socket is not closed. It never blocks
// for long: on sockets it peeks with MSG_DONTWAIT; on other net.Conns it
// reads with a 1 ms deadline.
//
// Note: SetReadDeadline(time.Now()) followed by a Read does NOT work for
// this on TCP: the runtime returns the timeout before trying the read
// syscall when the deadline has already passed, so a closed peer looks
// alive. Hence the peek.
func (c *Conn) alive() bool {
	if c.Reader != nil && c.Reader.Buffered() > 0 {
		return false
	}
	// A deadline left in the past would make the peek fail without looking.
	if err := c.Net.SetReadDeadline(time.Time{}); err != nil {
		return false
	}
	if ok, handled := peekAlive(c.Net); handled {
		return ok
	}
	return deadlineAlive(c)
}

// aliveAfterIdle reports whether c, idle since c.idleSince, may be handed
// out. lv, when it knows (an event loop's record of the socket), answers
// with no system call and is always asked; otherwise a connection idle
// longer than livenessAfter is peeked (alive).
func (c *Conn) aliveAfterIdle(lv Liveness, now func() time.Time) bool {
	if c.idleSince.IsZero() {
		return true
	}
	if lv != nil {
		if quiet, known := lv.Quiet(c.Net); known {
			return quiet && (c.Reader == nil || c.Reader.Buffered() == 0)
		}
	}
	return now().Sub(c.idleSince) <= livenessAfter || c.alive()
}

// deadlineAlive is the portable fallback: a Peek with a 1 ms deadline. A
// timeout means alive; the Reader keeps no timeout error, so it stays
// usable afterwards.
func deadlineAlive(c *Conn) bool {
	if err := c.Net.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		return false
	}
	_, err := c.Reader.Peek(1)
	if rerr := c.Net.SetReadDeadline(time.Time{}); rerr != nil {
		return false
	}
	if err == nil {
		return false // unexpected data from an idle server
	}
	return isTimeout(err)
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
