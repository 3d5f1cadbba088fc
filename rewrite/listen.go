package rewrite

import "strings"

// maxIdentLen is the longest identifier PostgreSQL keeps (NAMEDATALEN-1);
// longer ones are truncated.
const maxIdentLen = 63

// truncIdent cuts an identifier value to maxIdentLen bytes as PostgreSQL's
// truncate_identifier does (pg_mbcliplen: never inside a UTF-8 character).
func truncIdent(v string) string {
	if len(v) <= maxIdentLen {
		return v
	}
	n := maxIdentLen
	for n > 0 && v[n]&0xC0 == 0x80 {
		n-- // v[n] continues the character that starts before it
	}
	return v[:n]
}

// reservedWords are PostgreSQL's reserved and type_func_name key words
// (parser/kwlist.h, PostgreSQL 18): none of them is a ColId, so an unquoted
// channel name may not be one of them.
var reservedWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric both case cast
		check collate column constraint create current_catalog current_date current_role current_time
		current_timestamp current_user default deferrable desc distinct do else end except false fetch
		for foreign from grant group having in initially intersect into lateral leading limit localtime
		localtimestamp not null offset on only or order placing primary references returning select
		session_user some symmetric system_user table then to trailing true union unique user using
		variadic when where window with
		authorization binary collation concurrently cross current_schema freeze full ilike inner is
		isnull join left like natural notnull outer overlaps right similar tablesample verbose`) {
		m[w] = true
	}
	return m
}()

// closedQuote reports whether s, the text of a quoted token after its
// opening quote q, ends with its closing quote (and is not cut off by the
// end of the input): the quotes it ends with are one closing quote after
// pairs of doubled ones.
func closedQuote(s string, q byte) bool {
	n := 0
	for n < len(s) && s[len(s)-1-n] == q {
		n++
	}
	return n%2 == 1
}

// terminated reports whether the string or identifier token t is closed;
// the lexer runs an unterminated one to the end of the input, which
// PostgreSQL rejects.
func terminated(src string, t token) bool {
	switch t.kind {
	case tQIdent:
		return closedQuote(src[t.pos+1:t.end], '"')
	case tUIdent:
		return closedQuote(src[t.pos+3:t.end], '"')
	case tString:
		if src[t.pos] == '\'' {
			return closedQuote(src[t.pos+1:t.end], '\'')
		}
		return closedQuote(src[t.pos+2:t.end], '\'')
	case tUString:
		return closedQuote(src[t.pos+3:t.end], '\'')
	case tEString:
		s := src[t.pos+2 : t.end]
		for i := 0; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '\'':
				if i+1 < len(s) && s[i+1] == '\'' {
					i++
					continue
				}
				return i == len(s)-1
			}
		}
		return false
	case tDollar:
		s := src[t.pos:t.end]
		tag := s[:dollarTag(s, 0)]
		return len(s) >= 2*len(tag) && strings.HasSuffix(s, tag)
	}
	return true
}

// identAt decodes the identifier token at st[i] like identValue, with a
// UESCAPE 'c' clause after a U&"…" identifier, and returns the index after
// it.
func identAt(src string, st []token, i int) (v string, next int, ok bool) {
	t := st[i]
	if t.kind != tUIdent {
		v, ok = identValue(src, t)
		return v, i + 1, ok
	}
	esc, next := byte('\\'), i+1
	if next+1 < len(st) && kw(src, st[next], "uescape") {
		e := st[next+1]
		if e.kind != tString || src[e.pos] != '\'' || !terminated(src, e) {
			return "", next, false
		}
		c := undouble(src[e.pos+1:e.end], '\'')
		if len(c) != 1 || hexVal(c[0]) >= 0 || c[0] == '+' || c[0] == '\'' || c[0] == '"' || isSpace(c[0]) {
			return "", next, false // PostgreSQL: invalid Unicode escape character
		}
		esc, next = c[0], next+2
	}
	v, ok = unicodeUnescape(undouble(src[t.pos+3:t.end], '"'), esc)
	return v, next, ok
}

// channelName decodes the channel name (a ColId) at st[i] of a LISTEN or
// UNLISTEN statement as PostgreSQL names it (see StateChange)
// and returns the index after it; ok is false when PostgreSQL's grammar or
// scanner would reject it there.
func channelName(s stmt, i int) (name string, next int, ok bool) {
	if !isIdentTok(s.kind(i)) || !terminated(s.src, s.st[i]) {
		return "", i, false
	}
	v, next, ok := identAt(s.src, s.st, i)
	if !ok || v == "" || s.st[i].kind == tIdent && reservedWords[v] {
		return "", next, false
	}
	return truncIdent(v), next, true
}

// listen records a LISTEN or UNLISTEN statement and where it is.
func (a *analyzer) listen(k StateKind, src string, st []token) {
	s := stmt{src, st}
	c := StateChange{Kind: k}
	if k == Unlisten && s.punct(1, '*') && len(st) == 2 {
		c.Name = "*"
	} else if n, next, ok := channelName(s, 1); ok && next == len(st) {
		c.Name = n
	}
	if a.top > 0 {
		c.Stmt, c.Pos, c.End = a.top, st[0].pos, st[len(st)-1].end
	}
	a.f.State = append(a.f.State, c)
}
