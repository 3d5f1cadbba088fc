package integration

// The oracle of TestListenRandomized: from what every client logged (each
// statement with the monotonic times it was sent and completed, each
// notification it received, how its connection ended) and what the killer
// did, it decides for every client connection and every notification
// whether the notification must, may or must not have reached it, and
// checks every other rule. See TestListenRandomized for the rules.

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// lrEvent is one line of a client's log (Go clients make them directly,
// node clients print them as JSON).
type lrEvent struct {
	Ev   string  `json:"ev"` // conn, op, recv, fatal, barrier, end (node also: stopped, done, log)
	C    int     `json:"c"`  // client number; -1 is the outside sender
	G    int     `json:"g"`  // connection generation of the client (a new one after each FATAL)
	Kind string  `json:"kind,omitempty"`
	Acts []lrAct `json:"acts,omitempty"`
	SQL  string  `json:"sql,omitempty"`
	Sent int64   `json:"sent,omitempty"` // monotonic ns
	Done int64   `json:"done,omitempty"` // monotonic ns; 0 when the connection died instead
	OK   bool    `json:"ok,omitempty"`
	Tag  string  `json:"tag,omitempty"`
	Code string  `json:"code,omitempty"` // SQLSTATE of an error
	Sev  string  `json:"sev,omitempty"`  // its severity
	Err  string  `json:"err,omitempty"`
	PID  uint32  `json:"pid,omitempty"`
	Ch   string  `json:"ch,omitempty"`
	ID   string  `json:"id,omitempty"`
	T    int64   `json:"t,omitempty"`
	// InBlock: a notification arrived while the client was inside a
	// transaction block (after the ReadyForQuery that said so, before it
	// sent COMMIT or ROLLBACK).
	InBlock bool     `json:"inblock,omitempty"`
	Got     []string `json:"got,omitempty"`  // pg_listening_channels()
	Want    []string `json:"want,omitempty"` // what the client's own model says
	Driver  string   `json:"driver,omitempty"`
	Msg     string   `json:"msg,omitempty"`
}

// lrAct is what a statement does to LISTEN state or sends: listen,
// unlisten, unlisten_all (UNLISTEN * and DISCARD ALL), notify.
type lrAct struct {
	K  string `json:"k"`
	Ch string `json:"ch,omitempty"`
	ID string `json:"id,omitempty"`
}

// The op kinds.
const (
	lrStmt     = "stmt"     // a Query (one or more statements) or one extended-protocol statement
	lrBegin    = "begin"    // BEGIN
	lrCommit   = "commit"   // COMMIT (tag COMMIT, or ROLLBACK for a failed block)
	lrRollback = "rollback" // ROLLBACK
	lrChannels = "channels" // SELECT pg_listening_channels()
)

// lrKill is one kill: in lockpool mode of lockpool's listener backend(s),
// in direct mode of some clients' own backends.
type lrKill struct {
	Sent, Done, Gone int64
	Listeners        []int32 // lockpool: the 'lockpool listener' backends terminated
	Targets          []lrKey // direct: the connections whose backend was terminated
	Note             string
}

type lrKey struct{ C, G int }

func (k lrKey) String() string {
	if k.C < 0 {
		return "outside sender"
	}
	return fmt.Sprintf("client %d gen %d", k.C, k.G)
}

const lrInf = int64(math.MaxInt64)

// lrSpan is a closed interval of monotonic ns.
type lrSpan struct{ Lo, Hi int64 }

func (s lrSpan) overlaps(lo, hi int64) bool { return s.Lo <= hi && lo <= s.Hi }

// lrEffect is a change of one channel's LISTEN state, taking effect at an
// unknown instant in [Lo, Hi].
type lrEffect struct {
	On     bool
	Lo, Hi int64
	What   string
}

// lrConn is one client connection as the oracle sees it.
type lrConn struct {
	Key     lrKey
	Driver  string
	PID     uint32
	Start   int64 // connected
	Fatal   *lrEvent
	Barrier int64 // the final barrier was sent; 0 if none
	Ended   int64
	Ops     []*lrEvent
	Recvs   []*lrEvent
	// Derived.
	Spans     []lrSpan              // server round trips: autocommit statements, whole blocks
	Effects   map[string][]lrEffect // per channel, in order
	Uncertain map[string][]lrSpan   // per channel: pending LISTEN state that did not commit
	ObsEnd    int64                 // must-receive only for notifications read before this
}

// lrNote is one notification sent.
type lrNote struct {
	ID, Ch    string
	Sender    lrKey
	SenderPID uint32
	Tx        int
	Idx       int
	CS, CC    int64 // the commit was sent / completed (CC lrInf: unknown)
	Status    string
	SQL       string
}

const (
	lrCommitted  = "committed"
	lrRolledBack = "rolled back"
	lrUnknown    = "unknown" // the connection died while the commit was in flight
)

// lrViolation is one broken rule.
type lrViolation struct {
	Kind string
	Text string
}

// lrOracle holds everything the checks need.
type lrOracle struct {
	mode   string // direct | lockpool
	t0     int64
	conns  map[lrKey]*lrConn
	order  []lrKey
	notes  map[string]*lrNote
	kills  []lrKill
	delta  time.Duration // before a kill: how long a delivery may still be cut off by it
	grace  time.Duration // after the killed backend is gone: until the clients it affects are told
	viol   []lrViolation
	stats  map[string]int
	allowd map[string]bool // SQLSTATEs the clients cause on purpose
}

func (o *lrOracle) ms(t int64) string {
	if t == lrInf || t == 0 {
		return "∞"
	}
	return fmt.Sprintf("+%.1fms", float64(t-o.t0)/1e6)
}

func (o *lrOracle) add(kind, format string, args ...any) {
	o.viol = append(o.viol, lrViolation{Kind: kind, Text: fmt.Sprintf(format, args...)})
}

// newLROracle builds the connections, their transactions and LISTEN
// effects, and the notifications from the events.
func newLROracle(mode string, t0 int64, events []lrEvent, kills []lrKill, delta, grace time.Duration) *lrOracle {
	o := &lrOracle{mode: mode, t0: t0, conns: map[lrKey]*lrConn{}, notes: map[string]*lrNote{}, kills: kills,
		delta: delta, grace: grace, stats: map[string]int{},
		allowd: map[string]bool{"22012": true, "25P02": true}}
	get := func(e lrEvent) *lrConn {
		k := lrKey{e.C, e.G}
		c := o.conns[k]
		if c == nil {
			c = &lrConn{Key: k, Effects: map[string][]lrEffect{}, Uncertain: map[string][]lrSpan{}}
			o.conns[k] = c
			o.order = append(o.order, k)
		}
		return c
	}
	for i := range events {
		e := &events[i]
		c := get(*e)
		switch e.Ev {
		case "conn":
			c.PID, c.Start, c.Driver = e.PID, e.Done, e.Driver
		case "op":
			c.Ops = append(c.Ops, e)
		case "recv":
			c.Recvs = append(c.Recvs, e)
		case "fatal":
			if c.Fatal == nil {
				c.Fatal = e
			}
		case "barrier":
			c.Barrier = e.Sent
		case "end":
			c.Ended = e.T
		}
	}
	tx := 0
	for _, k := range o.order {
		tx = o.build(o.conns[k], tx)
	}
	return o
}

// build derives a connection's spans, LISTEN effects and the notifications
// it sent; tx numbers transactions across connections.
func (o *lrOracle) build(c *lrConn, tx int) int {
	committed := map[string]bool{} // the model's committed LISTEN set
	type blockState struct {
		begin  int64
		stmts  []*lrEvent
		failed bool
	}
	var block *blockState
	doneOr := func(e *lrEvent) int64 {
		if e.Done == 0 {
			return lrInf
		}
		return e.Done
	}
	// commitTx applies a transaction's statements: its notifications get
	// the commit interval [cs, cc] and status; its LISTEN actions become
	// effects (net per channel) or, when it did not commit, uncertainty.
	commitTx := func(stmts []*lrEvent, cs, cc int64, status string) {
		tx++
		idx := 0
		for _, s := range stmts {
			for _, a := range s.Acts {
				if a.K == "notify" {
					idx++
					o.notes[a.ID] = &lrNote{ID: a.ID, Ch: a.Ch, Sender: c.Key, SenderPID: c.PID, Tx: tx, Idx: idx,
						CS: cs, CC: cc, Status: status, SQL: s.SQL}
				}
			}
		}
		if status != lrCommitted {
			for _, s := range stmts {
				for _, a := range s.Acts {
					switch a.K {
					case "listen", "unlisten":
						c.Uncertain[a.Ch] = append(c.Uncertain[a.Ch], lrSpan{s.Sent, cc})
					case "unlisten_all":
						c.Uncertain["*"] = append(c.Uncertain["*"], lrSpan{s.Sent, cc})
					}
				}
			}
			return
		}
		after := map[string]bool{}
		for ch := range committed {
			after[ch] = true
		}
		first := map[string]int64{} // the first statement that touched a channel
		var firstAll int64
		for _, s := range stmts {
			for _, a := range s.Acts {
				switch a.K {
				case "listen", "unlisten":
					if _, ok := first[a.Ch]; !ok {
						first[a.Ch] = s.Sent
					}
				case "unlisten_all":
					if firstAll == 0 {
						firstAll = s.Sent
					}
				}
			}
			lrApply(after, s.Acts)
		}
		chs := map[string]bool{}
		for ch := range committed {
			chs[ch] = true
		}
		for ch := range after {
			chs[ch] = true
		}
		for ch := range chs {
			if committed[ch] == after[ch] {
				continue
			}
			lo, ok := first[ch]
			if firstAll != 0 && (!ok || firstAll < lo) {
				lo = firstAll
			}
			what := "LISTEN"
			if !after[ch] {
				what = "UNLISTEN"
			}
			if len(stmts) > 1 || strings.Contains(stmts[0].SQL, ";") {
				what += " (committed at " + o.ms(cc) + ")"
			}
			c.Effects[ch] = append(c.Effects[ch], lrEffect{On: after[ch], Lo: lo, Hi: cc, What: what})
		}
		for ch := range committed {
			delete(committed, ch)
		}
		for ch := range after {
			committed[ch] = true
		}
	}
	for _, e := range c.Ops {
		fatal := e.Done == 0
		switch e.Kind {
		case lrBegin:
			if e.OK {
				block = &blockState{begin: e.Sent}
			} else {
				c.Spans = append(c.Spans, lrSpan{e.Sent, doneOr(e)})
			}
		case lrStmt, lrChannels:
			if block != nil {
				block.stmts = append(block.stmts, e)
				if !e.OK {
					block.failed = true
				}
				continue
			}
			c.Spans = append(c.Spans, lrSpan{e.Sent, doneOr(e)})
			switch {
			case e.OK:
				commitTx([]*lrEvent{e}, e.Sent, e.Done, lrCommitted)
			case fatal:
				commitTx([]*lrEvent{e}, e.Sent, lrInf, lrUnknown)
			default:
				commitTx([]*lrEvent{e}, e.Sent, e.Done, lrRolledBack)
			}
		case lrCommit, lrRollback:
			if block == nil {
				c.Spans = append(c.Spans, lrSpan{e.Sent, doneOr(e)})
				continue
			}
			c.Spans = append(c.Spans, lrSpan{block.begin, doneOr(e)})
			switch {
			case fatal && e.Kind == lrCommit:
				commitTx(block.stmts, e.Sent, lrInf, lrUnknown)
			case e.Kind == lrCommit && e.OK && e.Tag == "COMMIT" && !block.failed:
				commitTx(block.stmts, e.Sent, e.Done, lrCommitted)
			default:
				commitTx(block.stmts, e.Sent, doneOr(e), lrRolledBack)
			}
			block = nil
		}
	}
	if block != nil {
		// The connection ended inside a block: it never sent COMMIT, so
		// nothing of it committed.
		c.Spans = append(c.Spans, lrSpan{block.begin, lrInf})
		commitTx(block.stmts, lrInf, lrInf, lrRolledBack)
	}
	// Connection end: no channel is listened to afterwards.
	c.ObsEnd = lrInf
	switch {
	case c.Barrier != 0:
		c.ObsEnd = c.Barrier
	case c.Fatal != nil:
		c.ObsEnd = c.Fatal.T - int64(o.delta)
		if k := o.killBefore(c.Fatal.T); k != nil {
			c.ObsEnd = k.Sent - int64(o.delta)
		}
	case c.Ended != 0:
		c.ObsEnd = c.Ended
	}
	return tx
}

// lrApply applies LISTEN actions to a set of channels.
func lrApply(set map[string]bool, acts []lrAct) {
	for _, a := range acts {
		switch a.K {
		case "listen":
			set[a.Ch] = true
		case "unlisten":
			delete(set, a.Ch)
		case "unlisten_all":
			for ch := range set {
				delete(set, ch)
			}
		}
	}
}

// killBefore is the last kill sent at or before t.
func (o *lrOracle) killBefore(t int64) *lrKill {
	var k *lrKill
	for i := range o.kills {
		if o.kills[i].Sent <= t {
			k = &o.kills[i]
		}
	}
	return k
}

// readEnd is the latest instant at which c's backend may read a
// notification committed in [cs, cc]: a statement in flight then is
// finished first, and a block open then holds it until the block ends.
func (c *lrConn) readEnd(cs, cc int64) int64 {
	// The spans are in order and do not overlap: only the last one that
	// starts by cc can reach cs.
	j := sort.Search(len(c.Spans), func(i int) bool { return c.Spans[i].Lo > cc }) - 1
	if j >= 0 && c.Spans[j].Hi >= cs && c.Spans[j].Hi > cc {
		return c.Spans[j].Hi
	}
	return cc
}

// state says whether c listens to ch throughout [lo, hi]: certain is false
// when a change may happen inside it. withPending adds the uncertainty of
// LISTEN state changes that never committed (lockpool may have acted on
// them meanwhile: for the kill verdict).
func (c *lrConn) state(ch string, lo, hi int64, withPending bool) (on, certain bool, why string) {
	if withPending {
		for _, s := range append(c.Uncertain[ch], c.Uncertain["*"]...) {
			if s.overlaps(lo, hi) {
				return false, false, "a LISTEN state change that did not commit was pending"
			}
		}
	}
	for _, e := range c.Effects[ch] {
		if e.Lo <= hi && lo <= e.Hi {
			return false, false, ""
		}
		if e.Hi < lo {
			on = e.On
		}
	}
	return on, true, ""
}

// describe is c's LISTEN history on ch, for reports.
func (o *lrOracle) describe(c *lrConn, ch string) string {
	var parts []string
	for _, e := range c.Effects[ch] {
		parts = append(parts, fmt.Sprintf("%s in [%s, %s]", e.What, o.ms(e.Lo), o.ms(e.Hi)))
	}
	if len(parts) == 0 {
		return "never listened to it"
	}
	return strings.Join(parts, ", ")
}

func (o *lrOracle) connName(c *lrConn) string {
	d := c.Driver
	if d == "" {
		d = "?"
	}
	return fmt.Sprintf("%s (%s, pid %d)", c.Key, d, c.PID)
}

// check runs every check and returns the violations.
func (o *lrOracle) check() []lrViolation {
	o.checkOps()
	o.checkDeliveries()
	o.checkKills()
	return o.viol
}

// checkOps: unexpected errors, pg_listening_channels() against the
// client's own model, connections that ended without a FATAL.
func (o *lrOracle) checkOps() {
	for _, k := range o.order {
		c := o.conns[k]
		for _, e := range c.Ops {
			o.stats["statements"]++
			if e.Kind == lrChannels && e.OK {
				o.stats["pg_listening_channels() checks"]++
				if strings.Join(e.Got, ",") != strings.Join(e.Want, ",") {
					o.add("pg_listening_channels", "%s at %s: pg_listening_channels() = %q, but the channels it LISTENed to (committed) are %q",
						o.connName(c), o.ms(e.Sent), e.Got, e.Want)
				}
			}
			if !e.OK && e.Done != 0 && !o.allowd[e.Code] {
				o.add("unexpected error", "%s: %s at %s: %s %s: %s", o.connName(c), shorten(e.SQL, 80), o.ms(e.Sent), e.Sev, e.Code, e.Err)
			}
		}
		if f := c.Fatal; f != nil {
			o.stats["connections closed by the server"]++
			switch {
			case f.Code == "" || f.Sev != "FATAL":
				o.add("closed without FATAL", "%s: connection lost at %s without a FATAL (%s %s: %s)", o.connName(c), o.ms(f.T), f.Sev, f.Code, f.Err)
			case f.Code != "57P01" && f.Code != "08006":
				o.add("FATAL code", "%s: FATAL %s at %s (want 57P01 or 08006): %s", o.connName(c), f.Code, o.ms(f.T), f.Err)
			}
			if o.killBefore(f.T) == nil {
				o.add("FATAL without kill", "%s: FATAL %s at %s before any kill: %s", o.connName(c), f.Code, o.ms(f.T), f.Err)
			}
		}
	}
}

// checkDeliveries: for every connection and every notification, must /
// may / must not; no duplicates; order; own pid; nothing inside a block.
func (o *lrOracle) checkDeliveries() {
	notes := make([]*lrNote, 0, len(o.notes))
	for _, n := range o.notes {
		notes = append(notes, n)
		o.stats["notifications "+n.Status]++
	}
	sort.Slice(notes, func(i, j int) bool { return notes[i].ID < notes[j].ID })
	for _, k := range o.order {
		c := o.conns[k]
		got := map[string]int{}
		for _, r := range c.Recvs {
			o.stats["deliveries"]++
			got[r.ID]++
			n := o.notes[r.ID]
			if n == nil {
				o.add("unknown notification", "%s received %q on %q at %s (pid %d): no client sent it", o.connName(c), shorten(r.ID, 40), r.Ch, o.ms(r.T), r.PID)
				continue
			}
			if r.Ch != n.Ch {
				o.add("channel", "%s received %s on channel %q, sent on %q", o.connName(c), n.ID, r.Ch, n.Ch)
			}
			if got[r.ID] == 2 {
				o.add("duplicate", "%s received %s (on %s, from %s) more than once", o.connName(c), n.ID, n.Ch, n.Sender)
			}
			if r.InBlock {
				o.add("inside a block", "%s received %s at %s while inside a transaction block", o.connName(c), n.ID, o.ms(r.T))
			}
			own := n.Sender == c.Key
			if (r.PID == c.PID) != own {
				if own {
					o.add("own pid", "%s received its own notification %s with pid %d, not its own PID() %d", o.connName(c), n.ID, r.PID, c.PID)
				} else {
					o.add("own pid", "%s received %s from %s with pid %d, its own PID(): it would take it for its own", o.connName(c), n.ID, n.Sender, r.PID)
				}
			} else if r.PID != n.SenderPID {
				o.add("sender pid", "%s received %s from %s with pid %d, the sender's PID() is %d", o.connName(c), n.ID, n.Sender, r.PID, n.SenderPID)
			}
		}
		o.checkOrder(c)
		for _, n := range notes {
			o.expectation(c, n, got[n.ID])
		}
	}
}

// The classes of a (connection, notification) pair.
const (
	lrMust    = "must"
	lrMustNot = "must not"
	lrMay     = "may"
)

// classify says whether n must, may or must not reach c; re is the latest
// instant c's backend may read it.
func (o *lrOracle) classify(c *lrConn, n *lrNote) (class string, re int64) {
	switch {
	case n.Status == lrRolledBack:
		return lrMustNot, 0
	case n.Status == lrUnknown:
		return lrMay, 0
	case c.Start == 0 || n.CC < c.Start:
		return lrMustNot, 0 // committed before the connection existed
	case c.Fatal != nil && n.CS > c.Fatal.T:
		return lrMustNot, 0 // after the connection was closed
	}
	re = c.readEnd(n.CS, n.CC)
	on, certain, _ := c.state(n.Ch, n.CS, re, false)
	switch {
	case certain && !on:
		return lrMustNot, re
	case certain && on && re < c.ObsEnd:
		return lrMust, re
	}
	return lrMay, re
}

// expectation checks one connection against one notification.
func (o *lrOracle) expectation(c *lrConn, n *lrNote, got int) {
	class, re := o.classify(c, n)
	o.stats["pairs "+class]++
	switch {
	case class == lrMustNot && got > 0 && n.Status == lrRolledBack:
		o.add("extra", "%s received %s (%s on %s, from %s), whose transaction did not commit", o.connName(c), n.ID, shorten(n.SQL, 60), n.Ch, n.Sender)
	case class == lrMustNot && got > 0 && re == 0:
		o.add("extra", "%s received %s, committed at [%s, %s] outside the connection's life [%s, %s]", o.connName(c), n.ID,
			o.ms(n.CS), o.ms(n.CC), o.ms(c.Start), o.ms(c.ObsEnd))
	case class == lrMustNot && got > 0:
		o.add("extra", "%s received %s on %s (from %s, committed in [%s, %s], read by %s) while not listening to %s: %s",
			o.connName(c), n.ID, n.Ch, n.Sender, o.ms(n.CS), o.ms(n.CC), o.ms(re), n.Ch, o.describe(c, n.Ch))
	case class == lrMust && got == 0:
		end := "the final barrier"
		if c.Fatal != nil {
			end = "its FATAL (" + o.ms(c.Fatal.T) + ")"
		}
		o.add("missing", "%s missed %s on %s (from %s: %s), committed in [%s, %s], read by %s, while it listened to %s: %s; no UNLISTEN before %s at %s",
			o.connName(c), n.ID, n.Ch, n.Sender, shorten(n.SQL, 60), o.ms(n.CS), o.ms(n.CC), o.ms(re), n.Ch, o.describe(c, n.Ch), end, o.ms(c.ObsEnd))
	}
}

// checkOrder: notifications of one transaction in the order sent; of
// different transactions, never one received before another that committed
// strictly earlier.
func (o *lrOracle) checkOrder(c *lrConn) {
	var maxCS int64 = -1
	var maxNote *lrNote
	lastIdx := map[int]int{}
	for _, r := range c.Recvs {
		n := o.notes[r.ID]
		if n == nil || n.Status == lrRolledBack {
			continue
		}
		if n.CC < maxCS {
			o.add("order", "%s received %s (committed in [%s, %s]) after %s (commit sent at %s): it committed before that one",
				o.connName(c), n.ID, o.ms(n.CS), o.ms(n.CC), maxNote.ID, o.ms(maxNote.CS))
		}
		if i, ok := lastIdx[n.Tx]; ok && n.Idx < i {
			o.add("order", "%s received %s (number %d of its transaction) after number %d", o.connName(c), n.ID, n.Idx, i)
		}
		if n.Idx > lastIdx[n.Tx] {
			lastIdx[n.Tx] = n.Idx
		}
		if n.CS != lrInf && n.CS > maxCS {
			maxCS, maxNote = n.CS, n
		}
	}
}

// checkKills: who had to get a FATAL and who had to stay open.
func (o *lrOracle) checkKills() {
	for i, k := range o.kills {
		o.stats["kills"]++
		next := lrInf
		if i+1 < len(o.kills) {
			next = o.kills[i+1].Sent
		}
		winEnd := k.Gone + int64(o.grace)
		if k.Gone == 0 {
			winEnd = k.Done + int64(o.grace)
		}
		if o.mode == "lockpool" && len(k.Listeners) == 0 {
			// Nothing was killed: only "no listener" below applies.
			for _, key := range o.order {
				if c := o.conns[key]; key.C >= 0 && c.Start != 0 && c.Start < k.Sent && (c.Fatal == nil || c.Fatal.T >= k.Sent) &&
					o.listenStatus(c, k.Sent, winEnd) == "listening" {
					o.add("no listener", "kill %d at %s: no backend with application_name %q in the database while %s listened (%s)",
						i+1, o.ms(k.Sent), listenListenerAppName, o.connName(c), k.Note)
					break
				}
			}
			continue
		}
		target := map[lrKey]bool{}
		for _, t := range k.Targets {
			target[t] = true
		}
		listening := 0
		for _, key := range o.order {
			c := o.conns[key]
			if key.C < 0 || c.Start == 0 || c.Start >= k.Sent || (c.Fatal != nil && c.Fatal.T < k.Sent) ||
				(c.Barrier != 0 && c.Barrier < winEnd) {
				continue
			}
			byK := c.Fatal != nil && c.Fatal.T >= k.Sent && c.Fatal.T < next
			if o.mode == "direct" {
				switch {
				case target[key] && !byK:
					o.add("kill", "%s: its backend was terminated at %s but it got no FATAL", o.connName(c), o.ms(k.Sent))
				case !target[key] && byK:
					o.add("kill", "%s: closed at %s by kill %d of other backends", o.connName(c), o.ms(c.Fatal.T), i+1)
				}
				continue
			}
			status := o.listenStatus(c, k.Sent, winEnd)
			switch {
			case status == "listening":
				listening++
				o.stats["kills: listening clients"]++
				if !byK {
					o.add("kill", "%s listened (%s) throughout [%s, %s] when lockpool's listener was terminated, but was not closed with a FATAL",
						o.connName(c), o.listenSummary(c, k.Sent), o.ms(k.Sent), o.ms(winEnd))
				}
			case status == "not listening":
				o.stats["kills: clients not listening"]++
				if byK {
					o.add("kill", "%s listened to nothing throughout [%s, %s] when lockpool's listener was terminated, yet was closed at %s: FATAL %s",
						o.connName(c), o.ms(k.Sent), o.ms(winEnd), o.ms(c.Fatal.T), c.Fatal.Code)
				}
			default:
				o.stats["kills: clients changing LISTEN state"]++
			}
		}
		if o.mode == "lockpool" && listening == 0 {
			o.stats["kills with no client certainly listening"]++
		}
	}
}

// listenStatus is "listening" when c certainly listens to some channel
// throughout [lo, hi], "not listening" when it certainly listens to none,
// else "changing".
func (o *lrOracle) listenStatus(c *lrConn, lo, hi int64) string {
	chs := map[string]bool{}
	for ch := range c.Effects {
		chs[ch] = true
	}
	for ch := range c.Uncertain {
		chs[ch] = true
	}
	anyOn, allCertainOff := false, true
	for ch := range chs {
		if ch == "*" {
			continue
		}
		on, certain, _ := c.state(ch, lo, hi, true)
		if certain && on {
			anyOn = true
		}
		if !certain || on {
			allCertainOff = false
		}
	}
	for _, s := range c.Uncertain["*"] {
		if s.overlaps(lo, hi) {
			allCertainOff = false
		}
	}
	switch {
	case anyOn:
		return "listening"
	case allCertainOff:
		return "not listening"
	}
	return "changing"
}

func (o *lrOracle) listenSummary(c *lrConn, t int64) string {
	var on []string
	for ch := range c.Effects {
		if v, certain, _ := c.state(ch, t, t, false); v && certain {
			on = append(on, ch)
		}
	}
	sort.Strings(on)
	return "to " + strings.Join(on, ", ")
}

// report is the violations grouped by kind, at most max of each shown.
func (o *lrOracle) report(max int) string {
	byKind := map[string][]string{}
	var kinds []string
	for _, v := range o.viol {
		if _, ok := byKind[v.Kind]; !ok {
			kinds = append(kinds, v.Kind)
		}
		byKind[v.Kind] = append(byKind[v.Kind], v.Text)
	}
	sort.Strings(kinds)
	var b strings.Builder
	for _, k := range kinds {
		vs := byKind[k]
		fmt.Fprintf(&b, "%d × %s:\n", len(vs), k)
		for i, v := range vs {
			if i == max {
				fmt.Fprintf(&b, "  … %d more\n", len(vs)-max)
				break
			}
			fmt.Fprintf(&b, "  %s\n", v)
		}
	}
	return b.String()
}

// summary is the counts the run produced, for the log.
func (o *lrOracle) summary() string {
	keys := make([]string, 0, len(o.stats))
	for k := range o.stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, o.stats[k]))
	}
	return fmt.Sprintf("%d connections; %s", len(o.conns), strings.Join(parts, ", "))
}

// lrMutation is a change to a correct run's log that breaks one rule.
type lrMutation struct {
	name, kind string
	apply      func(base *lrOracle, ev []lrEvent) []lrEvent // nil: not applicable to this log
}

// lrSelfCheck applies each mutation to a run's log (one the oracle found
// no violation in) and checks that the oracle reports the broken rule. It
// returns, per mutation, the first violation of the expected kind (caught)
// or why not (missed).
func lrSelfCheck(mode string, t0 int64, events []lrEvent, kills []lrKill, delta, grace time.Duration) (caught, missed []string) {
	base := newLROracle(mode, t0, events, kills, delta, grace)
	recvOf := func(pred func(c *lrConn, n *lrNote, r lrEvent) bool) int {
		for i, e := range events {
			if e.Ev != "recv" {
				continue
			}
			c, n := base.conns[lrKey{e.C, e.G}], base.notes[e.ID]
			if c != nil && n != nil && pred(c, n, e) {
				return i
			}
		}
		return -1
	}
	clone := func() []lrEvent { return append([]lrEvent(nil), events...) }
	without := func(ev []lrEvent, i int) []lrEvent { return append(ev[:i:i], ev[i+1:]...) }
	deliver := func(class, status string) func(*lrOracle, []lrEvent) []lrEvent {
		return func(base *lrOracle, ev []lrEvent) []lrEvent {
			for _, k := range base.order {
				c := base.conns[k]
				if k.C < 0 || c.Start == 0 {
					continue
				}
				for _, n := range base.notes {
					if n.Status != status || n.CS < c.Start || (c.Fatal != nil && n.CS > c.Fatal.T) {
						continue
					}
					if cl, _ := base.classify(c, n); cl == class {
						return append(ev, lrEvent{Ev: "recv", C: k.C, G: k.G, Ch: n.Ch, ID: n.ID, PID: n.SenderPID, T: n.CC + 1})
					}
				}
			}
			return nil
		}
	}
	muts := []lrMutation{
		{"drop a notification that had to arrive", "missing", func(base *lrOracle, ev []lrEvent) []lrEvent {
			i := recvOf(func(c *lrConn, n *lrNote, r lrEvent) bool { cl, _ := base.classify(c, n); return cl == lrMust })
			if i < 0 {
				return nil
			}
			return without(ev, i)
		}},
		{"deliver a rolled-back notification", "extra", deliver(lrMustNot, lrRolledBack)},
		{"deliver to a client not listening", "extra", deliver(lrMustNot, lrCommitted)},
		{"deliver a notification twice", "duplicate", func(base *lrOracle, ev []lrEvent) []lrEvent {
			i := recvOf(func(*lrConn, *lrNote, lrEvent) bool { return true })
			if i < 0 {
				return nil
			}
			return append(ev[:i+1:i+1], ev[i:]...)
		}},
		{"swap two notifications committed one after the other", "order", func(base *lrOracle, ev []lrEvent) []lrEvent {
			last := map[lrKey]int{}
			for i, e := range ev {
				if e.Ev != "recv" {
					continue
				}
				k := lrKey{e.C, e.G}
				if j, ok := last[k]; ok {
					a, b := base.notes[ev[j].ID], base.notes[e.ID]
					if a != nil && b != nil && a.CC < b.CS {
						ev[i], ev[j] = ev[j], ev[i]
						return ev
					}
				}
				last[k] = i
			}
			return nil
		}},
		{"report a client's own notification with another pid", "own pid", func(base *lrOracle, ev []lrEvent) []lrEvent {
			i := recvOf(func(c *lrConn, n *lrNote, r lrEvent) bool { return n.Sender == c.Key })
			if i < 0 {
				return nil
			}
			ev[i].PID = 1
			return ev
		}},
		{"report another session's notification with the receiver's pid", "own pid", func(base *lrOracle, ev []lrEvent) []lrEvent {
			i := recvOf(func(c *lrConn, n *lrNote, r lrEvent) bool { return n.Sender != c.Key })
			if i < 0 {
				return nil
			}
			ev[i].PID = base.conns[lrKey{ev[i].C, ev[i].G}].PID
			return ev
		}},
		{"report another session's notification with a third pid", "sender pid", func(base *lrOracle, ev []lrEvent) []lrEvent {
			i := recvOf(func(c *lrConn, n *lrNote, r lrEvent) bool { return n.Sender != c.Key })
			if i < 0 {
				return nil
			}
			ev[i].PID = 1
			return ev
		}},
		{"deliver inside a transaction block", "inside a block", func(base *lrOracle, ev []lrEvent) []lrEvent {
			i := recvOf(func(*lrConn, *lrNote, lrEvent) bool { return true })
			if i < 0 {
				return nil
			}
			ev[i].InBlock = true
			return ev
		}},
		{"pg_listening_channels() answering wrong", "pg_listening_channels", func(base *lrOracle, ev []lrEvent) []lrEvent {
			for i, e := range ev {
				if e.Ev == "op" && e.Kind == lrChannels && e.OK {
					ev[i].Got = append(append([]string(nil), e.Got...), "not_listened")
					return ev
				}
			}
			return nil
		}},
		{"a statement failing", "unexpected error", func(base *lrOracle, ev []lrEvent) []lrEvent {
			for i, e := range ev {
				if e.Ev == "op" && e.Kind == lrStmt && e.OK && e.C >= 0 {
					ev[i].OK, ev[i].Code, ev[i].Sev, ev[i].Err = false, "XX000", "ERROR", "mutation"
					return ev
				}
			}
			return nil
		}},
		{"a FATAL with another SQLSTATE", "FATAL code", func(base *lrOracle, ev []lrEvent) []lrEvent {
			for i, e := range ev {
				if e.Ev == "fatal" {
					ev[i].Code = "08P01"
					return ev
				}
			}
			return nil
		}},
		{"a killed client that got no FATAL", "kill", func(base *lrOracle, ev []lrEvent) []lrEvent {
			for _, k := range base.kills {
				for _, tk := range k.Targets {
					for i, e := range ev {
						if e.Ev == "fatal" && e.C == tk.C && e.G == tk.G {
							return without(ev, i)
						}
					}
				}
			}
			return nil
		}},
	}
	for _, m := range muts {
		ev := m.apply(base, clone())
		if ev == nil {
			missed = append(missed, fmt.Sprintf("%s: not applicable to this run's log", m.name))
			continue
		}
		o := newLROracle(mode, t0, ev, kills, delta, grace)
		found := ""
		for _, v := range o.check() {
			if v.Kind == m.kind {
				found = v.Text
				break
			}
		}
		if found == "" {
			missed = append(missed, fmt.Sprintf("%s: no %q violation reported", m.name, m.kind))
			continue
		}
		caught = append(caught, fmt.Sprintf("%s → %s: %s", m.name, m.kind, shorten(found, 400)))
	}
	return caught, missed
}
