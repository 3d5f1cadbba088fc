package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// nodeSuite is node-postgres' vendored integration tests.
type nodeSuite struct {
	tests   string        // the vendored test directory
	modules string        // node_modules with pg and the tests' dependencies
	timeout time.Duration // per file
	run     string        // regexp on the file name; "" = all
	env     []string      // the target
}

// nodeSkips are the integration test files that need what neither target
// has, with the reason.
var nodeSkips = map[string]string{
	"client/ssl-tests.js": "needs a server with TLS",
}

// runNode lays out dir as packages/pg is upstream — test/ (a copy of the
// vendored tests) beside lib (a link to node_modules/pg/lib), which the
// tests require as ../lib — and runs each integration file with node.
func runNode(n nodeSuite, dir string) ([]result, error) {
	tests, err := filepath.Abs(n.tests)
	if err != nil {
		return nil, err
	}
	modules, err := filepath.Abs(n.modules)
	if err != nil {
		return nil, err
	}
	pgLib := filepath.Join(modules, "pg", "lib")
	if _, err := os.Stat(filepath.Join(pgLib, "index.js")); err != nil {
		return nil, fmt.Errorf("no pg package in %s (npm ci --prefix integration/node): %v", modules, err)
	}
	var filter *regexp.Regexp
	if n.run != "" {
		if filter, err = regexp.Compile(n.run); err != nil {
			return nil, fmt.Errorf("-run: %v", err)
		}
	}
	testDir := filepath.Join(dir, "test")
	if err := copyTree(tests, testDir); err != nil {
		return nil, err
	}
	if err := os.Symlink(pgLib, filepath.Join(dir, "lib")); err != nil {
		return nil, err
	}
	logs := filepath.Join(dir, "node-logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	var files []string
	integration := filepath.Join(testDir, "integration")
	err = filepath.WalkDir(integration, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, "-tests.js") {
			rel, _ := filepath.Rel(integration, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)

	// As upstream's CI: PGTESTNOSSL skips the TLS parts of files that also
	// test other things.
	env := append(suiteEnv(), n.env...)
	env = append(env, "PGTESTNOSSL=true", "NODE_PATH="+modules)
	var results []result
	for _, f := range files {
		if filter != nil && !filter.MatchString(f) {
			continue
		}
		if _, skip := nodeSkips[f]; skip {
			results = append(results, result{f, "SKIP"})
			continue
		}
		// A file that fails runs once more (its log then holds the second
		// run): a few allow a fixed time for thousands of round trips, which
		// a loaded machine misses now and then, directly as through a pooler.
		status := "FAIL"
		logPath := filepath.Join(logs, strings.ReplaceAll(f, "/", "_")+".log")
		for range 2 {
			if runNodeFile(dir, "test/integration/"+f, env, n.timeout, logPath) {
				status = "PASS"
				break
			}
		}
		results = append(results, result{f, status})
	}
	return results, nil
}

// runNodeFile runs one test file with node in dir, its output to logPath,
// and reports whether node exited 0 within timeout. On timeout node's
// process group is killed (a file may start psql).
func runNodeFile(dir, file string, env []string, timeout time.Duration, logPath string) bool {
	log, err := os.Create(logPath)
	if err != nil {
		return false
	}
	defer log.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", file)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		fmt.Fprintf(log, "\ndriversuites: killed after %s\n", timeout)
		return false
	}
	return err == nil
}
