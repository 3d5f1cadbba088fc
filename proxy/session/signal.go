package session

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
// session (Session.Signal) to carry it out, and the server does
// (Host.Signal): for a client of this instance itself, for another
// instance's client through that instance.

// KeyPIDBase is the lowest key pid the server hands a client: PID_MAX_LIMIT
// of 64-bit Linux, so that no key pid is a PostgreSQL backend's pid (the
// server's key-pid scheme, with the cluster instance's number in higher
// bits, starts here).
const KeyPIDBase = 1 << 22

// IsKeyPID reports whether pid is shaped like a key pid (it may name no
// client): at least KeyPIDBase and a positive int32, as libpq expects.
func IsKeyPID(pid int64) bool { return pid >= KeyPIDBase && pid <= math.MaxInt32 }

// signalKeyPID carries out a pg_terminate_backend (terminate) or
// pg_cancel_backend of key pid for the session's user (an admin when
// admin_users lists it): the server does it for a client of this instance,
// or sends it to the instance whose number the key pid carries
// (Host.Signal). The wait ends with the caller's cancel request or kill.
func (s *Session) signalKeyPID(pid uint32, terminate bool, timeout time.Duration) (local.SignalResult, error) {
	ctx := s.waitContext()
	defer s.endWait()
	admin := s.srv.Host.Config().IsAdmin(s.user)
	var res local.SignalResult
	var err error
	s.offload(func() { res, err = s.srv.Host.Signal(ctx, pid, terminate, timeout, s.user, admin) })
	return res, err
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
// last read the pid of the backend it runs on (SeenPIDs).
func (s *Session) expectSignals(f *rewrite.Findings) {
	if f != nil && f.BackendPID && s.link.sc != nil {
		s.srv.Seen.note(s.link.sc.PID, s.pid)
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
func (s *Session) onSignalWarning(body []byte) bool {
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
	if !ok || !IsKeyPID(v) || uint32(v) == s.pid {
		return false
	}
	// No timeout: a terminate does not wait for the client to end; a
	// forward to another instance is bounded by connect_timeout.
	ctx, cancel := context.WithTimeout(s.srv.Base, s.srv.Host.Config().Server.ConnectTimeout)
	var res local.SignalResult
	admin := s.srv.Host.Config().IsAdmin(s.user)
	s.offload(func() { res, _ = s.srv.Host.Signal(ctx, uint32(v), terminate, 0, s.user, admin) })
	cancel()
	return res == local.SignalSent
}

// seenBy returns the key pid of the client that last read pid from
// pg_backend_pid() (SeenPIDs), when pid is a backend's pid one did.
func (s *Session) seenBy(pid int64) (uint32, bool) {
	if pid <= 0 || pid > math.MaxInt32 {
		return 0, false
	}
	return s.srv.Seen.client(uint32(pid))
}
