package rewrite

// anchor marks the bytes at which MayHit stops to look around. Each word that
// can matter anywhere in a statement contains exactly one anchor byte that is
// checked, so MayHit looks at every byte once and never copies:
//
//	'v'/'V'  "advisory"                 (the eleven advisory functions)
//	'_'      "lease_", "set_config"     (lease virtual functions, set_config)
//	'p'/'P'  "temp" / "temporary" word  (SELECT … INTO TEMP)
//	'&'      U&' / U&"                  (escapes could spell any name)
//	';'      a statement start          (statement-leading keywords)
var anchor [256]uint8

const (
	anV = 1 + iota
	anUnderscore
	anP
	anAmp
	anSemi
)

func init() {
	anchor['v'], anchor['V'] = anV, anV
	anchor['_'] = anUnderscore
	anchor['p'], anchor['P'] = anP, anP
	anchor['&'] = anAmp
	anchor[';'] = anSemi
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

// MayHit is the byte prefilter run on every Query and Parse body. It reports
// false only when Analyze would find nothing; it may report true for SQL that
// turns out to contain nothing (a word inside a string, say). It does not
// allocate and reads each byte once.
func MayHit(sql string) bool {
	if leadingHit(sql, 0) {
		return true
	}
	s := sql
	i := 0
	// Eight bytes per step: one branch when none is an anchor (the usual case).
	for ; i+8 <= len(s); i += 8 {
		b := s[i : i+8]
		if anchor[b[0]]|anchor[b[1]]|anchor[b[2]]|anchor[b[3]]|anchor[b[4]]|anchor[b[5]]|anchor[b[6]]|anchor[b[7]] == 0 {
			continue
		}
		for j := i; j < i+8; j++ {
			if anchor[s[j]] != 0 && anchorHit(s, j) {
				return true
			}
		}
	}
	for ; i < len(s); i++ {
		if anchor[s[i]] != 0 && anchorHit(s, i) {
			return true
		}
	}
	return false
}

// anchorHit checks the words around the anchor byte s[i]. The byte before
// the anchor is tested first: it rejects almost every anchor cheaply.
func anchorHit(s string, i int) bool {
	prev := byte(0)
	if i > 0 {
		prev = s[i-1] | 0x20
	}
	switch anchor[s[i]] {
	case anV: // ad[v]isory
		return prev == 'd' && hasFold(s, i-2, "advisory")
	case anUnderscore: // leas[e]_ , se[t]_config
		return prev == 'e' && hasFold(s, i-5, "lease_") || prev == 't' && hasFold(s, i-3, "set_config")
	case anP: // tem[p], tem[p]orary as a whole word
		if prev != 'm' || !hasFold(s, i-3, "temp") {
			return false
		}
		j := i + 1
		if hasFold(s, j, "orary") {
			j += 5
		}
		return j >= len(s) || !identCont[s[j]]
	case anAmp: // U&' U&"
		return prev == 'u' && i+1 < len(s) && (s[i+1] == '\'' || s[i+1] == '"')
	case anSemi:
		return leadingHit(s, i+1)
	}
	return false
}

// leadingHit reports whether the statement starting at s[i] (after
// whitespace and comments) begins with a keyword that Analyze classifies.
func leadingHit(s string, i int) bool {
	i = skipSpace(s, i)
	if i >= len(s) || !identStart[s[i]] {
		return false
	}
	j := i + 1
	for j < len(s) && identCont[s[j]] {
		j++
	}
	w := s[i:j]
	switch len(w) {
	case 2:
		return foldEq(w, "do")
	case 3:
		return foldEq(w, "set")
	case 4:
		return foldEq(w, "drop") || foldEq(w, "load")
	case 5:
		return foldEq(w, "reset") || foldEq(w, "close")
	case 6:
		return foldEq(w, "listen") || foldEq(w, "create")
	case 7:
		return foldEq(w, "declare") || foldEq(w, "prepare") || foldEq(w, "discard")
	case 8:
		return foldEq(w, "unlisten")
	case 10:
		return foldEq(w, "deallocate")
	}
	return false
}
