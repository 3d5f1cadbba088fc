package session

import (
	"github.com/lockpool/lockpool/rewrite"
)

// pg_stat_activity, as a client of lockpool sees it. The server's view
// lists lockpool's pooled connections, idle between transactions, and
// none of the clients waiting between transactions without one. Each
// reference to the view in a FROM list (rewrite.Findings.ActivityViews)
// is replaced with lockpool's view of the same row type:
//   - the server's rows, minus this instance's idle pooled connections
//     (a client attached to a server connection is that backend's row,
//     whose pid is what pg_backend_pid() returns in its transaction);
//   - a row per client of this instance that has no server connection,
//     with its key pid (the pid its driver was given), user, database,
//     address, port and login time, backend_type "client backend", state
//     "idle" (or "active" while it waits for a connection) and an empty
//     query. As PostgreSQL does, only a caller with the privileges of the
//     client's user or of pg_read_all_stats sees more than its pid, user
//     and database; others read "<insufficient privilege>" as its query.
//   - The caller's own row is that of the server connection its
//     statement runs on (pg_backend_pid()).
//
// pg_terminate_backend and pg_cancel_backend of such a row's pid inside
// the same statement act on that client (see onSignalWarning).

// activityViewEdits replaces each pg_stat_activity in a FROM list with
// lockpool's view of it.
func (s *Session) activityViewEdits(f *rewrite.Findings, sql string) []sqlEdit {
	if len(f.ActivityViews) == 0 {
		return nil
	}
	return viewEdits(f.ActivityViews, sql, s.srv.Host.ActivityView(s.pid), "pg_stat_activity")
}

// viewEdits replaces each reference refs to a catalog view in sql with
// text, which keeps the view's name when the query gives no alias.
func viewEdits(refs []rewrite.ViewRef, sql, text, name string) []sqlEdit {
	var edits []sqlEdit
	for _, v := range refs {
		if v.End > len(sql) {
			continue
		}
		t := text
		if !v.Aliased {
			t += " AS " + name
		}
		edits = append(edits, sqlEdit{pos: v.Pos, end: v.End, text: t})
	}
	return edits
}
