package rewrite

import "strings"

// MayHit is the byte prefilter run on every Query and Parse body. It reports
// false only when Analyze would find nothing; it may report true for SQL that
// turns out to contain nothing (a word inside a string, say). It never
// allocates or copies. Each pass is a SIMD strings.IndexByte over the input
// for a byte that is rare in ordinary SQL, checked where found:
//
//	'('      a call: the word before it (after whitespace) may end with one
//	         of the function names (advisory, lease_*, set_config,
//	         pg_notify, pg_listening_channels, pg_terminate_backend,
//	         pg_cancel_backend, pg_backend_pid); when a comment may sit between name and
//	         '(' it falls back to a per-byte search for "advisory",
//	         "lease_", "set_config", "pg_notify", "pg_listening_channels",
//	         "pg_terminate_backend", "pg_cancel_backend" and "pg_backend_pid"
//	';'      a statement start: the next word is a leading keyword
//	'&'      U&' / U&" (escapes could spell any name)
//	'p', 'P' the word temp/temporary (SELECT … INTO TEMP)
//	'_'      pg_prepared_statements, pg_stat_activity (any case)
//
// plus a leading keyword at the very start.
func MayHit(sql string) bool {
	s := sql
	if leadingHit(s, 0) {
		return true
	}
	for i := indexFrom(s, 0, '('); i >= 0; i = indexFrom(s, i+1, '(') {
		if callBefore(s, i) {
			return true
		}
	}
	for i := indexFrom(s, 0, ';'); i >= 0; i = indexFrom(s, i+1, ';') {
		if leadingHit(s, i+1) {
			return true
		}
	}
	for i := indexFrom(s, 1, '&'); i >= 0; i = indexFrom(s, i+1, '&') {
		if s[i-1]|0x20 == 'u' && i+1 < len(s) && (s[i+1] == '\'' || s[i+1] == '"') {
			return true
		}
	}
	for i := indexFrom(s, 2, '_'); i >= 0; i = indexFrom(s, i+1, '_') {
		if s[i-1]|0x20 == 'g' && (hasFold(s, i-2, "pg_prepared_statements") || hasFold(s, i-2, "pg_stat_activity")) {
			return true
		}
	}
	return tempWord(s, 'p') || tempWord(s, 'P')
}

func indexFrom(s string, from int, c byte) int {
	if from >= len(s) {
		return -1
	}
	k := strings.IndexByte(s[from:], c)
	if k < 0 {
		return -1
	}
	return from + k
}

// tempWord reports "temp" or "temporary" (any case), not followed by an
// identifier byte, whose p is the byte p.
func tempWord(s string, p byte) bool {
	for i := indexFrom(s, 3, p); i >= 0; i = indexFrom(s, i+1, p) {
		if s[i-1]|0x20 != 'm' || !hasFold(s, i-3, "temp") {
			continue
		}
		j := i + 1
		if hasFold(s, j, "orary") {
			j += 5
		}
		if j >= len(s) || !identCont[s[j]] {
			return true
		}
	}
	return false
}

// callNames are the functions Analyze looks for in calls.
var callNames = [...]string{
	"pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared",
	"pg_advisory_xact_lock", "pg_advisory_xact_lock_shared", "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared",
	"pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all",
	"lease_acquire", "lease_renew", "lease_release", "lease_list", "lease_fence", "set_config",
	"pg_notify", "pg_listening_channels", TerminateBackend, CancelBackend, BackendPID,
}

// callsByLast holds callNames by their last byte, so a word is compared
// only with the names it may end with (at most five).
var callsByLast = func() (m [256][]string) {
	for _, n := range callNames {
		m[n[len(n)-1]] = append(m[n[len(n)-1]], n)
	}
	return m
}()

// callBefore reports whether the '(' at s[i] may follow one of callNames.
// The word before it is taken backwards over identifier bytes (or a quoted
// identifier) and matched as a suffix, a superset of the lexer's token.
func callBefore(s string, i int) bool {
	j := i
	crossed := false
	for j > 0 && isSpace(s[j-1]) {
		if s[j-1] == '\n' || s[j-1] == '\r' {
			crossed = true
		}
		j--
	}
	if j >= 2 && s[j-1] == '/' && s[j-2] == '*' {
		return slowHit(s) // a block comment between name and '('
	}
	if crossed {
		line := s[:j]
		if k := strings.LastIndexAny(line, "\n\r"); k >= 0 {
			line = line[k+1:]
		}
		if strings.Contains(line, "--") {
			return slowHit(s) // maybe a line comment between name and '('
		}
	}
	var w string
	if j > 0 && s[j-1] == '"' {
		k := strings.LastIndexByte(s[:j-1], '"')
		w = s[k+1 : j-1]
	} else {
		k := j
		for k > 0 && identCont[s[k-1]] {
			k--
		}
		w = s[k:j]
	}
	if len(w) < len("pg_notify") {
		return false
	}
	for _, n := range callsByLast[w[len(w)-1]|0x20] {
		if hasFold(w, len(w)-len(n), n) {
			return true
		}
	}
	return false
}

// slowHit is a per-byte search for the words a call name must contain.
func slowHit(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case 'v', 'V':
			if hasFold(s, i-2, "advisory") {
				return true
			}
		case '_':
			if hasFold(s, i-5, "lease_") || hasFold(s, i-3, "set_config") ||
				hasFold(s, i-2, "pg_notify") || hasFold(s, i-2, "pg_listening_channels") ||
				hasFold(s, i-2, TerminateBackend) || hasFold(s, i-2, CancelBackend) || hasFold(s, i-2, BackendPID) {
				return true
			}
		}
	}
	return false
}

// leadingHit reports whether the statement starting at s[i] (after
// whitespace and comments) begins with a keyword that Analyze classifies,
// or one that changes the schema (ChangesSchema): MayHit false means
// ChangesSchema false too, so a caller that has run MayHit need not run it.
func leadingHit(s string, i int) bool {
	w := leadingWord(s, i)
	switch len(w) {
	case 2:
		return foldEq(w, "do")
	case 3:
		return foldEq(w, "set")
	case 4:
		return foldEq(w, "drop") || foldEq(w, "load")
	case 5:
		return foldEq(w, "reset") || foldEq(w, "close") || foldEq(w, "alter")
	case 6:
		return foldEq(w, "listen") || foldEq(w, "notify") || foldEq(w, "create") || foldEq(w, "import")
	case 7:
		return foldEq(w, "declare") || foldEq(w, "prepare") || foldEq(w, "discard")
	case 8:
		return foldEq(w, "unlisten")
	case 10:
		return foldEq(w, "deallocate")
	}
	return false
}

// leadingWord returns the word the statement starting at s[i] begins with,
// after whitespace and comments ("" when it starts with no identifier).
func leadingWord(s string, i int) string {
	i = skipSpace(s, i)
	if i >= len(s) || !identStart[s[i]] {
		return ""
	}
	j := i + 1
	for j < len(s) && identCont[s[j]] {
		j++
	}
	return s[i:j]
}

// ChangesSchema reports whether some statement of sql starts with a word
// that may change what a prepared statement returns (ALTER, CREATE, DROP,
// IMPORT FOREIGN SCHEMA); statements that keep every table's columns
// (TRUNCATE, COMMENT, REINDEX, …) do not count. It looks at the first word
// and the word after each semicolon; a semicolon inside a string can only
// make it say yes wrongly. It is false whenever MayHit is (leadingHit
// counts these words too).
func ChangesSchema(sql string) bool {
	for i := 0; ; {
		switch w := leadingWord(sql, i); len(w) {
		case 4:
			if foldEq(w, "drop") {
				return true
			}
		case 5:
			if foldEq(w, "alter") {
				return true
			}
		case 6:
			if foldEq(w, "create") || foldEq(w, "import") {
				return true
			}
		}
		k := indexFrom(sql, i, ';')
		if k < 0 {
			return false
		}
		i = k + 1
	}
}

// hasFold reports whether s[i:] starts with lower (ASCII lower case and
// punctuation) ignoring ASCII case.
func hasFold(s string, i int, lower string) bool {
	if i < 0 || len(s)-i < len(lower) {
		return false
	}
	for j := 0; j < len(lower); j++ {
		c := s[i+j]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[j] {
			return false
		}
	}
	return true
}
