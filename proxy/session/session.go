package session

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/proxy/txcmd"
	"github.com/lockpool/lockpool/rewrite"
)

// stmt is a client's named prepared statement.
type stmt struct {
	name    string
	srvName string
	parse   []byte // Parse body after the statement name: query, parameter types
	client  []byte // the client's Parse body when lockpool rewrote it (parse is the rewrite); nil: the same
	find    rewrite.Findings
	begins  bool   // the statement opens a transaction block
	desc    uint64 // hash of the RowDescription the client was given (0: not described)
	fresh   bool   // answered lazily: prepare afresh at first use, never reuse an older server statement
	at      int64  // when the client prepared it (Unix microseconds): pg_prepared_statements.prepare_time
	params  []byte // its ParameterDescription's body, once the client was given one
}

// sessionExtras is the part of a session that few clients use: held
// advisory locks, lease calls and the statements lockpool answers itself,
// the names of parameters to read back, a stale statement found by a check.
// It is made at first use (session.more), so an idle client carries one
// pointer for all of it; the session stays in a smaller size class.
type sessionExtras struct {
	local     [numLocalKinds]local.Handler // per-session state of each kind of statement lockpool answers itself (handler.go)
	virt      map[string]*localStmtEntry   // the client's statements lockpool answers itself
	vportals  map[string]*localPortalEntry // their portals
	setNames  []string                     // parameters changed with SET: read back at the next idle point
	tagged    map[string]string            // portal -> command tag its Execute reports (portalTag); nil: none
	staleStmt *stmt                        // a check found this client statement's result type changed
	signals   uint8                        // signal functions a statement on the server calls (signalsTerminate, signalsCancel)
}

// more returns the session's extras, made at the first call.
func (s *Session) more() *sessionExtras {
	if s.extras == nil {
		s.extras = new(sessionExtras)
	}
	return s.extras
}

// errSessionEnd ends a session whose client was already told why.
var errSessionEnd = errors.New("session ended")

// session is one logged-in client. Everything in it belongs to the session
// coroutine, which reads the client, writes the server, and relays the
// server's replies; the few things other goroutines see live in link (the
// server link, under its own lock) and out (the client socket).
type Session struct {
	srv      *Shared
	loop     *evloop.Loop // the loop that runs the session
	co       *evloop.Co   // the coroutine running it now (nil while it rests)
	sock     *evloop.Conn // the client's socket (below TLS, if any)
	life     lifeState    // new, running, resting or ended (states.go)
	mustRead bool         // the client's socket is readable: read before resting again
	killed   *pgError     // a kill that reached the session while it rested
	done     func()       // runs once the session ended and cleaned up
	conn     net.Conn
	r        *wire.Reader
	out      clientOut
	app      *appstate.App
	user     string
	database string
	remote   string
	pid      uint32
	secret   uint32
	params   backend.ClientParams
	idleTx   time.Duration // idle_transaction_timeout (0: off)

	link serverLink // the server connection and its life cycle

	// The conversation with the server.
	q          replyQueue // replies the client is owed, in order
	sout       []byte     // buffered writes to the server
	srvScratch []byte     // server messages larger than the read buffer
	cout       []byte     // buffered writes to the client
	pos        position   // where the conversation with the server stands (states.go)
	watching   bool       // waiting in watchIdle: notifications to write interrupt the wait (deliverWake)
	// localTx is 'E' when a statement that opens a transaction block failed
	// before reaching a server: the client is in a failed transaction that
	// only lockpool knows, until ROLLBACK.
	localTx   byte
	localExit bool // localTx: the client prepared a transaction-ending statement

	// Pins.
	// Whether the session is pinned, and why, is the link's (link.pinned,
	// link.pinReason: the session writes them, setPinned).
	slot      *pinSlot // a pin slot held (taken before a statement that may lock, kept while pinned)
	pinWant   string   // why the statements since the last probe would pin (a policy's reason); "" none
	needProbe bool
	wantSlot  bool // a statement wants a pin slot and no server connection is attached: attach takes both together

	// Statements.
	unnamed      *rewrite.Findings // the last unnamed Parse's findings; nil or zero: none (made at the first hit, then reused)
	unnamedParse []byte            // the client's last unnamed Parse (query and types)
	unnamedHere  bool              // the attached connection has it
	unnamedBegin bool              // it opens a transaction block
	plainParses  *parseMemo        // recent unnamed Parses with nothing found: the same bytes again need no look (nil until the first)
	stmts        map[string]*stmt

	// Settings read back at the next idle point.
	setsPending  bool
	discarded    bool // a DISCARD ALL ran: the startup settings get their values back at the read-back
	dropPrepared bool // DEALLOCATE ALL / DISCARD ALL ran: the server forgot every prepared statement

	// extras is what few sessions use, made at first use (session.more).
	extras *sessionExtras

	connected int64            // when it logged in, Unix nanoseconds (SHOW CLIENTS)
	wakeFn    func(*evloop.Co) // s.wake, for GoOnReadable at each rest

	// drainAfterTx: the listeners were handed to a successor before this
	// client was served a statement; it is closed at the idle point after
	// its first one (package proxy: handoff.go). executed: it sent a Query, Execute or
	// FunctionCall. served: one of them ended at an idle point.
	drainAfterTx atomic.Bool
	executed     atomic.Bool
	served       atomic.Bool
}

func New(srv *Shared, conn net.Conn, br *bufio.Reader, as *appstate.App, user, database string, params map[string]string) *Session {
	// Carry over whatever the client sent after its login (pipelined
	// statements) into the session's own reader.
	var early []byte
	if n := br.Buffered(); n > 0 {
		early, _ = br.Peek(n)
	}
	remote := ""
	if ec, ok := conn.(interface{ RemoteString() string }); ok {
		remote = ec.RemoteString() // an event loop's connection: one allocation
	} else {
		remote = conn.RemoteAddr().String()
	}
	s := &Session{
		srv: srv, conn: conn, r: wire.NewReader(conn, srv.Bufs, early), app: as, user: user, database: database,
		remote: remote, pos: position{txStatus: 'I'},
	}
	s.out.conn = conn
	if _, isTLS := conn.(*tls.Conn); isTLS {
		// A read that times out may leave TLS state unusable: TLS clients
		// keep their buffer.
		s.r.SetReleaseAfter(0)
	}
	s.params.Init(params)
	return s
}

// SetLoop names the loop the session will run on, before it is
// registered where other goroutines find it: from then on a kill reaches
// it only through l (interrupt), never by closing the client's socket
// under its login, which goes on writing to it until Run.
func (s *Session) SetLoop(l *evloop.Loop) {
	s.link.mu.Lock()
	s.link.loop = l
	s.link.mu.Unlock()
}

// Run is the session's first coroutine: it binds the client's socket to co
// (the loop adopts it) and serves the client; done runs when the session
// has ended and cleaned up. co must be on the loop SetLoop named, if any.
func (s *Session) Run(co *evloop.Co, sock *evloop.Conn, done func()) {
	s.done = done
	s.wakeFn = s.wake // made once: a method value allocates
	s.link.mu.Lock()
	s.loop, s.sock, s.link.loop = co.Loop(), sock, co.Loop()
	s.link.mu.Unlock()
	s.app.Connected.Inc()
	s.resume(co)
}

// resume serves the client on co until the session ends or rests. A
// resting session (idle, holding no server connection, nothing buffered)
// has no coroutine and no stack: its loop starts a new coroutine on resume
// when the client's socket becomes readable.
func (s *Session) resume(co *evloop.Co) {
	s.co, s.life = co, lifeRunning
	if err := s.sock.Bind(co); err != nil {
		s.srv.Log.Debug("client socket stays outside the event loop", "client", s.remote, "err", err)
	}
	for !s.turn() {
		s.mustRead = true // unless it rests below: the client spoke meanwhile
		if s.loop.GoOnReadable(s.sock, s.wakeFn) {
			s.mustRead = false
			s.life = lifeResting
			s.co = nil
			s.r.Release()
			s.sock.Unbind()
			return
		}
	}
}

// wake resumes a resting session whose client's socket became readable:
// it reads at once, into a borrowed buffer, rather than asking whether it
// may rest again (a peek) and reading one byte without a buffer first.
func (s *Session) wake(co *evloop.Co) {
	s.mustRead = true
	s.r.Borrow()
	s.resume(co)
}

// interrupt ends the session with pe (a FATAL), on the loop goroutine: a
// running coroutine's current (or next) socket wait returns pe; a resting
// session is woken to say it.
func (s *Session) interrupt(pe *pgError) {
	switch {
	case s.life == lifeEnded:
	case s.life == lifeNew:
		// Still logging in (or its Run is on its way): its turn starts
		// with the FATAL.
		s.killed = pe
	case s.life == lifeResting:
		s.killed = pe
		if s.loop.StopOnReadable(s.sock) {
			s.loop.Go(s.resume)
		}
	case s.co != nil:
		// Its current or next socket wait ends with pe; should it come
		// to an idle point first (after an offloaded wait), it does not
		// rest but reads, and that wait ends it.
		s.killed = pe
		s.co.Interrupt(pe)
	}
}

// restable reports whether the session may rest: idle, with no server
// connection and nothing owed, on an adopted socket.
func (s *Session) restable() bool {
	return s.loop != nil && s.sock.Adopted() && s.link.sc == nil && s.q.len() == 0 && !s.pos.copyIn &&
		s.r.Buffered() == 0 && s.killed == nil && !s.mustRead
}

// turn reads and handles client messages until the session ends (true:
// it cleaned up) or may rest (false).
func (s *Session) turn() (ended bool) {
	defer func() {
		// A bug in one session ends that session, never the process.
		if v := recover(); v != nil {
			s.srv.Log.Error("session crashed", "app", s.app.Cfg.Name, "client", s.remote, "panic", v, "stack", string(debug.Stack()))
			s.out.end(nil, &pgError{Code: "XX000", Message: "lockpool: internal error", Hint: "This is a bug in lockpool; the connection is closed."})
			ended = true
		}
		if ended {
			s.life = lifeEnded
			s.cleanup()
			s.srv.Host.Unadmit(s.app)
			s.app.Connected.Dec()
			if s.done != nil {
				s.done()
			}
		}
	}()
	if pe := s.killed; pe != nil {
		s.end(pe)
		return true
	}
	cfg := s.srv.Host.Config()
	maxMsg := cfg.MaxMessageSize
	s.idleTx = cfg.IdleTransactionTimeout
	for {
		if s.r.Buffered() == 0 {
			s.sendIdle()
			if err := s.flushBatch(); err != nil {
				s.end(err)
				return true
			}
			if err := s.idle(); err != nil {
				s.end(err)
				return true
			}
			if s.restable() {
				return false
			}
		}
		typ, n, err := s.r.Header()
		s.mustRead = false
		if err != nil {
			var pe *pgError
			switch {
			case isTimeout(err) && s.idleInTransaction():
				s.end(pgerr.IdleInTransaction())
			case errors.Is(err, wire.ErrProtocol), errors.As(err, &pe):
				s.end(err) // a protocol error, or a kill's FATAL
			}
			return true
		}
		s.r.SetDeadline(time.Time{})
		if n > maxMsg && maxMsg > 0 {
			s.end(pgerr.MessageTooLarge(n, maxMsg))
			return true
		}
		if s.pos.skipping && typ != 'S' && typ != 'X' {
			if err := s.discard(n); err != nil {
				return true
			}
			continue
		}
		if err := s.dispatch(typ, n); err != nil {
			s.end(err)
			return true
		}
	}
}

// dispatch handles one client message.
func (s *Session) dispatch(typ byte, n int) error {
	if s.localTx != 0 {
		return s.inLocalFailedTx(typ, n)
	}
	switch typ {
	case 'X':
		return errSessionEnd
	case 'Q':
		s.markExecuted()
		return s.onQuery(n)
	case 'P':
		return s.onParse(n)
	case 'B':
		return s.onBind(n)
	case 'D':
		return s.onDescribe(n)
	case 'C':
		return s.onClose(n)
	case 'S':
		return s.onSync(n)
	case 'H':
		return s.onFlush(n)
	case 'E':
		s.markExecuted()
		return s.onExecute(n)
	case 'F':
		s.markExecuted()
		if err := s.toServer(replyQuery, opPass); err != nil {
			_ = s.discard(n)
			return s.attachFailed(err, true, false)
		}
		return s.forwardBody(typ, n)
	case 'd', 'c', 'f':
		if !s.pos.copyIn && !s.copyMayStart() {
			// No COPY runs or can start (none was asked for, or the server
			// ended it with an error): PostgreSQL ignores these, and so
			// does lockpool, whatever connection the session holds.
			return s.discard(n)
		}
		// Forwarded even before the server's CopyInResponse was relayed (a
		// client may send its data right after the COPY statement); the
		// server ignores COPY messages outside COPY.
		if typ != 'd' {
			if s.pos.copyIn {
				s.pos.copyIn = false
			} else if r := s.q.back(); r != nil && (r.kind == replyQuery || r.kind == replyExecute) {
				r.copyDone = true // the COPY ends before its CopyInResponse is relayed
			}
		}
		s.pos.copyData = true
		return s.forwardBody(typ, n)
	}
	return wire.ProtocolErrorf("invalid frontend message type %d", typ)
}

// copyMayStart reports whether the server may still answer a statement
// sent on the session's connection with a CopyInResponse: the last reply
// owed is a Query's or an Execute's.
func (s *Session) copyMayStart() bool {
	if s.link.sc == nil {
		return false
	}
	r := s.q.back()
	return r != nil && (r.kind == replyQuery || r.kind == replyExecute)
}

// markExecuted records that the client ran a statement (a load, no store,
// after the first).
func (s *Session) markExecuted() {
	if !s.executed.Load() {
		s.executed.Store(true)
	}
}

// end finishes a session that must stop: a FATAL error is the last thing
// the client gets, then its connection is closed.
func (s *Session) end(err error) {
	var pe *pgError
	switch {
	case errors.Is(err, errSessionEnd):
		s.out.end(s.cout, nil)
		return
	case errors.As(err, &pe):
	case errors.Is(err, wire.ErrProtocol):
		pe = pgerr.Protocol("%v", err)
	default:
		s.srv.Log.Debug("session ended", "app", s.app.Cfg.Name, "client", s.remote, "err", err)
		s.out.end(nil, nil)
		return
	}
	s.out.end(s.cout, pe)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// idleInTransaction reports whether the client is idle inside a
// transaction block on its server connection.
func (s *Session) idleInTransaction() bool {
	return s.link.sc != nil && s.pos.txStatus != 'I' && s.q.len() == 0
}

// idle prepares for a wait on the client: a pinned session's server is
// watched meanwhile (notifications, its death: watchIdle), and so is the
// server of a client idle inside a transaction block, which gets
// idle_transaction_timeout to speak.
func (s *Session) idle() error {
	if s.pos.copyIn && s.link.sc != nil {
		return s.watchCopy()
	}
	if s.link.sc == nil || s.q.len() > 0 {
		return nil
	}
	var deadline time.Time
	if s.idleTx > 0 && s.pos.txStatus != 'I' {
		deadline = time.Now().Add(s.idleTx)
		s.r.SetDeadline(deadline)
	}
	if s.pos.idle() && (s.link.pinned || s.app.SessionPool) {
		return s.watchIdle(false, time.Time{})
	}
	if s.pos.txStatus != 'I' && !s.pos.unsynced {
		// The server's death (a failover, a restart, a terminated
		// backend) reaches the client at once, as on a direct connection,
		// not at its next statement: its transaction and the
		// transaction-level locks it believes it holds are gone.
		return s.watchIdle(true, deadline)
	}
	return nil
}

// body reads and consumes the n-byte body of the message whose header was
// just read. It aliases the reader's buffer (or its scratch buffer for a
// large message) and is valid until the next read from the client.
func (s *Session) body(n int) ([]byte, error) { return s.r.Body(n) }

func (s *Session) discard(n int) error {
	_, err := s.r.Discard(n)
	return err
}

// attachAttempts bounds the server connections one attach takes when
// each is found closed by the server before anything of the client's was
// sent on it.
const attachAttempts = 3

// attach takes a server connection for this session if it has none, with
// a pin slot when a statement wants one (wantSlot). A connection that the
// server closed before anything of the client's was sent on it (found at
// the parameter sync, the first exchange on it: a switchover's shutdown
// ends idle backends, racing the pool's liveness check) is destroyed and
// another one taken, up to attachAttempts in all: nothing of the client's
// ran, so it costs the client time, not an error.
func (s *Session) attach() error {
	if s.link.sc != nil {
		return nil
	}
	for attempt := 1; ; attempt++ {
		withSlot := s.wantSlot
		closed, err := s.attachOnce()
		if err == nil || !closed || attempt == attachAttempts {
			return err
		}
		if withSlot && s.slot != nil {
			// Taken with the connection: waited for again with the next
			// one, as the wait order wants (no slot held while waiting
			// for a connection).
			s.slot.Release()
			s.slot, s.wantSlot = nil, true
		}
		s.srv.Log.Debug("server connection closed before the client's statement; taking another",
			"app", s.app.Cfg.Name, "client", s.remote, "attempt", attempt, "err", err)
	}
}

// attachOnce is one attempt of attach; closed reports that its error is
// the server closing the connection it took before the client's
// statement was sent.
func (s *Session) attachOnce() (closed bool, err error) {
	s.link.mu.Lock()
	draining := s.link.draining
	s.link.mu.Unlock()
	if draining {
		return false, errShutdown()
	}
	var sc *pool.Conn
	if s.wantSlot {
		var err error
		if sc, err = s.acquireWithPin(); err != nil {
			return false, err
		}
	} else if sc = s.srv.Pool.AcquireIdle(s.app.Cfg.Name, s.database, s.liveness()); sc == nil {
		var err error
		ctx := s.waitContext()
		if s.co != nil {
			sc, err = s.srv.Pool.AcquireParked(ctx, s.app.Cfg.Name, s.database, parkedWait{s.co})
		} else {
			sc, err = s.srv.Pool.Acquire(ctx, s.app.Cfg.Name, s.database)
		}
		s.endWait()
		if err != nil {
			return false, err
		}
	}
	s.bindServer(sc)
	sc.LastClient = s.remote
	st := backend.StateOf(sc)
	ps, err := s.syncParams(sc, st)
	if err != nil {
		closed := serverClosed(err)
		if closed {
			sc.Broken = true
			if sc.Gone == "" {
				sc.Gone = pool.ErrReason(err)
			}
		}
		s.destroyServer(sc)
		var pe *pgError
		if errors.As(err, &pe) {
			pe.Severity = "FATAL"
			return false, pe
		}
		return closed, err
	}
	if err := s.link.attach(sc, st); err != nil {
		s.releaseServer(sc)
		return false, err
	}
	s.unnamedHere = false
	s.pos.txStatus = 'I'
	s.pos.sawFatal = false
	s.cout = append(s.cout, ps...)
	return false, nil
}

// serverClosed reports whether err, from an exchange with a server
// connection, is the server having closed it (not a timeout).
func serverClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// acquireWithPin takes the pin slot a statement wants and a server
// connection together, waiting for both holding neither (parked in the
// session's loop, like a connection wait). The slot is the session's
// (s.slot) from then on; attachFailed gives it back should the statement
// not reach the server.
func (s *Session) acquireWithPin() (*pool.Conn, error) {
	s.wantSlot = false
	ctx := s.waitContext()
	var p pool.Parker
	if s.co != nil {
		p = parkedWait{s.co}
	}
	sc, err := s.srv.Pool.AcquireWithPin(ctx, s.app.Cfg.Name, s.database, p)
	s.endWait()
	if err != nil {
		s.needProbe, s.pinWant = false, ""
		return nil, err
	}
	s.slot = &pinSlot{pool: s.srv.Pool, app: s.app.Cfg.Name}
	return sc, nil
}

// toServer attaches a server connection if needed and records the reply
// the next message written to the server owes the client (none for kind
// 0). The caller then appends the message to sout.
func (s *Session) toServer(kind replyKind, op replyOp) error {
	if err := s.attach(); err != nil {
		return err
	}
	switch kind {
	case 0:
	case replyQuery:
		s.pos.askPending = true
	case replySync:
		s.pos.askPending = true
		s.pos.unsynced = false
	default:
		s.pos.unsynced = true
		s.pos.askPending = false
	}
	if kind != 0 {
		s.q.push(reply{kind: kind, op: op})
	}
	return nil
}

// expect records one more reply for a message the caller appends itself
// after toServer: the same rules, with a statement to forget on failure.
func (s *Session) expect(r reply) {
	s.q.push(r)
	s.pos.unsynced = true
	s.pos.askPending = false
}

// forwardBody forwards the n-byte body of a client message unchanged.
func (s *Session) forwardBody(typ byte, n int) error {
	s.sout = append(s.sout, typ, byte((n+4)>>24), byte((n+4)>>16), byte((n+4)>>8), byte(n+4))
	if n <= s.r.Size() {
		b, err := s.r.Peek(n)
		if err != nil {
			return err
		}
		s.sout = append(s.sout, b...)
		_, _ = s.r.Discard(n)
		return nil
	}
	// Large message: stream it through without holding it in memory.
	if err := s.writeServer(); err != nil {
		return err
	}
	sc := s.link.sc
	w := &errWriter{w: sc.Net}
	if d, ok := sc.Net.(*evloop.Conn); ok {
		w.w = drainingWriter{d, s.drainServer}
	}
	if _, err := io.CopyN(w, s.r, int64(n)); err != nil {
		if w.err != nil {
			return s.serverLost(w.err)
		}
		return err
	}
	return nil
}

// writeServer writes the buffered messages to the attached server.
func (s *Session) writeServer() error {
	if len(s.sout) == 0 {
		return nil
	}
	sc := s.link.sc
	if sc == nil {
		s.sout = s.sout[:0]
		return nil
	}
	if s.link.state == linkAttached {
		if err := s.link.to(linkRelaying); err != nil {
			return err
		}
	}
	// The bytes being written leave s.sout: a reply relayed meanwhile
	// (drainServer) may queue a message of its own for the server.
	out := s.sout
	s.sout = nil
	var err error
	d, ok := sc.Net.(*evloop.Conn)
	switch {
	case ok && s.pos.copyData:
		// COPY data goes now, relaying what the server says meanwhile.
		s.pos.copyData = false
		_, err = d.WriteDraining(out, s.drainServer)
	case ok:
		// Sent at the end of the loop's turn with the turn's other
		// writes (one io_uring submission); a failure shows at the next
		// read of the replies, which ends in serverLost as well. What is
		// too large to queue is written now, relaying the server's replies
		// meanwhile.
		_, err = d.WriteDeferredDraining(out, s.drainServer)
	default:
		_, err = sc.Net.Write(out)
	}
	s.app.Stats.ToServer(len(out))
	if len(s.sout) == 0 && cap(out) <= 64<<10 {
		s.sout = out[:0]
	}
	if s.pos.askPending {
		s.pos.asked = s.q.server
		s.pos.askPending = false
	}
	if err != nil {
		return s.serverLost(err)
	}
	return nil
}

// flushBatch sends what the client asked for, relays the server's replies
// to everything the server was asked to answer, and writes the client's
// replies.
func (s *Session) flushBatch() error {
	if err := s.writeServer(); err != nil {
		return err
	}
	if s.pos.asked > 0 && !s.pos.copyIn {
		if err := s.pump(); err != nil {
			return err
		}
	}
	return s.flushClient()
}

// flushClient writes the buffered replies to the client.
func (s *Session) flushClient() error {
	if len(s.cout) == 0 {
		return nil
	}
	err := s.out.write(s.cout)
	s.app.Stats.ToClient(len(s.cout))
	if cap(s.cout) > 64<<10 {
		s.cout = nil
	} else {
		s.cout = s.cout[:0]
	}
	return err
}

// settle brings the server conversation up to the message being handled:
// every earlier message is answered and its reply queued for the client, so
// that a reply lockpool makes itself can follow in order, and an error
// earlier in the batch is known (then s.pos.skipping is set).
func (s *Session) settle() error {
	if s.link.sc == nil || s.q.server == 0 && len(s.sout) == 0 {
		return nil
	}
	if s.q.server > 0 && !s.pos.askPending {
		s.sout = append(s.sout, 'H', 0, 0, 0, 4) // Flush: the server sends what it has
		s.pos.askPending = true
	}
	if err := s.writeServer(); err != nil {
		return err
	}
	if s.pos.asked > 0 && !s.pos.copyIn {
		return s.pump()
	}
	return nil
}

// pushLocal queues lockpool's own reply; it is written as soon as every
// reply before it was.
func (s *Session) pushLocal(b []byte, undo func()) {
	s.q.push(reply{kind: replyLocal, local: b, undo: undo})
	s.emitFront()
}

// emitFront moves lockpool's own replies that reached the front of the
// queue to the client's buffer.
func (s *Session) emitFront() {
	for {
		r := s.q.front()
		if r == nil || r.kind != replyLocal {
			return
		}
		s.cout = append(s.cout, r.local...)
		s.q.pop()
	}
}

// status is the transaction status the client sees now.
func (s *Session) status() byte {
	if s.localTx != 0 {
		return s.localTx
	}
	if s.link.sc == nil {
		return 'I'
	}
	return s.pos.txStatus
}

// attachFailed reports a failure to get a server connection. The client
// stays connected and may retry; a statement that opens a transaction block
// leaves it in a failed transaction, so that its next statements never run
// outside the block it asked for.
func (s *Session) attachFailed(err error, simple, begins bool) error {
	if s.link.sc == nil && (s.slot != nil || s.wantSlot) && !s.link.pinned {
		// A pin slot taken for this statement must not outlive it: nothing
		// ran, so nothing can be held.
		s.slot.Release()
		s.slot, s.wantSlot, s.needProbe, s.pinWant = nil, false, false, ""
	}
	var pe *pgError
	switch {
	case errors.As(err, &pe):
	case errors.Is(err, errSessionEnd):
		return err
	case errors.Is(err, pool.ErrPinTimeout):
		pe = policy.PinTimeout(s.app.Cfg.Name, s.app.Cfg.MaxPinned, s.app.Cfg.WaitTimeout.String())
	case errors.Is(err, pool.ErrWaitTimeout):
		pe = policy.PoolTimeout(s.app.Cfg.Name, s.app.Cfg.MaxConnections, s.app.Cfg.WaitTimeout.String())
	case errors.Is(err, context.Canceled):
		pe = errCanceled()
	case errors.Is(err, pool.ErrClosed):
		pe = errShutdown()
	default:
		pe = backend.LoginError(err, s.database, s.app.Cfg.Name).(*pgError)
	}
	if pe.Severity == "FATAL" {
		return pe
	}
	if begins {
		s.localTx = 'E'
	}
	return s.localError(pe, simple)
}

// localError answers an error with no server involved: with ReadyForQuery
// for a simple query, else by discarding until the client's Sync.
func (s *Session) localError(pe *pgError, simple bool) error {
	if ke := s.killedBy(); ke != nil {
		return ke // as in fail
	}
	buf := appendError(nil, 'E', pe)
	if simple {
		buf = wire.AppendReadyForQuery(buf, s.status())
	} else {
		s.pos.skipping = true
	}
	s.pushLocal(buf, nil)
	return nil
}

// fail answers a statement with an error, keeping the client's and the
// server's transaction states in agreement: with no server attached the
// error is lockpool's own; otherwise the server raises it, so that the
// server's transaction fails with it.
func (s *Session) fail(pe *pgError, simple bool) error {
	if ke := s.killedBy(); ke != nil {
		// A kill ended the wait that failed (it cancels waits in
		// lockpool): its FATAL is the answer, not the cancel's error.
		return ke
	}
	if s.link.sc == nil {
		return s.localError(pe, simple)
	}
	sql := backend.RaiseSQL(pe)
	if simple {
		if err := s.toServer(replyQuery, opPass); err != nil {
			return s.attachFailed(err, true, false)
		}
		s.sout = wire.AppendQuery(s.sout, sql)
		return nil
	}
	s.expect(reply{kind: replyParse, op: opSwallow})
	s.expect(reply{kind: replyBind, op: opSwallow})
	s.expect(reply{kind: replyExecute, op: opPass})
	s.sout = wire.AppendParse(s.sout, "", sql, nil)
	s.sout = wire.AppendBindExecute(s.sout, "")
	s.unnamedHere = false
	s.pos.skipping = true
	return nil
}

// analyze runs the prefilter and, on a hit, the lexer. sql aliases the
// read buffer: Analyze's results that are kept are copied by the caller.
// mayHit is the prefilter's answer: when it is false the statement changes
// no schema either (rewrite.ChangesSchema), so the caller need not ask.
func analyze(body []byte) (f rewrite.Findings, mayHit bool) {
	if len(body) == 0 {
		return rewrite.Findings{}, false
	}
	sql := unsafe.String(unsafe.SliceData(body), len(body))
	if !rewrite.MayHit(sql) {
		return rewrite.Findings{}, false
	}
	return rewrite.Analyze(strings.Clone(sql)), true
}

// decide maps findings to a policy decision for this session.
func (s *Session) decide(f *rewrite.Findings) policy.Decision {
	if !f.Advisory && len(f.State) == 0 {
		return policy.Decision{}
	}
	in := policy.Input{
		App:            s.app.Cfg.Name,
		AdvisoryLocks:  s.app.Advisory,
		SessionState:   s.app.SessionState,
		SessionPool:    s.app.SessionPool,
		SessionAcquire: f.SessionAcquire,
		Advisory:       f.Advisory,
		Unlock:         local.CallsUnlock(f),
		Holdable:       local.Holdable(f),
		AdvisoryPinned: (s.link.pinned || s.slot != nil || s.wantSlot) && s.pinWant == "advisory_lock",
		Pinned:         s.link.pinned,
	}
	for _, fn := range f.Funcs {
		if fn.SessionAcquire() {
			in.AcquireFunc = fn.String()
			break
		}
	}
	for _, c := range f.State {
		switch c.Kind {
		case rewrite.Listen:
			switch s.app.Listen {
			case policy.Reject:
				in.Listen = true
			case policy.Pin:
				if !in.State {
					in.State, in.StateKind = true, stateReason(c.Kind)
				}
			}
			// Shared: answered by lockpool (package local), nothing to pin.
		case rewrite.TempTable, rewrite.DeclareHold, rewrite.Prepare, rewrite.Load:
			if !in.State {
				in.State, in.StateKind = true, stateReason(c.Kind)
			}
		case rewrite.SetRole:
			if c.Name != "" && !in.State {
				in.State, in.StateKind = true, stateReason(c.Kind)
			} else {
				in.StateEnd = true
			}
		default:
			in.StateEnd = true
		}
	}
	return policy.Decide(in)
}

func stateReason(k rewrite.StateKind) string {
	switch k {
	case rewrite.Listen:
		return "listen"
	case rewrite.TempTable:
		return "temp_table"
	case rewrite.DeclareHold:
		return "cursor"
	case rewrite.Prepare:
		return "prepare"
	case rewrite.SetRole:
		return "role"
	case rewrite.Load:
		return "load"
	}
	return "state"
}

// apply carries out a decision before the statement is forwarded. It
// returns false when the statement was answered with an error instead.
func (s *Session) apply(d policy.Decision, f *rewrite.Findings, simple bool) (bool, error) {
	switch d.Action {
	case policy.Refuse:
		for _, fn := range f.Funcs {
			if fn.SessionAcquire() {
				s.app.Rejected(fn.String())
			}
		}
		return false, s.fail(d.Err, simple)
	case policy.PinFirst:
		if s.slot == nil && s.link.sc == nil {
			// Outside a server connection the slot comes with the
			// connection (attach): waiting for it holds neither.
			s.wantSlot = true
		} else if s.slot == nil {
			// The session holds its connection (inside a transaction, or
			// mid-batch): it waits for a slot only, and takes a free one
			// ahead of sessions that wait holding nothing (pool.AcquirePin).
			ctx := s.waitContext()
			var err error
			s.offload(func() { err = s.srv.Pool.AcquirePin(ctx, s.app.Cfg.Name) })
			s.endWait()
			if err != nil {
				var pe *pgError
				switch {
				case errors.Is(err, pool.ErrPinTimeout):
					pe = policy.PinTimeout(s.app.Cfg.Name, s.app.Cfg.MaxPinned, s.app.Cfg.WaitTimeout.String())
				case errors.Is(err, context.Canceled):
					pe = errCanceled()
				default:
					pe = &pgError{Code: "53300", Message: "lockpool: cannot take a pin slot: " + err.Error(), Hint: "Retry later."}
				}
				return false, s.fail(pe, simple)
			}
			s.slot = &pinSlot{pool: s.srv.Pool, app: s.app.Cfg.Name}
		}
		s.needProbe = true
		if s.pinWant == "" {
			s.pinWant = d.Reason
		}
	case policy.Probe:
		s.needProbe = true
	}
	return true, nil
}

// liveness is how the pool checks an idle connection for this session:
// from a coroutine, by what its loop's epoll reported (pool.Liveness);
// otherwise nil (the pool peeks).
func (s *Session) liveness() pool.Liveness {
	if s.co == nil {
		return nil
	}
	return s.co
}

// offload runs fn, which may wait on something other than this session's
// own sockets: a pool or pin-slot wait, a lease or lock call on another
// PostgreSQL connection, a dial. Every such wait goes through offload, so
// that a session driven by an event loop never stalls the other sessions of
// its loop (see doc.go).
func (s *Session) offload(fn func()) {
	if s.co == nil {
		fn()
		return
	}
	s.co.Offload(fn)
}

// waitContext returns the context for a wait in lockpool (a connection, a
// pin slot, a lease) that a CancelRequest ends; call endWait after.
// The context is reused until a cancel request ends it, so a wait costs
// no allocation.
func (s *Session) waitContext() context.Context {
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	if s.link.waitCtx == nil {
		s.link.waitCtx, s.link.waitStop = context.WithCancel(s.srv.Base)
	}
	s.link.waiting = true
	s.link.waitCo = s.co
	return s.link.waitCtx
}

// parkedWait is the session's coroutine as the pool's Parker. The context
// of its waits is the session's waitCtx, whose end wakes the coroutine
// (serverLink.stopWaitLocked, for a cancel request or a kill; its parent,
// the server's base context, ends only after every session has), so the
// pool need not watch it (pool.CancelParker).
type parkedWait struct{ *evloop.Co }

// WakesOnCancel implements pool.CancelParker.
func (parkedWait) WakesOnCancel() bool { return true }

func (s *Session) endWait() {
	s.link.mu.Lock()
	s.link.waiting = false
	s.link.waitCo = nil
	s.link.mu.Unlock()
}

// cancelRunning handles a CancelRequest for this session (on the cancel
// connection's goroutine). A wait in lockpool (for a connection, a pin slot,
// a lease) ends with 57014. A statement of the client's running on the
// server is cancelled there; the link records the cancel in flight
// (serverLink.cancelling) and the session neither gives the connection back
// nor probes it before PostgreSQL has taken the cancel (awaitCancel), so
// the cancel cannot reach another client's work, and a backend that
// finished meanwhile ignores a cancel that arrives while it is idle. The
// link's lock is not held while the cancel connection is dialed: the
// session's loop never waits on a dial.
func (s *Session) CancelRunning(ctx context.Context) {
	s.link.mu.Lock()
	if s.link.waiting {
		s.link.stopWaitLocked()
	}
	if s.link.state != linkRelaying || s.link.sc == nil || s.link.cancelling != nil {
		s.link.mu.Unlock()
		return // nothing of the client's runs on the server, or a cancel is on its way
	}
	sc, done := s.link.sc, make(chan struct{})
	s.link.cancelling = done
	s.link.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if err := s.srv.Pool.Cancel(cctx, sc); err != nil {
		s.srv.Log.Debug("cancel failed", "err", err)
	}
	cancel()
	s.link.mu.Lock()
	s.link.cancelling = nil
	s.link.mu.Unlock()
	close(done)
}

// awaitCancel waits (offloaded) until no cancel request for the client's
// statement is in flight; see cancelRunning.
func (s *Session) awaitCancel() {
	if done := s.link.cancelInFlight(); done != nil {
		s.offload(func() { <-done })
	}
}

// onQuery handles a simple Query.
func (s *Session) onQuery(n int) error {
	body, err := s.body(n)
	if err != nil {
		return err
	}
	q, err := wire.ParseQuery(body)
	if err != nil {
		return err
	}
	f, mayHit := analyze(q.SQL)
	if s.extras != nil {
		s.beforeCommit(q.SQL)
	}
	if !f.Hit() {
		if mayHit && changesSchema(q.SQL) {
			s.srv.Stmts.Retire()
		}
		if err := s.toServer(replyQuery, opPass); err != nil {
			begins := txcmd.Of(q.SQL) == txcmd.Begin
			return s.attachFailed(err, true, begins)
		}
		// body aliases the read buffer; nothing read the client since.
		s.sout = wire.AppendFrame(s.sout, 'Q', body)
		return nil
	}
	sql := string(q.SQL)
	d := s.decide(&f)
	if h := s.claim(&f, d); h != nil {
		return s.answerQuery(h, &f, sql)
	}
	if changesSchema([]byte(sql)) {
		s.srv.Stmts.Retire()
	}
	if deallocates(&f) && s.deallocate(&f, true) {
		return nil
	}
	s.noteFallback(d, sql)
	ok, err := s.apply(d, &f, true)
	if !ok || err != nil {
		return err
	}
	sql, tags := s.rewriteStatements(sql, &f, s.pos.txStatus == 'I' && s.localTx == 0 && f.Statements == 1)
	if f.LeaseFence && s.srv.Leases != nil {
		sql = rewrite.RewriteFence(sql, s.srv.Leases.Schema())
	}
	s.trackSets(&f)
	if tags != nil && len(f.State) > 0 {
		s.beforeImplicitCommit(&f)
	}
	if err := s.toServer(replyQuery, opPass); err != nil {
		return s.attachFailed(err, true, txcmd.Of([]byte(sql)) == txcmd.Begin)
	}
	s.q.back().tags = tags
	s.expectNotifies(&f, nil)
	s.expectSignals(&f)
	s.sout = wire.AppendQuery(s.sout, sql)
	return nil
}

// onSync handles Sync.
func (s *Session) onSync(n int) error {
	if err := s.discard(n); err != nil {
		return err
	}
	failed := s.pos.skipping
	s.pos.skipping = false
	if s.link.sc == nil && (s.slot != nil || s.wantSlot) && !s.link.pinned {
		// Nothing ran on a server: nothing can be held.
		s.slot.Release()
		s.slot, s.wantSlot, s.needProbe, s.pinWant = nil, false, false, ""
	}
	if s.link.sc == nil {
		s.pos.unsynced = false
		if l := s.listeningOf(); l != nil {
			if err := l.Ready(s, s.status(), failed); err != nil {
				return err
			}
		}
		s.pushLocal(wire.AppendReadyForQuery(nil, s.status()), nil)
		return nil
	}
	if s.extras != nil {
		s.beforeImplicitCommit(nil)
	}
	if err := s.toServer(replySync, opPass); err != nil {
		return s.attachFailed(err, false, false)
	}
	s.sout = append(s.sout, 'S', 0, 0, 0, 4)
	return nil
}

// onFlush handles Flush: the server sends what it has, and so does lockpool.
func (s *Session) onFlush(n int) error {
	if err := s.discard(n); err != nil {
		return err
	}
	if s.link.sc != nil {
		s.sout = append(s.sout, 'H', 0, 0, 0, 4)
		s.pos.askPending = true
	}
	return nil
}

// drain is called at shutdown (from another goroutine): an idle client is
// told and closed now, a client inside a transaction at its end. After a
// Handoff, a client that was not served a statement yet runs one first.
func (s *Session) Drain() {
	s.link.mu.Lock()
	// A client watched inside a transaction block is not idle: it ends at
	// the transaction's end, as one whose statement runs.
	idle := s.link.state == linkDetached || s.link.state == linkWatched && !s.link.watchedInTx
	if !s.served.Load() && s.srv.Host.HandedOff() {
		// Idle, in a prepare round trip, or its first statement is on its way.
		s.drainAfterTx.Store(true)
		s.link.mu.Unlock()
		return
	}
	s.link.draining = true
	s.link.mu.Unlock()
	if idle {
		s.kill(errShutdown())
	}
}

// kill ends the session with a FATAL error (from another goroutine): its
// loop interrupts it (interrupt), and the session writes the FATAL last and
// cleans up. A session given no loop yet (neither SetLoop nor Run) has its
// FATAL written here.
func (s *Session) kill(pe *pgError) {
	s.link.mu.Lock()
	l := s.link.loop
	fatal := pe.Fatal()
	if s.link.killErr == nil {
		// Set before the waits are cancelled: a wait that ends now
		// answers with this FATAL, not with the cancel's 57014, even
		// before the posted interrupt has run (killedBy).
		s.link.killErr = fatal
	}
	if l == nil {
		s.out.end(nil, pe)
	} else {
		l.Post(func() { s.interrupt(fatal) })
	}
	s.link.mu.Unlock()
	s.stopWait() // a wait in lockpool (offloaded: a held-lock wait) ends too
}

// stopWait ends a wait in lockpool of a session that another goroutine
// is closing (kill): a held lock's wait has no bound of its own, and the
// session goroutine must get to its cleanup.
func (s *Session) stopWait() {
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	if s.link.waiting {
		s.link.stopWaitLocked()
	}
}

// killedBy returns the FATAL of a kill of the session, or nil: the one the
// loop delivered, or one on its way (a kill cancels the session's waits at
// once and posts its interrupt to the loop).
func (s *Session) killedBy() *pgError {
	if s.killed != nil {
		return s.killed
	}
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	return s.link.killErr
}

// exchangeBroken ends the session after one of lockpool's own exchanges
// with the client's server connection, inside the client's transaction
// block, did not complete cleanly: with the kill's FATAL when a kill ended
// it, otherwise as a lost server connection (08006; the connection is
// destroyed and the client's transaction is gone).
func (s *Session) exchangeBroken(err error) *pgError {
	if ke := s.killedBy(); ke != nil {
		return ke
	}
	var pe *pgError
	if errors.As(s.serverLost(err), &pe) && pe.IsFatal() {
		return pe
	}
	return pgerr.ConnectionLost(s.link.pinned || s.slot != nil).Fatal()
}

// cleanup runs when the session ends, however it ends.
func (s *Session) cleanup() {
	s.srv.Host.Unregister(s)
	s.link.mu.Lock()
	s.link.stopWaitLocked()
	s.link.mu.Unlock()
	sc := s.link.sc
	lost := s.link.state == linkLost
	// A link left probing is one whose own exchange with the server (probe,
	// read-back) stopped half way: replies are unread, so it is not clean.
	midExchange := s.link.state == linkProbing
	clean := !lost && !midExchange && s.pos.clean(s.q.server)
	busy := s.q.server > 0 || s.pos.unsynced
	_ = s.link.to(linkClosing)
	s.link.detach()
	if sc != nil && clean {
		s.awaitCancel()
	}
	if sc != nil {
		switch {
		case clean && (s.link.pinned || s.app.SessionPool || s.slot != nil):
			if s.resetServer(sc) {
				s.releaseServer(sc)
			} else {
				s.destroyServer(sc)
			}
		case clean:
			s.releaseServer(sc)
		case busy && !lost:
			// A statement may still run (a lock wait, say): cancel it so
			// the backend notices its client is gone and ends now, not
			// when the statement would have finished.
			s.offload(func() {
				ctx, cancel := context.WithTimeout(s.srv.Base, 2*time.Second)
				_ = s.srv.Pool.Cancel(ctx, sc)
				cancel()
			})
			s.destroyServer(sc)
		default:
			s.destroyServer(sc)
		}
	}
	s.setPinned(false, "")
	s.slot.Release()
	s.slot, s.wantSlot = nil, false
	s.endHandlers()
	s.out.end(nil, nil)
	// The read buffer goes back to the pool (when nothing is left in it):
	// a client that connects for one transaction would otherwise cost a
	// buffer's allocation, and its garbage, per connection.
	s.r.Release()
	s.srv.Host.Ended(s)
}
