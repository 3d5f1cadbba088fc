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
}

// runGoSuite copies the module from the module cache (downloading it when
// needed) into dir/src, builds its tests, runs them with go test -json and
// returns the top-level tests' results. go test's output is kept in
// dir/go-test.json.
func runGoSuite(g goSuite, dir, run string) ([]result, error) {
	src, err := moduleDir(g.module+"@"+g.version, dir)
	if err != nil {
		return nil, err
	}
	copyDir := filepath.Join(dir, "src")
	if err := copyTree(src, copyDir); err != nil {
		return nil, err
	}
	env := append(suiteEnv(), g.env...)
	env = append(env, "GOWORK=off")

	// Build every test binary first (running none of the tests), so that
	// compiling does not compete with the tests' own time limits.
	build := exec.Command("go", "test", "-count=1", "-run", "^$", "./...")
	build.Dir, build.Env = copyDir, env
	_ = build.Run() // a build failure shows again in the real run, per package

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
	return retryFailed(results, g.module, copyDir, env, log), nil
}

// maxRetries bounds the tests run again one by one after a suite's run.
const maxRetries = 60

// retryFailed runs each failed top-level test once more, alone, and keeps
// the second outcome. The suites carry tests with tight time limits (lib/pq's
// TestListenerClose allows 100 ms, and its panic ends the whole package, so
// the tests still running with it never finish): on a loaded machine one
// of them fails now and then, directly as through a pooler, and a comparison
// of two runs would report noise. A test that fails twice is a failure.
// Each retry's output is appended to log.
func retryFailed(results []result, module, dir string, env []string, log io.Writer) []result {
	retries := 0
	for i, r := range results {
		if r.status != "FAIL" || strings.HasSuffix(r.name, "/(package)") || r.name == "(package)" {
			continue
		}
		if retries++; retries > maxRetries {
			break
		}
		pkg, test := ".", r.name
		if j := strings.LastIndex(r.name, "/"); j >= 0 {
			pkg, test = "./"+r.name[:j], r.name[j+1:]
		}
		fmt.Fprintf(log, "=== driversuites: running %s again, alone\n", r.name)
		cmd := exec.Command("go", "test", "-json", "-count=1", "-run", "^"+test+"$", pkg)
		cmd.Dir, cmd.Env = dir, env
		out, _ := cmd.Output()
		_, _ = log.Write(out)
		again, err := parseTestJSON(bytes.NewReader(out), module)
		if err != nil {
			continue
		}
		for _, a := range again {
			if a.name == r.name && a.status == "PASS" {
				results[i].status = "PASS"
				fmt.Fprintf(log, "=== driversuites: %s passed when run again\n", r.name)
			}
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
