package rewrite

import "strings"

// tokKind classifies a lexical token.
type tokKind uint8

const (
	tEOF     tokKind = iota
	tIdent           // unquoted identifier or keyword (compare case-insensitively)
	tQIdent          // "quoted identifier" ("" escapes, case preserved)
	tUIdent          // U&"unicode identifier"
	tString          // 'string' ('' escapes); also N'', B'', X''
	tEString         // E'string' (backslash escapes)
	tUString         // U&'string'
	tDollar          // $tag$ … $tag$
	tNumber          // 1, 1.5, .5e3, 0x1F, 1_000
	tParam           // $1
	tOp              // one operator character: + - * / < > = ~ ! @ # % ^ & | ` ?
	tPunct           // one of ( ) [ ] , ; . :
	tCast            // ::
	tOther           // any other byte
)

// token is a byte range of the source; it never copies.
type token struct {
	kind     tokKind
	pos, end int
}

// lexer splits SQL into tokens, skipping whitespace and comments. It never
// panics: an unterminated string, identifier or comment runs to the end.
type lexer struct {
	s string
	i int
}

// identStart reports whether c may start an unquoted identifier.
// identCont reports whether c may continue one ($ and digits included).
var identStart, identCont, opChar [256]bool

func init() {
	for c := 0; c < 256; c++ {
		b := byte(c)
		letter := b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '_' || b >= 0x80
		identStart[c] = letter
		identCont[c] = letter || b >= '0' && b <= '9' || b == '$'
	}
	for _, c := range []byte("+-*/<>=~!@#%^&|`?") {
		opChar[c] = true
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// skipSpace returns the index of the first byte at or after i that is not
// whitespace or part of a comment. It is shared by the lexer and the
// prefilter so both agree on where a statement starts.
func skipSpace(s string, i int) int {
	for i < len(s) {
		c := s[i]
		switch {
		case isSpace(c):
			i++
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			i += 2
			for i < len(s) && s[i] != '\n' && s[i] != '\r' {
				i++
			}
		case c == '/' && i+1 < len(s) && s[i+1] == '*':
			i = skipBlockComment(s, i+2)
		default:
			return i
		}
	}
	return len(s)
}

// skipBlockComment skips a nested /* */ comment whose opening was just before i.
func skipBlockComment(s string, i int) int {
	depth := 1
	for i+1 < len(s) {
		switch {
		case s[i] == '/' && s[i+1] == '*':
			depth++
			i += 2
		case s[i] == '*' && s[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(s)
}

// scanQuoted returns the index just past the closing quote q of a string that
// started before i, honouring doubled quotes; len(s) when unterminated.
func scanQuoted(s string, i int, q byte) int {
	for {
		k := strings.IndexByte(s[i:], q)
		if k < 0 {
			return len(s)
		}
		i += k + 1
		if i < len(s) && s[i] == q {
			i++
			continue
		}
		return i
	}
}

// scanEString is scanQuoted for E'…' strings: a backslash escapes the next byte.
func scanEString(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case '\\':
			i += 2
		case '\'':
			if i+1 < len(s) && s[i+1] == '\'' {
				i += 2
				continue
			}
			return i + 1
		default:
			i++
		}
	}
	return len(s)
}

// dollarTag reports the end of a dollar-quote opening tag ($$ or $tag$)
// starting at s[i] == '$', or -1 when there is none.
func dollarTag(s string, i int) int {
	j := i + 1
	if j < len(s) && s[j] == '$' {
		return j + 1
	}
	if j >= len(s) || !identStart[s[j]] {
		return -1
	}
	j++
	for j < len(s) && identCont[s[j]] && s[j] != '$' {
		j++
	}
	if j < len(s) && s[j] == '$' {
		return j + 1
	}
	return -1
}

func (l *lexer) next() token {
	s := l.s
	i := skipSpace(s, l.i)
	if i >= len(s) {
		l.i = len(s)
		return token{kind: tEOF, pos: len(s), end: len(s)}
	}
	c := s[i]
	var k tokKind
	j := i + 1
	switch {
	case identStart[c]:
		k = tIdent
		if j < len(s) && s[j] == '\'' {
			switch c | 0x20 {
			case 'e':
				k, j = tEString, scanEString(s, j+1)
			case 'b', 'x', 'n':
				k, j = tString, scanQuoted(s, j+1, '\'')
			}
		} else if c|0x20 == 'u' && j+1 < len(s) && s[j] == '&' {
			switch s[j+1] {
			case '\'':
				k, j = tUString, scanQuoted(s, j+2, '\'')
			case '"':
				k, j = tUIdent, scanQuoted(s, j+2, '"')
			}
		}
		if k == tIdent {
			for j < len(s) && identCont[s[j]] {
				j++
			}
		}
	case c == '\'':
		k, j = tString, scanQuoted(s, j, '\'')
	case c == '"':
		k, j = tQIdent, scanQuoted(s, j, '"')
	case c == '$':
		if j < len(s) && isDigit(s[j]) {
			k = tParam
			for j < len(s) && isDigit(s[j]) {
				j++
			}
		} else if e := dollarTag(s, i); e >= 0 {
			k = tDollar
			if x := strings.Index(s[e:], s[i:e]); x >= 0 {
				j = e + x + (e - i)
			} else {
				j = len(s)
			}
		} else {
			k = tOther
		}
	case isDigit(c) || c == '.' && j < len(s) && isDigit(s[j]):
		k, j = tNumber, scanNumber(s, i)
	case c == ':':
		k = tPunct
		if j < len(s) && s[j] == ':' {
			k, j = tCast, j+1
		}
	case c == '(' || c == ')' || c == '[' || c == ']' || c == ',' || c == ';' || c == '.':
		k = tPunct
	case opChar[c]:
		k = tOp
	default:
		k = tOther
	}
	l.i = j
	return token{kind: k, pos: i, end: j}
}

// scanNumber returns the end of a numeric literal starting at s[i].
func scanNumber(s string, i int) int {
	digits := func(j int, hex bool) int {
		for j < len(s) {
			c := s[j]
			if isDigit(c) || c == '_' || hex && (c|0x20 >= 'a' && c|0x20 <= 'f') {
				j++
				continue
			}
			break
		}
		return j
	}
	if s[i] == '0' && i+2 < len(s) {
		switch s[i+1] | 0x20 {
		case 'x', 'o', 'b':
			c := s[i+2] | 0x20
			if isDigit(s[i+2]) || c >= 'a' && c <= 'f' {
				return digits(i+2, true)
			}
		}
	}
	j := digits(i, false)
	if j < len(s) && s[j] == '.' && !(j+1 < len(s) && s[j+1] == '.') {
		j = digits(j+1, false)
	}
	if j < len(s) && s[j]|0x20 == 'e' {
		k := j + 1
		if k < len(s) && (s[k] == '+' || s[k] == '-') {
			k++
		}
		if k < len(s) && isDigit(s[k]) {
			j = digits(k, false)
		}
	}
	return j
}

// foldEq reports whether s equals lower (an ASCII lower-case word) ignoring
// ASCII case, without allocating.
func foldEq(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// lowerASCII folds ASCII letters like PostgreSQL folds unquoted identifiers;
// it returns s itself when nothing changes.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
