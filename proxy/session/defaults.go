package session

import (
	"slices"
	"sort"
	"strings"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/rewrite"
)

// A RESET on PostgreSQL returns a setting to its reset value, which for a
// setting the client gave at startup is the client's startup value. A
// pooled server connection's reset values are its own (lockpool logs in
// with none), so a RESET x or SET [LOCAL] x TO DEFAULT of such a setting is
// sent as SET [LOCAL] x TO its startup value, and a RESET ALL as a DO block
// that runs RESET ALL, then set_config of each startup value (a list
// setting such as search_path, whose SET syntax differs, also goes through
// set_config in a DO block). What is sent runs in the client's transaction
// like the statement it replaces (rolled back with it, an error in an
// aborted transaction), and lockpool gives the client the command tag of
// the statement it sent (tagFixes). Statements inside a DO body or a
// function are not rewritten; readBackSettings corrects what they leave once
// the transaction is over.

// rewritesDefault reports whether c is a RESET-like statement of the
// client's text that must be sent as a DO block.
func (s *Session) rewritesDefault(c rewrite.SetCmd) bool {
	if c.Stmt == 0 || !c.Reset || len(s.params.Startup()) == 0 {
		return false
	}
	if c.All {
		return true
	}
	_, ok := s.params.Startup()[c.Name]
	return ok
}

// listQuoted are the settings whose SET takes a list of identifiers: a
// string constant there is one element, so their startup value (a whole
// list) is given back through set_config in a DO block.
var listQuoted = map[string]bool{"search_path": true, "temp_tablespaces": true, "session_preload_libraries": true, "local_preload_libraries": true}

// defaultsStatement is the statement that stands for c (see
// rewritesDefault): SET [LOCAL] name TO the startup value, which PostgreSQL
// answers as it answers c (a SET LOCAL outside a transaction block warns
// alike), or a DO block for RESET ALL and the list settings.
func (s *Session) defaultsStatement(c rewrite.SetCmd) string {
	if !c.All && !listQuoted[c.Name] {
		scope := ""
		if c.Local {
			scope = "LOCAL "
		}
		return "SET " + scope + backend.QuoteGUC(c.Name) + " TO " + backend.EscapedLiteral(s.params.Startup()[c.Name])
	}
	var body strings.Builder
	local := "false"
	if c.Local {
		local = "true"
	}
	setting := func(name, v string) {
		body.WriteString("PERFORM pg_catalog.set_config(" + backend.EscapedLiteral(name) + ", " + backend.EscapedLiteral(v) + ", " + local + "); ")
	}
	if c.All {
		body.WriteString("RESET ALL; ")
		names := make([]string, 0, len(s.params.Startup()))
		for k := range s.params.Startup() {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			setting(k, s.params.Startup()[k])
		}
	} else {
		setting(c.Name, s.params.Startup()[c.Name])
	}
	tag := "$lockpool$"
	for strings.Contains(body.String(), tag) {
		tag = "$lockpool" + tag[1:]
	}
	return "DO " + tag + "BEGIN " + body.String() + "END" + tag
}

// defaultsEdits are the edits that replace each RESET-like statement that
// rewritesDefault names (defaultsStatement), with the command tags the
// client must see for them. alone says that sql runs by itself outside a
// transaction block: a SET LOCAL … TO DEFAULT of a list setting is then
// sent as it is, since it changes nothing there and PostgreSQL's warning
// about it is what the client must get (set_config in a DO block would not
// warn).
func (s *Session) defaultsEdits(f *rewrite.Findings, alone bool) []sqlEdit {
	if len(s.params.Startup()) == 0 {
		return nil
	}
	var edits []sqlEdit
	for _, c := range f.Sets {
		if !s.rewritesDefault(c) || alone && c.Local && listQuoted[c.Name] {
			continue
		}
		edits = append(edits, sqlEdit{pos: c.Pos, end: c.End, text: s.defaultsStatement(c), fix: tagFix{stmt: c.Stmt, tag: c.Tag}})
	}
	return edits
}

// rewriteStatements returns sql as lockpool sends it (defaultsEdits,
// listenEdits, preparedViewEdits, activityViewEdits) and the command tags
// it corrects; sql itself and nil when nothing changes.
func (s *Session) rewriteStatements(sql string, f *rewrite.Findings, alone bool) (string, *tagFixes) {
	edits := s.defaultsEdits(f, alone)
	edits = append(edits, s.listenEdits(f, sql)...)
	edits = append(edits, s.preparedViewEdits(f, sql)...)
	edits = append(edits, s.activityViewEdits(f, sql)...)
	if len(edits) == 0 {
		return sql, nil
	}
	return applyEdits(sql, edits)
}

// rewriteParse is rewriteStatements for a Parse's query and types (rest,
// as on the wire); it returns rest itself when nothing changes.
func (s *Session) rewriteParse(rest []byte, f *rewrite.Findings, alone bool) []byte {
	query, tail, ok := wire.CString(rest)
	if !ok || len(f.Sets) == 0 && len(f.ChannelsCalls) == 0 && len(f.PreparedViews) == 0 && len(f.ActivityViews) == 0 {
		return rest
	}
	sql, _ := s.rewriteStatements(string(query), f, alone)
	if sql == string(query) {
		return rest
	}
	return append(wire.AppendCString(nil, sql), tail...)
}

// portalTag returns the command tag an Execute of a portal bound to a
// statement with findings f must report, "" when the server's is right.
func (s *Session) portalTag(f *rewrite.Findings) string {
	if f == nil || f.Statements != 1 {
		return ""
	}
	for _, c := range f.Sets {
		if s.rewritesDefault(c) {
			return c.Tag
		}
	}
	return ""
}

// tagFix is one command tag lockpool corrects: that of the stmt-th
// CommandComplete of the reply (1-based).
type tagFix struct {
	stmt   int
	tag    string
	listen *local.ListenOp // a LISTEN or UNLISTEN sent as UNLISTEN * (listenEdits): noted when it completes
}

// tagFixes are the command tags lockpool corrects in one reply (a Query's
// or an Execute's), and how many CommandCompletes it has seen.
type tagFixes struct {
	fixes []tagFix
	seen  int
}

// next takes the reply's next CommandComplete and returns its fix, nil
// when the server's tag stands.
func (t *tagFixes) next() *tagFix {
	t.seen++
	for i := range t.fixes {
		if t.fixes[i].stmt == t.seen {
			return &t.fixes[i]
		}
	}
	return nil
}

// sqlEdit replaces sql[pos:end] with text; fix, when its stmt is set, is
// the command tag the client must see for that statement.
type sqlEdit struct {
	pos, end int
	text     string
	fix      tagFix
}

// applyEdits applies edits (any order, not overlapping) to sql.
func applyEdits(sql string, edits []sqlEdit) (string, *tagFixes) {
	if len(edits) == 0 {
		return sql, nil
	}
	slices.SortFunc(edits, func(a, b sqlEdit) int { return a.pos - b.pos })
	var b strings.Builder
	var tags *tagFixes
	last := 0
	for _, e := range edits {
		if e.pos < last || e.end > len(sql) {
			continue
		}
		b.WriteString(sql[last:e.pos])
		b.WriteString(e.text)
		last = e.end
		if e.fix.stmt > 0 {
			if tags == nil {
				tags = new(tagFixes)
			}
			tags.fixes = append(tags.fixes, e.fix)
		}
	}
	b.WriteString(sql[last:])
	return b.String(), tags
}
