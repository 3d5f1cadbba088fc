package proxy

import (
	"context"
	"math"
	"time"

	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/rewrite"
)

// Signals of key pids: the core's side of pg_terminate_backend and
// pg_cancel_backend of a client's key pid. The signal kind of package
// local answers such a call when it is a whole statement, and asks the
// session (Session.Signal) to carry it out: for a client of this instance
// here (Server.signalClient), for another instance's client through that
// instance (clustersignal.go).

// signalRequest is one pg_terminate_backend or pg_cancel_backend of a key
// pid, as the calling session asks it (or another instance of the cluster
// on its behalf, clustersignal.go).
type signalRequest struct {
	pid       uint32
	terminate bool          // pg_terminate_backend, else pg_cancel_backend
	timeout   time.Duration // terminate: how long to wait for the client to end (0: no wait)
	user      string        // the caller's login user
	admin     bool          // the caller's user is in admin_users
}

// allows reports whether the caller may signal a client that logged in as
// user.
func (r signalRequest) allows(user string) bool { return r.admin || r.user == user }

// signalKeyPID carries out r for a client of this instance or, when the
// key pid carries another instance's number, sends it to that instance.
// The wait ends with the caller's cancel request or kill.
func (s *session) signalKeyPID(r signalRequest) (local.SignalResult, error) {
	ctx := s.waitContext()
	defer s.endWait()
	var res local.SignalResult
	var err error
	s.offload(func() {
		if n := pidNumber(r.pid); n != 0 && s.srv.cluster != nil && n != s.srv.cluster.Number() {
			res, err = s.srv.forwardSignal(ctx, n, r)
			return
		}
		res = s.srv.signalClient(ctx, r)
	})
	return res, err
}

// keyPIDLive reports whether pid is the key pid of a client of this
// instance, or carries the number of another live instance of the cluster
// (which may or may not serve such a client).
func (s *Server) keyPIDLive(pid uint32) bool {
	if n := pidNumber(pid); n != 0 && s.cluster != nil && n != s.cluster.Number() {
		_, ok := s.cluster.PeerInfo(n)
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[pid]
	return ok
}

// signalClient carries out r for a client of this instance, whose key pid
// is not the caller's own: a terminate kills the session and, with a
// timeout, waits for it to have ended; a cancel is the cancel request of
// its key.
func (s *Server) signalClient(ctx context.Context, r signalRequest) local.SignalResult {
	s.mu.Lock()
	t := s.sessions[r.pid]
	switch {
	case t == nil:
		s.mu.Unlock()
		return local.SignalNoClient
	case !r.allows(t.user):
		s.mu.Unlock()
		return local.SignalDenied
	}
	var ended chan struct{}
	if r.terminate && r.timeout > 0 {
		// Made while t is registered: its sessionEnded has not run yet.
		ended = s.watchEndLocked(t)
	}
	s.mu.Unlock()
	if !r.terminate {
		s.cancelSession(t.pid, t.secret)
		return local.SignalSent
	}
	s.log.Info("pg_terminate_backend: client terminated", "client", t.remote, "id", t.pid, "app", t.app.cfg.Name, "by_user", r.user)
	t.kill(local.ErrTerminated())
	if ended == nil {
		return local.SignalSent
	}
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	select {
	case <-ended:
		return local.SignalSent
	case <-timer.C:
		return local.SignalStillRunning
	case <-ctx.Done():
		return local.SignalCanceled
	}
}

// watchEndLocked returns a channel closed when ss has ended and cleaned up
// (sessionEnded); s.mu is held and ss registered.
func (s *Server) watchEndLocked(ss *session) chan struct{} {
	if s.ends == nil {
		s.ends = make(map[*session]chan struct{})
	}
	ch := s.ends[ss]
	if ch == nil {
		ch = make(chan struct{})
		s.ends[ss] = ch
	}
	return ch
}

// sessionEnded runs at the end of a session's cleanup: whoever waits for
// it to end (watchEndLocked) is told.
func (s *Server) sessionEnded(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.ends[ss]; ch != nil {
		close(ch)
		delete(s.ends, ss)
	}
}

// Signal calls inside larger statements (SELECT pg_terminate_backend(pid)
// FROM unnest($1::int[]) pid, …) run on the server, which knows no key
// pid: for one it warns "PID … is not a PostgreSQL backend process"
// (routine pg_signal_backend, SQLSTATE 01000) and returns false. While a
// statement that calls the signal functions runs (expectSignals), such a
// warning naming the key pid of a client the caller may signal is carried
// out by lockpool instead (onSignalWarning), as KILL_CLIENT or a
// CancelRequest, and not relayed: the client ends as with a backend's
// pid. What lockpool cannot change is the call's value in the row, which
// the server computed: false (PostgreSQL: true), and a timeout argument is
// not waited for. A warning for the caller's own key pid, for a pid the
// caller may not signal, for no client's, or in a statement that calls
// both functions (the warning does not say which) is relayed as it is.

// Bits of sessionExtras.signals: the signal functions a statement running
// on the server calls.
const (
	signalsTerminate = 1 << iota
	signalsCancel
)

// expectSignals notes that a statement with findings f (nil: none) is
// going to the server: its signal functions' warnings are looked at until
// the server owes nothing (onReady clears them).
//
// A statement that calls pg_backend_pid() makes this client the one that
// last read the pid of the backend it runs on (seenPIDs).
func (s *session) expectSignals(f *rewrite.Findings) {
	if f != nil && f.BackendPID && s.link.sc != nil {
		s.srv.seen.note(s.link.sc.PID, s.pid)
	}
	if f == nil || !f.Terminates && !f.Cancels {
		return
	}
	x := s.more()
	if f.Terminates {
		x.signals |= signalsTerminate
	}
	if f.Cancels {
		x.signals |= signalsCancel
	}
}

// onSignalWarning handles a NoticeResponse body the server sent while a
// statement that calls a signal function runs: when it is
// pg_signal_backend's warning for the key pid of a client the caller may
// signal, the signal is sent to that client and onSignalWarning reports
// true (the warning is not the client's: a direct connection has none).
func (s *session) onSignalWarning(body []byte) bool {
	x := s.extras
	if x == nil || x.signals == 0 {
		return false
	}
	var terminate bool
	switch x.signals {
	case signalsTerminate:
		terminate = true
	case signalsCancel:
	default:
		return false // both are called: which one warned is not known
	}
	v, ok := local.SignalWarningPID(body)
	if !ok || !isKeyPID(v) || uint32(v) == s.pid {
		return false
	}
	pid := uint32(v)
	r := signalRequest{pid: pid, terminate: terminate, user: s.user, admin: s.srv.Config().IsAdmin(s.user)}
	var res local.SignalResult
	if n := pidNumber(pid); n != 0 && s.srv.cluster != nil && n != s.srv.cluster.Number() {
		ctx, cancel := context.WithTimeout(s.srv.baseCtx, s.srv.rc.Load().cfg.Server.ConnectTimeout)
		s.offload(func() { res, _ = s.srv.forwardSignal(ctx, n, r) })
		cancel()
	} else {
		res = s.srv.signalClient(s.srv.baseCtx, r) // no timeout: it does not wait
	}
	return res == local.SignalSent
}

// seenBy returns the key pid of the client that last read pid from
// pg_backend_pid() (seenPIDs), when pid is a backend's pid one did.
func (s *session) seenBy(pid int64) (uint32, bool) {
	if pid <= 0 || pid > math.MaxInt32 {
		return 0, false
	}
	return s.srv.seen.client(uint32(pid))
}
