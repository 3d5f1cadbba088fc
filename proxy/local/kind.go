package local

import (
	"context"
	"time"

	"github.com/lockpool/lockpool/advisory"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/rewrite"
)

// Handler is one kind's per-session state and its answers.
type Handler interface {
	// Prepare makes the statement of a claimed Query or Parse. sql is the
	// statement's text; rest is the Parse's query and parameter types as
	// on the wire, nil for a simple Query; it aliases nothing that
	// changes. An error answers the statement with that error instead (a
	// FATAL one ends the session).
	Prepare(s Session, f *rewrite.Findings, sql string, rest []byte) (Stmt, *pgerr.Error)
	// End releases the kind's per-session state when the session ends.
	End(s Session)
}

// Stmt is a prepared statement lockpool answers itself.
type Stmt interface {
	// ParamTypes are the parameter types Describe of the statement shows.
	// The caller may change the slice it gets.
	ParamTypes() []uint32
	// Describe appends what the statement returns: a RowDescription in
	// the result formats given (nil: text), or NoData.
	Describe(buf []byte, formats []int16) []byte
	// Bind makes a portal from the Bind's parameters, of the types the
	// statement was prepared with (the client's where it declared them); a
	// is nil for a simple Query, whose statement has no parameters to take.
	Bind(s Session, a *wire.BindArgs, types []uint32) (Portal, *pgerr.Error)
}

// Portal is a bound Stmt.
type Portal interface {
	// Run executes the portal and returns its reply: the rows in formats
	// and CommandComplete, with the RowDescription when withDesc (a simple
	// Query), and any notices where PostgreSQL would send them. A nil
	// reply with no error means the statement's reply comes from the
	// server (Session.Forward).
	Run(s Session, formats []int16, withDesc bool) ([]byte, *pgerr.Error)
}

// ReadyNoticer is a Handler with notices for the client at the end of a
// transaction, put before its ReadyForQuery.
type ReadyNoticer interface {
	ReadyNotices(s Session, buf []byte) []byte
}

// IdleSender is a Handler with messages for a client that is idle outside
// a transaction block with nothing owed (notifications).
type IdleSender interface {
	IdleMessages(s Session, buf []byte) []byte
}

// Kind is one kind of statement lockpool answers itself: an entry of the
// core's table of kinds, made by the kind's constructor (LeaseKind,
// HoldKind, ListenKind, SignalKind).
type Kind struct {
	name   string
	claims func(s Session, f *rewrite.Findings, d policy.Decision) bool
	open   func(s Session) Handler
}

// Name is the kind's name.
func (k Kind) Name() string { return k.name }

// Claims reports whether the statement is this kind's, given the policy's
// decision for it.
func (k Kind) Claims(s Session, f *rewrite.Findings, d policy.Decision) bool {
	return k.claims(s, f, d)
}

// Open makes the kind's per-session state at its first claim.
func (k Kind) Open(s Session) Handler { return k.open(s) }

// Session is what a kind needs from the client session it answers for.
// Its methods are called on the session's coroutine (or in a function it
// offloads, while it waits for it), except those the listen kind's inbox
// calls on the listener hub's goroutine: PID, Database, Config, Hub, Kill
// and WakeIdle, which are safe on any goroutine.
type Session interface {
	// PID is the client's key pid (its BackendKeyData).
	PID() uint32
	// User is the client's login user.
	User() string
	// Database is the database the client logged in to.
	Database() string
	// Remote is the client's address.
	Remote() string
	// App is the configuration of the client's application.
	App() *config.Application
	// Config is the configuration in force.
	Config() *config.Config
	// ListenShared reports whether LISTEN of the client is answered by
	// lockpool (listen: shared, outside session pooling).
	ListenShared() bool
	// HoldApp is the application's advisory_locks: hold metrics; nil
	// under another policy.
	HoldApp() *HoldApp

	// Leases is the lease store; nil when leases are off.
	Leases() LeaseStore
	// Locks is the holder of advisory_locks: hold; nil without one.
	Locks() *advisory.Manager
	// Hub is the listener hub of listen: shared; nil without one.
	Hub() *listen.Hub

	// Offload runs fn, which may wait on anything but the session's own
	// sockets, without stalling the session's event loop.
	Offload(fn func())
	// WaitContext is the context of a wait in lockpool that the client's
	// cancel request (or a kill) ends; EndWait must follow the wait.
	WaitContext() context.Context
	// EndWait ends the wait WaitContext began.
	EndWait()
	// Kill ends the session with a FATAL error.
	Kill(pe *pgerr.Error)
	// KilledBy is the FATAL of a kill of the session, or nil.
	KilledBy() *pgerr.Error

	// Status is the transaction status the client sees now ('I', 'T' or
	// 'E').
	Status() byte
	// LockLimits are the client's lock_timeout and statement_timeout as
	// it set them, read from its server connection inside a transaction
	// block. An error is a FATAL: the session ends.
	LockLimits() (advisory.Limits, *pgerr.Error)
	// WakeIdle asks the session's loop to write the idle messages
	// (IdleSender) of an idle client now.
	WakeIdle()
	// Forward sends a statement to the server as the client sent it: an
	// unnamed Parse of parse (its query and declared parameter types), a
	// Bind of bind (parameter formats, parameters, result formats) and an
	// Execute, whose rows, notices or error take the statement's place in
	// the reply order. An error answers the statement instead.
	Forward(parse, bind []byte) *pgerr.Error

	// ClientPID is the key pid pid names for the signal functions: pid
	// itself when it is shaped like a key pid lockpool hands out
	// (keyShaped; it may name no client), else the key pid of the client
	// that last read pid from pg_backend_pid(); ok is false when it is
	// neither.
	ClientPID(pid int64) (key uint32, keyShaped, ok bool)
	// KeyPIDLive reports whether key is the key pid of a client of this
	// instance, or carries the number of another live instance of the
	// cluster.
	KeyPIDLive(key uint32) bool
	// Signal terminates (with a wait of up to timeout for its end, 0: no
	// wait) or cancels the client with key pid key, on this instance or
	// the one of the cluster serving it, as the session's user may. The
	// wait ends with the session's cancel request or kill.
	Signal(key uint32, terminate bool, timeout time.Duration) (SignalResult, error)
}
