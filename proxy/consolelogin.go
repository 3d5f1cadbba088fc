package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/lockpool/lockpool/auth"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/proxy/console"
)

// consoleDatabase is the virtual database of the admin console: a client
// that asks for it is an operator, never an application.
const consoleDatabase = config.ConsoleDatabase

// serveConsole authenticates a client that asked for the database
// lockpool and, for a user listed in admin_users, hands it to the admin
// console (package console), which answers its commands on this goroutine.
func (s *Server) serveConsole(conn net.Conn, br *bufio.Reader, pkt *startupPacket) {
	user := pkt.params["user"]
	if err := s.consoleLogin(conn, br, user); err != nil {
		var pe *pgerr.Error
		if errors.As(err, &pe) {
			pe.Severity = "FATAL"
			_, _ = conn.Write(pe.AppendTo(nil, 'E'))
		}
		s.log.Info("admin console login refused", "user", user, "remote", conn.RemoteAddr().String(), "err", err)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	c := console.NewConn(s, s.log, conn, br, user)
	if !s.addConsole(c) {
		c.End(pgerr.Shutdown())
		return
	}
	defer s.removeConsole(c)
	c.Serve(s.baseCtx)
}

// consoleLogin authenticates user against the configured users, as a
// login to an application does, then requires admin_users to list it.
func (s *Server) consoleLogin(conn net.Conn, br *bufio.Reader, user string) error {
	rc := s.rc.Load()
	cred := rc.creds[user]
	if _, err := auth.Authenticate(&authConn{c: conn, br: br}, rc.cfg.AuthMethod, user, cred); err != nil {
		var ae *auth.Error
		if errors.As(err, &ae) {
			return &pgerr.Error{Code: ae.Code, Message: ae.Message, Detail: ae.Detail, Hint: ae.Hint}
		}
		return err
	}
	if cred == nil {
		return &pgerr.Error{Code: "28000", Message: fmt.Sprintf("lockpool: role %q is not configured", user), Hint: "Add the user to the users section of lockpool's config."}
	}
	if !rc.cfg.IsAdmin(user) {
		return &pgerr.Error{Code: "28000", Message: fmt.Sprintf("lockpool: user %q may not use the admin console", user),
			Hint: "List the user in admin_users to let it connect to the database lockpool."}
	}
	return nil
}

// addConsole records an admin console connection, unless lockpool is
// shutting down.
func (s *Server) addConsole(c *console.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	if s.consoles == nil {
		s.consoles = make(map[*console.Conn]struct{})
	}
	s.consoles[c] = struct{}{}
	return true
}

func (s *Server) removeConsole(c *console.Conn) {
	s.mu.Lock()
	delete(s.consoles, c)
	s.mu.Unlock()
}

// endConsoles closes every admin console connection with 57P01 (shutdown).
func (s *Server) endConsoles() {
	s.mu.Lock()
	list := make([]*console.Conn, 0, len(s.consoles))
	for c := range s.consoles {
		list = append(list, c)
	}
	s.mu.Unlock()
	for _, c := range list {
		c.End(pgerr.Shutdown())
	}
}
