package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// goSuite is a Go module whose tests are the suite.
type goSuite struct {
	module, version string
	env             []string // the target, as the module's tests read it
	buildOnly       bool     // copy and build the tests, run none (runs from the same srcDir then start at once)
}

// runGoSuite copies the module from the module cache (downloading it when
// needed) into srcDir (default dir/src) unless an earlier run did, builds
// its tests, runs them with go test -json and returns the top-level tests'
// results. go test's output is kept in dir/go-test.json.
func runGoSuite(g goSuite, dir, srcDir, run string) ([]result, error) {
	src, err := moduleDir(g.module+"@"+g.version, dir)
	if err != nil {
		return nil, err
	}
	copyDir := filepath.Join(dir, "src")
	if srcDir != "" {
		copyDir = srcDir
	}
	// The copy is made once: go's build cache keys packages by their
	// directory, so runs against several targets from one copy compile once.
	marker := filepath.Join(copyDir, ".driversuites-copied")
	if _, err := os.Stat(marker); err != nil {
		if err := copyTree(src, copyDir); err != nil {
			return nil, err
		}
		if err := os.WriteFile(marker, []byte(g.module+"@"+g.version+"\n"), 0o644); err != nil {
			return nil, err
		}
	} else if b, _ := os.ReadFile(marker); string(b) != g.module+"@"+g.version+"\n" {
		return nil, fmt.Errorf("-srcdir %s holds %s, not %s@%s", copyDir, strings.TrimSpace(string(b)), g.module, g.version)
	}
	env := append(suiteEnv(), g.env...)
	env = append(env, "GOWORK=off")

	// Build every test binary first (running none of the tests), so that
	// compiling does not compete with the tests' own time limits.
	build := exec.Command("go", "test", "-count=1", "-run", "^$", "./...")
	build.Dir, build.Env = copyDir, env
	_ = build.Run() // a build failure shows again in the real run, per package
	if g.buildOnly {
		return nil, nil
	}

	args := []string{"test", "-json", "-count=1"}
	if run != "" {
		args = append(args, "-run", run)
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir, cmd.Env = copyDir, env
	log, err := os.Create(filepath.Join(dir, "go-test.json"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	results, perr := parseTestJSON(io.TeeReader(out, log), g.module)
	werr := cmd.Wait()
	if perr != nil {
		return nil, perr
	}
	var ee *exec.ExitError
	if werr != nil && !(errors.As(werr, &ee) && ee.ExitCode() == 1) {
		return nil, fmt.Errorf("go test: %v (see %s)", werr, log.Name())
	}
	results = addUnstarted(results, g.module, copyDir, env)
	return retryFailed(results, g.module, copyDir, env, log), nil
}

// addUnstarted adds a FAIL for every test (Test and Fuzz functions) go test
// -list names that the run never started (its package's test binary died
// before reaching it), so that retryFailed runs it and the two targets list
// the same tests.
func addUnstarted(results []result, module, dir string, env []string) []result {
	cmd := exec.Command("go", "test", "-list", ".", "./...")
	cmd.Dir, cmd.Env = dir, env
	out, _ := cmd.Output()
	seen := map[string]bool{}
	for _, r := range results {
		seen[r.name] = true
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && (f[0] == "ok" || f[0] == "?" || f[0] == "FAIL"):
			rel := strings.TrimPrefix(strings.TrimPrefix(f[1], module), "/")
			for _, n := range names {
				if rel != "" {
					n = rel + "/" + n
				}
				if !seen[n] {
					results = append(results, result{n, "FAIL"})
				}
			}
			names = names[:0]
		case len(f) == 1 && (strings.HasPrefix(f[0], "Test") || strings.HasPrefix(f[0], "Fuzz")):
			// Benchmarks do not run, nor do examples without an
			// output comment; an example that runs is in results.
			names = append(names, f[0])
		}
	}
	sort.Slice(results, func(i, j int) bool { return results[i].name < results[j].name })
	return results
}

// maxRetries bounds the tests run again one by one after a suite's run (a
// package that died early leaves most of its tests to run so: lib/pq has 150).
const maxRetries = 150

// retryFailed runs the failed top-level tests once more and keeps the second
// outcome: first each package's failed tests together, then each test still
// failing alone. The suites carry tests with tight time limits (lib/pq's
// TestListenerClose allows 100 ms, and its panic ends the whole package, so
// every test still running beside it never finishes): on a loaded machine
// one of them fails now and then, directly as through a pooler, and a
// comparison of two runs would report noise. A test that fails in all its
// runs is a failure. The retries' output is appended to log.
func retryFailed(results []result, module, dir string, env []string, log io.Writer) []result {
	// rerun runs the named tests of one package and marks those that pass.
	rerun := func(pkg string, idx []int) {
		names := make([]string, len(idx))
		for k, i := range idx {
			names[k] = results[i].name[strings.LastIndex(results[i].name, "/")+1:]
		}
		fmt.Fprintf(log, "=== driversuites: running again in %s: %s\n", pkg, strings.Join(names, " "))
		cmd := exec.Command("go", "test", "-json", "-count=1", "-timeout", "5m", "-run", "^("+strings.Join(names, "|")+")$", pkg)
		cmd.Dir, cmd.Env = dir, env
		out, _ := cmd.Output()
		_, _ = log.Write(out)
		again, err := parseTestJSON(bytes.NewReader(out), module)
		if err != nil {
			return
		}
		passed := map[string]bool{}
		for _, a := range again {
			passed[a.name] = a.status == "PASS"
		}
		for _, i := range idx {
			if passed[results[i].name] {
				results[i].status = "PASS"
				fmt.Fprintf(log, "=== driversuites: %s passed when run again\n", results[i].name)
			}
		}
	}
	failedByPkg := func() (map[string][]int, []string) {
		m := map[string][]int{}
		var pkgs []string
		for i, r := range results {
			if r.status != "FAIL" || r.name == "(package)" || strings.HasSuffix(r.name, "/(package)") {
				continue
			}
			pkg := "."
			if j := strings.LastIndex(r.name, "/"); j >= 0 {
				pkg = "./" + r.name[:j]
			}
			if m[pkg] == nil {
				pkgs = append(pkgs, pkg)
			}
			m[pkg] = append(m[pkg], i)
		}
		sort.Strings(pkgs)
		return m, pkgs
	}
	m, pkgs := failedByPkg()
	for _, pkg := range pkgs {
		rerun(pkg, m[pkg])
	}
	m, pkgs = failedByPkg()
	n := 0
	for _, pkg := range pkgs {
		for _, i := range m[pkg] {
			if n++; n > maxRetries {
				return results
			}
			rerun(pkg, []int{i})
		}
	}
	return results
}

// parseTestJSON reads go test -json output: one result per top-level test
// that finished, a FAIL for one that started and never finished (its test
// binary died), and "<package>/(package)" FAIL for a package that failed
// while none of its tests did (build error, TestMain, a crash between tests).
func parseTestJSON(r io.Reader, module string) ([]result, error) {
	type pkgState struct {
		status  map[string]string // top-level test → PASS/FAIL/SKIP
		started []string
		failed  bool
	}
	pkgs := map[string]*pkgState{}
	get := func(p string) *pkgState {
		if pkgs[p] == nil {
			pkgs[p] = &pkgState{status: map[string]string{}}
		}
		return pkgs[p]
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("{")) {
			continue
		}
		var e struct{ Action, Package, Test string }
		if json.Unmarshal(line, &e) != nil || e.Package == "" {
			continue
		}
		p := get(e.Package)
		if e.Test == "" {
			if e.Action == "fail" {
				p.failed = true
			}
			continue
		}
		if strings.Contains(e.Test, "/") {
			continue // a subtest
		}
		switch e.Action {
		case "run":
			p.started = append(p.started, e.Test)
		case "pass", "fail", "skip":
			p.status[e.Test] = strings.ToUpper(e.Action)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var results []result
	for pkg, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		name := func(test string) string {
			if rel == "" {
				return test
			}
			return rel + "/" + test
		}
		anyFailed := false
		for _, t := range p.started {
			if _, ok := p.status[t]; !ok {
				p.status[t] = "FAIL"
			}
		}
		for t, s := range p.status {
			results = append(results, result{name(t), s})
			anyFailed = anyFailed || s == "FAIL"
		}
		if p.failed && !anyFailed {
			results = append(results, result{name("(package)"), "FAIL"})
		}
	}
	sort.Slice(results, func(i, j int) bool { return results[i].name < results[j].name })
	return results, nil
}

// moduleDir returns the module cache directory of module@version,
// downloading it when needed (from GOPROXY).
func moduleDir(modVersion, workdir string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	cmd.Dir = workdir // outside any module
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); jerr != nil || m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", modVersion, err, m.Error)
	}
	return m.Dir, nil
}

// copyTree copies the directory tree src to dst, writable (the module
// cache is read-only).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o644|info.Mode().Perm()&0o111)
	})
}

// suiteEnv is this process's environment without PG* variables (PGX_*
// among them), so that only the target reaches a suite, the same for every
// target.
func suiteEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}
