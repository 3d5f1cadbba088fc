package rewrite

import (
	"strings"
	"unicode/utf8"
)

// kw reports whether t is the unquoted keyword/identifier word (lower case).
func kw(src string, t token, word string) bool {
	return t.kind == tIdent && foldEq(src[t.pos:t.end], word)
}

func isPunct(src string, t token, c byte) bool {
	return (t.kind == tPunct || t.kind == tOp) && t.end-t.pos == 1 && src[t.pos] == c
}

func isStringTok(k tokKind) bool {
	return k == tString || k == tEString || k == tUString || k == tDollar
}

func isIdentTok(k tokKind) bool { return k == tIdent || k == tQIdent || k == tUIdent }

// identIs reports whether identifier token t names exactly name (lower case),
// following PostgreSQL: unquoted names fold to lower case, quoted names are
// compared as written.
func identIs(src string, t token, name string) bool {
	switch t.kind {
	case tIdent:
		return foldEq(src[t.pos:t.end], name)
	case tQIdent:
		// name never contains '"', so a match has no doubled quotes.
		return t.end-t.pos == len(name)+2 && src[t.end-1] == '"' && src[t.pos+1:t.end-1] == name
	case tUIdent:
		v, ok := identValue(src, t)
		return ok && v == name
	}
	return false
}

// identValue decodes an identifier token: unquoted → lower case, quoted → as
// written with "" undoubled, U&"" → unicode escapes applied (backslash escape).
func identValue(src string, t token) (string, bool) {
	switch t.kind {
	case tIdent:
		return lowerASCII(src[t.pos:t.end]), true
	case tQIdent:
		return undouble(src[t.pos+1:t.end], '"'), true
	case tUIdent:
		return unicodeUnescape(undouble(src[t.pos+3:t.end], '"'), '\\')
	}
	return "", false
}

// undouble returns the body of a quoted literal whose opening quote is gone:
// doubled quotes become one, the closing quote (if any) ends it.
func undouble(s string, q byte) string {
	k := strings.IndexByte(s, q)
	if k < 0 {
		return s
	}
	if k == len(s)-1 || s[k+1] != q {
		return s[:k] // common case: no doubled quote, no copy
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == q {
			if i+1 < len(s) && s[i+1] == q {
				i++
			} else {
				break
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

// stringValue decodes the string literal at st[i] (with a following
// UESCAPE 'c' clause for U&'…' strings) and returns the index after it.
func stringValue(src string, st []token, i int) (val string, next int, ok bool) {
	t := st[i]
	next = i + 1
	switch t.kind {
	case tString:
		body := src[t.pos+1 : t.end]
		if src[t.pos] != '\'' { // N'', B'', X''
			if src[t.pos]|0x20 != 'n' {
				return "", next, false
			}
			body = src[t.pos+2 : t.end]
		}
		return undouble(body, '\''), next, true
	case tEString:
		v, ok := eUnescape(src[t.pos+2 : t.end])
		return v, next, ok
	case tUString:
		esc := byte('\\')
		if next+1 < len(st) && kw(src, st[next], "uescape") && st[next+1].kind == tString {
			e := undouble(src[st[next+1].pos+1:st[next+1].end], '\'')
			if len(e) != 1 {
				return "", next, false
			}
			esc, next = e[0], next+2
		}
		v, ok := unicodeUnescape(undouble(src[t.pos+3:t.end], '\''), esc)
		return v, next, ok
	case tDollar:
		return dollarBody(src[t.pos:t.end]), next, true
	}
	return "", next, false
}

// dollarBody returns the text between the tags of a dollar-quoted string.
func dollarBody(s string) string {
	e := dollarTag(s, 0)
	tag := s[:e]
	body := s[e:]
	if len(body) >= len(tag) && strings.HasSuffix(body, tag) {
		body = body[:len(body)-len(tag)]
	}
	return body
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c|0x20 >= 'a' && c|0x20 <= 'f':
		return int(c|0x20-'a') + 10
	}
	return -1
}

// eUnescape decodes the body of an E'…' string (opening quote removed).
func eUnescape(s string) (string, bool) {
	if strings.IndexByte(s, '\\') < 0 {
		return undouble(s, '\''), true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\'' {
			if i+1 < len(s) && s[i+1] == '\'' {
				i++
				b = append(b, '\'')
				continue
			}
			break
		}
		if c != '\\' || i+1 >= len(s) {
			b = append(b, c)
			continue
		}
		i++
		switch c = s[i]; c {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'x':
			v, n := 0, 0
			for n < 2 && i+1 < len(s) && hexVal(s[i+1]) >= 0 {
				v = v*16 + hexVal(s[i+1])
				i++
				n++
			}
			if n == 0 {
				b = append(b, 'x')
			} else {
				b = append(b, byte(v))
			}
		case 'u', 'U':
			n := 4
			if c == 'U' {
				n = 8
			}
			if i+n >= len(s) {
				return "", false
			}
			v := 0
			for k := 1; k <= n; k++ {
				h := hexVal(s[i+k])
				if h < 0 {
					return "", false
				}
				v = v*16 + h
			}
			i += n
			b = utf8.AppendRune(b, rune(v))
		default:
			if c >= '0' && c <= '7' {
				v, n := int(c-'0'), 1
				for n < 3 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '7' {
					v = v*8 + int(s[i+1]-'0')
					i++
					n++
				}
				b = append(b, byte(v))
			} else {
				b = append(b, c)
			}
		}
	}
	return string(b), true
}

// unicodeUnescape applies U&'…' escapes (esc XXXX, esc+XXXXXX, esc esc).
func unicodeUnescape(s string, esc byte) (string, bool) {
	if strings.IndexByte(s, esc) < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != esc {
			b = append(b, c)
			continue
		}
		if i+1 < len(s) && s[i+1] == esc {
			b = append(b, esc)
			i++
			continue
		}
		n, k := 4, i+1
		if k < len(s) && s[k] == '+' {
			n, k = 6, k+1
		}
		if k+n > len(s) {
			return "", false
		}
		v := 0
		for _, h := range []byte(s[k : k+n]) {
			x := hexVal(h)
			if x < 0 {
				return "", false
			}
			v = v*16 + x
		}
		if v > utf8.MaxRune {
			return "", false
		}
		b = utf8.AppendRune(b, rune(v))
		i = k + n - 1
	}
	return string(b), true
}

// quoteLiteral renders v as a standard-conforming SQL string literal.
func quoteLiteral(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// quoteIdent renders v as a double-quoted SQL identifier.
func quoteIdent(v string) string {
	return `"` + strings.ReplaceAll(v, `"`, `""`) + `"`
}
