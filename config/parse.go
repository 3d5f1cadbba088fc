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
	p := &parser{path: name, getenv: getenv, sections: map[string]*section{}, lists: map[string]*list{}}
	root, err := p.decodeYAML(data)
	if err != nil {
		return nil, err
	}
	cfg := &Config{Path: path}
	p.sections[""] = p.fill(root, "", "", 1, cfg)
	if cfg.InstanceID == "" {
		cfg.InstanceID = defaultInstanceID()
	}
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

func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "lockpool"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// parser collects errors and remembers where each section was written, so
// cross-field validation can point at the right line.
type parser struct {
	path   string
	getenv func(string) (string, bool)
	errs   []*Error

	sections map[string]*section // by path: "" (the top level), "server", "tls", ...; absent when not filled
	lists    map[string]*list    // by path: "users", "applications"
}

// list is a list of sections as written.
type list struct {
	line  int        // line of the list's key, or of its section when not written
	bad   bool       // it was not a list (already reported)
	items []*section // one per item, in order
}

func (p *parser) errorf(line int, format string, args ...any) {
	if line < 1 {
		line = 1
	}
	// One error, one line: a value decoded with a line break (a folded or
	// escaped YAML string) is shown escaped.
	msg := lineBreaks.Replace(fmt.Sprintf(format, args...))
	p.errs = append(p.errs, &Error{Path: p.path, Line: line, Msg: msg})
}

var lineBreaks = strings.NewReplacer("\n", `\n`, "\r", `\r`)

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
	where  string // key path prefix for messages: "", "server", "applications[0]"
	line   int    // line to blame for keys that are not written
	vals   map[string]*yaml.Node
	lines  map[string]int  // line of each written key
	failed map[string]bool // keys whose value was reported as wrong
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
	s := &section{where: where, line: max(line, 1), vals: map[string]*yaml.Node{}, lines: map[string]int{}, failed: map[string]bool{}}
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
// not written or an error was reported (and s.failed[key] set); null
// reports an empty value.
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
		s.failed[key] = true
		return "", "", false, false
	}
	out, msg := expand(n.Value, p.getenv)
	if msg != "" {
		p.errorf(line, "%s: %s", s.name(key), msg)
		s.failed[key] = true
		return "", "", false, false
	}
	shown = strconv.Quote(truncate(n.Value, 60))
	if out != n.Value {
		shown += " (after ${} expansion)"
	}
	return out, shown, false, true
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
		name, def, hasDef := strings.Cut(name, ":-")
		if !validVarName(name) {
			return "", "invalid environment variable reference: ${ must be followed by a name made of letters, digits and _ and then } or :-default} (write $${ for a literal ${)"
		}
		v, ok := getenv(name)
		if hasDef && v == "" {
			v, ok = def, true // as in the shell: unset or empty takes the default
		}
		if !ok {
			return "", fmt.Sprintf("environment variable %s is not set (write ${%s:-default} for a default)", name, name)
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

// fill reads the mapping n, the section or list item declared by the key
// at path ("" for the top level), into target, the struct that key's at
// returned: every key of the section first gets its default, then its
// written value; then the keys' checks run. where names the mapping in
// messages ("", "server", "applications[0]"); line is blamed for keys that
// are not written.
func (p *parser) fill(n *yaml.Node, path, where string, line int, target any) *section {
	decl := children(path)
	names := make([]string, len(decl))
	for i, k := range decl {
		names[i] = k.name()
	}
	s := p.section(n, where, line, names)
	notMapping := !isNull(deref(n)) && deref(n).Kind != yaml.MappingNode
	dsts := make([]any, len(decl))
	for i, k := range decl {
		switch k.kind {
		case kindSection:
			p.fillSection(s, k, target)
		case kindList:
			p.fillList(s, k, target, notMapping)
		default:
			dsts[i] = k.at(target)
			k.setDefault(dsts[i])
			p.value(s, k, dsts[i])
		}
	}
	for i, k := range decl {
		if k.check == nil || s.failed[k.name()] {
			continue
		}
		v := load(dsts[i])
		quoted := ""
		if str, ok := v.(string); ok {
			quoted = p.quote(s, k.name(), str)
		}
		if msg := k.check(s.name(k.name()), v, quoted); msg != "" {
			p.errorf(s.lineOf(k.name()), "%s", msg)
		}
	}
	return s
}

// value reads the written value of k, if any, from s into dst.
func (p *parser) value(s *section, k *key, dst any) {
	if n := deref(s.vals[k.name()]); k.kind == kindNames && n != nil && n.Kind == yaml.SequenceNode {
		p.names(s, k, n, dst.(*string))
		return
	}
	text, shown, null, ok := p.scalar(s, k.name())
	if !ok {
		return
	}
	if problem := k.set(dst, text, null, shown); problem != "" {
		p.errorf(s.lineOf(k.name()), "%s: %s", s.name(k.name()), problem)
		s.failed[k.name()] = true
	}
}

// names reads k, a kindNames key written as the YAML list n, into dst as
// comma-separated names. Each item must be a single value without a comma.
func (p *parser) names(s *section, k *key, n *yaml.Node, dst *string) {
	var out []string
	for i, item := range n.Content {
		name := fmt.Sprintf("%s[%d]", s.name(k.name()), i)
		line := itemLine(item, s.lineOf(k.name()))
		item = deref(item)
		if item == nil || item.Kind != yaml.ScalarNode || isNull(item) {
			kind := "an empty value"
			if item != nil && !isNull(item) {
				kind = kindName(item)
			}
			p.errorf(line, "%s must be a name, not %s", name, kind)
			s.failed[k.name()] = true
			continue
		}
		v, msg := expand(item.Value, p.getenv)
		if msg != "" {
			p.errorf(line, "%s: %s", name, msg)
			s.failed[k.name()] = true
			continue
		}
		if strings.Contains(v, ",") {
			p.errorf(line, "%s: %s contains a comma; write one name per item", name, strconv.Quote(truncate(item.Value, 60)))
			s.failed[k.name()] = true
			continue
		}
		out = append(out, strings.TrimSpace(v))
	}
	*dst = strings.Join(out, ",")
}

// fillSection reads the section k of s. An optional section that is not
// written stays nil; any other is filled, from defaults when not written.
func (p *parser) fillSection(s *section, k *key, parent any) {
	name := k.name()
	if !s.has(name) && k.optional {
		return
	}
	if s.has(name) && k.empty != "" && isNull(deref(s.vals[name])) {
		p.errorf(s.lineOf(name), "%s", k.empty)
		return
	}
	p.sections[k.path] = p.fill(s.vals[name], k.path, s.name(name), s.lineOf(name), k.at(parent))
}

// fillList reads the list k of s, one item at a time. parentBad: s itself
// was not a mapping (already reported), so the list is not reported missing.
func (p *parser) fillList(s *section, k *key, parent any, parentBad bool) {
	name := k.name()
	l := &list{line: s.lineOf(name), bad: parentBad}
	p.lists[k.path] = l
	items, ok := p.list(s, name)
	l.bad = l.bad || !ok
	for i, n := range items {
		where := fmt.Sprintf("%s[%d]", s.name(name), i)
		l.items = append(l.items, p.fill(n, k.path, where, itemLine(n, l.line), k.at(parent)))
	}
}

func itemLine(n *yaml.Node, fallback int) int {
	if n = deref(n); n != nil && n.Line > 0 {
		return n.Line
	}
	return fallback
}
