package session

import (
	"context"
	"errors"
	"time"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/proxy/txcmd"
	"github.com/lockpool/lockpool/rewrite"
)

// The session as the kinds of package local see it (local.Session), and
// the mechanics they use that belong to the session, its server link and
// its loop: reading the client's lock limits on its server connection,
// waking an idle session for its notifications, sending a statement on to
// the server, signalling a client by its key pid. The listen kind's
// handler is also told of the session's transactions here.

// PID implements local.Session.
func (s *Session) PID() uint32 { return s.pid }

// User implements local.Session.
func (s *Session) User() string { return s.user }

// Database implements local.Session.
func (s *Session) Database() string { return s.database }

// Remote implements local.Session.
func (s *Session) Remote() string { return s.remote }

// App implements local.Session.
func (s *Session) App() *config.Application { return &s.app.Cfg }

// Config implements local.Session.
func (s *Session) Config() *config.Config { return s.srv.Host.Config() }

// ListenShared implements local.Session.
func (s *Session) ListenShared() bool { return s.app.Listen == policy.Shared && !s.app.SessionPool }

// HoldApp implements local.Session.
func (s *Session) HoldApp() *local.HoldApp { return s.app.Hold }

// Leases implements local.Session.
func (s *Session) Leases() local.LeaseStore { return s.srv.Leases }

// Locks implements local.Session.
func (s *Session) Locks() *advisory.Manager { return s.srv.Locks }

// Hub implements local.Session.
func (s *Session) Hub() *listen.Hub { return s.srv.Hub }

// Offload implements local.Session.
func (s *Session) Offload(fn func()) { s.offload(fn) }

// WaitContext implements local.Session.
func (s *Session) WaitContext() context.Context { return s.waitContext() }

// EndWait implements local.Session.
func (s *Session) EndWait() { s.endWait() }

// Kill implements local.Session.
func (s *Session) Kill(pe *pgerr.Error) { s.kill(pe) }

// KilledBy implements local.Session.
func (s *Session) KilledBy() *pgerr.Error { return s.killedBy() }

// Status implements local.Session.
func (s *Session) Status() byte { return s.status() }

// LockLimits implements local.Session.
func (s *Session) LockLimits() (advisory.Limits, *pgerr.Error) { return s.lockLimits() }

// WakeIdle implements local.Session (postDeliver).
func (s *Session) WakeIdle() { s.postDeliver() }

// noteFallback counts a statement under advisory_locks: hold that lockpool
// does not answer itself, and logs its text the first time.
func (s *Session) noteFallback(d policy.Decision, sql string) {
	s.app.Hold.NoteFallback(s.srv.Log, s.app.Cfg.Name, d, sql)
}

// lockLimits are the client's lock_timeout and statement_timeout as it set
// them: its session values, or inside a transaction block the values in
// force there (SET LOCAL included), read from its server connection. A
// read that does not complete cleanly ends the session (a FATAL): the
// connection's replies would be out of step, or lockpool's statement would
// have failed the client's transaction behind its back.
func (s *Session) lockLimits() (advisory.Limits, *pgerr.Error) {
	lt, st := s.params.Values()["lock_timeout"], s.params.Values()["statement_timeout"]
	if s.link.sc != nil && s.pos.txStatus == 'T' && s.q.len() == 0 && !s.pos.unsynced && len(s.sout) == 0 && s.link.state == linkAttached {
		v, err := s.readTimeouts()
		if err != nil {
			return advisory.Limits{}, s.exchangeBroken(err)
		}
		lt, st = v[0], v[1]
	}
	return advisory.Limits{LockTimeout: backend.GUCDuration(lt), StatementTimeout: backend.GUCDuration(st)}, nil
}

// readTimeouts asks the client's server connection, idle inside the
// client's transaction block, for lock_timeout and statement_timeout. Any
// error leaves the link probing (cleanup destroys the connection).
func (s *Session) readTimeouts() ([2]string, error) {
	var v [2]string
	sc := s.link.sc
	if err := s.link.to(linkProbing); err != nil {
		return v, err
	}
	v, err := backend.ReadTimeouts(sc)
	if err != nil {
		return v, err
	}
	return v, s.link.to(linkAttached)
}

// errDeliver ends an idle wait of a session (watchIdle) that has
// notifications to write.
var errDeliver = errors.New("notifications to deliver")

// postDeliver asks the session's loop to write the waiting notifications
// (any goroutine).
func (s *Session) postDeliver() {
	s.link.mu.Lock()
	l := s.link.loop
	s.link.mu.Unlock()
	if l != nil {
		l.Post(s.deliverWake)
	}
}

// deliverWake runs on the session's loop: a resting session is woken (its
// turn writes the notifications at its idle point), one waiting idle on
// its pinned server and its client (watchIdle) is interrupted to write
// them. A session that runs writes them at its next idle point anyway.
func (s *Session) deliverWake() {
	switch {
	case s.life == lifeEnded:
	case s.life == lifeResting:
		if s.loop.StopOnReadable(s.sock) {
			s.loop.Go(s.resume)
		}
	case s.co != nil && s.watching:
		s.co.Interrupt(errDeliver)
	}
}

// Forward implements local.Session: the statement goes to the server as
// the client sent it, an unnamed Parse of parse, a Bind of bind and an
// Execute, whose rows, notices or error take its place in the reply order
// (the ParseComplete and BindComplete are lockpool's, not passed on).
func (s *Session) Forward(parse, bind []byte) *pgerr.Error {
	if err := s.toServer(replyParse, opSwallow); err != nil {
		// attachFailed answers the call with the error, or ends the session.
		if err := s.attachFailed(err, false, false); err != nil {
			if pe, ok := pgerr.As(err); ok {
				return pe
			}
			return pgerr.ConnectionLost(false).Fatal()
		}
		return nil
	}
	s.expect(reply{kind: replyBind, op: opSwallow})
	s.expect(reply{kind: replyExecute, op: opPass})
	s.sout = wire.AppendFrame(s.sout, 'P', append([]byte{0}, parse...))
	s.sout = wire.AppendBind(s.sout, "", "", bind)
	s.sout = wire.AppendExecute(s.sout, "", 0)
	s.unnamedHere = false // the server's unnamed statement is no longer the client's
	return nil
}

// ClientPID implements local.Session: a key pid, or a backend's pid a
// client read (seenBy).
func (s *Session) ClientPID(pid int64) (key uint32, keyShaped, ok bool) {
	if IsKeyPID(pid) {
		return uint32(pid), true, true
	}
	key, ok = s.seenBy(pid)
	return key, false, ok
}

// KeyPIDLive implements local.Session.
func (s *Session) KeyPIDLive(key uint32) bool { return s.srv.Host.KeyPIDLive(key) }

// Signal implements local.Session: the caller is the session's user, an
// admin when admin_users lists it (signalKeyPID).
func (s *Session) Signal(key uint32, terminate bool, timeout time.Duration) (local.SignalResult, error) {
	return s.signalKeyPID(key, terminate, timeout)
}

// listeningOf returns the session's listen handler, nil when it never
// used LISTEN.
func (s *Session) listeningOf() *local.Listening {
	if s.extras == nil {
		return nil
	}
	l, _ := s.extras.local[kindListen].(*local.Listening)
	return l
}

// listenHandler returns the session's listen handler, made at first use.
func (s *Session) listenHandler() *local.Listening {
	return s.handler(kindListen).(*local.Listening)
}

// beforeCommit runs before a simple Query is sent (sql: its text): a
// savepoint command is noted in the listen handler's pending list, and a
// COMMIT of a block with LISTENs subscribes the client to their channels
// first (local.Listening.SubscribeEarly).
func (s *Session) beforeCommit(sql []byte) {
	l := s.listeningOf()
	if l == nil {
		return
	}
	if cmd, name, ok := local.SavepointOf(sql); ok {
		l.Savepoint(cmd, name)
		return
	}
	if txcmd.Of(sql) == txcmd.Commit {
		l.SubscribeEarly(s, l.PendingListens())
	}
}

// beforeImplicitCommit runs before a Query (f: its findings) or a Sync
// (f nil) that ends an implicit transaction with LISTENs in it is sent:
// the client is subscribed to their channels first, as before a COMMIT
// (beforeCommit).
func (s *Session) beforeImplicitCommit(f *rewrite.Findings) {
	if s.status() != 'I' || !s.ListenShared() {
		return
	}
	var channels []string
	if f != nil {
		for _, c := range f.State {
			if c.Kind == rewrite.Listen && c.Stmt > 0 {
				channels = append(channels, c.Name)
			}
		}
	} else if l := s.listeningOf(); l != nil {
		channels = l.PendingListens()
	}
	if len(channels) > 0 {
		s.listenHandler().SubscribeEarly(s, channels)
	}
}

// expectNotifies registers the NOTIFYs of a statement about to be bound on
// the attached server connection (f: its findings; nil: none).
// bindTail, when not nil, is the Bind's tail: $n arguments of pg_notify are
// taken from it.
func (s *Session) expectNotifies(f *rewrite.Findings, bindTail []byte) {
	// Registered whether or not anyone listens yet: a LISTEN may reach the
	// listener connection before this transaction commits. Ready settles
	// them at the commit.
	if f == nil || len(f.Notifies) == 0 || s.link.sc == nil || s.srv.Hub == nil {
		return
	}
	var args *wire.BindArgs
	if bindTail != nil {
		args = new(wire.BindArgs)
		if (wire.Bind{Tail: bindTail}).Args(args) != nil {
			args = nil
		}
	}
	s.listenHandler().Expect(s, f, s.link.sc.PID, args)
}

// listenEdits are the edits of a Query that LISTENs among other
// statements: each LISTEN or UNLISTEN is sent as UNLISTEN * (its tag
// restored, its effect noted at its CommandComplete), each
// pg_listening_channels() call as the unnest of the session's channels.
func (s *Session) listenEdits(f *rewrite.Findings, sql string) []sqlEdit {
	if !s.ListenShared() {
		return nil
	}
	var edits []sqlEdit
	for _, c := range f.State {
		if c.Kind != rewrite.Listen && c.Kind != rewrite.Unlisten || c.Stmt == 0 || c.Name == "" || c.End > len(sql) {
			continue
		}
		unlisten := c.Kind == rewrite.Unlisten
		op := local.NewListenOp(unlisten, c.Name)
		tag := "UNLISTEN"
		if !unlisten {
			tag = "LISTEN"
		}
		edits = append(edits, sqlEdit{pos: c.Pos, end: c.End, text: "UNLISTEN *", fix: tagFix{stmt: c.Stmt, tag: tag, listen: &op}})
	}
	if len(f.ChannelsCalls) > 0 {
		text := local.ChannelsArray(s.listeningOf().Channels())
		for _, c := range f.ChannelsCalls {
			if c.End <= len(sql) {
				edits = append(edits, sqlEdit{pos: c.Pos, end: c.End, text: text})
			}
		}
	}
	return edits
}
