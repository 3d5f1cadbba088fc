package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// validate checks the filled config; every problem is reported with the line
// of the key that causes it (or of its section when the value is a default).
func (p *parser) validate(c *Config) {
	top := p.top

	p.checkAddr(top, "listen", c.Listen, false)
	p.checkAddr(top, "admin_listen", c.AdminListen, true)
	if c.AdminListen != "" && c.AdminListen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		p.errorf(top.lineOf("admin_listen"), "admin_listen must differ from listen (both are %s)", p.quote(top, "admin_listen", c.AdminListen))
	}
	p.nonNegative(top, "leak_check_interval", c.LeakCheckInterval)
	p.nonNegative(top, "shutdown_timeout", c.ShutdownTimeout)
	p.positive(top, "client_login_timeout", c.ClientLoginTimeout)
	p.nonNegative(top, "idle_transaction_timeout", c.IdleTransactionTimeout)
	if c.MaxMessageSize < minMessageSize || c.MaxMessageSize > maxMessageSize {
		p.errorf(top.lineOf("max_message_size"), "max_message_size must be between 1kB and 1GB (got %d bytes)", c.MaxMessageSize)
	}

	if c.TLS != nil {
		if c.TLS.CertFile == "" {
			p.errorf(p.tls.lineOf("cert_file"), "tls.cert_file is required when tls is set (remove tls to serve without TLS)")
		}
		if c.TLS.KeyFile == "" {
			p.errorf(p.tls.lineOf("key_file"), "tls.key_file is required when tls is set (remove tls to serve without TLS)")
		}
	}

	srv := p.server
	if c.Server.Host == "" {
		p.errorf(srv.lineOf("host"), "server.host must not be empty (a host name, an IP address, or a Unix socket directory starting with /)")
	}
	if c.Server.Port < 1 || c.Server.Port > 65535 {
		p.errorf(srv.lineOf("port"), "server.port must be between 1 and 65535 (got %d)", c.Server.Port)
	}
	p.atLeast(srv, "max_connections", c.Server.MaxConnections, 1)
	p.positive(srv, "idle_timeout", c.Server.IdleTimeout)
	p.positive(srv, "max_lifetime", c.Server.MaxLifetime)
	p.positive(srv, "connect_timeout", c.Server.ConnectTimeout)
	if c.Server.CAFile != "" && c.Server.TLS != "verify-full" && c.Server.TLS != "require" {
		p.errorf(srv.lineOf("ca_file"), "server.ca_file is only used with server.tls verify-full or require (got %s)", p.quote(srv, "tls", c.Server.TLS))
	}
	p.atLeast(top, "max_client_connections", c.MaxClientConnections, 1)

	// Users.
	if len(c.Users) == 0 && !p.usersBad && c.AuthQuery == nil {
		p.errorf(p.usersLine, "at least one user is required under users (name and password)")
	}
	userLine := map[string]int{}
	for i, u := range c.Users {
		s := p.users[i]
		switch {
		case u.Name == "":
			p.errorf(s.lineOf("name"), "%s: name is required", s.where)
		case userLine[u.Name] != 0:
			p.errorf(s.lineOf("name"), "%s: user %q is already defined at line %d; user names must be unique", s.where, u.Name, userLine[u.Name])
		default:
			userLine[u.Name] = s.lineOf("name")
		}
		if u.Password == "" && c.AuthMethod != "trust" && !p.failed(s, "password") {
			p.errorf(s.lineOf("password"), "%s: password is required with auth_method %s", s.where, c.AuthMethod)
		}
	}

	// Applications.
	if len(c.Applications) == 0 && !p.appsBad {
		p.errorf(p.appsLine, "at least one application is required under applications (name and user)")
	}
	appLine := map[string]int{}
	type pair struct{ user, db string }
	pairs := map[pair]int{} // -> index of the first application with it
	totalPinned := 0
	var pinParts []string
	for i, a := range c.Applications {
		s := p.apps[i]
		label := s.where
		if a.Name != "" {
			label = fmt.Sprintf("%s (%s)", s.where, a.Name)
		}
		switch {
		case a.Name == "":
			p.errorf(s.lineOf("name"), "%s: name is required", s.where)
		case appLine[a.Name] != 0:
			p.errorf(s.lineOf("name"), "%s: application %q is already defined at line %d; application names must be unique", s.where, a.Name, appLine[a.Name])
		default:
			appLine[a.Name] = s.lineOf("name")
		}
		switch {
		case a.User == "":
			if !p.failed(s, "user") {
				p.errorf(s.lineOf("user"), "%s: user is required (the role its clients log in as)", label)
			}
		case !hasUser(c.Users, a.User) && c.AuthQuery == nil:
			p.errorf(s.lineOf("user"), "%s: user %q is not defined under users", label, a.User)
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
					label, a.User, db, appName(c.Applications[j], p.apps[j]), p.apps[j].line)
			} else {
				pairs[k] = i
			}
		}
		p.atLeast(s, "max_connections", a.MaxConnections, 1)
		p.positive(s, "wait_timeout", a.WaitTimeout)
		p.atLeast(s, "max_prepared_statements", a.MaxPreparedStatements, 1)
		p.atLeast(s, "max_clients", a.MaxClients, 0)
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

	// Leases.
	ls := p.leases
	if msg := checkIdentifier(c.Leases.Schema); msg != "" {
		p.errorf(ls.lineOf("schema"), "leases.schema: %s %s", p.quote(ls, "schema", c.Leases.Schema), msg)
	}
	p.atLeast(ls, "max_connections", c.Leases.MaxConnections, 1)

	// Pins plus lease connections must leave the instance at least one
	// connection for ordinary transactions.
	if c.Server.MaxConnections >= 1 && c.Leases.MaxConnections >= 0 {
		reserved := totalPinned + c.Leases.MaxConnections
		if reserved >= c.Server.MaxConnections {
			line := srv.lineOf("max_connections")
			if !srv.has("max_connections") && !p.top.has("server") {
				line = p.appsLine
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

// failed reports whether an error was already reported on s[key]'s line for
// that key, to avoid a second message about the same value.
func (p *parser) failed(s *section, key string) bool {
	if !s.has(key) {
		return false
	}
	prefix := s.name(key) + ":"
	for _, e := range p.errs {
		if e.Line == s.lineOf(key) && strings.HasPrefix(e.Msg, prefix) {
			return true
		}
	}
	return false
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

func (p *parser) checkAddr(s *section, key, addr string, mayBeEmpty bool) {
	if addr == "" {
		if !mayBeEmpty {
			p.errorf(s.lineOf(key), "%s must not be empty (host:port, e.g. 127.0.0.1:6432)", s.name(key))
		}
		return
	}
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < 0 || n > 65535 {
		p.errorf(s.lineOf(key), "%s: %s is not a host:port address (e.g. 127.0.0.1:6432)", s.name(key), p.quote(s, key, addr))
	}
}

func (p *parser) positive(s *section, key string, d time.Duration) {
	if d <= 0 && !p.failed(s, key) {
		p.errorf(s.lineOf(key), "%s must be greater than 0 (got %s)", s.name(key), d)
	}
}

func (p *parser) nonNegative(s *section, key string, d time.Duration) {
	if d < 0 {
		p.errorf(s.lineOf(key), "%s must not be negative (got %s; 0 turns it off)", s.name(key), d)
	}
}

func (p *parser) atLeast(s *section, key string, n, min int) {
	if n < min {
		p.errorf(s.lineOf(key), "%s must be at least %d (got %d)", s.name(key), min, n)
	}
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
