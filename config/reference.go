package config

import (
	"fmt"
	"strings"
)

// ReferencePath is where the configuration reference lives, relative to
// the repository's root.
const ReferencePath = "docs/configuration.md"

// referenceIntro is the reference's text before the tables: how the file
// is read and reloaded.
const referenceIntro = `# Configuration reference

<!-- Generated from the key table in config/keys.go by ` + "`go generate ./config`" + `; do not edit. -->

lockpool reads one YAML file, named with ` + "`-config FILE`" + ` (default ` + "`config.yaml`" + `;
[` + "`config.yaml`" + `](../config.yaml) is a commented example). The file is strict: unknown keys,
a key written twice, YAML merge keys (` + "`<<`" + `) and a second YAML document are errors.
` + "`lockpool -check -config FILE`" + ` reads and validates the file without starting, prints every
problem with its file and line, and exits with status 0 when the file is valid.

Every value may contain ` + "`${VAR}`" + `, replaced by that environment variable before the value is
converted (an unset variable is an error); ` + "`${VAR:-default}`" + ` takes ` + "`default`" + ` when ` + "`VAR`" + ` is
unset or empty, as in the shell, and ` + "`$${`" + ` is a literal ` + "`${`" + `. Keys are never expanded. Durations
take a unit (` + "`250ms`, `5s`, `1m`, `1h30m`" + `; a bare ` + "`0`" + ` also works); sizes are bytes or a number
with ` + "`kB`, `MB` or `GB`" + `, powers of 1024 as in postgresql.conf.

SIGHUP, or ` + "`RELOAD`" + ` on the admin console, reads the file again. A file with errors is logged and
changes nothing. Otherwise the keys marked *applied* in the column "reload" take effect at once, for
new logins, connections and checks (connected clients stay connected); a key marked *restart* keeps
the value lockpool started with until it is restarted, and the reload logs a WARN line naming those
changed keys (` + "`restart_needed=listen,tls`" + `). The admin console's ` + "`SHOW CONFIG`" + ` lists the values in
force, with the same mark in its column ` + "`changeable`" + `.
`

// Reference returns the configuration reference, docs/configuration.md:
// [referenceIntro], then one table per section (key, default, reload,
// meaning), generated from the key declarations.
func Reference() string {
	var b strings.Builder
	b.WriteString(referenceIntro)
	section := ""
	for i := range keys {
		k := &keys[i]
		if !k.isValue() {
			continue
		}
		if p := k.parent(); p != section || i == 0 {
			section = p
			if p == "" {
				b.WriteString("\n## Top level\n\n")
			} else {
				sk := keyAt(p)
				name := "`" + p + "`"
				if sk.kind == kindList {
					name = "`" + p + "[]`"
				}
				fmt.Fprintf(&b, "\n## %s\n\n%s.\n\n", name, upperFirst(sk.meaning))
			}
			b.WriteString("| key | default | reload | meaning |\n| --- | --- | --- | --- |\n")
		}
		def := k.shown
		if def == "" {
			def = "`" + k.def + "`"
			if k.def == "" {
				def = "`\"\"`"
			}
		}
		reload := "applied"
		if k.restart {
			reload = "**restart**"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.path, cell(def), reload, cell(k.meaning))
	}
	return b.String()
}

// upperFirst capitalises the first letter of a sentence.
func upperFirst(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

// cell escapes the one character that would end a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
