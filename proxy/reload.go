package proxy

import (
	"github.com/lockpool/lockpool/config"
)

// restartKeys lists the keys whose change a reload cannot apply: the
// listeners, client TLS, the log format, and what the lease store was built
// with (its instance name, schema, connection cap and server address). Their
// old values stay in force until a restart.
func restartKeys(old, cur *config.Config) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, key)
		}
	}
	add(old.Listen != cur.Listen, "listen")
	add(old.AdminListen != cur.AdminListen, "admin_listen")
	var oldTLS, curTLS config.TLS
	if old.TLS != nil {
		oldTLS = *old.TLS
	}
	if cur.TLS != nil {
		curTLS = *cur.TLS
	}
	add((old.TLS == nil) != (cur.TLS == nil) || oldTLS != curTLS, "tls")
	add(old.LogFormat != cur.LogFormat, "log_format")
	add(old.InstanceID != cur.InstanceID, "instance_id")
	add(old.EventLoops != cur.EventLoops, "event_loops")
	add(old.IOURing != cur.IOURing, "io_uring")
	add(old.HandoverSocket != cur.HandoverSocket, "handover_socket")
	add(old.Server.DialConcurrency != cur.Server.DialConcurrency, "server.dial_concurrency")
	add(old.Leases.Schema != cur.Leases.Schema, "leases.schema")
	add(old.Leases.MaxConnections != cur.Leases.MaxConnections, "leases.max_connections")
	add(old.Server.Host != cur.Server.Host, "server.host")
	add(old.Server.Port != cur.Server.Port, "server.port")
	add(old.Server.TLS != cur.Server.TLS, "server.tls")
	add(old.Server.CAFile != cur.Server.CAFile, "server.ca_file")
	add(clusterChanged(old, cur), "cluster")
	add(budgetScopeChanged(old, cur), "applications[].budget_scope")
	return keys
}
