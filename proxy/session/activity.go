package session

import (
	"fmt"
	"net"
	"strings"

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

// ActivityView is the parenthesised query that stands for
// pg_stat_activity (see activityViewEdits), given the pids of the server's
// idle pooled connections and its clients; caller is the key pid of the
// client whose statement reads it.
func ActivityView(idle []uint32, clients []ClientView, caller uint32) string {
	var b strings.Builder
	b.WriteString("(SELECT a.* FROM pg_catalog.pg_stat_activity a")
	if len(idle) > 0 {
		// The statement runs on one of them, taken from the pool after
		// this text was made: its own row stays.
		b.WriteString(" WHERE a.pid = pg_catalog.pg_backend_pid() OR a.pid <> ALL ('{")
		for i, c := range idle {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, c)
		}
		b.WriteString("}'::pg_catalog.int4[])")
	}
	n := 0
	for _, c := range clients {
		if c.Link.Attached || c.ID == caller {
			continue // the caller's row is its server connection's
		}
		if n == 0 {
			b.WriteString(" UNION ALL SELECT * FROM pg_catalog.jsonb_populate_recordset(NULL::pg_catalog.pg_stat_activity, " +
				"(SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('datid', d.oid, 'datname', c.datname, 'pid', c.pid, " +
				"'usesysid', r.oid, 'usename', c.usename) || CASE WHEN r.oid IS NOT NULL AND (pg_catalog.pg_has_role(r.oid, 'USAGE') OR " +
				"pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')) THEN pg_catalog.jsonb_build_object('client_addr', c.addr, " +
				"'client_port', c.port, 'backend_start', c.started, 'backend_type', 'client backend', 'state', c.state, 'query', '') " +
				"ELSE '{\"query\": \"<insufficient privilege>\"}' END ORDER BY c.pid) FROM (VALUES ")
		} else {
			b.WriteString(", ")
		}
		n++
		state := "idle"
		if c.Link.Waiting {
			state = "active"
		}
		addr, port := "NULL", "-1" // a Unix socket, as PostgreSQL shows it
		if ip := net.ParseIP(c.Addr); ip != nil {
			addr, port = escapedLiteral(ip.String()), fmt.Sprint(c.Port)
		}
		fmt.Fprintf(&b, "(%d, %s, %s, %s::pg_catalog.inet, %s, pg_catalog.to_timestamp(%d / 1e6), %s)",
			c.ID, escapedLiteral(c.Database), escapedLiteral(c.User), addr, port, c.Connected.UnixMicro(), escapedLiteral(state))
	}
	if n > 0 {
		b.WriteString(") c(pid, datname, usename, addr, port, started, state) " +
			"LEFT JOIN pg_catalog.pg_roles r ON r.rolname = c.usename LEFT JOIN pg_catalog.pg_database d ON d.datname = c.datname))")
	}
	b.WriteByte(')')
	return b.String()
}
