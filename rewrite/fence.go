package rewrite

import (
	"slices"
	"strconv"
	"strings"
)

type edit struct {
	pos, end int
	text     string
}

// RewriteFence rewrites every call of lease_fence( — unqualified or
// lockpool.-qualified, any case, "lease_fence" quoted — to
// "<schema>".lease_fence( so it reaches the lease table's schema whatever the
// client's search_path. Calls inside DO bodies (and EXECUTE strings in them)
// are rewritten too (a rewritten body is re-quoted with dollar quotes);
// strings, comments, other schemas and CREATE FUNCTION/PROCEDURE bodies are
// left alone. It returns sql itself, without allocating, when there is
// nothing to rewrite.
func RewriteFence(sql, schema string) string {
	if !containsFold(sql, "lease_fence") {
		return sql
	}
	out, _ := rewriteFence(sql, quoteIdent(schema)+".lease_fence", 0, false)
	return out
}

// containsFold reports whether s contains lower (which contains '_')
// ignoring ASCII case.
func containsFold(s, lower string) bool {
	u := strings.IndexByte(lower, '_')
	for i := 0; i < len(s); {
		k := strings.IndexByte(s[i:], '_')
		if k < 0 {
			return false
		}
		if hasFold(s, i+k-u, lower) {
			return true
		}
		i += k + 1
	}
	return false
}

func rewriteFence(src, repl string, depth int, body bool) (string, bool) {
	var edits []edit
	bp := getTokens()
	it := stmtIter{src: src, lx: lexer{s: src}, body: body, buf: (*bp)[:0]}
	defer func() { putTokens(bp, it.buf) }()
	// nested rewrites a string token holding SQL (a DO body, an EXECUTE string).
	nested := func(st []token, i int) {
		if depth >= maxDepth {
			return
		}
		v, next, ok := stringValue(src, st, i)
		if !ok {
			return
		}
		if nv, changed := rewriteFence(v, repl, depth+1, true); changed {
			q := dollarQuote(nv)
			if p := st[i].pos; p > 0 && identCont[src[p-1]] {
				q = " " + q // DO'…' → DO $lp$…$lp$, not the identifier DO$lp$
			}
			edits = append(edits, edit{st[i].pos, st[next-1].end, q})
		}
	}
	for !it.done {
		st := it.next()
		if len(st) == 0 {
			continue
		}
		s := stmt{src, st}
		if s.kw(0, "create") {
			i := 1
			if s.kw(1, "or") && s.kw(2, "replace") {
				i = 3
			}
			if s.kw(i, "function") || s.kw(i, "procedure") {
				continue
			}
		}
		if s.kw(0, "do") {
			i := 1
			if s.kw(1, "language") {
				i = 3
			}
			if isStringTok(s.kind(i)) {
				nested(st, i)
			}
			continue
		}
		for i := 0; i+1 < len(st); i++ {
			t := st[i]
			if body && isStringTok(st[i+1].kind) && kw(src, t, "execute") {
				nested(st, i+1)
				continue
			}
			if !isIdentTok(t.kind) || !isPunct(src, st[i+1], '(') || !identIs(src, t, "lease_fence") {
				continue
			}
			pos := t.pos
			if i >= 2 && isPunct(src, st[i-1], '.') && isIdentTok(st[i-2].kind) {
				if !identIs(src, st[i-2], "lockpool") {
					continue
				}
				pos = st[i-2].pos
			}
			edits = append(edits, edit{pos, t.end, repl})
		}
	}
	if len(edits) == 0 {
		return src, false
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.pos - b.pos })
	var b strings.Builder
	last := 0
	for _, e := range edits {
		if e.pos < last {
			continue
		}
		b.WriteString(src[last:e.pos])
		b.WriteString(e.text)
		last = e.end
	}
	b.WriteString(src[last:])
	return b.String(), true
}

// dollarQuote quotes v with a dollar tag that does not occur in it.
func dollarQuote(v string) string {
	tag := "$lp$"
	for n := 0; strings.Index(v+tag, tag) != len(v); n++ {
		tag = "$lp" + strconv.Itoa(n) + "$"
	}
	return tag + v + tag
}
