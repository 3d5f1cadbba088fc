package proxy

import (
	"slices"
	"testing"

	"github.com/lockpool/lockpool/config"
)

func TestRestartKeys(t *testing.T) {
	base := func() *config.Config {
		return &config.Config{Listen: "127.0.0.1:6432", AdminListen: "127.0.0.1:9930", LogFormat: "text", InstanceID: "a",
			Server: config.Server{Host: "127.0.0.1", Port: 5432, TLS: "prefer"}, Leases: config.Leases{Schema: "lockpool", MaxConnections: 2}}
	}
	for _, tc := range []struct {
		name string
		edit func(*config.Config)
		want []string
	}{
		{"nothing", func(*config.Config) {}, nil},
		{"budgets only", func(c *config.Config) { c.LogLevel = "debug"; c.LogPinsOver = 1; c.Server.MaxConnections = 99 }, nil},
		{"listen", func(c *config.Config) { c.Listen = "127.0.0.1:7432" }, []string{"listen"}},
		{"admin and tls", func(c *config.Config) { c.AdminListen = ""; c.TLS = &config.TLS{CertFile: "c", KeyFile: "k"} }, []string{"admin_listen", "tls"}},
		{"log format", func(c *config.Config) { c.LogFormat = "json" }, []string{"log_format"}},
		{"lease store", func(c *config.Config) { c.InstanceID = "b"; c.Leases.Schema = "x"; c.Leases.MaxConnections = 3 },
			[]string{"instance_id", "leases.schema", "leases.max_connections"}},
		{"server address", func(c *config.Config) {
			c.Server.Host = "/run/pg"
			c.Server.Port = 5433
			c.Server.TLS = "disable"
			c.Server.CAFile = "ca"
		},
			[]string{"server.host", "server.port", "server.tls", "server.ca_file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := base()
			tc.edit(cur)
			if got := restartKeys(base(), cur); !slices.Equal(got, tc.want) {
				t.Fatalf("restartKeys = %q, want %q", got, tc.want)
			}
		})
	}
}
