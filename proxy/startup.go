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
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/wire"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/lockpool/lockpool/auth"
	"github.com/lockpool/lockpool/pool"
)

// Startup packet codes.
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
	protocol30        = 3 << 16
	maxStartupLen     = 10000
)

// startupReadBuf is the read buffer of the startup and login phase (the
// session then reads through its own wire.Reader).
const startupReadBuf = 512

// handleConn runs one client connection from its first byte to its close.
func (s *Server) handleConn(nc net.Conn) {
	handedOff := false
	defer func() {
		if !handedOff {
			nc.Close()
		}
	}()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		_ = tc.SetKeepAlive(true)
	}
	rc := s.rc.Load()
	login := rc.cfg.ClientLoginTimeout
	if login > 0 {
		_ = nc.SetDeadline(time.Now().Add(login))
	}
	conn, br, params, err := s.readStartup(nc)
	if err != nil {
		if pe := (*pgError)(nil); errors.As(err, &pe) {
			_, _ = conn.Write(appendError(nil, 'E', pe))
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, errCancelHandled) {
			s.log.Debug("startup failed", "remote", nc.RemoteAddr().String(), "err", err)
		}
		return
	}
	ss, err := s.login(conn, br, params)
	if err != nil {
		var pe *pgError
		if errors.As(err, &pe) {
			pe.Severity = "FATAL"
			_, _ = conn.Write(appendError(nil, 'E', pe))
		}
		s.log.Debug("login failed", "remote", nc.RemoteAddr().String(), "user", params["user"], "err", err)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	// Serve on a fresh goroutine: login (SCRAM, TLS) grew this one's stack,
	// and an idle session should cost a small stack, not that one.
	handedOff = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer nc.Close()
		ss.serve()
	}()
}

var errCancelHandled = errors.New("cancel request handled")

// readStartup reads the startup packet, answering SSL and GSS encryption
// requests and cancel requests on the way. It returns the (maybe TLS)
// connection, its reader, and the startup parameters.
func (s *Server) readStartup(nc net.Conn) (net.Conn, *bufio.Reader, map[string]string, error) {
	conn := nc
	br := bufio.NewReaderSize(conn, startupReadBuf)
	for {
		hdr, err := br.Peek(8)
		if err != nil {
			if len(hdr) == 0 {
				return conn, br, nil, io.EOF
			}
			return conn, br, nil, fmt.Errorf("short startup packet: %w", err)
		}
		n := int(binary.BigEndian.Uint32(hdr))
		code := binary.BigEndian.Uint32(hdr[4:])
		if n < 8 || n > maxStartupLen {
			return conn, br, nil, &pgError{Severity: "FATAL", Code: "08P01", Message: fmt.Sprintf("lockpool: invalid startup packet length %d", n), Hint: "Connect with a PostgreSQL client (protocol 3.0)."}
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return conn, br, nil, fmt.Errorf("short startup packet: %w", err)
		}
		body = body[8:]
		switch code {
		case codeSSLRequest:
			if br.Buffered() > 0 {
				return conn, br, nil, &pgError{Severity: "FATAL", Code: "08P01", Message: "lockpool: data after SSLRequest before the TLS handshake", Hint: "The client must wait for the server's answer to SSLRequest."}
			}
			if s.tlsConf == nil {
				if _, err := conn.Write([]byte{'N'}); err != nil {
					return conn, br, nil, err
				}
				continue
			}
			if _, err := conn.Write([]byte{'S'}); err != nil {
				return conn, br, nil, err
			}
			tc := tls.Server(conn, s.tlsConf)
			if err := tc.Handshake(); err != nil {
				return conn, br, nil, fmt.Errorf("tls handshake: %w", err)
			}
			conn = tc
			br = bufio.NewReaderSize(conn, startupReadBuf)
		case codeGSSENCRequest:
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return conn, br, nil, err
			}
		case codeCancelRequest:
			if len(body) >= 8 {
				s.cancelSession(binary.BigEndian.Uint32(body), binary.BigEndian.Uint32(body[4:]))
			}
			return conn, br, nil, errCancelHandled
		default:
			if code>>16 != 3 {
				return conn, br, nil, &pgError{Severity: "FATAL", Code: "0A000",
					Message: fmt.Sprintf("lockpool: unsupported frontend protocol %d.%d: server supports 3.0", code>>16, code&0xffff),
					Hint:    "Use a client that speaks protocol 3.0 (every client since PostgreSQL 7.4)."}
			}
			params, unknown, err := parseStartupParams(body)
			if err != nil {
				return conn, br, nil, err
			}
			if cfg := s.rc.Load().cfg; cfg.TLS != nil && cfg.TLS.Required {
				if _, isTLS := conn.(*tls.Conn); !isTLS {
					return conn, br, nil, &pgError{Severity: "FATAL", Code: "28000",
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
			return conn, br, params, nil
		}
	}
}

func parseStartupParams(b []byte) (map[string]string, []string, error) {
	params := make(map[string]string, 8)
	var unknown []string
	for len(b) > 0 && b[0] != 0 {
		k, rest, ok := wire.CString(b)
		if !ok {
			return nil, nil, &pgError{Severity: "FATAL", Code: "08P01", Message: "lockpool: invalid startup packet layout: expected terminator as last byte"}
		}
		v, rest2, ok := wire.CString(rest)
		if !ok {
			return nil, nil, &pgError{Severity: "FATAL", Code: "08P01", Message: "lockpool: invalid startup packet layout: expected terminator as last byte"}
		}
		b = rest2
		key := string(k)
		if strings.HasPrefix(key, "_pq_.") {
			unknown = append(unknown, key)
			continue
		}
		params[key] = string(v)
	}
	if params["user"] == "" {
		return nil, nil, &pgError{Severity: "FATAL", Code: "28000", Message: "lockpool: no PostgreSQL user name specified in startup packet", Hint: "Set the user in the connection string."}
	}
	if params["database"] == "" {
		params["database"] = params["user"]
	}
	if params["replication"] != "" && params["replication"] != "false" && params["replication"] != "off" && params["replication"] != "0" {
		return nil, nil, &pgError{Severity: "FATAL", Code: "0A000", Message: "lockpool: replication connections are not supported", Hint: "Connect to PostgreSQL directly for replication."}
	}
	return params, unknown, nil
}

// authConn adapts the startup connection to auth.Conn.
type authConn struct {
	c   net.Conn
	br  *bufio.Reader
	buf []byte
}

func (a *authConn) Send(msg pgproto3.BackendMessage) error {
	b, err := msg.Encode(a.buf[:0])
	if err != nil {
		return err
	}
	a.buf = b
	_, err = a.c.Write(b)
	return err
}

func (a *authConn) ReceivePassword() ([]byte, error) {
	typ, n, err := wire.ReadHeader(a.br)
	if err != nil {
		return nil, err
	}
	if typ != 'p' {
		return nil, wire.ProtocolErrorf("expected password message, got %q", typ)
	}
	if n > 64<<10 {
		return nil, wire.ProtocolErrorf("password message too long")
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(a.br, body); err != nil {
		return nil, err
	}
	return body, nil
}

// login authenticates the client, matches its application, and sends the
// startup answer. No server connection is needed once the server's
// parameters for that database are known.
func (s *Server) login(conn net.Conn, br *bufio.Reader, params map[string]string) (*session, error) {
	rc := s.rc.Load()
	user, database := params["user"], params["database"]
	cred := rc.creds[user]
	if _, known := rc.cfg.UserByName(user); !known {
		cred = nil
		if rc.cfg.AuthQuery != nil {
			ctx, cancel := context.WithTimeout(s.baseCtx, rc.cfg.Server.ConnectTimeout)
			c, err := s.authq.lookup(ctx, rc.cfg, user)
			cancel()
			if err != nil {
				s.log.Warn("auth_query lookup failed", "user", user, "err", err)
				return nil, &pgError{Code: "08006", Message: "lockpool: cannot look up the user in PostgreSQL", Hint: "Check auth_query and that PostgreSQL is reachable."}
			}
			cred = c
		}
	}
	ac := &authConn{c: conn, br: br}
	method := rc.cfg.AuthMethod
	res, err := auth.Authenticate(ac, method, user, cred)
	if err != nil {
		var ae *auth.Error
		if errors.As(err, &ae) {
			return nil, &pgError{Code: ae.Code, Message: ae.Message, Detail: ae.Detail, Hint: ae.Hint}
		}
		return nil, err
	}
	if cred != nil {
		s.learnSCRAM(user, cred, res.ClientKey)
	}
	if cred == nil {
		// trust with an unknown user.
		return nil, &pgError{Code: "28000", Message: fmt.Sprintf("lockpool: role %q is not configured", user), Hint: "Add the user to the users section of lockpool's config."}
	}
	app, ok := rc.cfg.Match(user, database)
	if !ok {
		return nil, &pgError{Code: "28000",
			Message: fmt.Sprintf("lockpool: no application is configured for user %q and database %q", user, database),
			Hint:    "Add an application with this user (and database, or none for any database) to lockpool's config."}
	}
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
	ss := newSession(s, conn, br, as, user, database, params)
	if err := ss.parseOptions(params["options"]); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(s.baseCtx, rc.cfg.Server.ConnectTimeout+as.cfg.WaitTimeout)
	defer cancel()
	srvParams, err := s.pool.ServerParams(ctx, app.Name, database)
	if err != nil {
		return nil, serverLoginError(err, database, as)
	}
	if !s.register(ss) {
		return nil, errShutdown()
	}
	buf := make([]byte, 0, 512)
	buf = append(buf, 'R', 0, 0, 0, 8, 0, 0, 0, 0) // AuthenticationOk
	buf = ss.appendStartupParams(buf, srvParams)
	buf = append(buf, 'K', 0, 0, 0, 12)
	buf = binary.BigEndian.AppendUint32(buf, ss.pid)
	buf = binary.BigEndian.AppendUint32(buf, ss.secret)
	buf = wire.AppendReadyForQuery(buf, 'I')
	if _, err := conn.Write(buf); err != nil {
		s.unregister(ss)
		return nil, err
	}
	admitted = false // the session gives its place back when it ends
	return ss, nil
}

// serverLoginError turns a failure to reach the server at login into what
// the client sees.
func serverLoginError(err error, database string, as *appState) error {
	var pge *pgconn.PgError
	if errors.As(err, &pge) {
		msg := pge.Message
		if !strings.HasPrefix(msg, "lockpool:") {
			msg = "lockpool: " + msg
		}
		hint := pge.Hint
		switch pge.Code {
		case "3D000":
			msg = fmt.Sprintf("lockpool: database %q does not exist", database)
			hint = "Check the database name in the connection string."
		case "28P01", "28000":
			hint = "lockpool could not log in to PostgreSQL with the password configured for this user; check users[].password."
		case "57P01", "57P02", "57P03":
			hint = "PostgreSQL ended lockpool's login to it (shutting down, restarting, or the backend was terminated); retry in a moment."
		case "53300":
			hint = "PostgreSQL has no connection slot free for lockpool (its max_connections); lower server.max_connections or raise PostgreSQL's."
		}
		if hint == "" {
			hint = fmt.Sprintf("PostgreSQL answered lockpool's login to it with this error (SQLSTATE %s).", pge.Code)
		}
		return &pgError{Code: pge.Code, Message: msg, Hint: hint}
	}
	if errors.Is(err, pool.ErrWaitTimeout) {
		return &pgError{Code: "53300", Message: fmt.Sprintf("lockpool: no server connection free for application %q to read server parameters", as.cfg.Name), Hint: "Retry in a moment."}
	}
	return &pgError{Code: "08006", Message: "lockpool: cannot connect to the PostgreSQL server", Hint: "Check that PostgreSQL is running and reachable from lockpool.", Detail: err.Error()}
}

// admit counts a logging-in client against max_client_connections and the
// application's max_clients.
func (s *Server) admit(as *appState) error {
	rc := s.rc.Load()
	if n := s.clientCount.Add(1); int(n) > rc.cfg.MaxClientConnections && rc.cfg.MaxClientConnections > 0 {
		s.clientCount.Add(-1)
		return &pgError{Code: "53300", Message: fmt.Sprintf("lockpool: too many client connections (max_client_connections %d)", rc.cfg.MaxClientConnections),
			Hint: "Close idle connections or raise max_client_connections."}
	}
	if n := as.clientCount.Add(1); as.cfg.MaxClients > 0 && int(n) > as.cfg.MaxClients {
		as.clientCount.Add(-1)
		s.clientCount.Add(-1)
		return &pgError{Code: "53300", Message: fmt.Sprintf("lockpool: too many client connections for application %q (max_clients %d)", as.cfg.Name, as.cfg.MaxClients),
			Hint: "Close idle connections of this application or raise its max_clients."}
	}
	return nil
}

func (s *Server) unadmit(as *appState) {
	as.clientCount.Add(-1)
	s.clientCount.Add(-1)
}
