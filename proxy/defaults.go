package proxy

import (
	"sort"
	"strings"

	"github.com/lockpool/lockpool/internal/wire"
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
func (s *session) rewritesDefault(c rewrite.SetCmd) bool {
	if c.Stmt == 0 || !c.Reset || len(s.params.startup) == 0 {
		return false
	}
	if c.All {
		return true
	}
	_, ok := s.params.startup[c.Name]
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
func (s *session) defaultsStatement(c rewrite.SetCmd) string {
	if !c.All && !listQuoted[c.Name] {
		scope := ""
		if c.Local {
			scope = "LOCAL "
		}
		return "SET " + scope + quoteGUC(c.Name) + " TO " + escapedLiteral(s.params.startup[c.Name])
	}
	var body strings.Builder
	local := "false"
	if c.Local {
		local = "true"
	}
	setting := func(name, v string) {
		body.WriteString("PERFORM pg_catalog.set_config(" + escapedLiteral(name) + ", " + escapedLiteral(v) + ", " + local + "); ")
	}
	if c.All {
		body.WriteString("RESET ALL; ")
		names := make([]string, 0, len(s.params.startup))
		for k := range s.params.startup {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			setting(k, s.params.startup[k])
		}
	} else {
		setting(c.Name, s.params.startup[c.Name])
	}
	tag := "$lockpool$"
	for strings.Contains(body.String(), tag) {
		tag = "$lockpool" + tag[1:]
	}
	return "DO " + tag + "BEGIN " + body.String() + "END" + tag
}

// rewriteDefaults returns sql with each RESET-like statement that
// rewritesDefault names replaced (defaultsStatement), and the command tags
// the client must see for them; sql itself and nil when there is none.
// alone says that sql runs by itself outside a transaction block: a SET
// LOCAL … TO DEFAULT of a list setting is then sent as it is, since it
// changes nothing there and PostgreSQL's warning about it is what the
// client must get (set_config in a DO block would not warn).
func (s *session) rewriteDefaults(sql string, f *rewrite.Findings, alone bool) (string, *tagFixes) {
	if len(s.params.startup) == 0 {
		return sql, nil
	}
	var b strings.Builder
	var tags *tagFixes
	last := 0
	for _, c := range f.Sets {
		if !s.rewritesDefault(c) || c.Pos < last || c.End > len(sql) || alone && c.Local && listQuoted[c.Name] {
			continue
		}
		if tags == nil {
			tags = new(tagFixes)
		}
		b.WriteString(sql[last:c.Pos])
		b.WriteString(s.defaultsStatement(c))
		last = c.End
		tags.fixes = append(tags.fixes, tagFix{stmt: c.Stmt, tag: c.Tag})
	}
	if tags == nil {
		return sql, nil
	}
	b.WriteString(sql[last:])
	return b.String(), tags
}

// rewriteDefaultsParse is rewriteDefaults for a Parse's query and types
// (rest, as on the wire); it returns rest itself when nothing changes.
func (s *session) rewriteDefaultsParse(rest []byte, f *rewrite.Findings, alone bool) []byte {
	query, tail, ok := wire.CString(rest)
	if !ok || len(f.Sets) == 0 {
		return rest
	}
	sql, tags := s.rewriteDefaults(string(query), f, alone)
	if tags == nil {
		return rest
	}
	return append(wire.AppendCString(nil, sql), tail...)
}

// portalTag returns the command tag an Execute of a portal bound to a
// statement with findings f must report, "" when the server's is right.
func (s *session) portalTag(f *rewrite.Findings) string {
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
	stmt int
	tag  string
}

// tagFixes are the command tags lockpool corrects in one reply (a Query's
// or an Execute's), and how many CommandCompletes it has seen.
type tagFixes struct {
	fixes []tagFix
	seen  int
}

// next takes the body of the reply's next CommandComplete and returns the
// body to relay.
func (t *tagFixes) next(body []byte) []byte {
	t.seen++
	for _, f := range t.fixes {
		if f.stmt == t.seen {
			return append([]byte(f.tag), 0)
		}
	}
	return body
}
