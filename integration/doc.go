// Package integration tests lockpool end to end: a real PostgreSQL started
// by the tests (one cluster per package run, see internal/pgtest), lockpool
// running in-process on 127.0.0.1:0, and real clients (pgx, psql, pgbench,
// node-postgres, lib/pq) on the other side.
package integration
