package rewrite

import "strings"

// Func is one of the eleven PostgreSQL advisory-lock functions.
type Func uint8

// The advisory-lock functions. The zero Func is not a function.
const (
	AdvisoryLock Func = 1 + iota
	AdvisoryLockShared
	TryAdvisoryLock
	TryAdvisoryLockShared
	AdvisoryXactLock
	AdvisoryXactLockShared
	TryAdvisoryXactLock
	TryAdvisoryXactLockShared
	AdvisoryUnlock
	AdvisoryUnlockShared
	AdvisoryUnlockAll
)

var funcNames = [...]string{
	AdvisoryLock:              "pg_advisory_lock",
	AdvisoryLockShared:        "pg_advisory_lock_shared",
	TryAdvisoryLock:           "pg_try_advisory_lock",
	TryAdvisoryLockShared:     "pg_try_advisory_lock_shared",
	AdvisoryXactLock:          "pg_advisory_xact_lock",
	AdvisoryXactLockShared:    "pg_advisory_xact_lock_shared",
	TryAdvisoryXactLock:       "pg_try_advisory_xact_lock",
	TryAdvisoryXactLockShared: "pg_try_advisory_xact_lock_shared",
	AdvisoryUnlock:            "pg_advisory_unlock",
	AdvisoryUnlockShared:      "pg_advisory_unlock_shared",
	AdvisoryUnlockAll:         "pg_advisory_unlock_all",
}

// String returns the canonical lower-case function name ("pg_advisory_lock").
func (f Func) String() string {
	if f == 0 || int(f) >= len(funcNames) {
		return "Func(?)"
	}
	return funcNames[f]
}

// SessionAcquire reports a session-level acquire (lock or try_lock, shared or
// not, not _xact_): the lock outlives the transaction.
func (f Func) SessionAcquire() bool { return f >= AdvisoryLock && f <= TryAdvisoryLockShared }

// Xact reports a transaction-level (_xact_) acquire.
func (f Func) Xact() bool { return f >= AdvisoryXactLock && f <= TryAdvisoryXactLockShared }

// Unlock reports pg_advisory_unlock, _unlock_shared or _unlock_all.
func (f Func) Unlock() bool { return f >= AdvisoryUnlock && f <= AdvisoryUnlockAll }

// Try reports the pg_try_ variants (they return false instead of waiting).
func (f Func) Try() bool {
	return f == TryAdvisoryLock || f == TryAdvisoryLockShared || f == TryAdvisoryXactLock || f == TryAdvisoryXactLockShared
}

// Shared reports the _shared variants.
func (f Func) Shared() bool { return f.Valid() && strings.HasSuffix(funcNames[f], "_shared") }

// Valid reports whether f is one of the eleven functions.
func (f Func) Valid() bool { return f >= AdvisoryLock && f <= AdvisoryUnlockAll }

// lookupFunc maps an identifier value (already case-folded as PostgreSQL
// would) to a Func.
func lookupFunc(name string) Func {
	if len(name) < len("pg_advisory_lock") || name[:3] != "pg_" {
		return 0
	}
	for f := AdvisoryLock; f <= AdvisoryUnlockAll; f++ {
		if funcNames[f] == name {
			return f
		}
	}
	return 0
}

// lookupFuncFold is lookupFunc for raw unquoted identifier text.
func lookupFuncFold(raw string) Func {
	if len(raw) < len("pg_advisory_lock") || len(raw) > len("pg_try_advisory_xact_lock_shared") || !hasFold(raw, 0, "pg_") {
		return 0
	}
	for f := AdvisoryLock; f <= AdvisoryUnlockAll; f++ {
		if foldEq(raw, funcNames[f]) {
			return f
		}
	}
	return 0
}

// ArgKind is the kind of a lease-call argument.
type ArgKind uint8

// Argument kinds of a whole-statement lease call.
const (
	ArgString ArgKind = 1 + iota // a string literal; Arg.Text is its decoded value
	ArgNumber                    // a numeric literal; Arg.Text is its text, with a leading '-' when negative
	ArgNull                      // NULL
	ArgParam                     // $n; Arg.Param is n
)

func (k ArgKind) String() string {
	switch k {
	case ArgString:
		return "string"
	case ArgNumber:
		return "number"
	case ArgNull:
		return "null"
	case ArgParam:
		return "param"
	}
	return "ArgKind(?)"
}

// Arg is one argument of a lease call. A cast (::text, ::numeric …) on a
// literal is accepted and dropped; Cast keeps its lower-case type name.
type Arg struct {
	Kind  ArgKind
	Text  string // decoded string value, or number text ("-1.5")
	Param int    // 1-based parameter number for ArgParam
	Cast  string // "" or the cast type ("text", "numeric", "double precision" …)
}

// LeaseCall is a statement that is, as a whole, one lease virtual call:
// SELECT [lockpool.]lease_xxx(args) [[AS] alias] or SELECT * FROM lease_xxx(args) [[AS] alias].
// The arity is not checked here. Findings.ChannelsWhole uses it too, for
// SELECT [* FROM] [pg_catalog.]pg_listening_channels() [[AS] alias].
type LeaseCall struct {
	Func  string // "lease_acquire", "lease_renew", "lease_release", "lease_list" or "pg_listening_channels"
	Args  []Arg
	Alias string // the column (or FROM) alias, decoded; "" when none
	Star  bool   // the SELECT * FROM form
}

// SignalCall is a statement that is, as a whole, one call of
// pg_terminate_backend or pg_cancel_backend with constant or $n arguments:
// SELECT [* FROM] [pg_catalog.]pg_terminate_backend(args) [[AS] alias]
// (any case, the name quoted or not). The number of arguments and their
// kinds are not checked here.
type SignalCall struct {
	Func  string // TerminateBackend or CancelBackend
	Args  []Arg
	Alias string // the column (or FROM) alias, decoded; "" when none
	Star  bool   // the SELECT * FROM form
}

// Terminate reports a pg_terminate_backend call (else pg_cancel_backend).
func (c *SignalCall) Terminate() bool { return c.Func == TerminateBackend }

// StateKind is a kind of session-state statement.
type StateKind uint8

// Session-state statement kinds. The zero StateKind is not a kind.
const (
	Listen      StateKind = 1 + iota // LISTEN channel
	Unlisten                         // UNLISTEN channel | *  (Name "*")
	TempTable                        // CREATE TEMP TABLE/VIEW/SEQUENCE (not ON COMMIT DROP), SELECT … INTO TEMP, CREATE … pg_temp.x
	DropTable                        // DROP TABLE/VIEW/SEQUENCE: a temp object may be gone (re-probe)
	DeclareHold                      // DECLARE name … WITH HOLD
	Close                            // CLOSE name | ALL (Name "*")
	Prepare                          // SQL PREPARE name AS …
	Deallocate                       // DEALLOCATE [PREPARE] name | ALL (Name "*")
	SetRole                          // SET [SESSION] ROLE / SESSION AUTHORIZATION, RESET ROLE / SESSION AUTHORIZATION, set_config('role'|'session_authorization', …, false); Name "" = back to the login role
	Load                             // LOAD 'library' (Name is the library)
	Discard                          // DISCARD ALL | TEMP | PLANS | SEQUENCES (Name lower case; TEMPORARY → "temp")
	SetConfig                        // set_config(…) whose arguments are not all literals and is not provably transaction-local (Name: the GUC if literal)
)

var stateNames = [...]string{
	Listen: "LISTEN", Unlisten: "UNLISTEN", TempTable: "TEMP TABLE", DropTable: "DROP TABLE",
	DeclareHold: "DECLARE WITH HOLD", Close: "CLOSE", Prepare: "PREPARE", Deallocate: "DEALLOCATE",
	SetRole: "SET ROLE", Load: "LOAD", Discard: "DISCARD", SetConfig: "set_config",
}

func (k StateKind) String() string {
	if k == 0 || int(k) >= len(stateNames) {
		return "StateKind(?)"
	}
	return stateNames[k]
}

// StateChange is one session-state statement.
type StateChange struct {
	Kind StateKind
	Name string // channel / cursor / statement / role / object name: lower-cased unless quoted; "*" for all
	// Where the statement is, for a LISTEN or UNLISTEN statement of the
	// analysed text itself (not of a DO body): Stmt is its number among the
	// text's non-empty statements (1-based; 0 elsewhere and for the other
	// kinds) and src[Pos:End] its text without the ';', as in SetCmd.
	//
	// A Listen or Unlisten Name is the channel as PostgreSQL names it: an
	// unquoted identifier folded to lower case (ASCII only), a quoted one
	// as written with "" undoubled, a U&"…" one decoded (UESCAPE honoured),
	// each cut to 63 bytes (NAMEDATALEN-1, at a UTF-8 character boundary)
	// as PostgreSQL truncates identifiers; "*" for UNLISTEN *. It is ""
	// when the statement is not one PostgreSQL accepts (no channel, a
	// string, a reserved word, a qualified name, a zero-length or
	// unterminated identifier, anything after the name): such a statement
	// fails on the server, so it is best sent there.
	Stmt     int
	Pos, End int
}

// NotifyCall is one NOTIFY statement or pg_notify call.
//
// Analyze reports every NOTIFY statement of the analysed text and every
// call of pg_notify (unqualified or pg_catalog-qualified, any case,
// "pg_notify" quoted) anywhere in it, inside other statements too, in text
// order. Neither is reported inside a DO body (or an EXECUTE string in one)
// or a function body: whether that code runs cannot be known here.
//
// A NOTIFY statement that PostgreSQL's grammar rejects (NOTIFY channel
// [, 'payload'] with a string constant only: no cast, no parameter, no
// expression) is reported with Known and KnownPayload false. A pg_notify
// call whose argument is a string literal (plain, E”, U&”, dollar-quoted;
// optionally cast to text or varchar without a length), NULL (what
// pg_notify treats as "") or $n (optionally cast the same way) has that
// argument known or its parameter set; any other argument, and a call
// without exactly two arguments, leaves it unknown. A known Channel "" is
// one PostgreSQL rejects ("channel name cannot be empty").
type NotifyCall struct {
	Channel      string // NOTIFY: the identifier as normalised (see above); pg_notify: the string literal's value exactly (pg_notify does not fold case)
	ChannelParam int    // pg_notify($n, …): n; 0 otherwise
	Payload      string // the payload literal's decoded value ("" when none)
	PayloadParam int    // $n payload: n; 0 otherwise
	Known        bool   // Channel is known (a literal or identifier)
	KnownPayload bool   // Payload is known (NOTIFY without payload: true with ""; a literal: true)
}

// Span is a byte range src[Pos:End] of the analysed text.
type Span struct{ Pos, End int }

// SetCmd is a tracked GUC change: SET, SET TIME ZONE, RESET, RESET ALL or a
// set_config call with literal arguments.
type SetCmd struct {
	Name   string // lower-cased GUC name ("search_path", "timezone", "app.user_id"); "" for RESET ALL
	Value  string // SQL text to re-send: the raw value after TO/= ("'UTC'", `public, "My Schema"`); for set_config a quoted literal
	Reset  bool   // RESET name, SET name TO DEFAULT, SET TIME ZONE LOCAL|DEFAULT, set_config(name, NULL, …)
	All    bool   // RESET ALL
	Local  bool   // SET LOCAL / set_config(…, true): transaction scoped
	Config bool   // came from set_config: Value is the second argument as a literal (list GUCs differ from SET)
	// Where the statement is, for a SET or RESET statement of the analysed
	// text itself (not of a DO body or a set_config call): Stmt is its
	// number among the text's non-empty statements (1-based; 0 elsewhere),
	// src[Pos:End] its text without the ';', and Tag the command tag
	// PostgreSQL completes it with ("SET" or "RESET").
	Stmt     int
	Pos, End int
	Tag      string
}

// SQL renders a statement that replays the change on another connection.
func (c SetCmd) SQL() string {
	switch {
	case c.All:
		return "RESET ALL"
	case c.Reset:
		return "RESET " + gucIdent(c.Name)
	case c.Config:
		local := "false"
		if c.Local {
			local = "true"
		}
		return "SELECT pg_catalog.set_config(" + quoteLiteral(c.Name) + ", " + c.Value + ", " + local + ")"
	}
	scope := ""
	if c.Local {
		scope = "LOCAL "
	}
	if c.Name == "timezone" {
		return "SET " + scope + "TIME ZONE " + c.Value
	}
	return "SET " + scope + gucIdent(c.Name) + " TO " + c.Value
}

func gucIdent(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = quoteIdent(p)
	}
	return strings.Join(parts, ".")
}

// Findings is what Analyze found in one Query or Parse body.
type Findings struct {
	Funcs          []Func        // advisory function calls in order (duplicates kept); nil when none
	SessionAcquire bool          // some call is a session-level acquire (needs a pin)
	Advisory       bool          // some advisory function is called (xact included)
	Lease          *LeaseCall    // the whole string is one lease virtual call
	Hold           *AdvisoryCall // the whole string is one session-level advisory call (advisory_locks: hold answers it)
	LeaseMention   bool          // a lease_acquire/renew/release/list call that is not a whole-statement call
	LeaseFence     bool          // lease_fence( or lockpool.lease_fence( is called (see RewriteFence)
	State          []StateChange // session-state statements in order
	Sets           []SetCmd      // GUC changes in order
	Notifies       []NotifyCall  // NOTIFY statements and pg_notify calls in order (see NotifyCall)
	// ChannelsCalls are the pg_listening_channels() calls (no argument;
	// unqualified or pg_catalog-qualified, any case) of the analysed text,
	// in order: src[Pos:End] is the whole call from its qualifier (if any)
	// to its ')', so it can be replaced textually by an expression of the
	// same type. Calls inside DO bodies, function bodies and statements
	// that store an expression instead of running it now (CREATE, ALTER,
	// PREPARE) are not reported: replacing those would be wrong.
	ChannelsCalls []Span
	// ChannelsWhole is set when the whole text is one statement (an
	// optional trailing ';' aside) that is exactly SELECT
	// [pg_catalog.]pg_listening_channels() [[AS] alias] or SELECT * FROM
	// [pg_catalog.]pg_listening_channels() [[AS] alias]: Func
	// "pg_listening_channels", no Args. The call is in ChannelsCalls too.
	ChannelsWhole *LeaseCall
	// PreparedViews are the FROM-list references to pg_prepared_statements
	// (unqualified or pg_catalog-qualified), in order, outside DO bodies
	// and statements that store their text (CREATE, ALTER, PREPARE): the
	// server's view shows lockpool's statement names, so lockpool replaces
	// each with the client's statements.
	PreparedViews []ViewRef
	// ActivityViews are the FROM-list references to pg_stat_activity, as
	// PreparedViews: the server's view shows lockpool's pooled connections
	// and not its clients, so lockpool replaces each with a view of its
	// own (an idle client is a row with its key pid).
	ActivityViews []ViewRef
	// Signal is set when the whole text is one statement (an optional
	// trailing ';' aside) that is one pg_terminate_backend or
	// pg_cancel_backend call (see SignalCall), and the text calls neither
	// function anywhere else.
	Signal *SignalCall
	// Terminates and Cancels report that the text calls
	// pg_terminate_backend or pg_cancel_backend (unqualified or
	// pg_catalog-qualified) outside DO bodies, anywhere in a statement.
	Terminates, Cancels bool
	// BackendPID reports that the text calls pg_backend_pid()
	// (unqualified or pg_catalog-qualified), in a DO body too.
	BackendPID bool
	Statements int // non-empty top-level statements; 0 when the prefilter found nothing (not lexed)
}

// Hit reports whether anything at all was found.
func (f Findings) Hit() bool {
	return f.Advisory || f.Lease != nil || f.LeaseMention || f.LeaseFence || len(f.State) > 0 || len(f.Sets) > 0 ||
		len(f.Notifies) > 0 || len(f.ChannelsCalls) > 0 || f.ChannelsWhole != nil || len(f.PreparedViews) > 0 || len(f.ActivityViews) > 0 || f.Signal != nil ||
		f.Terminates || f.Cancels || f.BackendPID
}
