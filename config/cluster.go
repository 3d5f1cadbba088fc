package config

import "strings"

// validateCluster checks the cluster section and the applications' cluster
// keys: a cluster budget needs a cluster, the cluster needs a name, a
// heartbeat well inside its ttl and an application whose user can log in to
// its database, and min_share fits in the budget. It fills cluster.database
// when it is not set.
func (p *parser) validateCluster(c *Config) {
	top, apps := p.sections[""], p.lists["applications"]
	scoped := false
	for i, a := range c.Applications {
		if apps == nil || i >= len(apps.items) {
			break
		}
		s := apps.items[i]
		if !a.ClusterScoped() {
			continue
		}
		scoped = true
		if c.Cluster == nil {
			p.errorf(s.lineOf("budget_scope"), "%s: budget_scope cluster needs a cluster section (cluster.name) naming the instances that share the budget", appName(a, s))
		}
		if a.MinShare > a.MaxConnections {
			p.errorf(s.lineOf("min_share"), "%s: min_share (%d) must not exceed max_connections (%d)", appName(a, s), a.MinShare, a.MaxConnections)
		}
	}
	if c.Cluster == nil {
		return
	}
	cs := p.sections["cluster"]
	if cs == nil {
		cs = top
	}
	if c.Cluster.Name == "" {
		p.errorf(cs.lineOf("name"), "cluster.name is required when cluster is set (instances with the same name share their budgets)")
	}
	if c.Cluster.Database == "" {
		p.defaultClusterDatabase(c, cs, scoped)
	}
	if c.Cluster.TTL > 0 && c.Cluster.HeartbeatEvery()*2 >= c.Cluster.TTL {
		p.errorf(cs.lineOf("heartbeat"), "cluster.heartbeat (%s) must be less than half of cluster.ttl (%s), so a live instance is never taken for dead", c.Cluster.Heartbeat, c.Cluster.TTL)
	}
	if !scoped {
		return
	}
	found := false
	for _, a := range c.Applications {
		if a.Database == c.Cluster.Database || a.Database == "" {
			found = true
			break
		}
	}
	if !found && c.Cluster.Database != "" { // "": reported by defaultClusterDatabase
		p.errorf(cs.lineOf("database"), "cluster.database %q: no application is configured for it (or for any database), so lockpool has no user to log in to it with", c.Cluster.Database)
	}
}

// defaultClusterDatabase sets cluster.database, not written (or written
// ""), to the database the cluster applications (budget_scope cluster)
// name: the one they all name, postgres when none names one. When they name
// different ones it reports that cluster.database must be set (scoped: there
// are cluster applications, so the cluster tables will be used).
func (p *parser) defaultClusterDatabase(c *Config, cs *section, scoped bool) {
	var dbs []string
	for _, a := range c.Applications {
		if a.ClusterScoped() && a.Database != "" && !contains(dbs, a.Database) {
			dbs = append(dbs, a.Database)
		}
	}
	switch {
	case len(dbs) == 0:
		c.Cluster.Database = "postgres"
	case len(dbs) == 1:
		c.Cluster.Database = dbs[0]
	case scoped:
		p.errorf(cs.line, "cluster.database is not set, and the budget_scope cluster applications name different databases (%s): set cluster.database to the one whose %s schema holds the cluster tables",
			strings.Join(dbs, ", "), c.Leases.Schema)
	}
}
