package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// Error is one problem found in a config file. Its text is
// "path:line: message" (or "path: message" when no line applies, which only
// happens when the file cannot be read).
type Error struct {
	Path string // the path given to Load or Parse
	Line int    // 1-based; 0 when unknown
	Msg  string // never contains a password
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
	}
	return e.Path + ": " + e.Msg
}

// Load reads the config file at path, expands ${VAR} from the process
// environment, applies defaults and validates. See the package doc for the
// error format.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	return Parse(data, path, os.LookupEnv)
}

// Parse is Load on bytes already read. path is used in error messages and
// stored in Config.Path; getenv looks up ${VAR} references (os.LookupEnv in
// production; nil means no variable is set).
func Parse(data []byte, path string, getenv func(string) (string, bool)) (*Config, error) {
	name := path
	if name == "" {
		name = "<config>"
	}
	if getenv == nil {
		getenv = func(string) (string, bool) { return "", false }
	}
	p := &parser{path: name, getenv: getenv}
	root, err := p.decodeYAML(data)
	if err != nil {
		return nil, err
	}
	cfg := defaults()
	cfg.Path = path
	p.config(root, cfg)
	p.validate(cfg)
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

const (
	defaultMaxMessageSize = 64 << 20
	minMessageSize        = 1 << 10
	maxMessageSize        = 1 << 30
)

func defaults() *Config {
	return &Config{
		Listen:                 "127.0.0.1:6432",
		AdminListen:            "127.0.0.1:9930",
		AuthMethod:             "scram-sha-256",
		LeakCheckInterval:      10 * time.Second,
		ShutdownTimeout:        30 * time.Second,
		ClientLoginTimeout:     15 * time.Second,
		IdleTransactionTimeout: 0,
		MaxMessageSize:         defaultMaxMessageSize,
		MaxClientConnections:   10000,
		Server: Server{
			Host:           "127.0.0.1",
			Port:           5432,
			MaxConnections: 20,
			IdleTimeout:    60 * time.Second,
			MaxLifetime:    time.Hour,
			ConnectTimeout: 5 * time.Second,
			TLS:            "prefer",
		},
		Leases: Leases{
			Schema:         "lockpool",
			MaxConnections: 2,
		},
	}
}

func defaultApplication() Application {
	return Application{
		PoolMode:              "transaction",
		MaxConnections:        4,
		MaxPinned:             1,
		AdvisoryLocks:         "pin",
		SessionState:          "pin",
		WaitTimeout:           5 * time.Second,
		MaxPreparedStatements: 200,
	}
}

func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "lockpool"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// Allowed keys per section.
var (
	topKeys = []string{"listen", "admin_listen", "auth_method", "instance_id", "leak_check_interval",
		"shutdown_timeout", "client_login_timeout", "idle_transaction_timeout", "max_message_size",
		"max_client_connections", "admin_token",
		"tls", "server", "users", "applications", "leases", "auth_query"}
	authQueryKeys = []string{"user", "password", "database", "query", "cache_ttl"}
	tlsKeys       = []string{"cert_file", "key_file", "required"}
	serverKeys    = []string{"host", "port", "max_connections", "idle_timeout", "max_lifetime", "connect_timeout", "tls", "ca_file"}
	userKeys      = []string{"name", "password"}
	appKeys       = []string{"name", "user", "database", "pool_mode", "max_connections", "max_pinned",
		"advisory_locks", "session_state", "wait_timeout", "max_prepared_statements", "max_clients"}
	leasesKeys = []string{"schema", "max_connections"}
)

// parser collects errors and remembers where each section was written, so
// cross-field validation can point at the right line.
type parser struct {
	path   string
	getenv func(string) (string, bool)
	errs   []*Error

	top, tls, server, leases *section
	users, apps              []*section
	usersLine, appsLine      int
	usersBad, appsBad        bool // users/applications was not a list (already reported)
}

func (p *parser) errorf(line int, format string, args ...any) {
	if line < 1 {
		line = 1
	}
	p.errs = append(p.errs, &Error{Path: p.path, Line: line, Msg: fmt.Sprintf(format, args...)})
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decodeYAML checks the text and decodes exactly one YAML document. It
// returns the root node (nil for an empty document).
func (p *parser) decodeYAML(data []byte) (root *yaml.Node, err error) {
	if line, msg := checkText(data); msg != "" {
		return nil, &Error{Path: p.path, Line: line, Msg: msg}
	}
	// yaml.v3 is not known to panic on any input, but a config file must
	// never crash the process: turn a panic into an error.
	defer func() {
		if r := recover(); r != nil {
			root, err = nil, &Error{Path: p.path, Line: 1, Msg: "invalid YAML (the YAML parser failed)"}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, p.yamlError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, p.yamlError(err)
		}
		return nil, &Error{Path: p.path, Line: max(extra.Line, 1), Msg: "only one YAML document is allowed (remove the second ---)"}
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil, nil
		}
		return doc.Content[0], nil
	}
	return &doc, nil
}

func (p *parser) yamlError(err error) error {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Path: p.path, Line: max(line, 1), Msg: "invalid YAML: " + m[2]}
	}
	// yaml.v3 omits the line when the problem is on the first line.
	return &Error{Path: p.path, Line: 1, Msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// checkText rejects invalid UTF-8 and control characters with their line,
// which yaml.v3 reports without one.
func checkText(data []byte) (line int, msg string) {
	line = 1
	for i := 0; i < len(data); {
		c := data[i]
		if c == '\n' {
			line++
			i++
			continue
		}
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\t' && c != '\r') || c == 0x7f {
				return line, fmt.Sprintf("control character %U is not allowed", rune(c))
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return line, "the file is not valid UTF-8"
		}
		i += size
	}
	return 0, ""
}

// section is a YAML mapping of a known shape.
type section struct {
	where string // key path prefix for messages: "", "server", "applications[0]"
	line  int    // line to blame for keys that are not written
	vals  map[string]*yaml.Node
	lines map[string]int // line of each written key
}

// lineOf is the line of key when written, else the section's line.
func (s *section) lineOf(key string) int {
	if l, ok := s.lines[key]; ok {
		return l
	}
	return s.line
}

func (s *section) has(key string) bool { _, ok := s.vals[key]; return ok }

// name is the key path of key for messages.
func (s *section) name(key string) string {
	if s.where == "" {
		return key
	}
	return s.where + "." + key
}

func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a single value"
	}
	return "something else"
}

// section reads n as a mapping with the allowed keys. A missing or null node
// is an empty section blamed on line.
func (p *parser) section(n *yaml.Node, where string, line int, allowed []string) *section {
	s := &section{where: where, line: max(line, 1), vals: map[string]*yaml.Node{}, lines: map[string]int{}}
	n = deref(n)
	if isNull(n) {
		return s
	}
	if n.Kind != yaml.MappingNode {
		label := where
		if label == "" {
			label = "the top level"
		}
		errLine := line // the key's line
		if where == "" {
			errLine = n.Line
		}
		p.errorf(errLine, "%s must be a mapping of keys to values, not %s", label, kindName(n))
		return s
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k == nil || k.Kind != yaml.ScalarNode {
			p.errorf(n.Content[i].Line, "%s: keys must be plain names", labelOf(where))
			continue
		}
		key := k.Value
		if key == "<<" {
			p.errorf(k.Line, "%s: YAML merge keys (<<) are not supported; write the keys out", labelOf(where))
			continue
		}
		if !contains(allowed, key) {
			p.errorf(k.Line, "unknown key %q in %s (known keys: %s)", truncate(key, 60), labelOf(where), strings.Join(allowed, ", "))
			continue
		}
		if prev, dup := s.lines[key]; dup {
			p.errorf(k.Line, "%s is written twice (first at line %d)", s.name(key), prev)
			continue
		}
		s.vals[key] = v
		s.lines[key] = k.Line
	}
	return s
}

func labelOf(where string) string {
	if where == "" {
		return "the top level"
	}
	return where
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// list reads s[key] as a sequence. Missing or null is an empty list; ok is
// false when an error was reported.
func (p *parser) list(s *section, key string) (items []*yaml.Node, ok bool) {
	n := deref(s.vals[key])
	if isNull(n) {
		return nil, true
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(s.lineOf(key), "%s must be a list (items start with -), not %s", s.name(key), kindName(n))
		return nil, false
	}
	return n.Content, true
}

// scalar returns the expanded text of s[key]. ok is false when the key is
// not written or an error was reported; null reports an empty value.
// Messages reported here never contain the value. shown is what messages
// about the value may quote: the value as written, so that the value of an
// environment variable is never printed.
func (p *parser) scalar(s *section, key string) (val, shown string, null, ok bool) {
	n, present := s.vals[key]
	if !present {
		return "", "", false, false
	}
	n = deref(n)
	line := s.lineOf(key)
	if isNull(n) {
		return "", `""`, true, true
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(line, "%s must be a single value, not %s", s.name(key), kindName(n))
		return "", "", false, false
	}
	out, msg := expand(n.Value, p.getenv)
	if msg != "" {
		p.errorf(line, "%s: %s", s.name(key), msg)
		return "", "", false, false
	}
	shown = strconv.Quote(truncate(n.Value, 60))
	if out != n.Value {
		shown += " (after ${} expansion)"
	}
	return out, shown, false, true
}

func (p *parser) str(s *section, key string, dst *string) {
	if v, _, _, ok := p.scalar(s, key); ok {
		*dst = v
	}
}

func (p *parser) boolean(s *section, key string, dst *bool) {
	v, shown, null, ok := p.scalar(s, key)
	if !ok {
		return
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "yes", "on":
		*dst = true
	case "false", "no", "off":
		*dst = false
	default:
		_ = null
		p.errorf(s.lineOf(key), "%s: %s is not true or false", s.name(key), shown)
	}
}

func (p *parser) enum(s *section, key string, dst *string, options ...string) {
	v, shown, null, ok := p.scalar(s, key)
	if !ok {
		return
	}
	if null || !contains(options, v) {
		p.errorf(s.lineOf(key), "%s: %s is not one of %s", s.name(key), shown, strings.Join(options, ", "))
		return
	}
	*dst = v
}

func (p *parser) int(s *section, key string, dst *int) {
	v, shown, null, ok := p.scalar(s, key)
	if !ok {
		return
	}
	if null {
		p.errorf(s.lineOf(key), "%s: missing value (an integer)", s.name(key))
		return
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 0)
	if err != nil {
		p.errorf(s.lineOf(key), "%s: %s is not an integer", s.name(key), shown)
		return
	}
	*dst = int(n)
}

func (p *parser) duration(s *section, key string, dst *time.Duration) {
	v, shown, null, ok := p.scalar(s, key)
	if !ok {
		return
	}
	if null {
		p.errorf(s.lineOf(key), "%s: missing value (a duration such as 250ms, 5s, 1m)", s.name(key))
		return
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		p.errorf(s.lineOf(key), "%s: %s is not a duration (write a number with a unit: 250ms, 5s, 1m, 1h)", s.name(key), shown)
		return
	}
	*dst = d
}

func (p *parser) size(s *section, key string, dst *int) {
	v, shown, null, ok := p.scalar(s, key)
	if !ok {
		return
	}
	if null {
		p.errorf(s.lineOf(key), "%s: missing value (bytes, or a size such as 64MB)", s.name(key))
		return
	}
	n, ok := parseSize(v)
	if !ok {
		p.errorf(s.lineOf(key), "%s: %s is not a size (write bytes, or a number with kB, MB or GB: 64MB)", s.name(key), shown)
		return
	}
	*dst = n
}

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"kB": 1 << 10, "KB": 1 << 10, "KiB": 1 << 10,
	"MB": 1 << 20, "MiB": 1 << 20,
	"GB": 1 << 30, "GiB": 1 << 30,
}

// parseSize parses "123", "64MB", "64 MB" (units are powers of 1024).
func parseSize(s string) (int, bool) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return 0, false
	}
	mult, ok := sizeUnits[strings.TrimSpace(s[i:])]
	if !ok {
		return 0, false
	}
	if n > math.MaxInt/mult {
		return math.MaxInt, true // too large; the range check reports it
	}
	return int(n * mult), true
}

// expand replaces ${NAME} in s. msg is non-empty on error and never contains
// the value of s or of a variable.
func expand(s string, getenv func(string) (string, bool)) (out string, msg string) {
	if !strings.Contains(s, "${") {
		return s, ""
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if strings.HasPrefix(s[i:], "$${") {
			b.WriteString("${")
			i += 3
			continue
		}
		if !strings.HasPrefix(s[i:], "${") {
			b.WriteByte(s[i])
			i++
			continue
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return "", "unterminated ${ (write ${NAME}, or $${ for a literal ${)"
		}
		name := s[i+2 : i+2+end]
		if !validVarName(name) {
			return "", "invalid environment variable reference: ${ must be followed by a name made of letters, digits and _ and then } (write $${ for a literal ${)"
		}
		v, ok := getenv(name)
		if !ok {
			return "", fmt.Sprintf("environment variable %s is not set", name)
		}
		b.WriteString(v)
		i += 2 + end + 1
	}
	return b.String(), ""
}

func validVarName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// config fills cfg from the root node, on top of the defaults.
func (p *parser) config(root *yaml.Node, cfg *Config) {
	top := p.section(root, "", 1, topKeys)
	p.top = top
	if n := deref(root); !isNull(n) && n.Kind != yaml.MappingNode {
		p.usersBad, p.appsBad = true, true // only the one error above
	}
	p.str(top, "listen", &cfg.Listen)
	p.str(top, "admin_listen", &cfg.AdminListen)
	p.enum(top, "auth_method", &cfg.AuthMethod, "scram-sha-256", "md5", "trust")
	p.str(top, "instance_id", &cfg.InstanceID)
	p.duration(top, "leak_check_interval", &cfg.LeakCheckInterval)
	p.duration(top, "shutdown_timeout", &cfg.ShutdownTimeout)
	p.duration(top, "client_login_timeout", &cfg.ClientLoginTimeout)
	p.duration(top, "idle_transaction_timeout", &cfg.IdleTransactionTimeout)
	p.size(top, "max_message_size", &cfg.MaxMessageSize)
	p.int(top, "max_client_connections", &cfg.MaxClientConnections)
	p.str(top, "admin_token", &cfg.AdminToken)
	if cfg.InstanceID == "" {
		cfg.InstanceID = defaultInstanceID()
	}

	if top.has("tls") {
		n := deref(top.vals["tls"])
		if isNull(n) {
			p.errorf(top.lineOf("tls"), "tls is empty: set cert_file and key_file, or remove tls to serve without TLS")
		} else {
			s := p.section(n, "tls", top.lineOf("tls"), tlsKeys)
			p.tls = s
			cfg.TLS = &TLS{}
			p.str(s, "cert_file", &cfg.TLS.CertFile)
			p.str(s, "key_file", &cfg.TLS.KeyFile)
			p.boolean(s, "required", &cfg.TLS.Required)
		}
	}

	s := p.section(top.vals["server"], "server", top.lineOf("server"), serverKeys)
	p.server = s
	p.str(s, "host", &cfg.Server.Host)
	p.int(s, "port", &cfg.Server.Port)
	p.int(s, "max_connections", &cfg.Server.MaxConnections)
	p.duration(s, "idle_timeout", &cfg.Server.IdleTimeout)
	p.duration(s, "max_lifetime", &cfg.Server.MaxLifetime)
	p.duration(s, "connect_timeout", &cfg.Server.ConnectTimeout)
	p.enum(s, "tls", &cfg.Server.TLS, "disable", "prefer", "require", "verify-full")
	p.str(s, "ca_file", &cfg.Server.CAFile)

	p.usersLine = top.lineOf("users")
	users, ok := p.list(top, "users")
	p.usersBad = p.usersBad || !ok
	for i, n := range users {
		s := p.section(n, fmt.Sprintf("users[%d]", i), itemLine(n, p.usersLine), userKeys)
		p.users = append(p.users, s)
		var u User
		p.str(s, "name", &u.Name)
		p.str(s, "password", &u.Password) // never put u.Password in a message
		cfg.Users = append(cfg.Users, u)
	}

	p.appsLine = top.lineOf("applications")
	apps, ok := p.list(top, "applications")
	p.appsBad = p.appsBad || !ok
	for i, n := range apps {
		s := p.section(n, fmt.Sprintf("applications[%d]", i), itemLine(n, p.appsLine), appKeys)
		p.apps = append(p.apps, s)
		a := defaultApplication()
		p.str(s, "name", &a.Name)
		p.str(s, "user", &a.User)
		p.str(s, "database", &a.Database)
		p.enum(s, "pool_mode", &a.PoolMode, "transaction", "session")
		p.int(s, "max_connections", &a.MaxConnections)
		p.int(s, "max_pinned", &a.MaxPinned)
		p.enum(s, "advisory_locks", &a.AdvisoryLocks, "pin", "reject", "allow")
		p.enum(s, "session_state", &a.SessionState, "pin", "reject", "allow")
		p.duration(s, "wait_timeout", &a.WaitTimeout)
		p.int(s, "max_prepared_statements", &a.MaxPreparedStatements)
		p.int(s, "max_clients", &a.MaxClients)
		cfg.Applications = append(cfg.Applications, a)
	}

	if top.has("auth_query") {
		aq := p.section(top.vals["auth_query"], "auth_query", top.lineOf("auth_query"), authQueryKeys)
		cfg.AuthQuery = &AuthQuery{Database: "postgres", Query: "SELECT usename, passwd FROM lockpool.user_lookup($1)", CacheTTL: 60 * time.Second}
		p.str(aq, "user", &cfg.AuthQuery.User)
		p.str(aq, "password", &cfg.AuthQuery.Password)
		p.str(aq, "database", &cfg.AuthQuery.Database)
		p.str(aq, "query", &cfg.AuthQuery.Query)
		p.duration(aq, "cache_ttl", &cfg.AuthQuery.CacheTTL)
		if cfg.AuthQuery.User == "" {
			p.errorf(top.lineOf("auth_query"), "auth_query.user is required (the role that runs the lookup)")
		}
	}

	s = p.section(top.vals["leases"], "leases", top.lineOf("leases"), leasesKeys)
	p.leases = s
	p.str(s, "schema", &cfg.Leases.Schema)
	p.int(s, "max_connections", &cfg.Leases.MaxConnections)
}

func itemLine(n *yaml.Node, fallback int) int {
	if n = deref(n); n != nil && n.Line > 0 {
		return n.Line
	}
	return fallback
}
