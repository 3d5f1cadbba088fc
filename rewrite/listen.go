package rewrite

import (
	"strconv"
	"strings"
)

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

// channelName decodes the channel name (a ColId) at st[i] of a LISTEN,
// UNLISTEN or NOTIFY statement as PostgreSQL names it (see StateChange)
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

// notify records a NOTIFY channel [, 'payload'] statement; one the grammar
// rejects is recorded with nothing known.
func (a *analyzer) notify(src string, st []token) {
	s := stmt{src, st}
	var c NotifyCall
	if ch, i, ok := channelName(s, 1); ok {
		switch {
		case i == len(st):
			c = NotifyCall{Channel: ch, Known: true, KnownPayload: true}
		case s.punct(i, ',') && sconst(src, st, i+1):
			if v, next, ok := stringValue(src, st, i+1); ok && next == len(st) {
				c = NotifyCall{Channel: ch, Payload: v, Known: true, KnownPayload: true}
			}
		}
	}
	a.f.Notifies = append(a.f.Notifies, c)
}

// sconst reports whether st[i] is a string constant PostgreSQL's grammar
// takes as Sconst: '…', E'…', U&'…' or dollar-quoted, closed (not N'…',
// B'…' or X'…').
func sconst(src string, st []token, i int) bool {
	if i >= len(st) {
		return false
	}
	t := st[i]
	switch t.kind {
	case tString:
		if src[t.pos] != '\'' {
			return false
		}
	case tEString, tUString, tDollar:
	default:
		return false
	}
	return terminated(src, t)
}

// notifyCall reads the arguments of a pg_notify call whose '(' is st[open].
func notifyCall(src string, st []token, open int) NotifyCall {
	var args [2][2]int // token ranges of the first two arguments
	n, depth, start := 0, 0, open+1
	for j := open + 1; j < len(st); j++ {
		t := st[j]
		switch {
		case isPunct(src, t, '(') || isPunct(src, t, '['):
			depth++
		case depth > 0 && (isPunct(src, t, ')') || isPunct(src, t, ']')):
			depth--
		case depth == 0 && (isPunct(src, t, ',') || isPunct(src, t, ')')):
			if n < len(args) {
				args[n] = [2]int{start, j}
			}
			n++
			start = j + 1
			if isPunct(src, t, ')') {
				var c NotifyCall
				if n == 2 {
					c.Channel, c.ChannelParam, c.Known = notifyArg(stmt{src, st[args[0][0]:args[0][1]]})
					c.Payload, c.PayloadParam, c.KnownPayload = notifyArg(stmt{src, st[args[1][0]:args[1][1]]})
				}
				return c
			}
		}
	}
	return NotifyCall{}
}

// notifyArg reads one pg_notify argument, all of s: a string literal or
// NULL (known; NULL is "", as pg_notify takes it) or $n, each optionally
// cast to text or varchar (casts that keep the value as it is).
func notifyArg(s stmt) (val string, param int, known bool) {
	i := 1
	switch t := s.st; {
	case len(t) == 0:
		return "", 0, false
	case t[0].kind == tParam:
		n, err := strconv.Atoi(s.src[t[0].pos+1 : t[0].end])
		if err != nil || n < 1 {
			return "", 0, false
		}
		param = n
	case s.kw(0, "null"):
		known = true
	case sconst(s.src, t, 0):
		v, next, ok := stringValue(s.src, t, 0)
		if !ok {
			return "", 0, false
		}
		val, i, known = v, next, true
	default:
		return "", 0, false
	}
	for i < len(s.st) {
		if s.kind(i) != tCast {
			return "", 0, false
		}
		i++
		if isIdentTok(s.kind(i)) && s.punct(i+1, '.') && identIs(s.src, s.st[i], "pg_catalog") {
			i += 2
			if !isIdentTok(s.kind(i)) || !(identIs(s.src, s.st[i], "text") || identIs(s.src, s.st[i], "varchar")) {
				return "", 0, false
			}
			i++
			continue
		}
		switch {
		case s.kw(i, "character") && s.kw(i+1, "varying"):
			i += 2
		case isIdentTok(s.kind(i)) && (identIs(s.src, s.st[i], "text") || identIs(s.src, s.st[i], "varchar")):
			i++
		default:
			return "", 0, false
		}
	}
	return val, param, known
}

// channelsCall records a pg_listening_channels() call whose name is st[i]
// (qualified by pg_catalog when hasQual); a call with arguments is not
// that function.
func (a *analyzer) channelsCall(src string, st []token, i int, hasQual bool) {
	if i+2 >= len(st) || !isPunct(src, st[i+2], ')') {
		return
	}
	pos := st[i].pos
	if hasQual {
		pos = st[i-2].pos
		if i >= 4 && isPunct(src, st[i-3], '.') && isIdentTok(st[i-4].kind) {
			pos = st[i-4].pos // database.pg_catalog.
		}
	}
	a.f.ChannelsCalls = append(a.f.ChannelsCalls, Span{Pos: pos, End: st[i+2].end})
	if a.top == 1 && len(a.f.ChannelsCalls) == 1 {
		a.chanWhole = wholeCall(src, st, "pg_catalog", func(t token) string {
			if identIs(src, t, "pg_listening_channels") {
				return "pg_listening_channels"
			}
			return ""
		})
	}
}
