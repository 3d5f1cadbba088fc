package rewrite

// Signal functions: pg_terminate_backend and pg_cancel_backend. A call that
// is a whole statement, with constants or $n for arguments, is reported
// (Findings.Signal) so that lockpool can answer it when the pid is one of
// its clients' key pids; a call anywhere else (SELECT
// pg_terminate_backend(pid) FROM pg_stat_activity …, a DO body, a second
// call) is not reported: it runs on the server unchanged.

// Names of the signal functions, and of pg_backend_pid, whose answer a
// client may pass to them (Findings.BackendPID).
const (
	TerminateBackend = "pg_terminate_backend"
	CancelBackend    = "pg_cancel_backend"
	BackendPID       = "pg_backend_pid"
)

// signalOf returns the signal function named by identifier t, or "".
func signalOf(src string, t token) string {
	if t.kind == tIdent && (t.end-t.pos < len(CancelBackend) || !hasFold(src, t.pos, "pg_")) {
		return ""
	}
	switch {
	case identIs(src, t, TerminateBackend):
		return TerminateBackend
	case identIs(src, t, CancelBackend):
		return CancelBackend
	}
	return ""
}

// signalCall records a call of a signal function (unqualified or
// pg_catalog-qualified) in a top-level statement: the first one of the
// text, when its statement is the whole call, is the candidate for
// Findings.Signal.
func (a *analyzer) signalCall(src string, st []token) {
	a.signalCalls++
	if a.top != 1 || a.signalCalls != 1 {
		return
	}
	c := wholeCall(src, st, "pg_catalog", func(t token) string { return signalOf(src, t) })
	if c != nil {
		a.signalWhole = &SignalCall{Func: c.Func, Args: c.Args, Alias: c.Alias, Star: c.Star}
	}
}
