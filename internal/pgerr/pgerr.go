// Package pgerr is the error type of everything lockpool itself reports to
// a client: a PostgreSQL ErrorResponse (or NoticeResponse) with a SQLSTATE,
// a message that starts with "lockpool: " and a hint.
//
// Constructors return a fresh *Error on every call, so a caller may change
// the value it got (Fatal, WithHint and WithDetail return copies anyway);
// the package keeps no shared *Error values.
package pgerr

import (
	"errors"
	"fmt"

	"github.com/lockpool/lockpool/internal/wire"
)

// Severities lockpool sends.
const (
	SeverityError   = "ERROR"
	SeverityFatal   = "FATAL"
	SeverityWarning = "WARNING"
	SeverityNotice  = "NOTICE"
)

// SQLSTATE codes lockpool reports (PostgreSQL's names, Appendix A).
const (
	Warning                      = "01000"
	ConnectionException          = "08000"
	ConnectionFailure            = "08006"
	ProtocolViolation            = "08P01"
	FeatureNotSupported          = "0A000"
	NumericValueOutOfRange       = "22003"
	NullValueNotAllowed          = "22004"
	InvalidParameterValue        = "22023"
	InvalidTextRepresentation    = "22P02"
	InvalidBinaryRepresentation  = "22P03"
	InFailedSQLTransaction       = "25P02"
	IdleInTransactionTimeout     = "25P03"
	InvalidSQLStatementName      = "26000"
	InvalidAuthorization         = "28000"
	InvalidPassword              = "28P01"
	DeadlockDetected             = "40P01"
	InvalidCatalogName           = "3D000"
	InsufficientPrivilege        = "42501"
	UndefinedFunction            = "42883"
	UndefinedParameter           = "42P02"
	IndeterminateDatatype        = "42P18"
	UndefinedObject              = "42704"
	DuplicatePreparedStatement   = "42P05"
	TooManyConnections           = "53300"
	ObjectNotInPrerequisiteState = "55000"
	LockNotAvailable             = "55P03"
	QueryCanceled                = "57014"
	AdminShutdown                = "57P01"
	CannotConnectNow             = "57P03"
	SystemError                  = "58000"
	InternalError                = "XX000"
)

// Error is an error lockpool sends to a client.
type Error struct {
	Severity string // ERROR (when empty), FATAL, WARNING, NOTICE
	Code     string // SQLSTATE
	Message  string // lockpool's own start with "lockpool: "
	Detail   string
	Hint     string
}

// Error returns "CODE: message".
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// SQLState returns the SQLSTATE code (the method pgx's errors have too).
func (e *Error) SQLState() string { return e.Code }

// IsFatal reports whether the error ends the client's connection.
func (e *Error) IsFatal() bool { return e.Severity == SeverityFatal }

// Fatal returns a copy of e with severity FATAL.
func (e *Error) Fatal() *Error {
	c := *e
	c.Severity = SeverityFatal
	return &c
}

// WithHint returns a copy of e with another hint.
func (e *Error) WithHint(hint string) *Error {
	c := *e
	c.Hint = hint
	return &c
}

// WithDetail returns a copy of e with a detail.
func (e *Error) WithDetail(detail string) *Error {
	c := *e
	c.Detail = detail
	return &c
}

// Field codes of ErrorResponse and NoticeResponse.
const (
	fieldSeverity  = 'S'
	fieldSeverityV = 'V' // not localized
	fieldCode      = 'C'
	fieldMessage   = 'M'
	fieldDetail    = 'D'
	fieldHint      = 'H'
)

// AppendTo appends e as an ErrorResponse (typ 'E') or NoticeResponse
// ('N'): fields S and V (ERROR when Severity is empty), C, M, and D and H
// when set. The strings must hold no NUL.
func (e *Error) AppendTo(dst []byte, typ byte) []byte {
	sev := e.Severity
	if sev == "" {
		sev = SeverityError
	}
	dst, start := wire.AppendHeader(dst, typ)
	dst = wire.AppendCString(append(dst, fieldSeverity), sev)
	dst = wire.AppendCString(append(dst, fieldSeverityV), sev)
	dst = wire.AppendCString(append(dst, fieldCode), e.Code)
	dst = wire.AppendCString(append(dst, fieldMessage), e.Message)
	if e.Detail != "" {
		dst = wire.AppendCString(append(dst, fieldDetail), e.Detail)
	}
	if e.Hint != "" {
		dst = wire.AppendCString(append(dst, fieldHint), e.Hint)
	}
	dst = append(dst, 0)
	return wire.FinishMsg(dst, start)
}

// FromBody decodes an ErrorResponse or NoticeResponse body (fields S, V,
// C, M, D, H; others are ignored; V wins over S). It stops at a malformed
// field and returns what it decoded before it.
func FromBody(body []byte) *Error {
	e := &Error{}
	var sev, sevV string
	for len(body) > 0 && body[0] != 0 {
		code := body[0]
		v, rest, ok := wire.CString(body[1:])
		if !ok {
			break
		}
		switch code {
		case fieldSeverity:
			sev = string(v)
		case fieldSeverityV:
			sevV = string(v)
		case fieldCode:
			e.Code = string(v)
		case fieldMessage:
			e.Message = string(v)
		case fieldDetail:
			e.Detail = string(v)
		case fieldHint:
			e.Hint = string(v)
		}
		body = rest
	}
	e.Severity = sev
	if sevV != "" {
		e.Severity = sevV
	}
	return e
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// New returns an ERROR with code, message (verbatim) and hint.
func New(code, message, hint string) *Error {
	return &Error{Code: code, Message: message, Hint: hint}
}

// Newf returns an ERROR with code and hint whose message is "lockpool: "
// followed by the formatted text.
func Newf(code, hint, format string, args ...any) *Error {
	return &Error{Code: code, Message: "lockpool: " + fmt.Sprintf(format, args...), Hint: hint}
}

// Protocol is the FATAL 08P01 of a malformed client message: the connection
// is closed after it. Protocol("%v", err) reports a wire.ErrProtocol error.
func Protocol(format string, args ...any) *Error {
	return &Error{
		Severity: SeverityFatal,
		Code:     ProtocolViolation,
		Message:  "lockpool: " + fmt.Sprintf(format, args...),
		Hint:     "The client sent a malformed message; the connection is closed.",
	}
}

// UnknownMessage is the FATAL 08P01 of a frontend message type lockpool
// does not know.
func UnknownMessage(typ byte) *Error {
	return Protocol("invalid frontend message type %d", typ).
		WithHint("The client sent a message lockpool does not know; the connection is closed.")
}

// MessageTooLarge is the FATAL 08P01 of a message over max_message_size.
func MessageTooLarge(n, maxSize int) *Error {
	return Protocol("message of %d bytes exceeds max_message_size (%d)", n, maxSize).
		WithHint("Send smaller messages or raise max_message_size.")
}

// Shutdown is the FATAL 57P01 a client gets when lockpool shuts down.
func Shutdown() *Error {
	return &Error{
		Severity: SeverityFatal,
		Code:     AdminShutdown,
		Message:  "lockpool: terminating connection because lockpool is shutting down",
		Hint:     "Reconnect; another lockpool instance or this one after its restart will serve you.",
	}
}

// Canceled is the 57014 of a wait in lockpool that a cancel request ended.
func Canceled() *Error {
	return New(QueryCanceled, "lockpool: canceling statement due to user request", "A cancel request ended the wait.")
}

// InFailedTransaction is PostgreSQL's own 25P02, for a statement lockpool
// answers itself inside a failed transaction.
func InFailedTransaction() *Error {
	return New(InFailedSQLTransaction, "current transaction is aborted, commands ignored until end of transaction block", "Roll back the transaction.")
}

// IdleInTransaction is the FATAL 25P03 of idle_transaction_timeout.
func IdleInTransaction() *Error {
	return &Error{
		Severity: SeverityFatal,
		Code:     IdleInTransactionTimeout,
		Message:  "lockpool: terminating connection due to idle-in-transaction timeout",
		Hint:     "The client left a transaction open longer than idle_transaction_timeout.",
	}
}

// ConnectionLost is the 08006 of a server connection that died under a
// client. sessionState says the client was pinned: its advisory locks and
// session state died with the backend.
func ConnectionLost(sessionState bool) *Error {
	if sessionState {
		return New(ConnectionFailure,
			"lockpool: the server connection was lost; the session's advisory locks and session state are gone",
			"Reconnect and take the locks again; they were released when the server connection ended.")
	}
	return New(ConnectionFailure,
		"lockpool: the server connection was lost; the current transaction is gone",
		"Reconnect and retry the transaction.")
}

// HostReplaced is the FATAL 57P01 of a client whose server connection
// lockpool ended because its host stopped being the primary (or the
// standby) the application targets: a failover, a switchover or a split
// brain. With sessionState the client was pinned (its advisory locks and
// session state are gone) or inside a transaction.
func HostReplaced(sessionState bool) *Error {
	if sessionState {
		return New(AdminShutdown,
			"lockpool: terminating connection because the primary changed; the session's advisory locks and session state are gone",
			"The locks were released with the old primary's connection; reconnect and take them again on the new primary.").Fatal()
	}
	return New(AdminShutdown,
		"lockpool: terminating connection because the primary changed; the current transaction is gone",
		"Reconnect and retry the transaction; it runs on the new primary.").Fatal()
}

// LocksLost is the FATAL 57P01 of a client whose advisory locks lockpool
// held for it (advisory_locks: hold) were lost with lockpool's lock
// connection: the server ended it (a restart, a failover, a switchover,
// pg_terminate_backend).
func LocksLost() *Error {
	return New(AdminShutdown,
		"lockpool: terminating connection because its advisory locks were lost",
		"The server ended lockpool's lock connection (a restart, or the primary changed) and PostgreSQL released the locks; reconnect and take them again.").Fatal()
}

// NoStatement is the 26000 of a Bind, Describe or Close of a prepared
// statement the client does not have (name "" is the unnamed statement).
func NoStatement(name string) *Error {
	if name == "" {
		return New(InvalidSQLStatementName, "lockpool: unnamed prepared statement does not exist",
			"Send Parse before Bind or Describe of the unnamed statement.")
	}
	return Newf(InvalidSQLStatementName, "Prepare the statement on this connection first.",
		"prepared statement %q does not exist", name)
}

// DuplicateStatement is the 42P05 of a Parse of a name the client uses.
func DuplicateStatement(name string) *Error {
	return Newf(DuplicatePreparedStatement, "Close the statement before preparing it again.",
		"prepared statement %q already exists", name)
}

// NoticeWarning is a WARNING notice (01000) with message verbatim.
func NoticeWarning(message, hint string) *Error {
	return &Error{Severity: SeverityWarning, Code: Warning, Message: message, Hint: hint}
}
