// Command driversuites runs a PostgreSQL driver's own test suite against one
// connection target (PostgreSQL itself, or lockpool in front of it) and
// prints one line per test, so that two runs can be compared line by line:
//
//	PASS <name>
//	FAIL <name>
//	SKIP <name>
//
// followed by a summary line "TOTAL <suite> pass=N fail=N skip=N".
//
// Usage:
//
//	driversuites -suite libpq|pgx|node -dsn DSN -workdir DIR [flags]
//
// The DSN is a libpq connection string, a URL (postgres://user:pw@host:port/db)
// or key=value pairs (host=… port=… user=… password=… dbname=…); only those
// five settings are used, always without TLS. The suites:
//
//   - libpq: github.com/lib/pq (-version, default v1.12.3, as in lockpool's
//     go.mod). The module is fetched with `go mod download`, copied into the
//     work directory and run with `go test -json -count=1 ./...` and
//     PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE=disable.
//     Its TestAuth expects the roles pqgomd5, pqgopassword and pqgoscram
//     (password "wordpass") of the module's testdata/postgres setup.
//   - pgx: github.com/jackc/pgx/v5 (default v5.12.0), the same way, with
//     PGX_TEST_DATABASE set to the target as a URL.
//   - node: node-postgres' integration tests vendored in
//     integration/driversuites/node-postgres (-node-tests), against the pg
//     package of integration/node/node_modules (-node-modules, installed by
//     `npm ci --prefix integration/node`). Each integration/**/*-tests.js
//     file is run by node with the PG* variables and PGTESTNOSSL=true, as
//     upstream's `make test-integration` and CI do, and passes when node
//     exits 0 within -timeout. client/ssl-tests.js needs a server with TLS
//     and is skipped.
//
// Test names: for Go suites the top-level tests (subtests are not listed),
// named by their package's path inside the module and the test name
// (pgconn/TestConnPing; the module's root package gives just TestPing). A
// test that started but never finished because its package's test binary
// died is a FAIL, and a package that failed outside any test (build error,
// TestMain) is "FAIL <package>/(package)". For node, the file's path under
// integration/ (connection-pool/error-tests.js).
//
// The work directory keeps what each run wrote (go test's JSON, each node
// file's output in node-logs/) for looking into a failure. The exit status
// is 0 when the suite ran, whatever its results, and 2 when it could not run.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// result is one test's outcome.
type result struct {
	name   string
	status string // PASS, FAIL or SKIP
}

func main() {
	suite := flag.String("suite", "", "libpq, pgx or node")
	dsn := flag.String("dsn", "", "connection target: postgres://user:pw@host:port/db or host=… port=… user=… password=… dbname=…")
	workdir := flag.String("workdir", "", "writable directory for the suite's logs (emptied first)")
	srcdir := flag.String("srcdir", "", "Go suites: directory of the module's copy, kept between runs so that a second run (another target) reuses the first one's build (default: the work directory's src, emptied first)")
	version := flag.String("version", "", "module version of a Go suite (default: libpq v1.12.3, pgx v5.12.0)")
	run := flag.String("run", "", "only these tests: go test's -run for Go suites, a regexp on the file name for node")
	nodeTests := flag.String("node-tests", "integration/driversuites/node-postgres/test", "node: the vendored test directory")
	nodeModules := flag.String("node-modules", "integration/node/node_modules", "node: node_modules holding pg and the tests' dependencies")
	timeout := flag.Duration("timeout", 90*time.Second, "node: time limit of one test file")
	buildOnly := flag.Bool("build-only", false, "Go suites: copy the module to -srcdir and build its tests, run none (so that runs against two targets from that copy may start together)")
	flag.Parse()

	if *dsn == "" || *workdir == "" {
		fatalf("-dsn and -workdir are required")
	}
	target, err := parseDSN(*dsn)
	if err != nil {
		fatalf("-dsn: %v", err)
	}
	dir, err := filepath.Abs(filepath.Join(*workdir, *suite))
	if err == nil {
		err = os.RemoveAll(dir)
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		fatalf("work directory: %v", err)
	}

	var results []result
	switch *suite {
	case "libpq":
		results, err = runGoSuite(goSuite{module: "github.com/lib/pq", version: or(*version, "v1.12.3"), env: target.libpqEnv(), buildOnly: *buildOnly}, dir, *srcdir, *run)
	case "pgx":
		results, err = runGoSuite(goSuite{module: "github.com/jackc/pgx/v5", version: or(*version, "v5.12.0"), env: []string{"PGX_TEST_DATABASE=" + target.url()}, buildOnly: *buildOnly}, dir, *srcdir, *run)
	case "node":
		results, err = runNode(nodeSuite{tests: *nodeTests, modules: *nodeModules, timeout: *timeout, run: *run, env: target.libpqEnv()}, dir)
	default:
		fatalf("-suite must be libpq, pgx or node")
	}
	if err != nil {
		fatalf("%s: %v", *suite, err)
	}
	if *buildOnly {
		return
	}
	report(os.Stdout, *suite, results)
}

// report prints one line per result and the summary.
func report(w io.Writer, suite string, results []result) {
	n := map[string]int{}
	for _, r := range results {
		fmt.Fprintf(w, "%s %s\n", r.status, r.name)
		n[r.status]++
	}
	fmt.Fprintf(w, "TOTAL %s pass=%d fail=%d skip=%d\n", suite, n["PASS"], n["FAIL"], n["SKIP"])
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "driversuites: "+format+"\n", args...)
	os.Exit(2)
}
