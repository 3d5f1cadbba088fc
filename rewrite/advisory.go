package rewrite

import (
	"strconv"
	"strings"
)

// AdvisoryCall is a statement that is, as a whole, one call of a
// session-level advisory function: SELECT [pg_catalog.]fn(args)[::type]
// [[AS] alias]. lockpool can answer it itself under advisory_locks: hold.
type AdvisoryCall struct {
	Func Func
	// Args are the key arguments' SQL texts as written ("42", "$1",
	// "hashtext($1)"): one or two, none for pg_advisory_unlock_all.
	Args []string
	// MaxParam is the highest $n the arguments use (0: none).
	MaxParam int
	// Cast is the result cast's type name, lower case with single spaces
	// ("integer", "pg_catalog.bool"); "" when none.
	Cast string
	// Alias is the column alias, decoded; "" when none.
	Alias string
}

// wholeAdvisory returns the call when the statement's tokens are exactly
// one advisory call in the recognised form, else nil. Arity is checked:
// pg_advisory_unlock_all takes no argument, the others one or two.
func wholeAdvisory(src string, st []token) *AdvisoryCall {
	s := stmt{src, st}
	if !s.kw(0, "select") {
		return nil
	}
	i := 1
	if isIdentTok(s.kind(i)) && s.punct(i+1, '.') {
		if !identIs(src, st[i], "pg_catalog") {
			return nil
		}
		i += 2
	}
	if !isIdentTok(s.kind(i)) {
		return nil
	}
	f := funcOf(src, st[i])
	if f == 0 || !s.punct(i+1, '(') {
		return nil
	}
	i += 2
	c := &AdvisoryCall{Func: f}
	start, depth := i, 0
	for ; i < len(st); i++ {
		t := st[i]
		switch {
		case t.kind == tParam:
			if n, err := strconv.Atoi(src[t.pos+1 : t.end]); err == nil && n > c.MaxParam {
				c.MaxParam = n
			}
		case isPunct(src, t, '(') || isPunct(src, t, '['):
			depth++
		case depth > 0 && (isPunct(src, t, ')') || isPunct(src, t, ']')):
			depth--
		case depth == 0 && (isPunct(src, t, ',') || isPunct(src, t, ')')):
			if i == start {
				if isPunct(src, t, ')') && len(c.Args) == 0 {
					goto closed // no arguments
				}
				return nil
			}
			c.Args = append(c.Args, src[st[start].pos:st[i-1].end])
			start = i + 1
			if isPunct(src, t, ')') {
				goto closed
			}
		}
	}
	return nil
closed:
	i++
	if f == AdvisoryUnlockAll && len(c.Args) != 0 || f != AdvisoryUnlockAll && (len(c.Args) < 1 || len(c.Args) > 2) {
		return nil
	}
	if s.kind(i) == tCast {
		i++
		var parts []string
		for isIdentTok(s.kind(i)) {
			v, _ := identValue(src, st[i])
			parts = append(parts, v)
			i++
			if s.punct(i, '.') {
				parts = append(parts, ".")
				i++
				continue
			}
			if !isIdentTok(s.kind(i)) || kw(src, st[i], "as") || len(parts) > 0 && !typeWordContinues(parts[len(parts)-1]) {
				break
			}
		}
		if len(parts) == 0 {
			return nil
		}
		c.Cast = strings.ReplaceAll(strings.Join(parts, " "), " . ", ".")
	}
	alias, ok := s.aliasToEnd(i)
	if !ok {
		return nil
	}
	c.Alias = alias
	return c
}

// typeWordContinues reports whether a type name may go on after word
// ("double precision", "character varying").
func typeWordContinues(word string) bool { return word == "double" || word == "character" }
