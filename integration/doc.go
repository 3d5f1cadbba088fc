// Package integration tests lockpool end to end: a real PostgreSQL started
// by the tests (one cluster per package run, see internal/pgtest), lockpool
// running in-process on 127.0.0.1:0 or as a built binary, and real clients
// (pgx, psql, pgbench, node-postgres, lib/pq) on the other side.
//
// The support code lives in internal/testenv; support_test.go gives it the
// short names the tests use, and main_test.go makes the roles and databases.
package integration
