package rewrite

import "strconv"

// stmt wraps the tokens of one statement with bounds-checked helpers.
type stmt struct {
	src string
	st  []token
}

func (s stmt) kw(i int, word string) bool { return i >= 0 && i < len(s.st) && kw(s.src, s.st[i], word) }
func (s stmt) punct(i int, c byte) bool {
	return i >= 0 && i < len(s.st) && isPunct(s.src, s.st[i], c)
}
func (s stmt) kind(i int) tokKind {
	if i < 0 || i >= len(s.st) {
		return tEOF
	}
	return s.st[i].kind
}

// aliasToEnd reads an optional column alias ([AS] name) at token i and
// reports whether the statement ends right after it; alias is decoded, ""
// when there is none.
func (s stmt) aliasToEnd(i int) (alias string, ok bool) {
	if s.kw(i, "as") {
		i++
		if !isIdentTok(s.kind(i)) {
			return "", false
		}
	}
	if isIdentTok(s.kind(i)) && !(s.st[i].kind == tIdent && clauseWord(s.src[s.st[i].pos:s.st[i].end])) {
		alias, _ = identValue(s.src, s.st[i])
		i++
	}
	return alias, i == len(s.st)
}

// set handles SET statements.
func (a *analyzer) set(src string, st []token) {
	s := stmt{src, st}
	i, local := 1, false
	switch {
	case s.kw(1, "session") && s.kw(2, "authorization"):
		a.state(SetRole, roleName(src, st, 3))
		return
	case s.kw(1, "session") && s.kw(2, "characteristics"):
		return
	case s.kw(1, "session"):
		i = 2
	case s.kw(1, "local"):
		i, local = 2, true
	}
	switch {
	case s.kw(i, "transaction") || s.kw(i, "constraints"):
	case s.kw(i, "role") && !s.kw(i+1, "to") && !s.punct(i+1, '='):
		if !local {
			a.state(SetRole, roleName(src, st, i+1))
		}
	case s.kw(i, "session") && s.kw(i+1, "authorization"):
		if !local {
			a.state(SetRole, roleName(src, st, i+2))
		}
	case s.kw(i, "time") && s.kw(i+1, "zone"):
		a.setValue(s, "timezone", i+2, local)
	case s.kw(i, "schema") && !s.kw(i+1, "to") && !s.punct(i+1, '='):
		a.setValue(s, "search_path", i+1, local)
	case s.kw(i, "names") && !s.kw(i+1, "to") && !s.punct(i+1, '='):
		a.setValue(s, "client_encoding", i+1, local)
	case s.kw(i, "xml") && s.kw(i+1, "option"):
		a.setValue(s, "xmloption", i+2, local)
	default:
		n, j, ok := gucName(s, i)
		if !ok || !(s.kw(j, "to") || s.punct(j, '=')) {
			return
		}
		if n == "role" || n == "session_authorization" {
			if !local {
				a.state(SetRole, roleName(src, st, j+1))
			}
			return
		}
		a.setValue(s, n, j+1, local)
	}
}

// setValue records SET name TO <st[j:]>.
func (a *analyzer) setValue(s stmt, n string, j int, local bool) {
	if j >= len(s.st) {
		return
	}
	c := a.located(SetCmd{Name: n, Local: local}, s, "SET")
	if j == len(s.st)-1 && (s.kw(j, "default") || n == "timezone" && s.kw(j, "local")) {
		c.Reset = true
	} else {
		c.Value = s.src[s.st[j].pos:s.st[len(s.st)-1].end]
	}
	a.f.Sets = append(a.f.Sets, c)
}

// located fills in where the statement s of the analysed text is (see
// SetCmd.Stmt); inside a DO body it leaves c as it is.
func (a *analyzer) located(c SetCmd, s stmt, tag string) SetCmd {
	if a.top > 0 {
		c.Stmt, c.Pos, c.End, c.Tag = a.top, s.st[0].pos, s.st[len(s.st)-1].end, tag
	}
	return c
}

// reset handles RESET statements.
func (a *analyzer) reset(src string, st []token) {
	s := stmt{src, st}
	switch {
	case s.kw(1, "all"):
		a.f.Sets = append(a.f.Sets, a.located(SetCmd{Reset: true, All: true}, s, "RESET"))
	case s.kw(1, "role"), s.kw(1, "session") && s.kw(2, "authorization"):
		a.state(SetRole, "")
	case s.kw(1, "time") && s.kw(2, "zone"):
		a.f.Sets = append(a.f.Sets, a.located(SetCmd{Name: "timezone", Reset: true}, s, "RESET"))
	case s.kw(1, "transaction"):
	default:
		n, _, ok := gucName(s, 1)
		if !ok {
			return
		}
		if n == "session_authorization" {
			a.state(SetRole, "")
			return
		}
		a.f.Sets = append(a.f.Sets, a.located(SetCmd{Name: n, Reset: true}, s, "RESET"))
	}
}

// roleName decodes the role of SET ROLE / SESSION AUTHORIZATION; "" for
// NONE and DEFAULT (back to the login role).
func roleName(src string, st []token, i int) string {
	if i < len(st) && (kw(src, st[i], "none") || kw(src, st[i], "default")) {
		return ""
	}
	return name(src, st, i)
}

// gucName parses a possibly dotted GUC name at st[i] and lower-cases it.
func gucName(s stmt, i int) (string, int, bool) {
	n := ""
	for {
		if !isIdentTok(s.kind(i)) {
			return "", i, false
		}
		v, ok := identValue(s.src, s.st[i])
		if !ok {
			return "", i, false
		}
		n += lowerASCII(v)
		i++
		if !s.punct(i, '.') {
			return n, i, true
		}
		n += "."
		i++
	}
}

// parseArg parses a literal argument (string, [-+]number, NULL, $n) with
// optional casts at st[i]; it returns the index after it.
func parseArg(s stmt, i int) (Arg, int, bool) {
	var a Arg
	neg := ""
	if (s.punct(i, '-') || s.punct(i, '+')) && s.kind(i+1) == tNumber {
		if s.punct(i, '-') {
			neg = "-"
		}
		i++
	}
	switch k := s.kind(i); {
	case k == tNumber:
		t := s.st[i]
		a = Arg{Kind: ArgNumber, Text: neg + s.src[t.pos:t.end]}
		i++
	case neg != "":
		return a, i, false
	case isStringTok(k):
		v, next, ok := stringValue(s.src, s.st, i)
		if !ok {
			return a, i, false
		}
		a, i = Arg{Kind: ArgString, Text: v}, next
	case k == tParam:
		t := s.st[i]
		n, err := strconv.Atoi(s.src[t.pos+1 : t.end])
		if err != nil || n < 1 {
			return a, i, false
		}
		a = Arg{Kind: ArgParam, Param: n}
		i++
	case s.kw(i, "null"):
		a = Arg{Kind: ArgNull}
		i++
	default:
		return a, i, false
	}
	for s.kind(i) == tCast {
		i++
		if !isIdentTok(s.kind(i)) {
			return a, i, false
		}
		v, _ := identValue(s.src, s.st[i])
		i++
		if s.punct(i, '.') && isIdentTok(s.kind(i+1)) { // pg_catalog.int8
			v, _ = identValue(s.src, s.st[i+1])
			i += 2
		}
		if v == "double" && s.kw(i, "precision") {
			v += " precision"
			i++
		}
		if s.punct(i, '(') { // typmod: numeric(10,2), varchar(20)
			for i < len(s.st) && !s.punct(i, ')') {
				i++
			}
			if !s.punct(i, ')') {
				return a, i, false
			}
			i++
		}
		a.Cast = v
	}
	return a, i, true
}

// parseBool parses set_config's is_local argument: TRUE/FALSE or a string
// that PostgreSQL accepts as a boolean, optionally cast.
func parseBool(s stmt, i int) (val bool, next int, ok bool) {
	if s.kw(i, "true") || s.kw(i, "false") {
		val = s.kw(i, "true")
		i++
		for s.kind(i) == tCast && isIdentTok(s.kind(i+1)) {
			i += 2
		}
		return val, i, true
	}
	a, next, ok := parseArg(s, i)
	if !ok || a.Kind != ArgString {
		return false, next, false
	}
	switch lowerASCII(a.Text) {
	case "t", "tr", "tru", "true", "y", "ye", "yes", "on", "1":
		return true, next, true
	case "f", "fa", "fal", "fals", "false", "n", "no", "of", "off", "0":
		return false, next, true
	}
	return false, next, false
}

// setConfig handles set_config(name, value, is_local) whose '(' is at i-1.
func (a *analyzer) setConfig(src string, st []token, i int) {
	s := stmt{src, st}
	n, i, okName := parseArg(s, i)
	okName = okName && n.Kind == ArgString
	var (
		v              Arg
		okVal, okLocal bool
		local          bool
	)
	if s.punct(i, ',') {
		v, i, okVal = parseArg(s, i+1)
		okVal = okVal && v.Kind != ArgParam
		if s.punct(i, ',') {
			local, i, okLocal = parseBool(s, i+1)
			okLocal = okLocal && s.punct(i, ')')
		}
	}
	if okLocal && local && !okName {
		return
	}
	guc := ""
	if okName {
		guc = lowerASCII(n.Text)
	}
	if okName && okLocal && (guc == "role" || guc == "session_authorization") {
		if !local {
			if okVal {
				a.state(SetRole, v.Text) // NULL → ""
			} else {
				a.state(SetConfig, guc)
			}
		}
		return
	}
	if okLocal && local && !okVal {
		return // transaction scoped, value unknown: nothing to replay
	}
	if okName && okVal && okLocal {
		c := SetCmd{Name: guc, Local: local, Config: true}
		if v.Kind == ArgNull {
			c.Reset = true
		} else {
			c.Value = quoteLiteral(v.Text)
		}
		a.f.Sets = append(a.f.Sets, c)
		return
	}
	a.state(SetConfig, guc)
}

// wholeLease returns the lease call when st is, as a whole,
// SELECT [* FROM] [lockpool.]lease_xxx(args) [[AS] alias].
func wholeLease(src string, st []token) *LeaseCall {
	return wholeCall(src, st, "lockpool", func(t token) string {
		if fn := leaseOf(src, t); fn != "lease_fence" {
			return fn
		}
		return ""
	})
}

// wholeCall returns the call when st is, as a whole, SELECT [* FROM]
// [schema.]fn(literal args) [[AS] alias], where fn names the function of
// an identifier token ("" for none).
func wholeCall(src string, st []token, schema string, fn func(token) string) *LeaseCall {
	s := stmt{src, st}
	if !s.kw(0, "select") {
		return nil
	}
	i, star := 1, false
	if s.punct(1, '*') && s.kw(2, "from") {
		i, star = 3, true
	}
	if isIdentTok(s.kind(i)) && s.punct(i+1, '.') {
		if !identIs(src, st[i], schema) {
			return nil
		}
		i += 2
	}
	if !isIdentTok(s.kind(i)) {
		return nil
	}
	name := fn(st[i])
	if name == "" || !s.punct(i+1, '(') {
		return nil
	}
	i += 2
	c := &LeaseCall{Func: name, Star: star}
	if s.punct(i, ')') {
		i++
	} else {
		for {
			arg, next, ok := parseArg(s, i)
			if !ok {
				return nil
			}
			c.Args = append(c.Args, arg)
			i = next
			if s.punct(i, ',') {
				i++
				continue
			}
			if !s.punct(i, ')') {
				return nil
			}
			i++
			break
		}
	}
	alias, ok := s.aliasToEnd(i)
	if !ok {
		return nil
	}
	c.Alias = alias
	return c
}
