package session

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"

	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/startupparam"
	"github.com/lockpool/lockpool/rewrite"
)

// clientParams are the parameter values a client should see: what it sent
// at startup and what it changed since, by lower-case name. Until the first
// change the values are the startup map itself, so a client that never
// changes a parameter keeps one map, or none when it sent no parameters.
type clientParams struct {
	startup map[string]string // the startup values (RESET ALL returns to them); nil: none
	changed map[string]string // the values since the first change; nil: the startup values
	fp      string            // fingerprint of the values, "" until computed
}

// reportedNames are the parameters PostgreSQL reports with ParameterStatus,
// with their canonical spelling.
var reportedNames = map[string]string{
	"application_name":              "application_name",
	"client_encoding":               "client_encoding",
	"datestyle":                     "DateStyle",
	"default_transaction_read_only": "default_transaction_read_only",
	"in_hot_standby":                "in_hot_standby",
	"integer_datetimes":             "integer_datetimes",
	"intervalstyle":                 "IntervalStyle",
	"is_superuser":                  "is_superuser",
	"server_encoding":               "server_encoding",
	"server_version":                "server_version",
	"session_authorization":         "session_authorization",
	"standard_conforming_strings":   "standard_conforming_strings",
	"timezone":                      "TimeZone",
}

// startupSkip are startup keys that are not parameters to carry.
var startupSkip = map[string]bool{"user": true, "database": true, "options": true, "replication": true}

// init makes the startup packet's parameters the client's values.
func (p *clientParams) init(startup map[string]string) {
	var vals map[string]string
	for k, v := range startup {
		if startupSkip[k] {
			continue
		}
		if vals == nil {
			vals = make(map[string]string, len(startup))
		}
		vals[lower(k)] = v
	}
	p.setStartup(vals)
}

// setStartup makes vals (nil: none) both the startup values and the
// current ones.
func (p *clientParams) setStartup(vals map[string]string) {
	p.startup = vals
	p.resetAll()
}

// resetAll brings back the startup values.
func (p *clientParams) resetAll() {
	p.changed, p.fp = nil, ""
}

// replace makes vals (which the caller gives up) the current values.
func (p *clientParams) replace(vals map[string]string) {
	p.changed, p.fp = vals, ""
}

// values returns the client's values; the caller must not change the map.
func (p *clientParams) values() map[string]string {
	if p.changed != nil {
		return p.changed
	}
	return p.startup
}

// own gives the values a map of their own before a change.
func (p *clientParams) own() map[string]string {
	if p.changed == nil {
		p.changed = make(map[string]string, len(p.startup)+1)
		for k, v := range p.startup {
			p.changed[k] = v
		}
	}
	return p.changed
}

func (p *clientParams) set(name, val string) {
	if cur, ok := p.values()[name]; ok && cur == val {
		return // the empty string is a value too: only a known one is the same
	}
	p.own()[name] = val
	p.fp = ""
}

func (p *clientParams) fingerprint() string {
	if p.fp != "" {
		return p.fp
	}
	vals := p.values()
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteByte('#')
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(vals[k])
		b.WriteByte(0)
	}
	p.fp = b.String()
	return p.fp
}

// validParamName reports whether a parameter name is safe to send back.
func validParamName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && i > 0) {
			return false
		}
	}
	return true
}

// parseOptions reads the startup options parameter as a PostgreSQL backend
// does and returns every setting the client asked for at login in the order
// PostgreSQL applies them: the switches of options first, then the explicit
// startup parameters in packet order, so that an explicit parameter wins
// over the same one in options. The session's parameters become those
// values, unchecked (checkStartupParams has the server check them).
//
// optErr is PostgreSQL's error for a bad switch or argument in options. It
// stands only once the settings (then just those PostgreSQL applied before
// it) passed the server's check, as on PostgreSQL, which applies each switch
// as it reads it. err is lockpool's own refusal, reported at once.
func (s *Session) ParseOptions(opts string, explicit []startupparam.Param) (settings []startupparam.Param, optErr, err error) {
	settings, optErr = startupparam.ParseOptions(opts)
	if optErr == nil {
		settings = append(settings, explicit...)
	}
	if err := startupparam.CheckUnsupported(settings); err != nil {
		return nil, nil, err
	}
	s.SetStartupValues(settings, nil)
	return settings, optErr, nil
}

// appendStartupParams appends the ParameterStatus set a client gets at
// login: the server's values, overridden by the client's own.
func (s *Session) AppendStartupParams(buf []byte, srv map[string]string) []byte {
	seen := make(map[string]bool, len(srv))
	for k, v := range srv {
		lk := lower(k)
		seen[lk] = true
		if cv, ok := s.params.values()[lk]; ok {
			v = cv
		}
		buf = wire.AppendParameterStatus(buf, k, v)
	}
	for k, v := range s.params.values() {
		if canon, ok := reportedNames[k]; ok && !seen[k] {
			buf = wire.AppendParameterStatus(buf, canon, v)
		}
	}
	return buf
}

// sqlLiteral quotes a value as a standard SQL string constant that means the
// same whatever standard_conforming_strings says.
func sqlLiteral(v string) string {
	tag := "$lockpool$"
	for strings.Contains(v, tag) {
		tag = "$lockpool" + tag[1:]
	}
	return tag + v + tag
}

// syncParams makes the server connection's parameters match the client's
// before the client's first statement on it. It returns ParameterStatus
// messages the client must see (values the server spelled differently).
func (s *Session) syncParams(sc *pool.Conn, st *serverState) ([]byte, error) {
	fp := s.params.fingerprint()
	if st.synced == fp {
		return nil, nil
	}
	var sets, setKeys, resets []string
	for k, want := range s.params.values() {
		cur, ok := st.params[k]
		if !ok || cur != want {
			sets = append(sets, "pg_catalog.set_config("+sqlLiteral(k)+", "+sqlLiteral(want)+", false)")
			setKeys = append(setKeys, k)
		}
	}
	for k, cur := range st.params {
		if _, mine := s.params.values()[k]; mine {
			continue
		}
		if def, ok := st.defaults[k]; ok && def == cur {
			continue
		}
		resets = append(resets, k)
	}
	if len(sets) == 0 && len(resets) == 0 {
		st.synced = fp
		return nil, nil
	}
	var q strings.Builder
	if len(sets) > 0 {
		q.WriteString("SELECT ")
		q.WriteString(strings.Join(sets, ", "))
		q.WriteString(";")
	}
	for _, k := range resets {
		if !validParamName(k) {
			continue
		}
		q.WriteString("RESET ")
		q.WriteString(quoteGUC(k))
		q.WriteString(";")
	}
	_ = sc.Net.SetDeadline(time.Now().Add(10 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return nil, err
	}
	var perr *pgError
	var ps []byte
	err := readUntilReady(sc, s.relayNotifications(func(typ byte, body []byte) {
		switch typ {
		case 'E':
			if perr == nil {
				e := pgerr.FromBody(body)
				perr = &pgError{Code: e.Code, Message: "lockpool: cannot apply connection parameters: " + e.Message, Hint: "Check the parameters in the connection string."}
			}
		case 'D':
			// set_config returns each value as the server spells it: that is
			// the client's value from now on.
			dataRowColumns(body, func(i int, v []byte, null bool) {
				if i >= len(setKeys) || null {
					return
				}
				k, val := setKeys[i], string(v)
				st.params[k] = val
				if s.params.values()[k] != val {
					s.params.set(k, val)
					if canon, ok := reportedNames[k]; ok {
						ps = wire.AppendParameterStatus(ps, canon, val)
					}
				}
			})
		case 'S':
			k, rest, ok := wire.CString(body)
			if !ok {
				return
			}
			v, _, _ := wire.CString(rest)
			st.params[lower(string(k))] = string(v)
		}
	}))
	if err != nil {
		return nil, err
	}
	if perr != nil {
		return nil, perr
	}
	for _, k := range resets {
		if def, ok := st.defaults[k]; ok {
			st.params[k] = def
		} else {
			delete(st.params, k)
		}
	}
	st.synced = s.params.fingerprint()
	return ps, nil
}

func quoteGUC(k string) string {
	parts := strings.Split(k, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

// readBackSettings makes the client's parameters what its session holds
// once a transaction that may have changed them is over, whatever it did:
// committed, rolled back to a savepoint or as a whole, failed, RESET ALL.
// The server connection applied PostgreSQL's rules, so the values it holds
// are the client's. It reads every setting that may differ from the
// connection's defaults: those this transaction named (names), those the
// client holds, those the connection was known to hold, and the client's
// startup settings. After a DISCARD ALL that ran (s.discarded) the client's
// startup settings get their startup values back, as a RESET does on
// PostgreSQL, where they are the reset values. The connection's known state
// (st.params) becomes exact, so nothing of this client reaches the next
// one. The client is sent a ParameterStatus for each reported parameter
// whose value differs from what it was last told. Runs on the relay with
// the session's connection to itself, at a safe point.
func (s *Session) readBackSettings(sc *pool.Conn, st *serverState, names []string) error {
	if st == nil {
		return nil
	}
	discarded := s.discarded
	s.discarded = false
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	var read []string
	seen := map[string]bool{}
	add := func(n string) {
		if n != "" && !seen[n] && validParamName(n) {
			seen[n] = true
			read = append(read, n)
		}
	}
	for _, n := range names {
		add(n)
	}
	for n := range s.params.values() {
		add(n)
	}
	for n := range s.params.startup {
		add(n)
	}
	for n, v := range st.params {
		if def, ok := st.defaults[n]; !ok || def != v {
			add(n)
		}
	}
	if len(read) == 0 {
		return nil
	}
	sort.Strings(read)
	var q strings.Builder
	q.WriteString("SELECT ")
	for i, n := range read {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("pg_catalog.current_setting(" + sqlLiteral(n) + ", true)")
	}
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return err
	}
	held := make(map[string]string, len(read))
	var perr error
	err := readUntilReady(sc, s.relayNotifications(func(typ byte, body []byte) {
		switch typ {
		case 'E':
			perr = fmt.Errorf("%w: %s", errRefused, pgerr.FromBody(body).Message)
		case 'D':
			dataRowColumns(body, func(i int, v []byte, null bool) {
				if i < len(read) && !null {
					held[read[i]] = string(v)
				}
			})
		}
	}))
	if err != nil {
		return err
	}
	if perr != nil {
		return perr
	}
	told := s.params.values() // what the client was told: its values, and the defaults it saw at login
	vals := make(map[string]string, len(held))
	for _, n := range read {
		delete(st.params, n)
		if v, ok := held[n]; ok {
			st.params[n] = v
			vals[n] = v
		}
	}
	if discarded {
		for k, v := range s.params.startup {
			vals[k] = v
		}
	}
	s.params.replace(vals)
	st.synced = ""
	if _, err := s.syncParams(sc, st); err != nil {
		return err
	}
	var ps []byte
	now := s.params.values()
	for k, canon := range reportedNames {
		was, ok := told[k]
		if !ok {
			was, ok = st.defaults[k]
		}
		v, has := now[k]
		if !has {
			v, has = st.defaults[k]
		}
		if has && (!ok || was != v) {
			ps = wire.AppendParameterStatus(ps, canon, v)
		}
	}
	s.insertBeforeReady(ps)
	return nil
}

// insertBeforeReady puts messages into the client's output before the
// ReadyForQuery that ends it, or after everything when it does not end with
// one.
func (s *Session) insertBeforeReady(msgs []byte) {
	if len(msgs) == 0 {
		return
	}
	if n := len(s.cout); n >= 6 && s.cout[n-6] == 'Z' {
		rfq := append([]byte(nil), s.cout[n-6:]...)
		s.cout = append(append(s.cout[:n-6], msgs...), rfq...)
		return
	}
	s.cout = append(s.cout, msgs...)
}

// escapedLiteral quotes v as an escape string constant (E'…'), which means
// the same whatever standard_conforming_strings says and may stand inside
// a dollar-quoted DO body.
func escapedLiteral(v string) string {
	var b strings.Builder
	b.WriteString("E'")
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\', '\'':
			b.WriteByte(c)
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// trackSets notes statements that may change the session's settings, so
// the relay reads them back once the statement's transaction is over.
// SET LOCAL ends with its transaction.
func (s *Session) trackSets(f *rewrite.Findings) {
	if len(f.Sets) == 0 && !hasSetConfig(f) {
		return
	}
	for _, c := range f.Sets {
		if c.Local {
			continue
		}
		s.setsPending = true
		if c.Name != "" {
			x := s.more()
			x.setNames = append(x.setNames, c.Name)
		}
	}
	for _, c := range f.State {
		switch {
		case c.Kind == rewrite.SetConfig:
			s.setsPending = true
			if c.Name != "" {
				x := s.more()
				x.setNames = append(x.setNames, c.Name)
			}
		case c.Kind == rewrite.Discard && c.Name == "all":
			// DISCARD ALL is RESET ALL and DEALLOCATE ALL too.
			s.setsPending, s.dropPrepared = true, true
		case c.Kind == rewrite.Deallocate && c.Name == "*":
			s.setsPending, s.dropPrepared = true, true
		}
	}
}

func hasSetConfig(f *rewrite.Findings) bool {
	for _, c := range f.State {
		if c.Kind == rewrite.SetConfig || c.Kind == rewrite.Discard || c.Kind == rewrite.Deallocate {
			return true
		}
	}
	return false
}

// setStartupValues makes the session's parameters (and what RESET ALL
// returns to) the settings of seq applied in order, so a later setting of a
// parameter wins; values, when not nil, are the server's spelling of each.
func (ss *Session) SetStartupValues(seq []startupparam.Param, values []string) {
	var eff map[string]string // nil: none
	for i, p := range seq {
		v := p.Value
		if values != nil {
			v = values[i]
		}
		if eff == nil {
			eff = make(map[string]string, len(seq))
		}
		eff[startupparam.CanonicalName(p.Name)] = v
	}
	ss.params.setStartup(eff)
}
