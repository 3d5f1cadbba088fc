package backend

import (
	"sort"
	"strings"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// ClientParams are the parameter values a client should see: what it sent
// at startup and what it changed since, by lower-case name. Until the first
// change the values are the startup map itself, so a client that never
// changes a parameter keeps one map, or none when it sent no parameters.
type ClientParams struct {
	startup map[string]string // the startup values (RESET ALL returns to them); nil: none
	changed map[string]string // the values since the first change; nil: the startup values
	fp      string            // Fingerprint of the values, "" until computed
}

// ReportedNames are the parameters PostgreSQL reports with ParameterStatus,
// with their canonical spelling.
var ReportedNames = map[string]string{
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

// Init makes the startup packet's parameters the client's values.
func (p *ClientParams) Init(startup map[string]string) {
	var vals map[string]string
	for k, v := range startup {
		if startupSkip[k] {
			continue
		}
		if vals == nil {
			vals = make(map[string]string, len(startup))
		}
		vals[Lower(k)] = v
	}
	p.SetStartup(vals)
}

// SetStartup makes vals (nil: none) both the startup values and the
// current ones.
func (p *ClientParams) SetStartup(vals map[string]string) {
	p.startup = vals
	p.ResetAll()
}

// ResetAll brings back the startup values.
func (p *ClientParams) ResetAll() {
	p.changed, p.fp = nil, ""
}

// Replace makes vals (which the caller gives up) the current values.
func (p *ClientParams) Replace(vals map[string]string) {
	p.changed, p.fp = vals, ""
}

// Values returns the client's values; the caller must not change the map.
func (p *ClientParams) Values() map[string]string {
	if p.changed != nil {
		return p.changed
	}
	return p.startup
}

// Own gives the values a map of their own before a change.
func (p *ClientParams) Own() map[string]string {
	if p.changed == nil {
		p.changed = make(map[string]string, len(p.startup)+1)
		for k, v := range p.startup {
			p.changed[k] = v
		}
	}
	return p.changed
}

func (p *ClientParams) Set(name, val string) {
	if cur, ok := p.Values()[name]; ok && cur == val {
		return // the empty string is a value too: only a known one is the same
	}
	p.Own()[name] = val
	p.fp = ""
}

func (p *ClientParams) Fingerprint() string {
	if p.fp != "" {
		return p.fp
	}
	vals := p.Values()
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	n := 1
	for _, k := range keys {
		n += len(k) + len(vals[k]) + 2
	}
	var b strings.Builder
	b.Grow(n) // one allocation for the whole fingerprint
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

// ValidParamName reports whether a parameter name is safe to send back.
func ValidParamName(k string) bool {
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

// SQLLiteral quotes a value as a standard SQL string constant that means the
// same whatever standard_conforming_strings says.
func SQLLiteral(v string) string {
	tag := "$lockpool$"
	for strings.Contains(v, tag) {
		tag = "$lockpool" + tag[1:]
	}
	return tag + v + tag
}

// QuoteGUC quotes a parameter name, each dot-separated part an identifier.
func QuoteGUC(k string) string {
	parts := strings.Split(k, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

// EscapedLiteral quotes v as an escape string constant (E'…'), which means
// the same whatever standard_conforming_strings says and may stand inside
// a dollar-quoted DO body.
func EscapedLiteral(v string) string {
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

// Startup returns the startup values (what RESET ALL returns to); nil:
// none. The map is the client's: do not change it.
func (p *ClientParams) Startup() map[string]string { return p.startup }

// RaiseSQL is a statement that makes the server raise pe.
func RaiseSQL(pe *pgerr.Error) string {
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	var b strings.Builder
	b.WriteString("DO $lockpool$BEGIN RAISE EXCEPTION USING ERRCODE = ")
	b.WriteString(q(pe.Code))
	b.WriteString(", MESSAGE = ")
	b.WriteString(q(pe.Message))
	if pe.Hint != "" {
		b.WriteString(", HINT = ")
		b.WriteString(q(pe.Hint))
	}
	if pe.Detail != "" {
		b.WriteString(", DETAIL = ")
		b.WriteString(q(pe.Detail))
	}
	b.WriteString("; END$lockpool$")
	return b.String()
}
