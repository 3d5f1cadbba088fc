package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestServerHosts: server.hosts lists host:port entries (the port defaults
// to server.port), Host and Port become the first one's, and bad entries,
// duplicates and hosts beside host/port are errors on the hosts line.
func TestServerHosts(t *testing.T) {
	for _, tc := range []struct {
		name, server string
		want         []HostAddr
		err          string
	}{
		{name: "host and port", server: "{host: db, port: 5433}", want: []HostAddr{{"db", 5433}}},
		{name: "list", server: "{hosts: [db1:5432, 'db2:5433', '[::1]:5434', db4]}",
			want: []HostAddr{{"db1", 5432}, {"db2", 5433}, {"::1", 5434}, {"db4", 5432}}},
		{name: "socket directory", server: "{hosts: [/run/pg:5432, '10.0.0.2:6000']}",
			want: []HostAddr{{"/run/pg", 5432}, {"10.0.0.2", 6000}}},
		{name: "both", server: "{host: db, hosts: [db1:5432]}", err: "server.hosts and server.host/server.port are both set"},
		{name: "bad port", server: "{hosts: [db1:99999]}", err: `server.hosts: "db1:99999": not host:port with a port from 1 to 65535`},
		{name: "twice", server: "{hosts: [db1:5432, db1:5432]}", err: "server.hosts: db1:5432 is listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := "users: [{name: app, password: pw}]\napplications: [{name: api, user: app}]\nserver: " + tc.server + "\n"
			c, err := Parse([]byte(in), "c.yaml", nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Server.Hosts(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Hosts() = %v, want %v", got, tc.want)
			}
			if c.Server.Host != tc.want[0].Host || c.Server.Port != tc.want[0].Port {
				t.Fatalf("Host, Port = %s, %d, want the first host", c.Server.Host, c.Server.Port)
			}
		})
	}
}
