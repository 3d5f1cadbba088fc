package config

import (
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// sectionTargets returns, for the top level and every section or list, a
// fresh struct of the type its keys fill.
func sectionTargets(t *testing.T) map[string]any {
	t.Helper()
	targets := map[string]any{"": &Config{}}
	for i := range keys {
		k := &keys[i]
		if !k.isValue() {
			targets[k.path] = k.at(&Config{})
		}
	}
	return targets
}

// TestKeyTable checks that the declarations are consistent: every key sits
// in a declared section, is stored in a field of the right type, has a
// default that converts and passes its own check, and documents itself.
func TestKeyTable(t *testing.T) {
	targets := sectionTargets(t)
	seen := map[string]bool{}
	for i := range keys {
		k := &keys[i]
		t.Run(k.path, func(t *testing.T) {
			if seen[k.path] {
				t.Fatalf("declared twice")
			}
			seen[k.path] = true
			if !regexp.MustCompile(`^[a-z_]+(\[\])?(\.[a-z_]+)?$`).MatchString(k.path) {
				t.Errorf("path is not name, section.name or list[].name")
			}
			if k.meaning == "" || strings.ContainsAny(k.meaning, "\n|") {
				t.Errorf("meaning %q must be one line without |", k.meaning)
			}
			var parent *key
			if p := k.parent(); p != "" {
				for j := range keys[:i] {
					if keys[j].path == p {
						parent = &keys[j]
					}
				}
				if parent == nil || parent.isValue() {
					t.Fatalf("section or list %q is not declared before the key", p)
				}
				if isItem := strings.Contains(k.path, "[]."); isItem != (parent.kind == kindList) {
					t.Errorf("[] must mark exactly the keys of a list")
				}
			}
			if parent != nil && parent.restart && !k.restart {
				t.Errorf("section %s needs a restart, so must each of its keys", parent.path)
			}
			if k.restart && k.kind == kindList {
				t.Errorf("restart marks a list's keys, not the list")
			}
			if !k.isValue() {
				if k.def != "" || k.check != nil || k.options != nil {
					t.Errorf("a section has no default, check or options")
				}
				return
			}
			if k.optional || k.empty != "" {
				t.Errorf("optional and empty are for sections")
			}
			dst := k.at(targets[k.parent()])
			want := map[kind]any{
				kindString: new(string), kindEnum: new(string), kindNames: new(string), kindBool: new(bool),
				kindInt: new(int), kindSize: new(int), kindDuration: new(time.Duration),
			}[k.kind]
			if reflect.TypeOf(dst) != reflect.TypeOf(want) {
				t.Fatalf("stored in a %T, want %T for its kind", dst, want)
			}
			if p := k.set(dst, k.def, false, `"`+k.def+`"`); p != "" {
				t.Fatalf("default: %s", p)
			}
			if k.check != nil {
				v := load(dst)
				if msg := k.check(k.path, v, `"x"`); msg != "" {
					t.Errorf("the default fails the key's own check: %s", msg)
				}
			}
			if (k.kind == kindEnum) != (len(k.options) > 0) {
				t.Errorf("options are for enums, and an enum needs them")
			}
			for _, o := range k.options {
				if !strings.Contains(k.meaning, "`"+o+"`") {
					t.Errorf("meaning does not name option `%s`", o)
				}
			}
		})
	}
}

// TestKeyTableCoversStructs checks that every field of the config structs
// is declared by exactly one key (Config.Path is not a key).
func TestKeyTableCoversStructs(t *testing.T) {
	for path, target := range sectionTargets(t) {
		v := reflect.ValueOf(target).Elem()
		for f := range v.NumField() {
			field := v.Type().Field(f)
			if path == "" && field.Name == "Path" {
				continue
			}
			var by []string
			addr := v.Field(f).Addr().Interface()
			for _, k := range children(path) {
				if k.isValue() || k.kind == kindSection && !k.optional {
					if k.at(target) == addr {
						by = append(by, k.path)
					}
					continue
				}
				// Optional sections and lists set their field.
				fresh := reflect.New(v.Type())
				k.at(fresh.Interface())
				if !fresh.Elem().Field(f).IsZero() {
					by = append(by, k.path)
				}
			}
			if len(by) != 1 {
				t.Errorf("%s.%s is declared by %v, want one key", v.Type().Name(), field.Name, by)
			}
		}
	}
}

// TestReferencePage fails when docs/configuration.md is not the page the
// declarations generate.
func TestReferencePage(t *testing.T) {
	doc, err := os.ReadFile("../" + ReferencePath)
	if err != nil {
		t.Fatalf("%v (run go generate ./config)", err)
	}
	want := Reference()
	if string(doc) != want {
		got := strings.Split(string(doc), "\n")
		for i, l := range strings.Split(want, "\n") {
			if i >= len(got) || got[i] != l {
				t.Fatalf("%s is out of date (run go generate ./config); first difference at line %d:\npage:      %q\ngenerated: %q",
					ReferencePath, i+1, strings.Join(got[i:min(i+1, len(got))], ""), l)
			}
		}
		t.Fatalf("%s is out of date (run go generate ./config)", ReferencePath)
	}
}

// TestReferenceMarksRestartKeys: every value key has one row, with its
// reload mark.
func TestReferenceMarksRestartKeys(t *testing.T) {
	page := Reference()
	for i := range keys {
		k := &keys[i]
		if !k.isValue() {
			continue
		}
		mark := "applied"
		if k.restart {
			mark = "**restart**"
		}
		prefix := "| `" + k.path + "` | "
		var rows []string
		for _, l := range strings.Split(page, "\n") {
			if strings.HasPrefix(l, prefix) {
				rows = append(rows, l)
			}
		}
		if len(rows) != 1 || strings.Split(rows[0], " | ")[2] != mark {
			t.Errorf("%s: rows %q, want one marked %s", k.path, rows, mark)
		}
	}
}

// TestShippedConfigListsEveryKey checks that config.yaml shows every
// declared key (commented-out keys count) and no other, each with its
// default unless the key has none to show.
func TestShippedConfigListsEveryKey(t *testing.T) {
	data, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Uncomment "# key: value" lines, keeping their indentation.
	text := regexp.MustCompile(`(?m)^(\s*)# ?(\s*[a-z_]+:)`).ReplaceAllString(string(data), "$1$2")
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(text), &root); err != nil {
		t.Fatalf("config.yaml with keys uncommented: %v", err)
	}
	found := map[string]*yaml.Node{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			path, v := prefix+n.Content[i].Value, n.Content[i+1]
			found[path] = v
			switch v.Kind {
			case yaml.MappingNode:
				walk(v, path+".")
			case yaml.SequenceNode:
				for _, item := range v.Content {
					walk(item, path+"[].")
				}
			}
		}
	}
	walk(root.Content[0], "")
	for i := range keys {
		k := &keys[i]
		n, ok := found[k.path]
		switch {
		case !ok:
			t.Errorf("config.yaml does not show %s", k.path)
		case k.isValue() && k.shown == "" && withDefaults(n.Value) != k.def:
			t.Errorf("config.yaml shows %s: %q, but its default is %q", k.path, n.Value, k.def)
		}
		delete(found, k.path)
	}
	for _, p := range slices.Sorted(maps.Keys(found)) {
		t.Errorf("config.yaml shows %s, which is not a declared key", p)
	}
}

// withDefaults expands v with no variable set, so ${VAR:-default} shows
// its default.
func withDefaults(v string) string {
	out, msg := expand(v, func(string) (string, bool) { return "", false })
	if msg != "" {
		return v
	}
	return out
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int]string{1 << 10: "1kB", 1 << 30: "1GB", 64 << 20: "64MB", 1536: "1536B", 0: "0B", 3 << 10: "3kB"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestOptionalSections: tls and auth_query stay nil when not written, get
// their defaults when written, and report what is missing.
func TestOptionalSections(t *testing.T) {
	const base = "applications: [{name: api, user: app}]\n"
	const users = "users: [{name: app, password: pw}]\n"
	defaultQuery := "SELECT usename, passwd FROM lockpool.user_lookup($1)"
	for _, tc := range []struct {
		name, in string
		tls      *TLS
		aq       *AuthQuery
		err      string
	}{
		{name: "neither", in: base + users},
		{name: "tls defaults", in: base + users + "tls: {cert_file: c.pem, key_file: k.pem}\n",
			tls: &TLS{CertFile: "c.pem", KeyFile: "k.pem"}},
		{name: "tls written", in: base + users + "tls: {cert_file: c.pem, key_file: k.pem, required: on}\n",
			tls: &TLS{CertFile: "c.pem", KeyFile: "k.pem", Required: true}},
		{name: "tls not a mapping", in: base + users + "tls: yes\n",
			err: "p.yaml:3: tls must be a mapping of keys to values, not a single value\n" +
				"p.yaml:3: tls.cert_file is required when tls is set (remove tls to serve without TLS)\n" +
				"p.yaml:3: tls.key_file is required when tls is set (remove tls to serve without TLS)"},
		{name: "auth_query defaults, no users", in: base + "auth_query: {user: lp_auth}\n",
			aq: &AuthQuery{User: "lp_auth", Database: "postgres", Query: defaultQuery, CacheTTL: time.Minute}},
		{name: "auth_query written", in: base + "auth_query:\n  user: lp_auth\n  password: s\n  database: auth\n  query: SELECT 1\n  cache_ttl: 5s\n",
			aq: &AuthQuery{User: "lp_auth", Password: "s", Database: "auth", Query: "SELECT 1", CacheTTL: 5 * time.Second}},
		{name: "auth_query without user", in: base + users + "auth_query: {password: s}\n",
			err: "p.yaml:3: auth_query.user is required (the role that runs the lookup)"},
		{name: "auth_query empty", in: base + users + "auth_query:\n",
			err: "p.yaml:3: auth_query.user is required (the role that runs the lookup)"},
		{name: "auth_query bad duration", in: base + users + "auth_query: {user: u, cache_ttl: 5}\n",
			err: `p.yaml:3: auth_query.cache_ttl: "5" is not a duration (write a number with a unit: 250ms, 5s, 1m, 1h)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.in), "p.yaml", nil)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error =\n%v\nwant\n%s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c.TLS == nil) != (tc.tls == nil) || c.TLS != nil && *c.TLS != *tc.tls {
				t.Errorf("TLS = %+v, want %+v", c.TLS, tc.tls)
			}
			if (c.AuthQuery == nil) != (tc.aq == nil) || c.AuthQuery != nil && *c.AuthQuery != *tc.aq {
				t.Errorf("AuthQuery = %+v, want %+v", c.AuthQuery, tc.aq)
			}
		})
	}
}

// TestEmptySections: server: and leases: written with no value mean their
// defaults.
func TestEmptySections(t *testing.T) {
	c, err := Parse([]byte("server:\nleases: ~\nusers: [{name: app, password: pw}]\napplications: [{name: api, user: app}]\n"), "p.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Server{Host: "127.0.0.1", Port: 5432, MaxConnections: 20, IdleTimeout: 10 * time.Minute, MaxLifetime: time.Hour, ConnectTimeout: 5 * time.Second, DialConcurrency: 4, TLS: "prefer", HealthCheckInterval: time.Second, TCPUserTimeout: 15 * time.Second}
	if c.Server != want || c.Leases != (Leases{Schema: "lockpool", MaxConnections: 2}) {
		t.Errorf("Server = %+v, Leases = %+v", c.Server, c.Leases)
	}
}
