package config

import (
	"strings"
	"testing"
)

// TestClusterDatabaseDefault: cluster.database, when not set, is the
// database the cluster applications name; when they name different ones it
// must be set.
func TestClusterDatabaseDefault(t *testing.T) {
	const users = "users: [{name: app, password: pw}, {name: jobs, password: pw}]\n"
	for _, tc := range []struct {
		name, apps, cluster string
		want                string // cluster.database
		err                 string
	}{
		{name: "one database", apps: "[{name: api, user: app, database: appdb, budget_scope: cluster}]",
			cluster: "{name: prod, ttl: 5s}", want: "appdb"},
		{name: "one database and any", apps: "[{name: api, user: app, database: appdb, budget_scope: cluster}, {name: w, user: jobs, budget_scope: cluster}]",
			cluster: "{name: prod}", want: "appdb"},
		{name: "none named", apps: "[{name: api, user: app, budget_scope: cluster}]",
			cluster: "{name: prod}", want: "postgres"},
		{name: "written empty", apps: "[{name: api, user: app, database: appdb, budget_scope: cluster}]",
			cluster: "{name: prod, database: ''}", want: "appdb"},
		{name: "instance applications do not count", apps: "[{name: api, user: app, database: appdb, budget_scope: cluster}, {name: w, user: jobs, database: jobsdb}]",
			cluster: "{name: prod}", want: "appdb"},
		{name: "written", apps: "[{name: api, user: app, database: appdb, budget_scope: cluster}, {name: w, user: jobs, database: jobsdb, budget_scope: cluster}]",
			cluster: "{name: prod, database: jobsdb}", want: "jobsdb"},
		{name: "different databases", apps: "[{name: api, user: app, database: appdb, budget_scope: cluster}, {name: w, user: jobs, database: jobsdb, budget_scope: cluster}]",
			cluster: "{name: prod}",
			err:     "c.yaml:4: cluster.database is not set, and the budget_scope cluster applications name different databases (appdb, jobsdb): set cluster.database to the one whose lockpool schema holds the cluster tables"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := users + "applications: " + tc.apps + "\nserver: {max_connections: 20}\ncluster: " + tc.cluster + "\n"
			c, err := Parse([]byte(in), "c.yaml", nil)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Cluster.Database != tc.want {
				t.Fatalf("cluster.database = %q, want %q", c.Cluster.Database, tc.want)
			}
		})
	}
	if !strings.Contains(Reference(), "the cluster applications' database") {
		t.Error("the reference does not show cluster.database's default")
	}
}
