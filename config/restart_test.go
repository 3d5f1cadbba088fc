package config

import (
	"slices"
	"testing"
)

func TestRestartNeeded(t *testing.T) {
	const base = "users: [{name: app, password: pw}]\n" +
		"applications: [{name: api, user: app, budget_scope: cluster}, {name: web, user: app, database: web}]\n" +
		"cluster: {name: c}\n"
	parse := func(t *testing.T, extra string) *Config {
		t.Helper()
		c, err := Parse([]byte(base+extra), "r.yaml", nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := parse(t, "")
	for _, tc := range []struct {
		name string
		cur  string // the whole file when it starts with "users", else added to base
		want []string
	}{
		{name: "nothing", want: nil},
		{name: "applied keys", cur: "log_level: debug\nserver: {max_connections: 30, connect_timeout: 1s}\nadmin_users: app\n", want: nil},
		{name: "listen and log_format", cur: "listen: 127.0.0.1:7000\nlog_format: json\n", want: []string{"listen", "log_format"}},
		{name: "tls added", cur: "tls: {cert_file: c, key_file: k}\n", want: []string{"tls"}},
		{name: "server address", cur: "server: {host: /run/pg, port: 5433, tls: disable}\n", want: []string{"server.host", "server.port", "server.tls"}},
		{name: "locks and leases", cur: "locks: {max_waiters: 3}\nleases: {schema: x}\n", want: []string{"leases.schema", "locks.max_waiters"}},
		{name: "cluster removed", cur: "users: [{name: app, password: pw}]\napplications: [{name: api, user: app}]\n",
			want: []string{"applications[].budget_scope", "cluster"}},
		{name: "new cluster application", cur: "users: [{name: app, password: pw}]\n" +
			"applications: [{name: api, user: app, budget_scope: cluster}, {name: web2, user: app, database: web2, budget_scope: cluster}]\ncluster: {name: c}\n",
			want: []string{"applications[].budget_scope", "cluster"}}, // cluster.database's default becomes web2
		{name: "instance application removed", cur: "users: [{name: app, password: pw}]\n" +
			"applications: [{name: api, user: app, budget_scope: cluster}]\ncluster: {name: c}\n", want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cur *Config
			if len(tc.cur) >= 5 && tc.cur[:5] == "users" {
				c, err := Parse([]byte(tc.cur), "r.yaml", nil)
				if err != nil {
					t.Fatal(err)
				}
				cur = c
			} else {
				cur = parse(t, tc.cur)
			}
			cur.InstanceID = old.InstanceID
			if got := RestartNeeded(old, cur); !slices.Equal(got, tc.want) {
				t.Fatalf("RestartNeeded = %q, want %q", got, tc.want)
			}
		})
	}
	c2 := parse(t, "")
	c2.Cluster.TTL *= 2
	c2.InstanceID = old.InstanceID
	if got := RestartNeeded(old, c2); !slices.Equal(got, []string{"cluster"}) {
		t.Fatalf("cluster.ttl changed: RestartNeeded = %q, want [cluster]", got)
	}
}

// TestSettingsInForce: after a reload, SHOW CONFIG shows a restart key's
// value lockpool started with, and an applied key's new value.
func TestSettingsInForce(t *testing.T) {
	const base = "users: [{name: app, password: pw}]\napplications: [{name: api, user: app}]\n"
	started, err := Parse([]byte(base+"listen: 127.0.0.1:6000\nlog_level: info\n"), "s.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := Parse([]byte(base+"listen: 127.0.0.1:7000\nlog_level: debug\ntls: {cert_file: c, key_file: k}\n"), "s.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range cur.SettingsInForce(started) {
		got[s.Key] = s.Value
	}
	for key, want := range map[string]string{"listen": "127.0.0.1:6000", "log_level": "debug", "tls.cert_file": ""} {
		if got[key] != want {
			t.Errorf("%s = %q, want %q", key, got[key], want)
		}
	}
}
