package proxy

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"

	"github.com/lockpool/lockpool/pool"
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

func (p *clientParams) reset(name string) {
	if _, ok := p.values()[name]; ok {
		delete(p.own(), name)
		p.fp = ""
	}
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
func (s *session) parseOptions(opts string, explicit []startupParam) (settings []startupParam, optErr, err error) {
	settings, optErr = optionParams(opts)
	if optErr == nil {
		settings = append(settings, explicit...)
	}
	if err := checkUnsupportedParams(settings); err != nil {
		return nil, nil, err
	}
	s.setStartupValues(settings, nil)
	return settings, optErr, nil
}

func quoteForMsg(s string) string { return `"` + s + `"` }

// appendStartupParams appends the ParameterStatus set a client gets at
// login: the server's values, overridden by the client's own.
func (s *session) appendStartupParams(buf []byte, srv map[string]string) []byte {
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
func (s *session) syncParams(sc *pool.Conn, st *serverState) ([]byte, error) {
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
	err := readUntilReady(sc, func(typ byte, body []byte) {
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
	})
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

// sessionSettingsSQL lists, as lower-case name and value, the built-in
// settings a server connection holds at session level: everything SET, a
// committed set_config or lockpool's own parameter sync left there. A
// setting it does not list is at the connection's default (what a RESET
// on it returns to). The transaction_* settings are left out: they live
// for one transaction. Custom settings ("app.user_id") are not in
// pg_settings; readBackSettings reads them by name.
const sessionSettingsSQL = "SELECT pg_catalog.lower(name), pg_catalog.current_setting(name) FROM pg_catalog.pg_settings" +
	" WHERE source = 'session' AND name NOT IN ('transaction_isolation', 'transaction_read_only', 'transaction_deferrable')"

// readBackSettings makes the client's parameters what its session holds
// once a transaction that may have changed them is over, whatever it did:
// committed, rolled back to a savepoint or as a whole, failed, RESET ALL,
// DISCARD ALL. The server connection applied PostgreSQL's rules, so its
// session-level settings are the client's, with one correction: a setting
// the client gave at startup that the connection holds at its own default
// was reset (DISCARD ALL, or a RESET lockpool could not rewrite), and on
// PostgreSQL a reset returns it to the client's startup value, so it gets
// that value back. The connection's known state (st.params) becomes exact,
// so nothing of this client reaches the next one. Custom settings are read
// by name: those the client touched (names) and those known on either side.
// The client is sent a ParameterStatus for each reported parameter whose
// value differs from what it was last told. Runs on the relay with the
// session's connection to itself, at a safe point.
func (s *session) readBackSettings(sc *pool.Conn, st *serverState, names []string) error {
	if st == nil {
		return nil
	}
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	var custom []string
	seen := map[string]bool{}
	addCustom := func(n string) {
		if strings.IndexByte(n, '.') > 0 && !seen[n] && validParamName(n) {
			seen[n] = true
			custom = append(custom, n)
		}
	}
	for _, n := range names {
		addCustom(n)
	}
	for n := range s.params.values() {
		addCustom(n)
	}
	for n := range s.params.startup {
		addCustom(n)
	}
	for n := range st.params {
		addCustom(n)
	}
	sort.Strings(custom)
	var q strings.Builder
	q.WriteString(sessionSettingsSQL)
	if len(custom) > 0 {
		q.WriteString(" UNION ALL VALUES ")
		for i, n := range custom {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(" + escapedLiteral(n) + "::pg_catalog.text, pg_catalog.current_setting(" + escapedLiteral(n) + ", true))")
		}
	}
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return err
	}
	held := make(map[string]string)
	var perr error
	err := readUntilReady(sc, func(typ byte, body []byte) {
		switch typ {
		case 'E':
			perr = fmt.Errorf("%w: %s", errRefused, pgerr.FromBody(body).Message)
		case 'D':
			var name string
			dataRowColumns(body, func(i int, v []byte, null bool) {
				switch {
				case i == 0 && !null:
					name = string(v)
				case i == 1 && !null && name != "":
					held[name] = string(v)
				}
			})
		}
	})
	if err != nil {
		return err
	}
	if perr != nil {
		return perr
	}
	told := s.params.values() // what the client was told: its values, and the defaults it saw at login
	vals := make(map[string]string, len(held)+len(s.params.startup))
	for k, v := range held {
		vals[k] = v
	}
	for k, v := range s.params.startup {
		if _, ok := vals[k]; !ok && strings.IndexByte(k, '.') < 0 {
			vals[k] = v // reset: back to the startup value
		}
	}
	for k := range st.params {
		delete(st.params, k)
	}
	for k, v := range st.defaults {
		st.params[k] = v
	}
	for k, v := range held {
		st.params[k] = v
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
func (s *session) insertBeforeReady(msgs []byte) {
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
// SET LOCAL ends with its transaction, except that a custom setting it
// names stays defined (empty) for the rest of the session.
func (s *session) trackSets(f *rewrite.Findings) {
	if len(f.Sets) == 0 && !hasSetConfig(f) {
		return
	}
	for _, c := range f.Sets {
		if c.Local && strings.IndexByte(c.Name, '.') < 0 {
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
