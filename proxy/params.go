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

// readBackSets reads the values of parameters the client changed with SET,
// RESET or set_config once its transaction is over, so they follow the
// client to other server connections and never reach other clients. RESET
// ALL brings back the client's startup values, as it would on a direct
// connection. Runs on the relay with the session's connection to itself.
func (s *session) readBackSets(sc *pool.Conn, st *serverState, all bool, names []string) error {
	if st == nil {
		return nil
	}
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if all {
		// The server is back at its defaults; the client wants its startup values.
		for k := range st.params {
			delete(st.params, k)
		}
		for k, v := range st.defaults {
			st.params[k] = v
		}
		s.params.resetAll()
		st.synced = ""
		ps, err := s.syncParams(sc, st)
		if err != nil {
			return err
		}
		s.cout = append(s.cout, ps...)
	}
	var valid []string
	seen := map[string]bool{}
	for _, n := range names {
		if n != "" && !seen[n] && validParamName(n) {
			seen[n] = true
			valid = append(valid, n)
		}
	}
	if len(valid) == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString("SELECT ")
	for i, n := range valid {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("pg_catalog.current_setting(" + sqlLiteral(n) + ", true)")
	}
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return err
	}
	var perr error
	err := readUntilReady(sc, func(typ byte, body []byte) {
		switch typ {
		case 'E':
			perr = fmt.Errorf("%w: %s", errRefused, pgerr.FromBody(body).Message)
		case 'S':
			k, rest, ok := wire.CString(body)
			if ok {
				v, _, _ := wire.CString(rest)
				st.params[lower(string(k))] = string(v)
			}
		case 'D':
			dataRowColumns(body, func(i int, v []byte, null bool) {
				if i >= len(valid) {
					return
				}
				k := valid[i]
				if null {
					delete(st.params, k)
					s.params.reset(k)
					return
				}
				st.params[k] = string(v)
				s.params.set(k, string(v))
			})
		}
	})
	if err != nil {
		return err
	}
	if perr != nil {
		return perr
	}
	st.synced = s.params.fingerprint()
	return nil
}

// trackSets notes SET/RESET statements so the relay reads the values back
// once the statement's transaction is over.
func (s *session) trackSets(f *rewrite.Findings) {
	if len(f.Sets) == 0 && !hasSetConfig(f) {
		return
	}
	for _, c := range f.Sets {
		if c.Local {
			continue
		}
		s.setsPending = true
		if c.All {
			s.setsAll = true
			continue
		}
		x := s.more()
		x.setNames = append(x.setNames, c.Name)
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
			s.setsPending, s.setsAll, s.dropPrepared = true, true, true
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
