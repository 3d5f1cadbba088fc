package config

import (
	"strconv"
	"strings"
	"time"
)

// Setting is one configuration key's value, as the admin console's SHOW
// CONFIG lists it.
type Setting struct {
	Key     string `json:"key"`
	Value   string `json:"value"`
	Default string `json:"default"`
	// Reload: a new value takes effect on reload (SIGHUP, RELOAD); false
	// means it needs a restart.
	Reload bool `json:"changeable"`
}

// restartKeys are the keys (or sections) a reload does not apply.
var restartKeys = []string{"listen", "admin_listen", "instance_id", "tls", "leases", "event_loops", "io_uring", "server.dial_concurrency", "handover_socket"}

// Settings lists the value of every key outside the users and
// applications lists, in the order of the key table. Passwords and
// admin_token show as "(set)" when set.
func (c *Config) Settings() []Setting {
	sections := map[string]any{"": c, "server": &c.Server, "leases": &c.Leases}
	if c.TLS != nil {
		sections["tls"] = c.TLS
	}
	if c.AuthQuery != nil {
		sections["auth_query"] = c.AuthQuery
	}
	var out []Setting
	for i := range keys {
		k := &keys[i]
		if !k.isValue() || strings.Contains(k.path, "[]") {
			continue
		}
		st := Setting{Key: k.path, Default: k.def, Reload: true}
		if k.shown != "" {
			st.Default = k.shown
		}
		for _, r := range restartKeys {
			if k.path == r || strings.HasPrefix(k.path, r+".") {
				st.Reload = false
			}
		}
		if parent, ok := sections[k.parent()]; ok {
			st.Value = formatValue(k, load(k.at(parent)))
		}
		if secret := k.name() == "password" || k.path == "admin_token"; secret && st.Value != "" {
			st.Value = "(set)"
		}
		out = append(out, st)
	}
	return out
}

// formatValue writes v, a value of k's kind, as it could be written in
// the file.
func formatValue(k *key, v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int:
		if k.kind == kindSize {
			for _, u := range []struct {
				unit string
				n    int
			}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}} {
				if x != 0 && x%u.n == 0 {
					return strconv.Itoa(x/u.n) + u.unit
				}
			}
		}
		return strconv.Itoa(x)
	case time.Duration:
		if x == 0 {
			return "0s"
		}
		return x.String()
	}
	return ""
}
