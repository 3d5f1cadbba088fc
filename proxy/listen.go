package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/listen"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/proxy/txcmd"
	"github.com/lockpool/lockpool/rewrite"
)

// listen: shared. LISTEN, UNLISTEN, UNLISTEN * and pg_listening_channels()
// are answered here, and notifications come from the database's one
// listener connection (package listen) through the session's inbox, so a
// listening client pins nothing. PostgreSQL's rules, as lockpool keeps them:
//   - LISTEN and UNLISTEN take effect when their transaction commits: a
//     statement run alone outside a transaction block at once (a LISTEN
//     completes only once the listener listens), one inside a block (or an
//     implicit transaction: a multi-statement Query, an extended batch) at
//     the ReadyForQuery that ends the block, unless it rolled back.
//   - A LISTEN inside a multi-statement Query is sent to the server as
//     UNLISTEN * (harmless on a connection that never listens; it fails and
//     rolls back exactly as LISTEN would), its command tag restored; its
//     effect is noted when its CommandComplete arrives.
//   - Notifications are written to the client only when it is idle outside
//     a transaction block with nothing owed; an idle client gets them at
//     once (its loop is woken). As on PostgreSQL, the ReadyForQuery that
//     ends a listening client's transaction comes after every notification
//     committed before its statement came (ready: a barrier on the
//     listener connection, one round trip). A notification the client's own
//     transaction sent (a NOTIFY or pg_notify of its own SQL) carries the
//     client's key pid.
//   - When the listener connection dies the client gets a FATAL and is
//     closed: it may have missed notifications. A client that lets more
//     than notifications.max_pending bytes pile up gets FATAL 53200.

// kindListen is the index of listen in localKinds.
const kindListen = 2

// listenOp is one LISTEN or UNLISTEN waiting for its transaction's end.
type listenOp struct {
	unlisten  bool
	channel   string // "*": UNLISTEN *
	savepoint string // not "": no LISTEN but a SAVEPOINT of that name, where a ROLLBACK TO cuts the list
}

// listening is a session's channels and notifications: the listen kind's
// localHandler. The session's coroutine owns it; its inbox is shared with
// the hub's goroutine.
type listening struct {
	channels   []string    // committed, in LISTEN order (pg_listening_channels())
	pending    []listenOp  // of the open transaction, applied when it commits
	rolledBack bool        // a ROLLBACK completed since the last ReadyForQuery
	failed     bool        // an error came since the last ReadyForQuery
	expects    []expectKey // notifications this transaction registered as its own (expect)
	early      []string    // channels subscribed before the COMMIT of a block that LISTENs (beforeCommit)
	inbox      *inbox
}

func listenClaims(s *session, f *rewrite.Findings, _ policy.Decision) bool {
	if s.app.listen != policy.Shared || s.app.sessionPool {
		return false
	}
	if f.ChannelsWhole != nil {
		return true
	}
	// A statement PostgreSQL would refuse (no valid channel: Name "") goes
	// to the server, which says why.
	return f.Statements == 1 && len(f.State) == 1 && !f.Advisory && len(f.Sets) == 0 &&
		(f.State[0].Kind == rewrite.Listen || f.State[0].Kind == rewrite.Unlisten) && f.State[0].Name != ""
}

func openListen(s *session) localHandler {
	return &listening{inbox: &inbox{s: s}}
}

// listeningOf returns the session's listen state, nil when it never used
// LISTEN.
func (s *session) listeningOf() *listening {
	if s.extras == nil {
		return nil
	}
	l, _ := s.extras.local[kindListen].(*listening)
	return l
}

// prepare implements localHandler.
func (l *listening) prepare(s *session, f *rewrite.Findings, sql string, _ []byte) (localStmt, *pgError) {
	if f.ChannelsWhole != nil {
		return &channelsStmt{l: l, call: f.ChannelsWhole}, nil
	}
	c := f.State[0]
	op := listenOp{unlisten: c.Kind == rewrite.Unlisten, channel: c.Name}
	st := &listenStmt{l: l, op: op}
	if len(c.Name) == 63 && c.End <= len(sql) {
		st.notice = truncationNotice(sql[c.Pos:c.End], c.Name)
	}
	return st, nil
}

// truncationNotice is PostgreSQL's NOTICE for a channel name longer than
// an identifier may be (stmt: the LISTEN or UNLISTEN; name: the channel as
// truncated); nil when the name was not cut.
func truncationNotice(stmt, name string) []byte {
	i := strings.IndexAny(stmt, " \t\r\n")
	if i < 0 {
		return nil
	}
	raw := strings.TrimSpace(stmt[i:])
	if strings.HasPrefix(raw, `"`) && strings.HasSuffix(raw, `"`) && len(raw) >= 2 {
		raw = strings.ReplaceAll(raw[1:len(raw)-1], `""`, `"`)
	} else {
		raw = strings.ToLower(raw) // PostgreSQL folds, then truncates
	}
	if len(raw) <= len(name) || strings.ContainsAny(raw, "-/") {
		return nil
	}
	return appendError(nil, 'N', &pgError{Severity: "NOTICE", Code: "42622",
		Message: "identifier \"" + raw + "\" will be truncated to \"" + name + "\""})
}

// end unlistens everything when the session ends.
func (l *listening) end(s *session) {
	l.inbox.close()
	if s.srv.hub != nil {
		s.srv.hub.UnlistenAll(s.database, l.inbox)
	}
	l.channels, l.pending = nil, nil
}

// idleMessages implements idleSender: the notifications waiting for the
// client.
func (l *listening) idleMessages(_ *session, buf []byte) []byte {
	return l.inbox.take(buf)
}

// has reports whether channel is among the committed channels.
func (l *listening) has(channel string) bool {
	for _, c := range l.channels {
		if c == channel {
			return true
		}
	}
	return false
}

// apply carries out op now: a LISTEN returns once the listener listens.
func (l *listening) apply(s *session, op listenOp) *pgError {
	hub := s.srv.hub
	if op.unlisten && len(l.channels) > 0 {
		// PostgreSQL gives an idle listener what was committed before its
		// UNLISTEN: notifications on their way to the listener connection
		// reach the client first.
		ctx, cancel := context.WithTimeout(s.waitContext(), s.app.cfg.WaitTimeout)
		s.offload(func() { _ = hub.Sync(ctx, s.database) })
		cancel()
		s.endWait()
	}
	switch {
	case op.unlisten && op.channel == "*":
		if len(l.channels) > 0 {
			hub.UnlistenAll(s.database, l.inbox)
		}
		l.channels = nil
	case op.unlisten:
		for i, c := range l.channels {
			if c == op.channel {
				l.channels = append(l.channels[:i], l.channels[i+1:]...)
				hub.Unlisten(s.database, c, l.inbox)
				break
			}
		}
	case !l.has(op.channel):
		ctx, cancel := context.WithTimeout(s.waitContext(), s.app.cfg.WaitTimeout+s.srv.rc.Load().cfg.Server.ConnectTimeout)
		var err error
		listened := len(l.channels) > 0
		s.offload(func() {
			// A listener connection that died while this LISTEN waited
			// delivered nothing to it: the LISTEN runs again on the next
			// one. A client that listened already was told (Lost) and is
			// being closed.
			for range 3 {
				err = hub.Listen(ctx, s.database, op.channel, l.inbox)
				if !errors.Is(err, listen.ErrListenerLost) || listened || l.inbox.isClosed() {
					break
				}
			}
		})
		cancel()
		s.endWait()
		if err != nil {
			if ke := s.killedBy(); ke != nil {
				return ke
			}
			if errors.Is(err, context.Canceled) {
				return errCanceled()
			}
			return &pgError{Code: "08006", Message: "lockpool: cannot listen on channel \"" + op.channel + "\": " + err.Error(),
				Hint: "lockpool's listener connection to the database could not listen; retry."}
		}
		l.channels = append(l.channels, op.channel)
	}
	return nil
}

// beforeCommit runs before a COMMIT of a block with LISTENs is sent:
// PostgreSQL registers a LISTEN before its transaction commits, so
// notifications committed from then on (the block's own among them)
// reach the client. The client is subscribed to those channels now; should
// the COMMIT not commit, ready takes the subscriptions back and drops what
// they brought.
func (s *session) beforeCommit(sql []byte) {
	l := s.listeningOf()
	if l == nil || l.savepoint(sql) || len(l.pending) == 0 || txcmd.Of(sql) != txcmd.Commit {
		return
	}
	var channels []string
	for _, op := range l.pending {
		if !op.unlisten && op.savepoint == "" {
			channels = append(channels, op.channel)
		}
	}
	l.subscribeEarly(s, channels)
}

// subscribeEarly subscribes the client to the channels a transaction about
// to commit LISTENs on (see beforeCommit); ready keeps or takes back the
// subscriptions at its end.
func (l *listening) subscribeEarly(s *session, channels []string) {
	for _, c := range channels {
		if l.has(c) || slices.Contains(l.early, c) {
			continue
		}
		op := listenOp{channel: c}
		ctx, cancel := context.WithTimeout(s.waitContext(), s.app.cfg.WaitTimeout+s.srv.rc.Load().cfg.Server.ConnectTimeout)
		var err error
		s.offload(func() { err = s.srv.hub.Listen(ctx, s.database, op.channel, l.inbox) })
		cancel()
		s.endWait()
		if err != nil {
			return // the commit's own Listen (ready) says it
		}
		l.early = append(l.early, op.channel)
	}
}

// beforeImplicitCommit runs before a Query (f: its findings) or a Sync
// (f nil) that ends an implicit transaction with LISTENs in it is sent:
// see beforeCommit.
func (s *session) beforeImplicitCommit(f *rewrite.Findings) {
	if s.status() != 'I' || s.app.listen != policy.Shared || s.app.sessionPool {
		return
	}
	var channels []string
	if f != nil {
		for _, c := range f.State {
			if c.Kind == rewrite.Listen && c.Stmt > 0 {
				channels = append(channels, c.Name)
			}
		}
	} else if l := s.listeningOf(); l != nil {
		for _, op := range l.pending {
			if !op.unlisten && op.savepoint == "" {
				channels = append(channels, op.channel)
			}
		}
	}
	if len(channels) > 0 {
		s.handler(kindListen).(*listening).subscribeEarly(s, channels)
	}
}

// savepoint notes a SAVEPOINT, ROLLBACK TO SAVEPOINT or RELEASE of a
// simple Query in the pending list, so that a rollback to a savepoint
// drops the LISTENs and UNLISTENs made after it, as PostgreSQL does. It
// reports whether sql was one.
func (l *listening) savepoint(sql []byte) bool {
	w, rest := txcmd.NextWord(sql)
	switch {
	case txcmd.WordIs(w, "savepoint"):
		if name := savepointName(rest); name != "" {
			l.pending = append(l.pending, listenOp{savepoint: name})
		}
	case txcmd.WordIs(w, "rollback"), txcmd.WordIs(w, "release"):
		rollback := txcmd.WordIs(w, "rollback")
		if rollback {
			if w, rest = txcmd.NextWord(rest); !txcmd.WordIs(w, "to") {
				return false
			}
		}
		if w2, r2 := txcmd.NextWord(rest); txcmd.WordIs(w2, "savepoint") {
			rest = r2
		}
		name := savepointName(rest)
		for i := len(l.pending) - 1; i >= 0; i-- {
			if l.pending[i].savepoint == name {
				if rollback {
					l.pending = l.pending[:i+1] // the savepoint stays
				} else {
					l.pending = append(l.pending[:i], l.pending[i+1:]...)
				}
				break
			}
		}
	default:
		return false
	}
	return true
}

// savepointName reads a savepoint name: an identifier, lower-cased unless
// quoted.
func savepointName(b []byte) string {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	b = b[i:]
	if len(b) > 0 && b[0] == '"' {
		var out []byte
		for j := 1; j < len(b); j++ {
			if b[j] == '"' {
				if j+1 < len(b) && b[j+1] == '"' {
					out = append(out, '"')
					j++
					continue
				}
				return string(out)
			}
			out = append(out, b[j])
		}
		return ""
	}
	j := 0
	for j < len(b) && (b[j]|0x20 >= 'a' && b[j]|0x20 <= 'z' || b[j] == '_' || b[j] >= '0' && b[j] <= '9' || b[j] == '$' || b[j] >= 0x80) {
		j++
	}
	return strings.ToLower(string(b[:j]))
}

// applyAll carries out the LISTENs and UNLISTENs of a committed
// transaction by their net effect, as PostgreSQL applies them at commit: a
// channel unlistened and listened again in one transaction is listened to
// throughout (no notification is lost in between).
func (l *listening) applyAll(s *session, pending []listenOp) *pgError {
	final := slices.Clone(l.channels)
	changed := false
	for _, op := range pending {
		switch {
		case op.savepoint != "":
			continue
		case op.unlisten && op.channel == "*":
			final = final[:0]
		case op.unlisten:
			final = slices.DeleteFunc(final, func(c string) bool { return c == op.channel })
		case !slices.Contains(final, op.channel):
			final = append(final, op.channel)
		}
		changed = true
	}
	if !changed {
		return nil
	}
	var gone, added []string
	for _, c := range l.channels {
		if !slices.Contains(final, c) {
			gone = append(gone, c)
		}
	}
	for _, c := range final {
		if !slices.Contains(l.channels, c) {
			added = append(added, c)
		}
	}
	for i, c := range gone {
		if i == 0 {
			l.apply(s, listenOp{unlisten: true, channel: c}) // syncs first
			continue
		}
		l.channels = slices.DeleteFunc(l.channels, func(x string) bool { return x == c })
		s.srv.hub.Unlisten(s.database, c, l.inbox)
	}
	for _, c := range added {
		if pe := l.apply(s, listenOp{channel: c}); pe != nil {
			return pe
		}
	}
	l.channels = final // PostgreSQL's order: a channel listened again moves to the end
	return nil
}

// note records a LISTEN or UNLISTEN that ran inside a transaction.
func (l *listening) note(op listenOp) { l.pending = append(l.pending, op) }

// ready runs before a ReadyForQuery with status reaches the client: a
// transaction that committed applies its LISTENs and UNLISTENs, one that
// rolled back (or failed) drops them. A failure to listen at commit ends
// the session: its LISTEN committed, and lockpool cannot honour it.
func (l *listening) ready(s *session, status byte, failed bool) error {
	failed = failed || l.failed
	rolledBack := l.rolledBack
	l.failed, l.rolledBack = false, false
	if status != 'I' {
		return nil
	}
	pending, expects, early := l.pending, l.expects, l.early
	l.pending, l.expects, l.early = nil, nil, nil
	if failed || rolledBack {
		for _, e := range expects {
			s.srv.hub.Withdraw(s.database, e.pid, l.inbox, e.channel, e.payload, e.any)
		}
		for _, c := range early {
			if !l.has(c) {
				s.srv.hub.Unlisten(s.database, c, l.inbox)
				l.inbox.drop(c)
			}
		}
		return nil
	}
	for _, e := range expects {
		s.srv.hub.Committed(s.database, e.pid, l.inbox, e.channel, e.payload, e.any)
	}
	if pe := l.applyAll(s, pending); pe != nil {
		// The LISTEN committed and lockpool cannot honour it.
		s.kill(pe.Fatal())
		return nil
	}
	for _, c := range early {
		if !l.has(c) { // its LISTEN was rolled back to a savepoint, or unlistened after
			s.srv.hub.Unlisten(s.database, c, l.inbox)
			l.inbox.drop(c)
		}
	}
	if len(l.channels) > 0 {
		// PostgreSQL gives a listening client every notification
		// committed before its statement (its transaction's own among
		// them) before this ReadyForQuery: a sender's backend signals the
		// listening backends before its COMMIT is answered, and a
		// listening backend reads the queue before each ReadyForQuery
		// outside a transaction block. The listener connection has them
		// once a round trip on it that started after the statement came
		// is over.
		ctx, cancel := context.WithTimeout(s.waitContext(), s.app.cfg.WaitTimeout)
		s.offload(func() { _ = s.srv.hub.Sync(ctx, s.database) })
		cancel()
		s.endWait()
	}
	return nil
}

// commandDone notes a statement's CommandComplete (tag with its NUL).
func (l *listening) commandDone(s *session, tag []byte) {
	switch string(tag) {
	case "ROLLBACK\x00":
		l.rolledBack = true
	case "DISCARD ALL\x00":
		// DISCARD ALL unlistens, and runs outside transaction blocks only.
		_ = l.apply(s, listenOp{unlisten: true, channel: "*"})
	}
}

// expect registers the NOTIFYs of a statement the session sends on the
// server connection with backend pid: the hub gives them to every
// listening client with this client's key pid (see listen.Hub.Expect and
// inbox.KeyPID).
func (l *listening) expect(s *session, f *rewrite.Findings, pid uint32, args *wire.BindArgs) {
	if pid == 0 {
		return
	}
	for _, n := range f.Notifies {
		channel, payload, any := n.Channel, n.Payload, !n.KnownPayload
		if !n.Known {
			var ok bool
			if channel, ok = notifyArg(args, n.ChannelParam); !ok {
				continue
			}
		}
		if any {
			payload, any = notifyArg(args, n.PayloadParam)
			any = !any
		}
		// PostgreSQL folds identical notifications of one transaction.
		e := expectKey{pid: pid, channel: channel, payload: payload, any: any}
		if slices.Contains(l.expects, e) {
			continue
		}
		l.expects = append(l.expects, e)
		s.srv.hub.Expect(s.database, pid, l.inbox, channel, payload, any)
	}
}

// expectNotifies registers the NOTIFYs of a statement about to be bound on
// the attached server connection (f: its findings; nil: none).
// bindTail, when not nil, is the Bind's tail: $n arguments of pg_notify are
// taken from it.
func (s *session) expectNotifies(f *rewrite.Findings, bindTail []byte) {
	// Registered whether or not anyone listens yet: a LISTEN may reach the
	// listener connection before this transaction commits. ready settles
	// them at the commit.
	if f == nil || len(f.Notifies) == 0 || s.link.sc == nil || s.srv.hub == nil {
		return
	}
	var args *wire.BindArgs
	if bindTail != nil {
		args = new(wire.BindArgs)
		if (wire.Bind{Tail: bindTail}).Args(args) != nil {
			args = nil
		}
	}
	s.handler(kindListen).(*listening).expect(s, f, s.link.sc.PID, args)
}

// notifyArg is pg_notify's argument $n as text (text, varchar and unknown
// send their bytes in both formats); ok false when there is none.
func notifyArg(a *wire.BindArgs, n int) (string, bool) {
	if a == nil || n < 1 || n > len(a.Params) || a.Params[n-1] == nil {
		return "", false
	}
	return string(a.Params[n-1]), true
}

// expectKey is one notification a transaction registered as its own.
type expectKey struct {
	pid              uint32
	channel, payload string
	any              bool
}

// listenStmt is a LISTEN or UNLISTEN, prepared.
type listenStmt struct {
	l      *listening
	op     listenOp
	notice []byte // PostgreSQL's NOTICE that the channel name was cut (truncationNotice)
}

func (st *listenStmt) paramTypes() []uint32 { return nil }

func (st *listenStmt) describe(buf []byte, _ []int16) []byte {
	return append(buf, 'n', 0, 0, 0, 4) // NoData
}

func (st *listenStmt) bind(*session, *wire.BindArgs, []uint32) (localPortal, *pgError) {
	return st, nil
}

// run takes effect at once when the statement is a transaction of its own
// (a simple Query outside a block); otherwise at the end of the
// transaction it belongs to.
func (st *listenStmt) run(s *session, _ []int16, withDesc bool) ([]byte, *pgError) {
	if withDesc && s.status() == 'I' {
		if pe := st.l.apply(s, st.op); pe != nil {
			return nil, pe
		}
	} else {
		st.l.note(st.op)
	}
	tag := "LISTEN"
	if st.op.unlisten {
		tag = "UNLISTEN"
	}
	buf, start := wire.AppendHeader(append([]byte(nil), st.notice...), 'C')
	buf = wire.AppendCString(buf, tag)
	return wire.FinishMsg(buf, start), nil
}

// channelsStmt is pg_listening_channels() as a whole statement.
type channelsStmt struct {
	l    *listening
	call *rewrite.LeaseCall
}

func (st *channelsStmt) paramTypes() []uint32 { return nil }

func (st *channelsStmt) cols() []leaseCol {
	name := "pg_listening_channels"
	if st.call.Alias != "" {
		name = st.call.Alias
	}
	return []leaseCol{{name, oidText, -1}}
}

func (st *channelsStmt) describe(buf []byte, formats []int16) []byte {
	return appendRowDescription(buf, st.cols(), formats)
}

func (st *channelsStmt) bind(*session, *wire.BindArgs, []uint32) (localPortal, *pgError) {
	return st, nil
}

func (st *channelsStmt) run(_ *session, formats []int16, withDesc bool) ([]byte, *pgError) {
	var buf []byte
	cols := st.cols()
	if withDesc {
		buf = appendRowDescription(buf, cols, formats)
	}
	for _, c := range st.l.channels {
		buf = appendDataRow(buf, cols, []any{c}, formats)
	}
	buf, start := wire.AppendHeader(buf, 'C')
	buf = wire.AppendCString(buf, "SELECT "+strconv.Itoa(len(st.l.channels)))
	return wire.FinishMsg(buf, start), nil
}

// listenEdits are the edits of a Query that LISTENs among other
// statements: each LISTEN or UNLISTEN is sent as UNLISTEN * (its tag
// restored, its effect noted at its CommandComplete), each
// pg_listening_channels() call as the unnest of the session's channels.
func (s *session) listenEdits(f *rewrite.Findings, sql string) []sqlEdit {
	if s.app.listen != policy.Shared || s.app.sessionPool {
		return nil
	}
	var edits []sqlEdit
	for _, c := range f.State {
		if c.Kind != rewrite.Listen && c.Kind != rewrite.Unlisten || c.Stmt == 0 || c.Name == "" || c.End > len(sql) {
			continue
		}
		op := &listenOp{unlisten: c.Kind == rewrite.Unlisten, channel: c.Name}
		tag := "UNLISTEN"
		if !op.unlisten {
			tag = "LISTEN"
		}
		edits = append(edits, sqlEdit{pos: c.Pos, end: c.End, text: "UNLISTEN *", fix: tagFix{stmt: c.Stmt, tag: tag, listen: op}})
	}
	if len(f.ChannelsCalls) > 0 {
		var channels []string
		if l := s.listeningOf(); l != nil {
			channels = l.channels
		}
		text := channelsArray(channels)
		for _, c := range f.ChannelsCalls {
			if c.End <= len(sql) {
				edits = append(edits, sqlEdit{pos: c.Pos, end: c.End, text: text})
			}
		}
	}
	return edits
}

// channelsArray is the set-returning expression that stands for
// pg_listening_channels().
func channelsArray(channels []string) string {
	var b strings.Builder
	b.WriteString("pg_catalog.unnest(")
	if len(channels) == 0 {
		b.WriteString("'{}'")
	} else {
		b.WriteString("ARRAY[")
		for i, c := range channels {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(escapedLiteral(c))
		}
		b.WriteByte(']')
	}
	b.WriteString("::pg_catalog.text[])")
	return b.String()
}

// inbox is a session's notifications on their way from the hub's goroutine
// to the session's: the listen.Subscriber of the session. Its lock guards
// the queue; the session takes it whole at an idle point.
type inbox struct {
	s *session

	mu     sync.Mutex
	buf    []byte // NotificationResponse messages, encoded
	posted bool   // a wake is posted to the session's loop and not yet taken
	closed bool   // the session ended, overflowed or lost its listener
}

// Notify implements listen.Subscriber.
func (in *inbox) Notify(n listen.Notification) {
	s := in.s
	pid := n.PID // the sender's key pid when the sender is a lockpool client (KeyPID)
	if n.Own {
		pid = s.pid
	}
	limit := s.srv.rc.Load().cfg.Notifications.MaxPending
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return
	}
	buf, start := wire.AppendHeader(in.buf, 'A')
	buf = binary.BigEndian.AppendUint32(buf, pid)
	buf = wire.AppendCString(buf, n.Channel)
	buf = wire.AppendCString(buf, n.Payload)
	in.buf = wire.FinishMsg(buf, start)
	if limit > 0 && len(in.buf) > limit {
		in.closed, in.buf = true, nil
		in.mu.Unlock()
		s.srv.hub.CountClosed("max_pending")
		s.kill(pgerr.Newf("53200", "Read notifications as they come (a client that LISTENs must keep reading), or raise notifications.max_pending.",
			"lockpool: more than %d bytes of notifications are waiting for this client", limit).Fatal())
		return
	}
	post := !in.posted
	in.posted = true
	in.mu.Unlock()
	if post {
		s.postDeliver()
	}
}

// KeyPID is the client's key pid: the pid notifications its own
// transactions send carry (listen.KeyPIDer).
func (in *inbox) KeyPID() uint32 { return in.s.pid }

// Lost implements listen.Subscriber: the listener connection died, so
// notifications may have been missed; the client is closed as if its own
// session had died.
func (in *inbox) Lost(err error) {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return
	}
	in.closed, in.buf = true, nil
	in.mu.Unlock()
	code := "08006"
	var pge *pgconn.PgError
	if errors.As(err, &pge) && pge.Code == "57P01" {
		code = "57P01"
	}
	in.s.kill(pgerr.Newf(code, "Notifications may have been missed: reconnect and LISTEN again.",
		"lockpool: the listener connection of database %q was lost: %v", in.s.database, err).Fatal())
}

// isClosed reports that the inbox takes no more notifications.
func (in *inbox) isClosed() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.closed
}

// take appends the waiting notifications to buf.
func (in *inbox) take(buf []byte) []byte {
	in.mu.Lock()
	buf = append(buf, in.buf...)
	in.buf = in.buf[:0]
	if cap(in.buf) > 64<<10 {
		in.buf = nil
	}
	in.posted = false
	in.mu.Unlock()
	return buf
}

// drop removes the waiting notifications of channel.
func (in *inbox) drop(channel string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := in.buf[:0]
	for b := in.buf; len(b) >= 5; {
		n := 1 + int(binary.BigEndian.Uint32(b[1:5]))
		msg := b[:n]
		b = b[n:]
		if ch, _, _ := wire.CString(msg[9:]); string(ch) == channel {
			continue
		}
		out = append(out, msg...)
	}
	in.buf = out
}

// close stops the inbox: nothing more is queued.
func (in *inbox) close() {
	in.mu.Lock()
	in.closed, in.buf = true, nil
	in.mu.Unlock()
}

// errDeliver ends an idle wait of a session (watchIdle) that has
// notifications to write.
var errDeliver = errors.New("notifications to deliver")

// postDeliver asks the session's loop to write the waiting notifications
// (any goroutine).
func (s *session) postDeliver() {
	s.link.mu.Lock()
	l := s.link.loop
	s.link.mu.Unlock()
	if l != nil {
		l.Post(s.deliverWake)
	}
}

// deliverWake runs on the session's loop: a resting session is woken (its
// turn writes the notifications at its idle point), one waiting idle on
// its pinned server and its client (watchIdle) is interrupted to write
// them. A session that runs writes them at its next idle point anyway.
func (s *session) deliverWake() {
	switch {
	case s.ended:
	case s.resting:
		if s.loop.StopOnReadable(s.sock) {
			s.loop.Go(s.resume)
		}
	case s.co != nil && s.watching:
		s.co.Interrupt(errDeliver)
	}
}
