package local

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
	"github.com/lockpool/lockpool/proxy/backend"
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
//     effect is noted when its CommandComplete arrives (the core rewrites
//     the Query and calls Note).
//   - Notifications are written to the client only when it is idle outside
//     a transaction block with nothing owed; an idle client gets them at
//     once (its loop is woken). As on PostgreSQL, the ReadyForQuery that
//     ends a listening client's transaction comes after every notification
//     committed before its statement came (Ready: a barrier on the
//     listener connection, one round trip). A notification the client's own
//     transaction sent (a NOTIFY or pg_notify of its own SQL) carries the
//     client's key pid.
//   - When the listener connection dies the client gets a FATAL and is
//     closed: it may have missed notifications. A client that lets more
//     than notifications.max_pending bytes pile up gets FATAL 53200.

// ListenKind is the kind of LISTEN, UNLISTEN and pg_listening_channels()
// under listen: shared: each must be the whole statement. Its Handler is a
// *Listening, which the core also tells of the session's transactions.
func ListenKind() Kind {
	return Kind{name: "listen", claims: listenClaims, open: openListen}
}

// ListenOp is one LISTEN or UNLISTEN waiting for its transaction's end.
type ListenOp struct {
	unlisten  bool
	channel   string // "*": UNLISTEN *
	savepoint string // not "": no LISTEN but a SAVEPOINT of that name, where a ROLLBACK TO cuts the list
}

// NewListenOp is a LISTEN (unlisten false) or UNLISTEN of channel ("*":
// UNLISTEN *).
func NewListenOp(unlisten bool, channel string) ListenOp {
	return ListenOp{unlisten: unlisten, channel: channel}
}

// Listening is a session's channels and notifications: the listen kind's
// Handler. The session's coroutine owns it; its inbox is shared with the
// hub's goroutine.
type Listening struct {
	channels   []string    // committed, in LISTEN order (pg_listening_channels())
	pending    []ListenOp  // of the open transaction, applied when it commits
	rolledBack bool        // a ROLLBACK completed since the last ReadyForQuery
	failed     bool        // an error came since the last ReadyForQuery
	expects    []expectKey // notifications this transaction registered as its own (Expect)
	early      []string    // channels subscribed before the COMMIT of a block that LISTENs (SubscribeEarly)
	inbox      *inbox
}

func listenClaims(s Session, f *rewrite.Findings, _ policy.Decision) bool {
	if !s.ListenShared() {
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

func openListen(s Session) Handler {
	return &Listening{inbox: &inbox{s: s}}
}

// Prepare implements Handler.
func (l *Listening) Prepare(s Session, f *rewrite.Findings, sql string, _ []byte) (Stmt, *pgerr.Error) {
	if f.ChannelsWhole != nil {
		return &channelsStmt{l: l, call: f.ChannelsWhole}, nil
	}
	c := f.State[0]
	op := ListenOp{unlisten: c.Kind == rewrite.Unlisten, channel: c.Name}
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
	return (&pgerr.Error{Severity: "NOTICE", Code: "42622",
		Message: "identifier \"" + raw + "\" will be truncated to \"" + name + "\""}).AppendTo(nil, 'N')
}

// End unlistens everything when the session ends.
func (l *Listening) End(s Session) {
	l.inbox.close()
	if hub := s.Hub(); hub != nil {
		hub.UnlistenAll(s.Database(), l.inbox)
	}
	l.channels, l.pending = nil, nil
}

// IdleMessages implements IdleSender: the notifications waiting for the
// client.
func (l *Listening) IdleMessages(_ Session, buf []byte) []byte {
	return l.inbox.take(buf)
}

// has reports whether channel is among the committed channels.
func (l *Listening) has(channel string) bool {
	for _, c := range l.channels {
		if c == channel {
			return true
		}
	}
	return false
}

// apply carries out op now: a LISTEN returns once the listener listens.
func (l *Listening) apply(s Session, op ListenOp) *pgerr.Error {
	hub := s.Hub()
	if op.unlisten && len(l.channels) > 0 {
		// PostgreSQL gives an idle listener what was committed before its
		// UNLISTEN: notifications on their way to the listener connection
		// reach the client first.
		ctx, cancel := context.WithTimeout(s.WaitContext(), s.App().WaitTimeout)
		s.Offload(func() { _ = hub.Sync(ctx, s.Database()) })
		cancel()
		s.EndWait()
	}
	switch {
	case op.unlisten && op.channel == "*":
		if len(l.channels) > 0 {
			hub.UnlistenAll(s.Database(), l.inbox)
		}
		l.channels = nil
	case op.unlisten:
		for i, c := range l.channels {
			if c == op.channel {
				l.channels = append(l.channels[:i], l.channels[i+1:]...)
				hub.Unlisten(s.Database(), c, l.inbox)
				break
			}
		}
	case !l.has(op.channel):
		ctx, cancel := context.WithTimeout(s.WaitContext(), s.App().WaitTimeout+s.Config().Server.ConnectTimeout)
		var err error
		listened := len(l.channels) > 0
		s.Offload(func() {
			// A listener connection that died while this LISTEN waited
			// delivered nothing to it: the LISTEN runs again on the next
			// one. A client that listened already was told (Lost) and is
			// being closed.
			for range 3 {
				err = hub.Listen(ctx, s.Database(), op.channel, l.inbox)
				if !errors.Is(err, listen.ErrListenerLost) || listened || l.inbox.isClosed() {
					break
				}
			}
		})
		cancel()
		s.EndWait()
		if err != nil {
			if ke := s.KilledBy(); ke != nil {
				return ke
			}
			if errors.Is(err, context.Canceled) {
				return pgerr.Canceled()
			}
			return &pgerr.Error{Code: "08006", Message: "lockpool: cannot listen on channel \"" + op.channel + "\": " + err.Error(),
				Hint: "lockpool's listener connection to the database could not listen; retry."}
		}
		l.channels = append(l.channels, op.channel)
	}
	return nil
}

// SubscribeEarly runs before a COMMIT of a block with LISTENs is sent
// (channels: those of its LISTENs, PendingListens), or a Query or a Sync
// that ends an implicit transaction with LISTENs in it: PostgreSQL
// registers a LISTEN before its transaction commits, so notifications
// committed from then on (the transaction's own among them) reach the
// client. The client is subscribed to those channels now; Ready keeps the
// subscriptions at the transaction's end or, should it not commit, takes
// them back and drops what they brought.
func (l *Listening) SubscribeEarly(s Session, channels []string) {
	for _, c := range channels {
		if l.has(c) || slices.Contains(l.early, c) {
			continue
		}
		op := ListenOp{channel: c}
		ctx, cancel := context.WithTimeout(s.WaitContext(), s.App().WaitTimeout+s.Config().Server.ConnectTimeout)
		var err error
		s.Offload(func() { err = s.Hub().Listen(ctx, s.Database(), op.channel, l.inbox) })
		cancel()
		s.EndWait()
		if err != nil {
			return // the commit's own Listen (Ready) says it
		}
		l.early = append(l.early, op.channel)
	}
}

// SavepointCmd is a savepoint command of a simple Query, as
// Listening.Savepoint takes it.
type SavepointCmd uint8

// The savepoint commands.
const (
	SavepointSet      SavepointCmd = iota + 1 // SAVEPOINT name
	SavepointRollback                         // ROLLBACK TO [SAVEPOINT] name
	SavepointRelease                          // RELEASE [SAVEPOINT] name
)

// Savepoint notes a savepoint command of a simple Query in the pending
// list, so that a rollback to a savepoint drops the LISTENs and UNLISTENs
// made after it, as PostgreSQL does.
func (l *Listening) Savepoint(cmd SavepointCmd, name string) {
	switch cmd {
	case SavepointSet:
		if name != "" {
			l.pending = append(l.pending, ListenOp{savepoint: name})
		}
	case SavepointRollback, SavepointRelease:
		for i := len(l.pending) - 1; i >= 0; i-- {
			if l.pending[i].savepoint == name {
				if cmd == SavepointRollback {
					l.pending = l.pending[:i+1] // the savepoint stays
				} else {
					l.pending = append(l.pending[:i], l.pending[i+1:]...)
				}
				break
			}
		}
	}
}

// PendingListens are the channels the LISTENs of the open transaction
// name (UNLISTENs left out), in order.
func (l *Listening) PendingListens() []string {
	var channels []string
	for _, op := range l.pending {
		if !op.unlisten && op.savepoint == "" {
			channels = append(channels, op.channel)
		}
	}
	return channels
}

// Channels are the committed channels, in LISTEN order; nil for a nil
// Listening.
func (l *Listening) Channels() []string {
	if l == nil {
		return nil
	}
	return l.channels
}

// applyAll carries out the LISTENs and UNLISTENs of a committed
// transaction by their net effect, as PostgreSQL applies them at commit: a
// channel unlistened and listened again in one transaction is listened to
// throughout (no notification is lost in between).
func (l *Listening) applyAll(s Session, pending []ListenOp) *pgerr.Error {
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
			l.apply(s, ListenOp{unlisten: true, channel: c}) // syncs first
			continue
		}
		l.channels = slices.DeleteFunc(l.channels, func(x string) bool { return x == c })
		s.Hub().Unlisten(s.Database(), c, l.inbox)
	}
	for _, c := range added {
		if pe := l.apply(s, ListenOp{channel: c}); pe != nil {
			return pe
		}
	}
	l.channels = final // PostgreSQL's order: a channel listened again moves to the end
	return nil
}

// Note records a LISTEN or UNLISTEN that ran inside a transaction.
func (l *Listening) Note(op ListenOp) { l.pending = append(l.pending, op) }

// NoteError notes an error the server sent: the transaction did not
// commit.
func (l *Listening) NoteError() { l.failed = true }

// Ready runs before a ReadyForQuery with status reaches the client: a
// transaction that committed applies its LISTENs and UNLISTENs, one that
// rolled back (or failed) drops them. A failure to listen at commit ends
// the session: its LISTEN committed, and lockpool cannot honour it.
func (l *Listening) Ready(s Session, status byte, failed bool) error {
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
			s.Hub().Withdraw(s.Database(), e.pid, l.inbox, e.channel, e.payload, e.any)
		}
		for _, c := range early {
			if !l.has(c) {
				s.Hub().Unlisten(s.Database(), c, l.inbox)
				l.inbox.drop(c)
			}
		}
		return nil
	}
	for _, e := range expects {
		s.Hub().Committed(s.Database(), e.pid, l.inbox, e.channel, e.payload, e.any)
	}
	if pe := l.applyAll(s, pending); pe != nil {
		// The LISTEN committed and lockpool cannot honour it.
		s.Kill(pe.Fatal())
		return nil
	}
	for _, c := range early {
		if !l.has(c) { // its LISTEN was rolled back to a savepoint, or unlistened after
			s.Hub().Unlisten(s.Database(), c, l.inbox)
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
		ctx, cancel := context.WithTimeout(s.WaitContext(), s.App().WaitTimeout)
		s.Offload(func() { _ = s.Hub().Sync(ctx, s.Database()) })
		cancel()
		s.EndWait()
	}
	return nil
}

// CommandDone notes a statement's CommandComplete (tag with its NUL).
func (l *Listening) CommandDone(s Session, tag []byte) {
	switch string(tag) {
	case "ROLLBACK\x00":
		l.rolledBack = true
	case "DISCARD ALL\x00":
		// DISCARD ALL unlistens, and runs outside transaction blocks only.
		_ = l.apply(s, ListenOp{unlisten: true, channel: "*"})
	}
}

// Expect registers the NOTIFYs of a statement (f: its findings) the
// session sends on the server connection with backend pid, args the
// Bind's arguments (nil: none): the hub gives them to every listening
// client with this client's key pid (see listen.Hub.Expect and
// inbox.KeyPID). Ready settles them at the transaction's end.
func (l *Listening) Expect(s Session, f *rewrite.Findings, pid uint32, args *wire.BindArgs) {
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
		s.Hub().Expect(s.Database(), pid, l.inbox, channel, payload, any)
	}
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
	l      *Listening
	op     ListenOp
	notice []byte // PostgreSQL's NOTICE that the channel name was cut (truncationNotice)
}

// ParamTypes implements Stmt.
func (st *listenStmt) ParamTypes() []uint32 { return nil }

// Describe implements Stmt.
func (st *listenStmt) Describe(buf []byte, _ []int16) []byte {
	return append(buf, 'n', 0, 0, 0, 4) // NoData
}

// Bind implements Stmt.
func (st *listenStmt) Bind(Session, *wire.BindArgs, []uint32) (Portal, *pgerr.Error) {
	return st, nil
}

// Run takes effect at once when the statement is a transaction of its own
// (a simple Query outside a block); otherwise at the end of the
// transaction it belongs to.
func (st *listenStmt) Run(s Session, _ []int16, withDesc bool) ([]byte, *pgerr.Error) {
	if withDesc && s.Status() == 'I' {
		if pe := st.l.apply(s, st.op); pe != nil {
			return nil, pe
		}
	} else {
		st.l.Note(st.op)
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
	l    *Listening
	call *rewrite.LeaseCall
}

// ParamTypes implements Stmt.
func (st *channelsStmt) ParamTypes() []uint32 { return nil }

func (st *channelsStmt) cols() []column {
	name := "pg_listening_channels"
	if st.call.Alias != "" {
		name = st.call.Alias
	}
	return []column{{name, wire.OIDText, -1}}
}

// Describe implements Stmt.
func (st *channelsStmt) Describe(buf []byte, formats []int16) []byte {
	return appendRowDescription(buf, st.cols(), formats)
}

// Bind implements Stmt.
func (st *channelsStmt) Bind(Session, *wire.BindArgs, []uint32) (Portal, *pgerr.Error) {
	return st, nil
}

// Run implements Portal.
func (st *channelsStmt) Run(_ Session, formats []int16, withDesc bool) ([]byte, *pgerr.Error) {
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

// inbox is a session's notifications on their way from the hub's goroutine
// to the session's: the listen.Subscriber of the session. Its lock guards
// the queue; the session takes it whole at an idle point.
type inbox struct {
	s Session

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
		pid = s.PID()
	}
	limit := s.Config().Notifications.MaxPending
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
		s.Hub().CountClosed("max_pending")
		s.Kill(pgerr.Newf("53200", "Read notifications as they come (a client that LISTENs must keep reading), or raise notifications.max_pending.",
			"lockpool: more than %d bytes of notifications are waiting for this client", limit).Fatal())
		return
	}
	post := !in.posted
	in.posted = true
	in.mu.Unlock()
	if post {
		s.WakeIdle()
	}
}

// KeyPID is the client's key pid: the pid notifications its own
// transactions send carry (listen.KeyPIDer).
func (in *inbox) KeyPID() uint32 { return in.s.PID() }

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
	in.s.Kill(pgerr.Newf(code, "Notifications may have been missed: reconnect and LISTEN again.",
		"lockpool: the listener connection of database %q was lost: %v", in.s.Database(), err).Fatal())
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

// SavepointOf reads a SAVEPOINT, ROLLBACK TO [SAVEPOINT] or RELEASE
// [SAVEPOINT] at the start of sql: the command and the savepoint's name;
// ok is false for any other statement.
func SavepointOf(sql []byte) (cmd SavepointCmd, name string, ok bool) {
	w, rest := txcmd.NextWord(sql)
	switch {
	case txcmd.WordIs(w, "savepoint"):
		return SavepointSet, savepointName(rest), true
	case txcmd.WordIs(w, "rollback"), txcmd.WordIs(w, "release"):
		cmd = SavepointRelease
		if txcmd.WordIs(w, "rollback") {
			if w, rest = txcmd.NextWord(rest); !txcmd.WordIs(w, "to") {
				return 0, "", false
			}
			cmd = SavepointRollback
		}
		if w2, r2 := txcmd.NextWord(rest); txcmd.WordIs(w2, "savepoint") {
			rest = r2
		}
		return cmd, savepointName(rest), true
	}
	return 0, "", false
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

// ChannelsArray is the set-returning expression that stands for
// pg_listening_channels().
func ChannelsArray(channels []string) string {
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
			b.WriteString(backend.EscapedLiteral(c))
		}
		b.WriteByte(']')
	}
	b.WriteString("::pg_catalog.text[])")
	return b.String()
}
