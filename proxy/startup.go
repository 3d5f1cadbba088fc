package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lockpool/lockpool/auth"
	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/appstate"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/session"
	"github.com/lockpool/lockpool/proxy/startupparam"
)

// Startup packet codes.
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
	protocol30        = 3 << 16
	// maxStartupLen is PostgreSQL's MAX_STARTUP_PACKET_LENGTH: the longest
	// startup packet body (the packet without its length word).
	maxStartupLen = 10000
)

// startupReadBuf is the read buffer of the startup and login phase (the
// session then reads through its own wire.Reader).
const startupReadBuf = 512

// loginCtx is where one connection's login runs: on a coroutine of an event
// loop (co set: the loop accepted it, Serve), or on a goroutine of its own
// (co nil: a listener the loops cannot take). On a coroutine, whatever may
// block on something other than the client's socket (a lookup in
// PostgreSQL, a dial, a TLS handshake's CPU, a cancel request forwarded) is
// offloaded to a goroutine while the loop serves others.
type loginCtx struct {
	co   *evloop.Co
	sock *evloop.Conn
	// loop is where the session will run (co's loop, or the one a
	// goroutine's login hands it to): the session is on it from its
	// registration, so a kill during the rest of the login goes through
	// the loop and never closes the socket under the login's writes.
	loop *evloop.Loop
	// final is the SASL final message of a SCRAM exchange, sent with what
	// follows it (AuthenticationOk and the startup answer, or the error)
	// in one write.
	final []byte
}

// offload runs fn where it may block: on a goroutine of its own while the
// coroutine waits, or in place without one.
func (lc *loginCtx) offload(fn func()) {
	if lc.co == nil {
		fn()
		return
	}
	lc.co.Offload(fn)
}

// detached runs fn, which uses the client's socket, on a goroutine of its
// own with the socket unbound from the coroutine (its reads and writes then
// wait in poll(2)), and binds the socket again after.
func (lc *loginCtx) detached(fn func()) error {
	if lc.co == nil {
		fn()
		return nil
	}
	lc.sock.Unbind()
	lc.co.Offload(fn)
	return lc.sock.Bind(lc.co)
}

// handleConn runs one client connection accepted on a goroutine (a listener
// the event loops do not take, see Serve): its login here, then its session
// on an event loop.
func (s *Server) handleConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		_ = tc.SetKeepAlive(true)
	}
	// Wrapped below TLS: the session's loop adopts the socket after login.
	sock := evloop.Wrap(nc)
	l := s.pickLoop()
	s.gate.enter()
	ss, kept := s.loginConn(&loginCtx{sock: sock, loop: l}, time.Now())
	s.gate.leave()
	if ss == nil {
		if !kept {
			_ = sock.Close()
		}
		return
	}
	// The session runs as a coroutine of an event loop, on a fresh stack
	// (login, SCRAM and TLS grew this goroutine's).
	s.wg.Add(1)
	l.Post(func() {
		l.Go(func(co *evloop.Co) {
			ss.Run(co, sock, func() {
				_ = sock.Close()
				s.wg.Done()
			})
		})
	})
}

// serveLogin runs the login of a connection an event loop accepted, on a
// coroutine of that loop, and then its session on the same coroutine. The
// login pipeline (loginGate) started it; the connection counts in s.wg.
func (s *Server) serveLogin(co *evloop.Co, sock *evloop.Conn, at time.Time) {
	var ss *session.Session
	kept := false
	if err := sock.Bind(co); err != nil {
		s.log.Debug("client socket not taken by the event loop", "client", sock.RemoteAddr().String(), "err", err)
	} else {
		s.logins.add(co)
		ss, kept = s.loginConn(&loginCtx{co: co, sock: sock, loop: co.Loop()}, at)
		s.logins.remove(co)
	}
	s.gate.done()
	if ss == nil {
		if !kept {
			_ = sock.Close()
		}
		s.wg.Done()
		return
	}
	ss.Run(co, sock, func() {
		_ = sock.Close()
		s.wg.Done()
	})
}

// loginConn runs a client connection's startup and login, accepted at at.
// It returns the session when the client logged in, or nil after the client
// got its error (the caller closes the socket), or nil and kept when the
// connection went on elsewhere (an admin console on its own goroutine).
// Whatever ends a login early, an error is the last message the client gets.
func (s *Server) loginConn(lc *loginCtx, at time.Time) (ss *session.Session, kept bool) {
	nc := lc.sock
	rc := s.rc.Load()
	if login := rc.cfg.ClientLoginTimeout; login > 0 {
		_ = nc.SetDeadline(at.Add(login))
	}
	conn, br, pkt, err := s.readStartup(lc, nc)
	if err != nil {
		var pe *pgerr.Error
		var oe *oldProtocolError
		switch {
		case errors.As(err, &pe):
			_, _ = conn.Write(pe.AppendTo(nil, 'E'))
		case errors.As(err, &oe):
			_, _ = conn.Write(oe.message())
		case !errors.Is(err, io.EOF) && !errors.Is(err, errCancelHandled):
			// As PostgreSQL: a bad length or a short packet is logged, and
			// the connection closed without a reply.
			s.log.Debug("startup failed", "remote", nc.RemoteAddr().String(), "err", err)
		}
		return nil, false
	}
	if pkt.params["database"] == consoleDatabase {
		// The admin console, on a goroutine of its own (consolelogin.go).
		if lc.co == nil {
			s.serveConsole(conn, br, pkt)
			return nil, false
		}
		nc.UnbindShared() // a shutdown closes the console from another goroutine
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConsole(conn, br, pkt)
			_ = nc.Close()
		}()
		return nil, true
	}
	ss, err = s.login(lc, conn, br, pkt)
	if err != nil {
		var pe *pgerr.Error
		if errors.As(err, &pe) {
			buf := lc.final
			if aa := (*afterAuthError)(nil); errors.As(err, &aa) {
				buf = append(buf, authenticationOk...)
			}
			pe.Severity = "FATAL"
			_, _ = conn.Write(pe.AppendTo(buf, 'E'))
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			loginTimedOut(conn, rc.cfg.ClientLoginTimeout)
		}
		s.logLoginFailure(nc.RemoteAddr().String(), pkt.params["user"], pkt.params["database"], err)
		return nil, false
	}
	_ = conn.SetDeadline(time.Time{})
	s.gate.seconds.Observe(time.Since(at).Seconds())
	return ss, false
}

// loginTimedOut tells a client whose login did not finish within
// client_login_timeout, once its startup packet was read, why it is closed
// (PostgreSQL's own words for its authentication_timeout, which it does not
// send; a startup packet that does not come in time is closed without a
// word, as PostgreSQL does), with a second to write it in.
func loginTimedOut(conn net.Conn, timeout time.Duration) {
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	pe := &pgerr.Error{Severity: "FATAL", Code: "57014", Message: "lockpool: canceling authentication due to timeout",
		Detail: fmt.Sprintf("The login did not finish within client_login_timeout (%s).", timeout),
		Hint:   "Check the client's network and load, or raise client_login_timeout."}
	_, _ = conn.Write(pe.AppendTo(nil, 'E'))
}

// errCancelHandled ends a connection that carried a cancel request or a
// forwarded signal request: it was answered, no session follows.
var errCancelHandled = errors.New("cancel request handled")

// errStartupLength is an invalid startup packet length word: PostgreSQL
// closes such a connection without a reply, and so does lockpool (a client
// that sends Terminate or anything else that is no startup packet first).
var errStartupLength = errors.New("invalid length of startup packet")

// oldProtocolError is a FATAL for a client that asked for a protocol
// between 0.1 and 2.x: PostgreSQL answers it in the protocol 2.0 error format
// ('E', then the text), which such a client can read.
type oldProtocolError struct{ text string }

func (e *oldProtocolError) Error() string { return e.text }

func (e *oldProtocolError) message() []byte {
	b := append([]byte("EFATAL:  "), e.text...)
	return append(b, '\n', 0)
}

// startupPacket is what a client sent in its startup packet.
type startupPacket struct {
	// params holds every key as sent (user, database, options, replication
	// and the parameters); for a key sent twice, the last value.
	params map[string]string
	// settings are the parameters to set, in packet order: every key but
	// user, database, options, replication and _pq_.* protocol options.
	settings []startupparam.Param
}

// readStartup reads the startup packet as PostgreSQL's ProcessStartupPacket
// does, answering SSL and GSS encryption requests and cancel requests on the
// way. It returns the (maybe TLS) connection, its reader, and the packet.
func (s *Server) readStartup(lc *loginCtx, nc net.Conn) (net.Conn, *bufio.Reader, *startupPacket, error) {
	conn := nc
	br := bufio.NewReaderSize(conn, startupReadBuf)
	sslDone, gssDone := false, false
	for {
		hdr, err := br.Peek(4)
		if err != nil {
			if len(hdr) == 0 {
				return conn, br, nil, io.EOF
			}
			return conn, br, nil, fmt.Errorf("incomplete startup packet: %w", err)
		}
		n := int(binary.BigEndian.Uint32(hdr))
		if n < 8 || n-4 > maxStartupLen {
			return conn, br, nil, fmt.Errorf("%w %d", errStartupLength, n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return conn, br, nil, fmt.Errorf("incomplete startup packet: %w", err)
		}
		code := binary.BigEndian.Uint32(body[4:])
		body = body[8:]
		switch {
		case code == codeCancelRequest:
			if len(body) >= 8 {
				pid, secret := binary.BigEndian.Uint32(body), binary.BigEndian.Uint32(body[4:])
				lc.offload(func() { s.cancelSession(pid, secret) })
			}
			return conn, br, nil, errCancelHandled
		case code == codeSignalRequest:
			_ = lc.detached(func() { s.serveSignalRequest(conn, br, body) }) // another instance of the cluster (clustersignal.go)
			return conn, br, nil, errCancelHandled
		case code == codeSSLRequest && !sslDone:
			if s.tlsConf != nil && br.Buffered() > 0 {
				// No handshake over a buffer holding plaintext.
				return conn, br, nil, errUnencryptedAfter("SSL request")
			}
			answer := byte('N')
			if s.tlsConf != nil {
				answer = 'S'
			}
			if _, err := conn.Write([]byte{answer}); err != nil {
				return conn, br, nil, err
			}
			if br.Buffered() > 0 {
				return conn, br, nil, errUnencryptedAfter("SSL request")
			}
			if answer == 'S' {
				tc := tls.Server(conn, s.tlsConf)
				var herr error
				if err := lc.detached(func() { herr = tc.Handshake() }); err != nil && herr == nil {
					herr = err
				}
				if herr != nil {
					return conn, br, nil, fmt.Errorf("tls handshake: %w", herr)
				}
				conn = tc
				br = bufio.NewReaderSize(conn, startupReadBuf)
			}
			// A GSS request may follow only a refused SSL request.
			sslDone, gssDone = true, answer == 'S'
		case code == codeGSSENCRequest && !gssDone:
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return conn, br, nil, err
			}
			if br.Buffered() > 0 {
				return conn, br, nil, errUnencryptedAfter("GSSAPI encryption request")
			}
			gssDone = true
		default:
			if code>>16 != 3 {
				msg := fmt.Sprintf("lockpool: unsupported frontend protocol %d.%d: server supports 3.0 to 3.0", code>>16, code&0xffff)
				if code>>16 < 3 && code != 0 {
					// PostgreSQL answers 0.0 (its "no protocol yet") in 3.0.
					return conn, br, nil, &oldProtocolError{text: msg}
				}
				return conn, br, nil, &pgerr.Error{Severity: "FATAL", Code: "0A000", Message: msg,
					Hint: "Use a client that speaks protocol 3.0 (every client since PostgreSQL 7.4)."}
			}
			pkt, unknown, err := parseStartupParams(body)
			if err != nil {
				return conn, br, nil, err
			}
			if cfg := s.rc.Load().cfg; cfg.TLS != nil && cfg.TLS.Required {
				if _, isTLS := conn.(*tls.Conn); !isTLS {
					return conn, br, nil, &pgerr.Error{Severity: "FATAL", Code: "28000",
						Message: "lockpool: TLS is required for every client connection",
						Hint:    "Connect with sslmode=require (or verify-full)."}
				}
			}
			if code != protocol30 || len(unknown) > 0 {
				// Newer minor version or _pq_ options: answer as PostgreSQL does.
				buf, start := wire.AppendHeader(nil, 'v')
				buf = binary.BigEndian.AppendUint32(buf, protocol30)
				buf = binary.BigEndian.AppendUint32(buf, uint32(len(unknown)))
				for _, u := range unknown {
					buf = wire.AppendCString(buf, u)
				}
				if _, err := conn.Write(wire.FinishMsg(buf, start)); err != nil {
					return conn, br, nil, err
				}
			}
			if err := pkt.check(); err != nil {
				return conn, br, nil, err
			}
			return conn, br, pkt, nil
		}
	}
}

// errUnencryptedAfter is PostgreSQL's answer to data that arrived with an
// encryption request, before the encryption could start.
func errUnencryptedAfter(request string) error {
	return &pgerr.Error{Severity: "FATAL", Code: "08P01", Message: "lockpool: received unencrypted data after " + request,
		Detail: "This could be either a client-software bug or evidence of an attempted man-in-the-middle attack.",
		Hint:   "The client must wait for the answer to its encryption request before it sends anything else."}
}

// parseStartupParams reads the name/value pairs of a startup packet body as
// PostgreSQL does: up to an empty name, and the byte after the last pair must
// be the body's last byte. It also returns the _pq_.* protocol options, which
// lockpool (like PostgreSQL 15) does not know.
func parseStartupParams(b []byte) (*startupPacket, []string, error) {
	pkt := &startupPacket{params: make(map[string]string, 8)}
	var unknown []string
	// cstr is the string at off, ended by a NUL or by the end of b
	// (PostgreSQL reads the body from a buffer with a NUL after it).
	// One string for the whole body: the names and values are its
	// substrings (one allocation, not two per pair).
	bs := string(b)
	cstr := func(off int) string {
		if i := strings.IndexByte(bs[off:], 0); i >= 0 {
			return bs[off : off+i]
		}
		return bs[off:]
	}
	off := 0
	for off < len(b) && b[off] != 0 {
		name := cstr(off)
		valOff := off + len(name) + 1
		if valOff >= len(b) {
			break // missing value: the layout check below complains
		}
		val := cstr(valOff)
		switch {
		case name == "database", name == "user", name == "options":
			pkt.params[name] = val
		case name == "replication":
			if _, ok := startupparam.ParseBool(val); !ok && val != "database" {
				return nil, nil, &pgerr.Error{Severity: "FATAL", Code: "22023",
					Message: fmt.Sprintf("invalid value for parameter %q: %q", "replication", val),
					Hint:    `Valid values are: "false", 0, "true", 1, "database".`}
			}
			pkt.params[name] = val
		case strings.HasPrefix(name, "_pq_."):
			unknown = append(unknown, name)
		default:
			pkt.params[name] = val
			pkt.settings = append(pkt.settings, startupparam.Param{Name: name, Value: val})
		}
		off = valOff + len(val) + 1
	}
	if off != len(b)-1 {
		return nil, nil, &pgerr.Error{Severity: "FATAL", Code: "08P01", Message: "lockpool: invalid startup packet layout: expected terminator as last byte"}
	}
	return pkt, unknown, nil
}

// check applies PostgreSQL's rules to the user and database of a parsed
// packet (a user is required, the database defaults to it, both are cut to
// 63 bytes) and refuses replication connections.
func (p *startupPacket) check() error {
	if p.params["user"] == "" {
		return &pgerr.Error{Severity: "FATAL", Code: "28000", Message: "lockpool: no PostgreSQL user name specified in startup packet", Hint: "Set the user in the connection string."}
	}
	if p.params["database"] == "" {
		p.params["database"] = p.params["user"]
	}
	for _, k := range []string{"user", "database"} {
		if v := p.params[k]; len(v) >= 64 {
			p.params[k] = v[:63]
		}
	}
	if v, ok := p.params["replication"]; ok {
		if on, _ := startupparam.ParseBool(v); on || v == "database" {
			return &pgerr.Error{Severity: "FATAL", Code: "0A000", Message: "lockpool: replication connections are not supported", Hint: "Connect to PostgreSQL directly for replication."}
		}
	}
	return nil
}

// authConn adapts the startup connection to auth.Conn.
type authConn struct {
	c   net.Conn
	br  *bufio.Reader
	buf []byte
	// final, when set, takes the SASL final message instead of the socket:
	// it goes out with the login's next write (loginCtx.final).
	final *[]byte
	rbuf  []byte // ReceivePassword's buffer, reused from one message to the next
	// sasl: the last request was a SASL one (PostgreSQL names the expected
	// answer differently then).
	sasl bool
}

func (a *authConn) Send(msg pgproto3.BackendMessage) error {
	switch msg.(type) {
	case *pgproto3.AuthenticationSASL, *pgproto3.AuthenticationSASLContinue:
		a.sasl = true
	default:
		a.sasl = false
	}
	if f, ok := msg.(*pgproto3.AuthenticationSASLFinal); ok && a.final != nil {
		b, err := f.Encode(make([]byte, 0, 9+len(f.Data)))
		*a.final = b
		return err
	}
	b, err := msg.Encode(a.buf[:0])
	if err != nil {
		return err
	}
	a.buf = b
	// Written now, not with the loop's turn (WriteDeferred): a deferred
	// write leaves the connection a write buffer that an idle client would
	// then keep.
	_, err = a.c.Write(b)
	return err
}

// ReceivePassword reads the client's next authentication message. As in
// PostgreSQL, a client that leaves or sends a bad length is closed without a
// reply, and another message type is a protocol violation (FATAL 08P01).
func (a *authConn) ReceivePassword() ([]byte, error) {
	typ, n, err := wire.ReadHeader(a.br)
	if err != nil {
		return nil, err
	}
	if typ != 'p' {
		what := "password"
		if a.sasl {
			what = "SASL"
		}
		return nil, &pgerr.Error{Severity: "FATAL", Code: "08P01",
			Message: fmt.Sprintf("lockpool: expected %s response, got message type %d", what, typ),
			Hint:    "The client must answer the authentication request before anything else."}
	}
	if n > 64<<10 {
		return nil, wire.ProtocolErrorf("password message too long")
	}
	// One buffer for the exchange's messages: auth copies what it keeps of
	// a message (as strings) before it asks for the next.
	if cap(a.rbuf) < n {
		a.rbuf = make([]byte, n, max(n, 256))
	}
	body := a.rbuf[:n]
	if _, err := io.ReadFull(a.br, body); err != nil {
		return nil, err
	}
	return body, nil
}

// login authenticates the client, matches its application, checks its
// startup settings and sends the startup answer. No server connection is
// needed once the server's parameters for that database are known and the
// client's set of settings was checked before (checkStartupParams).
func (s *Server) login(lc *loginCtx, conn net.Conn, br *bufio.Reader, pkt *startupPacket) (_ *session.Session, err error) {
	authenticated := false
	defer func() {
		if err != nil && authenticated {
			err = &afterAuthError{err}
		}
	}()
	rc := s.rc.Load()
	params := pkt.params
	user, database := params["user"], params["database"]
	cred := rc.creds[user]
	if _, known := rc.cfg.UserByName(user); !known {
		cred = nil
		if rc.cfg.AuthQuery != nil {
			c, err := s.lookupUser(lc, rc, user)
			if err != nil {
				s.log.Warn("auth_query lookup failed", "user", user, "err", err)
				return nil, &pgerr.Error{Code: "08006", Message: "lockpool: cannot look up the user in PostgreSQL", Hint: "Check auth_query and that PostgreSQL is reachable."}
			}
			cred = c
		}
	}
	ac := &authConn{c: conn, br: br, final: &lc.final}
	method := rc.cfg.AuthMethod
	res, err := auth.Authenticate(ac, method, user, cred)
	if err != nil {
		var ae *auth.Error
		if errors.As(err, &ae) {
			return nil, &pgerr.Error{Code: ae.Code, Message: ae.Message, Detail: ae.Detail, Hint: ae.Hint}
		}
		return nil, err
	}
	if cred != nil {
		s.learnSCRAM(user, cred, res.ClientKey)
	}
	if cred == nil {
		// trust with an unknown user.
		return nil, &pgerr.Error{Code: "28000", Message: fmt.Sprintf("lockpool: role %q is not configured", user), Hint: "Add the user to the users section of lockpool's config."}
	}
	app, ok := rc.cfg.Match(user, database)
	if !ok {
		return nil, &pgerr.Error{Code: "28000",
			Message: fmt.Sprintf("lockpool: no application is configured for user %q and database %q", user, database),
			Hint:    "Add an application with this user (and database, or none for any database) to lockpool's config."}
	}
	// From here on PostgreSQL would have sent AuthenticationOk.
	authenticated = true
	as := rc.apps[app.Name]
	if err := s.admit(as); err != nil {
		return nil, err
	}
	admitted := true
	defer func() {
		if admitted {
			s.unadmit(as)
		}
	}()
	ss := session.New(s.shared, conn, br, as, user, database, params)
	settings, optErr, err := ss.ParseOptions(params["options"], pkt.settings)
	if err != nil {
		return nil, err
	}
	// The context of a wait for the server, made only when one is needed
	// (a login that finds everything cached starts no timer).
	wait := lazyContext{parent: s.baseCtx, timeout: rc.cfg.Server.ConnectTimeout + as.Config().WaitTimeout}
	defer wait.stop()
	// As in PostgreSQL, an unknown database is reported before a bad setting.
	srvParams, known := s.pool.CachedServerParams(app.Name, database)
	if !known {
		if srvParams, err = s.serverParams(lc, wait.get(), app.Name, database); err != nil {
			return nil, backend.LoginError(err, database, as.Cfg.Name)
		}
	}
	notices, err := s.checkStartupParams(&wait, ss, settings, lc.offload)
	if err != nil {
		return nil, err
	}
	if optErr != nil {
		return nil, optErr
	}
	ss.SetLoop(lc.loop)
	if !s.register(ss) {
		return nil, pgerr.Shutdown()
	}
	buf := make([]byte, 0, 1024)
	buf = append(buf, lc.final...)
	buf = append(buf, authenticationOk...)
	buf = append(buf, notices...)
	buf = ss.AppendStartupParams(buf, srvParams)
	buf = append(buf, 'K', 0, 0, 0, 12)
	buf = binary.BigEndian.AppendUint32(buf, ss.PID())
	buf = binary.BigEndian.AppendUint32(buf, ss.Secret())
	buf = wire.AppendReadyForQuery(buf, 'I')
	if _, err := conn.Write(buf); err != nil {
		s.unregister(ss)
		s.sessionEnded(ss)
		return nil, err
	}
	admitted = false // the session gives its place back when it ends
	return ss, nil
}

// lookupUser looks user up with auth_query, where waiting is allowed. (The
// waits of login are methods of their own: a closure inside login would
// move login's variables to the heap on every login.)
func (s *Server) lookupUser(lc *loginCtx, rc *runtimeConfig, user string) (c *auth.Credential, err error) {
	lc.offload(func() {
		ctx, cancel := context.WithTimeout(s.baseCtx, rc.cfg.Server.ConnectTimeout)
		c, err = s.authq.lookup(ctx, rc.cfg, s.hosts, user)
		cancel()
	})
	return c, err
}

// serverParams waits for the server's parameters of (app, database) where
// waiting is allowed (a server connection may have to be dialed).
func (s *Server) serverParams(lc *loginCtx, ctx context.Context, app, database string) (p map[string]string, err error) {
	lc.offload(func() { p, err = s.pool.ServerParams(ctx, app, database) })
	return p, err
}

// lazyContext is a context with a timeout made at its first use.
type lazyContext struct {
	parent  context.Context
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
}

func (l *lazyContext) get() context.Context {
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithTimeout(l.parent, l.timeout)
	}
	return l.ctx
}

func (l *lazyContext) stop() {
	if l.cancel != nil {
		l.cancel()
	}
}

// authenticationOk is the AuthenticationOk message.
var authenticationOk = []byte{'R', 0, 0, 0, 8, 0, 0, 0, 0}

// afterAuthError is a login that failed after the client authenticated.
// PostgreSQL has sent AuthenticationOk by then (an unknown database or a bad
// parameter is reported after it), and clients act on that: libpq retries a
// login without application_name when such an error is 42704. lockpool
// sends AuthenticationOk with the error.
type afterAuthError struct{ err error }

func (e *afterAuthError) Error() string { return e.err.Error() }
func (e *afterAuthError) Unwrap() error { return e.err }

// admit counts a logging-in client against max_client_connections and the
// application's max_clients.
func (s *Server) admit(as *appstate.App) error {
	rc := s.rc.Load()
	if n := s.clientCount.Add(1); int(n) > rc.cfg.MaxClientConnections && rc.cfg.MaxClientConnections > 0 {
		s.clientCount.Add(-1)
		return &pgerr.Error{Code: "53300", Message: fmt.Sprintf("lockpool: too many client connections (max_client_connections %d)", rc.cfg.MaxClientConnections),
			Hint: "Close idle connections or raise max_client_connections."}
	}
	if !as.Admit() {
		s.clientCount.Add(-1)
		return &pgerr.Error{Code: "53300", Message: fmt.Sprintf("lockpool: too many client connections for application %q (max_clients %d)", as.Config().Name, as.Config().MaxClients),
			Hint: "Close idle connections of this application or raise its max_clients."}
	}
	return nil
}

func (s *Server) unadmit(as *appstate.App) {
	as.Unadmit()
	s.clientCount.Add(-1)
}
