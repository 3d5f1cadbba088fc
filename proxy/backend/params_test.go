package backend

import (
	"maps"
	"testing"
)

// TestClientParamsShareStartupUntilChanged checks that the current values
// start as the startup map itself and that no change through set, replace or
// a later RESET ALL ever writes into the startup values.
func TestClientParamsShareStartupUntilChanged(t *testing.T) {
	type op struct {
		kind      string // set, replace (the values become {name: val}), resetAll
		name, val string
	}
	for _, c := range []struct {
		name    string
		startup map[string]string
		ops     []op
		want    map[string]string
	}{
		{"no parameters", nil, nil, nil},
		{"startup only", map[string]string{"application_name": "a"}, nil, map[string]string{"application_name": "a"}},
		{"set a new one", map[string]string{"application_name": "a"}, []op{{"set", "search_path", "s"}},
			map[string]string{"application_name": "a", "search_path": "s"}},
		{"set without startup values", nil, []op{{"set", "timezone", "UTC"}}, map[string]string{"timezone": "UTC"}},
		{"set a new one to the empty string", map[string]string{"application_name": "a"}, []op{{"set", "my.flag", ""}},
			map[string]string{"application_name": "a", "my.flag": ""}},
		{"set to the empty string without startup values", nil, []op{{"set", "my.flag", ""}}, map[string]string{"my.flag": ""}},
		{"change a startup value", map[string]string{"application_name": "a"}, []op{{"set", "application_name", "b"}},
			map[string]string{"application_name": "b"}},
		{"replace the values", map[string]string{"application_name": "a", "timezone": "UTC"}, []op{{"replace", "timezone", "Asia/Kolkata"}},
			map[string]string{"timezone": "Asia/Kolkata"}},
		{"reset all", map[string]string{"application_name": "a"},
			[]op{{"set", "application_name", "b"}, {"set", "search_path", "s"}, {"resetAll", "", ""}},
			map[string]string{"application_name": "a"}},
		{"change after reset all", map[string]string{"application_name": "a"},
			[]op{{"set", "search_path", "s"}, {"resetAll", "", ""}, {"replace", "search_path", "t"}, {"set", "timezone", "UTC"}},
			map[string]string{"search_path": "t", "timezone": "UTC"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			startup := maps.Clone(c.startup)
			var p ClientParams
			p.SetStartup(startup)
			fp0 := p.Fingerprint()
			for _, o := range c.ops {
				switch o.kind {
				case "set":
					p.Set(o.name, o.val)
				case "replace":
					p.Replace(map[string]string{o.name: o.val})
				case "resetAll":
					p.ResetAll()
				}
			}
			if got := p.Values(); !maps.Equal(got, c.want) {
				t.Errorf("values %v, want %v", got, c.want)
			}
			if !maps.Equal(startup, c.startup) {
				t.Errorf("the startup values became %v, want %v", startup, c.startup)
			}
			// The fingerprint follows the values: equal values, equal fingerprints.
			if same := maps.Equal(p.Values(), c.startup); same != (p.Fingerprint() == fp0) {
				t.Errorf("fingerprint %q against the startup's %q, values equal: %v", p.Fingerprint(), fp0, same)
			}
		})
	}
}
