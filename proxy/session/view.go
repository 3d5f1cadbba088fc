package session

import (
	"crypto/tls"
	"net"
	"strconv"
	"time"

	"github.com/lockpool/lockpool/config"
)

// ClientView is one logged-in client as the admin console and lockpool's
// pg_stat_activity see it (Session.View).
type ClientView struct {
	ID                     uint32 // the key pid
	App                    config.Application
	User, Database, Remote string
	Connected              time.Time
	TLS                    bool
	Link                   LinkView
	Addr                   string // the client's address, without the port
	Port                   int
	State                  string // active (holds a server connection), waiting (in lockpool) or idle
}

// LinkView is the part of a session's server link the views show.
type LinkView struct {
	Waiting       bool
	Attached      bool
	BackendPID    uint32
	ServerDB      string
	ServerUser    string
	ServerCreated time.Time
	Pinned        bool
	PinReason     string
	PinnedSince   time.Time
}

// adminView reads the link under its lock.
func (l *serverLink) adminView() LinkView {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := LinkView{Waiting: l.waiting, Pinned: l.pinned, PinReason: l.pinReason, PinnedSince: l.pinnedSince}
	if l.sc != nil {
		v.Attached, v.BackendPID, v.ServerDB, v.ServerUser, v.ServerCreated = true, l.sc.PID, l.sc.Database, l.sc.User, l.sc.Created()
	}
	return v
}

// Link returns the session's server link as the views show it, read under
// the link's lock. Any goroutine may call it.
func (s *Session) Link() LinkView { return s.link.adminView() }

// View returns the session as the views show it: its fields fixed at
// login, and its link read under the link's lock. Any goroutine may call it.
func (s *Session) View() ClientView {
	c := ClientView{ID: s.pid, App: s.app.Cfg, User: s.user, Database: s.database, Remote: s.remote,
		Connected: time.Unix(0, s.connected), Link: s.link.adminView()}
	_, c.TLS = s.conn.(*tls.Conn)
	host, port, err := net.SplitHostPort(s.remote)
	if err != nil {
		host = s.remote
	}
	c.Addr = host
	c.Port, _ = strconv.Atoi(port)
	switch {
	case c.Link.Attached:
		c.State = "active"
	case c.Link.Waiting:
		c.State = "waiting"
	default:
		c.State = "idle"
	}
	return c
}
