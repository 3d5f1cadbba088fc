package rewrite

import "sync"

// maxDepth bounds recursion into DO bodies (and EXECUTE strings inside them).
const maxDepth = 8

// stmtIter yields the tokens of one statement at a time. Statements end at
// ';' except inside a BEGIN ATOMIC … END function body. In body mode (the
// body of a DO block) the PL/pgSQL words BEGIN, THEN, ELSE, LOOP, DECLARE and
// EXCEPTION also end a statement and are dropped.
type stmtIter struct {
	src  string
	lx   lexer
	body bool
	buf  []token
	done bool
}

func (it *stmtIter) next() []token {
	it.buf = it.buf[:0]
	atomic := 0
	for {
		t := it.lx.next()
		switch t.kind {
		case tEOF:
			it.done = true
			return it.buf
		case tPunct:
			if atomic == 0 && it.src[t.pos] == ';' {
				return it.buf
			}
		case tIdent:
			w := it.src[t.pos:t.end]
			if atomic > 0 {
				switch {
				case foldEq(w, "case") || foldEq(w, "begin"):
					atomic++
				case foldEq(w, "end"):
					atomic--
				}
			} else if foldEq(w, "atomic") && len(it.buf) > 0 && kw(it.src, it.buf[len(it.buf)-1], "begin") && !it.body {
				atomic = 1
			} else if it.body && len(w) >= 4 && len(w) <= 9 &&
				(foldEq(w, "begin") || foldEq(w, "then") || foldEq(w, "else") || foldEq(w, "loop") ||
					foldEq(w, "declare") || foldEq(w, "exception")) {
				return it.buf
			}
		}
		it.buf = append(it.buf, t)
	}
}

// analyzer accumulates Findings over the statements of a string and the
// bodies of its DO blocks.
type analyzer struct {
	f          Findings
	leaseCalls int        // lease_acquire/renew/release/list calls seen
	leaseWhole *LeaseCall // candidate whole-statement call
	advWhole   *AdvisoryCall
	advTried   bool       // advWhole was looked for (in the first statement with an advisory call)
	chanWhole  *LeaseCall // candidate whole-statement pg_listening_channels() call
	// signalCalls counts the pg_terminate_backend and pg_cancel_backend
	// calls of top-level statements; signalWhole is the first one when its
	// statement is the whole call.
	signalCalls int
	signalWhole *SignalCall
	top         int // number of the top-level statement being analysed; 0 inside a DO body
}

// Analyze lexes sql and reports advisory-lock calls, lease calls,
// session-state statements, GUC changes, NOTIFY statements and pg_notify
// calls, pg_listening_channels() calls, and a statement that is one
// pg_terminate_backend or pg_cancel_backend call. It runs MayHit first and
// returns the zero Findings (Statements 0) without lexing when it is false.
func Analyze(sql string) Findings {
	if !MayHit(sql) {
		return Findings{}
	}
	return analyze(sql)
}

// analyze is Analyze without the prefilter.
func analyze(sql string) Findings {
	var a analyzer
	a.run(sql, 0, false)
	if a.advWhole != nil && a.f.Statements == 1 && len(a.f.Funcs) == 1 && !a.f.Funcs[0].Xact() &&
		a.leaseCalls == 0 && !a.f.LeaseFence && len(a.f.State) == 0 && len(a.f.Sets) == 0 {
		a.f.Hold = a.advWhole
	}
	if a.leaseCalls > 0 {
		if a.leaseCalls == 1 && a.leaseWhole != nil && a.f.Statements == 1 {
			a.f.Lease = a.leaseWhole
		} else {
			a.f.LeaseMention = true
		}
	}
	if a.chanWhole != nil && a.f.Statements == 1 && len(a.f.ChannelsCalls) == 1 && len(a.chanWhole.Args) == 0 {
		a.f.ChannelsWhole = a.chanWhole
	}
	if a.signalWhole != nil && a.signalCalls == 1 && a.f.Statements == 1 {
		a.f.Signal = a.signalWhole
	}
	return a.f
}

// CountStatements returns the number of non-empty statements in sql
// (strings, comments and BEGIN ATOMIC bodies respected).
func CountStatements(sql string) int {
	bp := getTokens()
	it := stmtIter{src: sql, lx: lexer{s: sql}, buf: (*bp)[:0]}
	n := 0
	for !it.done {
		if len(it.next()) > 0 {
			n++
		}
	}
	putTokens(bp, it.buf)
	return n
}

// tokPool recycles statement token buffers so the hit path does not
// allocate one per call.
var tokPool = sync.Pool{New: func() any { b := make([]token, 0, 256); return &b }}

func getTokens() *[]token { return tokPool.Get().(*[]token) }

func putTokens(bp *[]token, b []token) {
	if cap(b) <= 1<<16 {
		*bp = b[:0]
		tokPool.Put(bp)
	}
}

func (a *analyzer) run(src string, depth int, body bool) {
	bp := getTokens()
	it := stmtIter{src: src, lx: lexer{s: src}, body: body, buf: (*bp)[:0]}
	defer func() { putTokens(bp, it.buf) }()
	for !it.done {
		st := it.next()
		if len(st) == 0 {
			continue
		}
		top := a.top
		if body {
			a.top = 0
		} else {
			a.f.Statements++
			a.top = a.f.Statements
		}
		a.statement(src, st, depth, body)
		a.top = top
	}
}

// statement analyses the tokens of one non-empty statement.
func (a *analyzer) statement(src string, st []token, depth int, body bool) {
	createFunc := false
	// stores: the statement keeps its expressions for later (a view, a
	// default, a prepared statement) rather than evaluating them now.
	stores := kw(src, st[0], "create") || kw(src, st[0], "alter") || kw(src, st[0], "prepare")
	if kw(src, st[0], "create") {
		i := 1
		if i+1 < len(st) && kw(src, st[i], "or") && kw(src, st[i+1], "replace") {
			i += 2
		}
		createFunc = i < len(st) && (kw(src, st[i], "function") || kw(src, st[i], "procedure"))
	}
	a.leading(src, st, depth, body)
	if !body && !stores {
		a.catalogViews(src, st)
	}
	if createFunc {
		return // a function body is not run by CREATE: no calls to report
	}
	for i := 0; i+1 < len(st); i++ {
		t := st[i]
		if !isIdentTok(t.kind) || !isPunct(src, st[i+1], '(') {
			if body && t.kind == tIdent && isStringTok(st[i+1].kind) && kw(src, t, "execute") && depth < maxDepth {
				if v, _, ok := stringValue(src, st, i+1); ok {
					a.run(v, depth+1, true)
				}
			}
			continue
		}
		// Qualifier: st[i-2] '.' st[i-1]; nil when unqualified.
		// A qualifier that is not an identifier is treated as none (conservative).
		var qual token
		hasQual := i >= 2 && isPunct(src, st[i-1], '.') && isIdentTok(st[i-2].kind)
		if hasQual {
			qual = st[i-2]
		}
		if f := funcOf(src, t); f != 0 {
			if !hasQual || identIs(src, qual, "pg_catalog") {
				a.f.Funcs = append(a.f.Funcs, f)
				a.f.Advisory = true
				if !a.advTried {
					a.advTried = true
					if !body {
						a.advWhole = wholeAdvisory(src, st)
					}
				}
				if f.SessionAcquire() {
					a.f.SessionAcquire = true
				}
			}
			continue
		}
		if l := leaseOf(src, t); l != "" {
			if hasQual && !identIs(src, qual, "lockpool") {
				continue
			}
			if l == "lease_fence" {
				a.f.LeaseFence = true
				continue
			}
			a.leaseCalls++
			if !body && a.leaseCalls == 1 {
				a.leaseWhole = wholeLease(src, st)
			}
			continue
		}
		if hasQual && !identIs(src, qual, "pg_catalog") {
			continue
		}
		switch {
		case identIs(src, t, "set_config"):
			a.setConfig(src, st, i+2)
		case identIs(src, t, BackendPID):
			a.f.BackendPID = true
		case body:
			// pg_notify and pg_listening_channels in a DO body: whether
			// they run is not known, and positions would not be in src.
		case identIs(src, t, "pg_notify"):
			a.f.Notifies = append(a.f.Notifies, notifyCall(src, st, i+1))
		case !stores && identIs(src, t, "pg_listening_channels"):
			a.channelsCall(src, st, i, hasQual)
		case signalOf(src, t) != "":
			if signalOf(src, t) == TerminateBackend {
				a.f.Terminates = true
			} else {
				a.f.Cancels = true
			}
			a.signalCall(src, st)
		}
	}
}

func funcOf(src string, t token) Func {
	switch t.kind {
	case tIdent:
		return lookupFuncFold(src[t.pos:t.end])
	case tQIdent, tUIdent:
		if v, ok := identValue(src, t); ok {
			return lookupFunc(v)
		}
	}
	return 0
}

var leaseNames = [...]string{"lease_acquire", "lease_renew", "lease_release", "lease_list", "lease_fence"}

// leaseOf returns the lease function named by identifier t, or "".
func leaseOf(src string, t token) string {
	if t.kind == tIdent && (t.end-t.pos < len("lease_list") || !hasFold(src, t.pos, "lease_")) {
		return ""
	}
	for _, n := range leaseNames {
		if identIs(src, t, n) {
			return n
		}
	}
	return ""
}

// name decodes a name-like token for StateChange.Name.
func name(src string, st []token, i int) string {
	if i >= len(st) {
		return ""
	}
	t := st[i]
	if isIdentTok(t.kind) {
		v, _ := identValue(src, t)
		return v
	}
	if isStringTok(t.kind) {
		v, _, _ := stringValue(src, st, i)
		return v
	}
	if isPunct(src, t, '*') {
		return "*"
	}
	return src[t.pos:t.end]
}

func (a *analyzer) state(k StateKind, n string) {
	a.f.State = append(a.f.State, StateChange{Kind: k, Name: n})
}

// leading classifies the statement by its first words.
func (a *analyzer) leading(src string, st []token, depth int, body bool) {
	t := st[0]
	if t.kind != tIdent {
		if !body {
			a.intoTemp(src, st)
		}
		return
	}
	w := src[t.pos:t.end]
	at := func(i int, word string) bool { return i < len(st) && kw(src, st[i], word) }
	switch {
	case foldEq(w, "listen"):
		a.listen(Listen, src, st)
	case foldEq(w, "unlisten"):
		a.listen(Unlisten, src, st)
	case foldEq(w, "notify"):
		if !body {
			a.notify(src, st)
		}
	case foldEq(w, "create"):
		a.create(src, st)
	case foldEq(w, "drop"):
		if at(1, "table") || at(1, "view") || at(1, "sequence") {
			i := 2
			if at(i, "if") && at(i+1, "exists") {
				i += 2
			}
			a.state(DropTable, lastNamePart(src, st, i))
		}
	case foldEq(w, "declare"):
		for i := 2; i+1 < len(st) && !kw(src, st[i], "for"); i++ {
			if kw(src, st[i], "with") && kw(src, st[i+1], "hold") {
				a.state(DeclareHold, name(src, st, 1))
				break
			}
		}
	case foldEq(w, "close"):
		if at(1, "all") {
			a.state(Close, "*")
		} else {
			a.state(Close, name(src, st, 1))
		}
	case foldEq(w, "prepare"):
		if at(1, "transaction") && len(st) > 2 && isStringTok(st[2].kind) {
			return // two-phase commit, not a prepared statement
		}
		a.state(Prepare, name(src, st, 1))
	case foldEq(w, "deallocate"):
		i := 1
		if at(i, "prepare") {
			i++
		}
		if at(i, "all") {
			a.state(Deallocate, "*")
		} else {
			a.state(Deallocate, name(src, st, i))
		}
	case foldEq(w, "set"):
		a.set(src, st)
	case foldEq(w, "reset"):
		a.reset(src, st)
	case foldEq(w, "load"):
		a.state(Load, name(src, st, 1))
	case foldEq(w, "discard"):
		n := name(src, st, 1)
		if n == "temporary" {
			n = "temp"
		}
		a.state(Discard, n)
	case foldEq(w, "do"):
		i := 1
		if at(i, "language") {
			i += 2
		}
		if i < len(st) && isStringTok(st[i].kind) && depth < maxDepth {
			if v, _, ok := stringValue(src, st, i); ok {
				a.run(v, depth+1, true)
			}
		}
	case !body && (foldEq(w, "select") || foldEq(w, "with")):
		a.intoTemp(src, st)
	}
}

// lastNamePart returns the last part of the dotted name starting at st[i].
func lastNamePart(src string, st []token, i int) string {
	for i+2 < len(st) && isPunct(src, st[i+1], '.') {
		i += 2
	}
	return name(src, st, i)
}

// create handles CREATE [OR REPLACE] [GLOBAL|LOCAL] TEMP|TEMPORARY
// TABLE|VIEW|SEQUENCE|RECURSIVE VIEW … and CREATE … pg_temp.name.
func (a *analyzer) create(src string, st []token) {
	at := func(i int, word string) bool { return i < len(st) && kw(src, st[i], word) }
	i := 1
	if at(i, "or") && at(i+1, "replace") {
		i += 2
	}
	if at(i, "global") || at(i, "local") {
		i++
	}
	if at(i, "temp") || at(i, "temporary") {
		i++
		if at(i, "recursive") {
			i++
		}
		isTable := at(i, "table")
		if !isTable && !at(i, "view") && !at(i, "sequence") {
			return
		}
		i++
		if at(i, "if") && at(i+1, "not") && at(i+2, "exists") {
			i += 3
		}
		if isTable {
			depth := 0
			for j := i; j < len(st); j++ {
				switch {
				case isPunct(src, st[j], '('):
					depth++
				case isPunct(src, st[j], ')'):
					depth--
				case depth == 0 && j+2 < len(st) && kw(src, st[j], "on") && kw(src, st[j+1], "commit") && kw(src, st[j+2], "drop"):
					return
				}
			}
		}
		a.state(TempTable, lastNamePart(src, st, i))
		return
	}
	// An object created in pg_temp is a temporary object.
	for j := i; j+2 < len(st); j++ {
		t := st[j]
		if isPunct(src, t, '(') || kw(src, t, "as") {
			return
		}
		if isIdentTok(t.kind) && isPunct(src, st[j+1], '.') {
			if v, _ := identValue(src, t); v == "pg_temp" || len(v) > 8 && v[:8] == "pg_temp_" {
				a.state(TempTable, lastNamePart(src, st, j))
				return
			}
		}
	}
}

// intoTemp finds SELECT … INTO [LOCAL|GLOBAL] TEMP|TEMPORARY [TABLE] name.
func (a *analyzer) intoTemp(src string, st []token) {
	for i := 1; i+2 < len(st); i++ {
		if !kw(src, st[i], "into") || kw(src, st[i-1], "insert") || kw(src, st[i-1], "merge") {
			continue
		}
		j := i + 1
		if kw(src, st[j], "local") || kw(src, st[j], "global") {
			j++
		}
		if j >= len(st) || !(kw(src, st[j], "temp") || kw(src, st[j], "temporary")) {
			continue
		}
		j++
		if j < len(st) && kw(src, st[j], "table") {
			j++
		}
		if j < len(st) && isIdentTok(st[j].kind) && !(st[j].kind == tIdent && clauseWord(src[st[j].pos:st[j].end])) {
			a.state(TempTable, lastNamePart(src, st, j))
			return
		}
	}
}

func clauseWord(w string) bool {
	for _, c := range [...]string{"from", "where", "group", "having", "window", "order", "limit", "offset", "fetch", "for", "union", "intersect", "except"} {
		if foldEq(w, c) {
			return true
		}
	}
	return false
}
