package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode"

	"gopkg.in/yaml.v3"
)

// validate checks the filled config; every problem is reported with the line
// of the key that causes it (or of its section when the value is a default).
func (p *parser) validate(c *Config) {
	top, srv := p.sections[""], p.sections["server"]

	if c.AdminListen != "" && c.AdminListen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		p.errorf(top.lineOf("admin_listen"), "admin_listen must differ from listen (both are %s)", p.quote(top, "admin_listen", c.AdminListen))
	}

	if c.AdminListen != "" && c.AdminToken == "" && !loopbackAddr(c.AdminListen) {
		p.errorf(top.lineOf("admin_listen"), "admin_listen %s is not a loopback address, so admin_token is required "+
			"(/debug/* shows client addresses, locks and profiles); set admin_token, or listen on 127.0.0.1", p.quote(top, "admin_listen", c.AdminListen))
	}

	if c.TLS != nil {
		tls := p.sections["tls"]
		if c.TLS.CertFile == "" {
			p.errorf(tls.lineOf("cert_file"), "tls.cert_file is required when tls is set (remove tls to serve without TLS)")
		}
		if c.TLS.KeyFile == "" {
			p.errorf(tls.lineOf("key_file"), "tls.key_file is required when tls is set (remove tls to serve without TLS)")
		}
	}

	if c.Server.CAFile != "" && c.Server.TLS != "verify-full" && c.Server.TLS != "require" {
		p.errorf(srv.lineOf("ca_file"), "server.ca_file is only used with server.tls verify-full or require (got %s)", p.quote(srv, "tls", c.Server.TLS))
	}

	p.validateHosts(c)
	p.validateCluster(c)

	if c.AuthQuery != nil && c.AuthQuery.User == "" {
		p.errorf(top.lineOf("auth_query"), "auth_query.user is required (the role that runs the lookup)")
	}

	// Users.
	users, apps := p.lists["users"], p.lists["applications"]
	if len(c.Users) == 0 && !users.bad && c.AuthQuery == nil {
		p.errorf(users.line, "at least one user is required under users (name and password)")
	}
	userLine := map[string]int{}
	for i, u := range c.Users {
		s := users.items[i]
		switch {
		case u.Name == "":
			p.errorf(s.lineOf("name"), "%s: name is required", s.where)
		case userLine[u.Name] != 0:
			p.errorf(s.lineOf("name"), "%s: user %q is already defined at line %d; user names must be unique", s.where, u.Name, userLine[u.Name])
		default:
			userLine[u.Name] = s.lineOf("name")
		}
		if u.Password == "" && c.AuthMethod != "trust" && !s.failed["password"] {
			p.errorf(s.lineOf("password"), "%s: password is required with auth_method %s", s.where, c.AuthMethod)
		}
	}

	for _, name := range c.AdminUserList() {
		if _, ok := c.UserByName(name); !ok && !top.failed["admin_users"] {
			p.errorf(top.lineOf("admin_users"), "admin_users: user %q is not defined under users (admin console users log in with a configured password)", name)
		}
	}

	// Applications.
	if len(c.Applications) == 0 && !apps.bad {
		p.errorf(apps.line, "at least one application is required under applications (name and user)")
	}
	appLine := map[string]int{}
	type pair struct{ user, db string }
	pairs := map[pair]int{} // -> index of the first application with it
	totalPinned := 0
	var pinParts []string
	for i, a := range c.Applications {
		s := apps.items[i]
		label := s.where
		if a.Name != "" {
			label = fmt.Sprintf("%s (%s)", s.where, a.Name)
		}
		switch {
		case a.Name == "":
			p.errorf(s.lineOf("name"), "%s: name is required", s.where)
		case strings.ContainsFunc(a.Name, unicode.IsControl):
			p.errorf(s.lineOf("name"), "%s: name %q has a control character (the name appears in logs, metric labels and SHOW output)", s.where, a.Name)
		case appLine[a.Name] != 0:
			p.errorf(s.lineOf("name"), "%s: application %q is already defined at line %d; application names must be unique", s.where, a.Name, appLine[a.Name])
		default:
			appLine[a.Name] = s.lineOf("name")
		}
		switch {
		case a.User == "":
			if !s.failed["user"] {
				p.errorf(s.lineOf("user"), "%s: user is required (the role its clients log in as)", label)
			}
		case !hasUser(c.Users, a.User) && c.AuthQuery == nil:
			p.errorf(s.lineOf("user"), "%s: user %q is not defined under users", label, a.User)
		}
		if a.Database == ConsoleDatabase {
			p.errorf(s.lineOf("database"), "%s: database %q is lockpool's admin console; an application cannot use that name", label, a.Database)
		}
		if a.User != "" {
			k := pair{a.User, a.Database}
			if j, dup := pairs[k]; dup {
				db := "any database (no database key)"
				if a.Database != "" {
					db = fmt.Sprintf("database %q", a.Database)
				}
				line := s.lineOf("database")
				if !s.has("database") {
					line = s.lineOf("user")
				}
				p.errorf(line, "%s: user %q with %s is already matched by %s at line %d; each (user, database) pair must belong to one application",
					label, a.User, db, appName(c.Applications[j], apps.items[j]), apps.items[j].line)
			} else {
				pairs[k] = i
			}
		}
		switch {
		case a.MaxPinned < 0:
			p.errorf(s.lineOf("max_pinned"), "%s: max_pinned must be 0 or more (got %d)", label, a.MaxPinned)
		case a.MaxConnections >= 1 && a.MaxPinned >= a.MaxConnections:
			line, what := s.lineOf("max_pinned"), "max_pinned"
			if !s.has("max_pinned") {
				line, what = s.lineOf("max_connections"), "max_pinned (default 1)"
			}
			p.errorf(line, "%s: %s is %d but must be less than max_connections (%d), so pinned sessions can never take every connection of the application",
				label, what, a.MaxPinned, a.MaxConnections)
		}
		if a.MaxPinned > 0 {
			totalPinned += a.MaxPinned
			name := a.Name
			if name == "" {
				name = s.where
			}
			pinParts = append(pinParts, fmt.Sprintf("%s %d", name, a.MaxPinned))
		}
	}

	// Pins plus lease connections must leave the instance at least one
	// connection for ordinary transactions.
	if c.Server.MaxConnections >= 1 && c.Leases.MaxConnections >= 0 {
		reserved := totalPinned + c.Leases.MaxConnections
		if reserved >= c.Server.MaxConnections {
			line := srv.lineOf("max_connections")
			if !srv.has("max_connections") && !top.has("server") {
				line = apps.line
			}
			pins := "0"
			if len(pinParts) > 0 {
				pins = strings.Join(pinParts, " + ")
				if len(pinParts) > 1 {
					pins += " = " + strconv.Itoa(totalPinned)
				}
			}
			p.errorf(line, "pins could take the whole instance: max_pinned of all applications (%s) plus leases.max_connections (%d) is %d, "+
				"which must be less than server.max_connections (%d); otherwise pinned sessions and lease connections could hold every server connection "+
				"and leave none for ordinary transactions (raise server.max_connections or lower max_pinned)",
				pins, c.Leases.MaxConnections, reserved, c.Server.MaxConnections)
		}
	}
}

func hasUser(users []User, name string) bool {
	for _, u := range users {
		if u.Name == name {
			return true
		}
	}
	return false
}

func appName(a Application, s *section) string {
	if a.Name != "" {
		return fmt.Sprintf("application %q", a.Name)
	}
	return s.where
}

// checkIdentifier returns why s is not a lowercase SQL identifier usable
// unquoted as a schema name, or "".
func checkIdentifier(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(s) > 63 {
		return "is longer than 63 bytes"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')) {
			return "is not a lowercase SQL identifier (a-z or _ first, then a-z, 0-9, _)"
		}
	}
	if strings.HasPrefix(s, "pg_") {
		return "starts with pg_, which PostgreSQL reserves for system schemas"
	}
	if reservedWords[s] {
		return "is a reserved SQL key word"
	}
	return ""
}

// reservedWords are PostgreSQL's reserved key words, including those that
// may only be function or type names: none can be an unquoted schema name.
var reservedWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric authorization
		binary both case cast check collate collation column concurrently constraint create cross
		current_catalog current_date current_role current_schema current_time current_timestamp
		current_user default deferrable desc distinct do else end except false fetch for foreign
		freeze from full grant group having ilike in initially inner intersect into is isnull join
		lateral leading left like limit localtime localtimestamp natural not notnull null offset on
		only or order outer overlaps placing primary references returning right select session_user
		similar some symmetric system_user table tablesample then to trailing true union unique user
		using variadic verbose when where window with`) {
		m[w] = true
	}
	return m
}()

// quote returns val quoted for a message, as written in the file: when it
// came from ${VAR} expansion the written text is shown instead, so variable
// values never reach a message.
func (p *parser) quote(s *section, key, val string) string {
	if n := deref(s.vals[key]); n != nil && n.Kind == yaml.ScalarNode && n.Value != val {
		return strconv.Quote(truncate(n.Value, 60)) + " (after ${} expansion)"
	}
	return strconv.Quote(truncate(val, 60))
}

// loopbackAddr reports whether the host of a host:port address can only be
// reached from this machine: localhost or a loopback IP. An empty host
// (":9930") listens on every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
