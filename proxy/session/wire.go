package session

import (
	"github.com/lockpool/lockpool/internal/pgerr"
)

// pgError is an error lockpool itself reports to a client: the one
// SQLSTATE error type of internal/pgerr.
type pgError = pgerr.Error

// appendError appends an ErrorResponse (or NoticeResponse when typ is 'N').
func appendError(dst []byte, typ byte, e *pgError) []byte { return e.AppendTo(dst, typ) }

// errShutdown is the FATAL a client gets when lockpool shuts down.
func errShutdown() *pgError { return pgerr.Shutdown() }

// errCanceled ends a wait in lockpool that a cancel request stopped.
func errCanceled() *pgError { return pgerr.Canceled() }

// errAborted answers a statement in a failed transaction block.
func errAborted() *pgError { return pgerr.InFailedTransaction() }

// Replies lockpool sends as they are; never modified.
var (
	msgParseComplete = []byte{'1', 0, 0, 0, 4}
	msgBindComplete  = []byte{'2', 0, 0, 0, 4}
	msgCloseComplete = []byte{'3', 0, 0, 0, 4}
	msgNoData        = []byte{'n', 0, 0, 0, 4}
)
