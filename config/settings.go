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
	// means it needs a restart (the key table's restart mark, which
	// [RestartNeeded] reports from too).
	Reload bool `json:"changeable"`
}

// Settings lists the value of every key outside the users and
// applications lists, in the order of the key table; a key of an optional
// section that is not configured shows "". Passwords and admin_token show
// as "(set)" when set.
func (c *Config) Settings() []Setting { return c.SettingsInForce(c) }

// SettingsInForce is [Config.Settings] after reloads from started, the
// configuration lockpool started with, to c: a key a reload does not apply
// (Reload false) shows started's value, which stays in force until a
// restart.
func (c *Config) SettingsInForce(started *Config) []Setting {
	var out []Setting
	for i := range keys {
		k := &keys[i]
		if !k.isValue() || strings.Contains(k.path, "[]") {
			continue
		}
		st := Setting{Key: k.path, Default: k.def, Reload: !k.restart}
		if k.shown != "" {
			st.Default = k.shown
		}
		from := c
		if k.restart {
			from = started
		}
		if parent := sectionOf(from, k.parent()); parent != nil {
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
