package policy

import (
	"fmt"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// Mode is an application's policy for one kind of session-bound state.
type Mode uint8

// The policies of DESIGN.md: advisory_locks and session_state take one each.
const (
	Pin Mode = iota
	Reject
	Allow
	// Hold (advisory_locks only): lockpool holds session-level advisory
	// locks for its clients on its own lock connections; statements it
	// cannot answer itself fall back to Pin.
	Hold
	// Shared (listen only): lockpool answers LISTEN itself and delivers
	// notifications from its own listener connection; nothing is pinned.
	Shared
)

// ParseMode maps a config value to a Mode.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "pin", "":
		return Pin, nil
	case "reject":
		return Reject, nil
	case "allow":
		return Allow, nil
	case "hold":
		return Hold, nil
	case "shared":
		return Shared, nil
	}
	return Pin, fmt.Errorf("policy: unknown mode %q (want pin, reject, allow, hold or shared)", s)
}

// String returns the config spelling of m.
func (m Mode) String() string {
	switch m {
	case Reject:
		return "reject"
	case Allow:
		return "allow"
	case Hold:
		return "hold"
	case Shared:
		return "shared"
	}
	return "pin"
}

// Input is everything Decide looks at.
type Input struct {
	App           string // application name, for messages
	AdvisoryLocks Mode   // the application's advisory_locks policy
	SessionState  Mode   // the application's session_state policy
	SessionPool   bool   // pool_mode session: the connection is the client's anyway

	// SessionAcquire: the statement calls a session-level advisory acquire
	// (lock or try-lock, shared or not). AcquireFunc names the first one.
	SessionAcquire bool
	AcquireFunc    string
	// Advisory: the statement calls any advisory function (unlocks included).
	Advisory bool
	// Unlock: the statement calls a session-level unlock function.
	Unlock bool
	// Holdable: the statement is, as a whole, one call of a session-level
	// advisory function that lockpool answers itself under Hold.
	Holdable bool
	// AdvisoryPinned: the session is pinned (or holds a pin slot) for
	// advisory locks its server connection holds, after a fallback: under
	// Hold its advisory calls go to that connection until it unpins, so an
	// unlock reaches the lock.
	AdvisoryPinned bool
	// State: the statement creates session state that cannot follow the
	// client to another server connection (LISTEN, temp table, WITH HOLD
	// cursor, SQL PREPARE, SET ROLE, LOAD). StateKind names it.
	State     bool
	StateKind string
	// Listen: the statement LISTENs, and the application's listen policy
	// is Reject (under Pin the statement is State; under Shared lockpool
	// answers it before any decision).
	Listen bool
	// StateEnd: the statement may end such state (UNLISTEN, DISCARD,
	// DEALLOCATE, CLOSE, DROP TABLE, RESET ROLE, unlocks).
	StateEnd bool

	Pinned bool // the session is pinned already
}

// Action is what the proxy does with the statement.
type Action uint8

const (
	// Forward sends the statement on the session's connection as usual.
	Forward Action = iota
	// PinFirst takes a pin slot (waiting up to wait_timeout, holding no
	// server connection when outside a transaction), then forwards, then
	// probes the server once the transaction is idle: the session stays
	// pinned only while the probe finds something held.
	PinFirst
	// Probe forwards, then probes once the transaction is idle (unlocks and
	// other statements that may end what keeps a session pinned).
	Probe
	// Refuse answers the statement with Decision.Err; the proxy makes sure
	// the client's and the server's transaction states agree afterwards.
	Refuse
	// Answer: lockpool answers the advisory call itself with the lock it
	// holds for the client (advisory_locks: hold); no server connection.
	Answer
)

// Decision is Decide's answer.
type Decision struct {
	Action Action
	Err    *pgerr.Error // set for Refuse
	// Reason is what the pin is for ("advisory_lock" or the state kind),
	// for metrics labels.
	Reason string
	// Fallback: under Hold, a statement touching session-level advisory
	// functions that lockpool cannot answer itself is handled as under Pin
	// (counted and logged by the proxy).
	Fallback bool
}

// Decide returns what to do with one statement.
func Decide(in Input) Decision {
	if in.SessionPool {
		return Decision{Action: Forward}
	}
	if in.AdvisoryLocks == Hold {
		if in.Holdable && !in.AdvisoryPinned {
			return Decision{Action: Answer}
		}
		in.AdvisoryLocks = Pin
		if in.SessionAcquire || in.Unlock {
			d := Decide(in)
			d.Fallback = true
			return d
		}
	}
	if in.SessionAcquire {
		switch in.AdvisoryLocks {
		case Reject:
			return Decision{Action: Refuse, Err: RejectAdvisory(in.App, in.AcquireFunc)}
		case Pin:
			if in.Pinned {
				return Decision{Action: Probe, Reason: "advisory_lock"}
			}
			return Decision{Action: PinFirst, Reason: "advisory_lock"}
		}
	}
	if in.Listen {
		return Decision{Action: Refuse, Err: RejectListen(in.App)}
	}
	if in.State {
		switch in.SessionState {
		case Reject:
			return Decision{Action: Refuse, Err: RejectState(in.App, in.StateKind)}
		case Pin:
			if in.Pinned {
				return Decision{Action: Probe, Reason: in.StateKind}
			}
			return Decision{Action: PinFirst, Reason: in.StateKind}
		}
	}
	if in.Advisory && in.AdvisoryLocks == Pin {
		// Unlocks, and transaction-level locks (which need no pin but
		// may be combined with unlocks): check afterwards.
		return Decision{Action: Probe, Reason: "advisory_lock"}
	}
	if in.StateEnd && in.Pinned {
		return Decision{Action: Probe}
	}
	return Decision{Action: Forward}
}

// RejectAdvisory is the 0A000 error for a session-level advisory lock under
// advisory_locks: reject.
func RejectAdvisory(app, fn string) *pgerr.Error {
	if fn == "" {
		fn = "session-level advisory lock"
	}
	return pgerr.Newf(pgerr.FeatureNotSupported,
		"Use pg_advisory_xact_lock inside a transaction, or SELECT lease_acquire('name', ttl_seconds) for a lock that holds no connection.",
		"%s is not allowed for application %q: a session-level advisory lock would outlive its transaction on a pooled connection", fn, app)
}

// RejectState is the 0A000 error for session state under session_state: reject.
func RejectState(app, kind string) *pgerr.Error {
	return pgerr.Newf(pgerr.FeatureNotSupported,
		"Keep the state inside one transaction (SET LOCAL, ON COMMIT DROP temp tables, cursors without HOLD), or set session_state: pin for this application.",
		"%s is not allowed for application %q: session state cannot follow a client across pooled connections", kind, app)
}

// RejectListen is the 0A000 error for LISTEN under listen: reject.
func RejectListen(app string) *pgerr.Error {
	return pgerr.Newf(pgerr.FeatureNotSupported,
		"Set listen: shared for this application: lockpool then answers LISTEN itself and delivers notifications without pinning a server connection.",
		"LISTEN is not allowed for application %q", app)
}

// PinTimeout is the 53300 error for a pin slot not free within wait_timeout.
func PinTimeout(app string, maxPinned int, wait string) *pgerr.Error {
	return pgerr.Newf(pgerr.TooManyConnections,
		"Other sessions of this application hold session-level advisory locks or session state. Release them sooner, use pg_advisory_xact_lock or lease_acquire, or raise max_pinned.",
		"no pin slot free for application %q within %s (max_pinned %d)", app, wait, maxPinned)
}

// PoolTimeout is the 53300 error for no server connection within wait_timeout.
func PoolTimeout(app string, maxConns int, wait string) *pgerr.Error {
	return pgerr.Newf(pgerr.TooManyConnections,
		"All of this application's server connections are busy. Retry, shorten transactions, or raise the application's max_connections.",
		"no server connection free for application %q within %s (max_connections %d)", app, wait, maxConns)
}
