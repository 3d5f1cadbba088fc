package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

func TestCommandLine(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	open := filepath.Join(dir, "open.yaml")
	writeFile(t, good, "users: [{name: app, password: pw}]\napplications: [{name: api, user: app}]\n")
	writeFile(t, open, "admin_listen: 0.0.0.0:9930\nusers: [{name: app, password: pw}]\napplications: [{name: api, user: app}]\n")
	for _, tc := range []struct {
		name         string
		args         []string
		code         int
		stdout       string // a regexp the output must match
		stderr       string
		emptyStdout  bool
		listAllFlags bool
	}{
		{name: "version", args: []string{"-version"}, code: 0, stdout: `^lockpool \S+ \(revision \S+, go1\.\d+[^)]*\)\n$`},
		{name: "version with double dash", args: []string{"--version"}, code: 0, stdout: `^lockpool `},
		{name: "help", args: []string{"-help"}, code: 0, stdout: `^Usage: lockpool \[flags\]`, listAllFlags: true},
		{name: "h", args: []string{"-h"}, code: 0, stdout: `^Usage: lockpool \[flags\]`, listAllFlags: true},
		{name: "unknown flag", args: []string{"-nope"}, code: 2, emptyStdout: true,
			stderr: `flag provided but not defined: -nope\nRun lockpool -help for the list of flags\.`},
		{name: "unknown argument", args: []string{"-config", good, "extra"}, code: 2, emptyStdout: true,
			stderr: `lockpool: unexpected argument "extra": lockpool takes flags only`},
		{name: "argument before flags", args: []string{"run"}, code: 2, emptyStdout: true, stderr: `unexpected argument "run"`},
		{name: "check", args: []string{"-check", "-config", good}, code: 0, stderr: `good\.yaml: ok`},
		{name: "check missing file", args: []string{"-check", "-config", filepath.Join(dir, "none.yaml")}, code: 1, stderr: `none\.yaml`},
		{name: "admin open without token", args: []string{"-check", "-config", open}, code: 1,
			stderr: `admin_listen "0\.0\.0\.0:9930" is not a loopback address, so admin_token is required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, &stdout, &stderr); code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout.String(), stderr.String())
			}
			if tc.stdout != "" && !regexp.MustCompile(tc.stdout).MatchString(stdout.String()) {
				t.Errorf("stdout %q does not match %q", stdout.String(), tc.stdout)
			}
			if tc.stderr != "" && !regexp.MustCompile(tc.stderr).MatchString(stderr.String()) {
				t.Errorf("stderr %q does not match %q", stderr.String(), tc.stderr)
			}
			if tc.emptyStdout && stdout.Len() > 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			if tc.listAllFlags {
				var f flags
				newFlagSet(&f).VisitAll(func(fl *flag.Flag) {
					if !strings.Contains(stdout.String(), "  -"+fl.Name) || !strings.Contains(stdout.String(), fl.Usage) {
						t.Errorf("help does not list -%s (%s):\n%s", fl.Name, fl.Usage, stdout.String())
					}
				})
			}
		})
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// lockedBuffer is a log destination safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines parses every log line as a JSON object with time, level and msg.
func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON (%v): %s", err, sc.Text())
		}
		for _, k := range []string{"time", "level", "msg"} {
			if s, _ := m[k].(string); s == "" {
				t.Fatalf("log line has no %s: %s", k, sc.Text())
			}
		}
		out = append(out, m)
	}
	return out
}

// waitLine waits for a log line whose msg is msg and returns it.
func (l *lockedBuffer) waitLine(t *testing.T, msg string, done <-chan int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range l.lines(t) {
			if m["msg"] == msg {
				return m
			}
		}
		select {
		case code := <-done:
			t.Fatalf("lockpool exited (%d) before logging %q:\n%s", code, msg, l.String())
		case <-time.After(20 * time.Millisecond): // the logger has no event to wait on
		}
	}
	t.Fatalf("no log line %q:\n%s", msg, l.String())
	return nil
}

// scrape returns the sample lines of GET url, by series ("name{labels}").
func scrape(t *testing.T, url string) map[string]string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		out[line[:i]] = line[i+1:]
	}
	return out
}

// series reports whether a series of name has every label in want, and
// returns its value.
func series(samples map[string]string, name string, want map[string]string) (string, bool) {
	for s, v := range samples {
		n, labels, _ := strings.Cut(s, "{")
		if n != name {
			continue
		}
		ok := true
		for k, val := range want {
			if !strings.Contains(labels, fmt.Sprintf("%s=%q", k, val)) {
				ok = false
			}
		}
		if ok {
			return v, true
		}
	}
	return "", false
}

// TestRunJSONLogMetricsReload runs lockpool's main with log_format json
// (no PostgreSQL needed: nothing connects): every documented metric series
// exists at 0 for each application right after start, lockpool_build_info
// is 1, a SIGHUP that changes listen names it as needing a restart, SIGTERM
// exits 0, and every log line is JSON.
func TestRunJSONLogMetricsReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	cfg := func(listen string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: 127.0.0.1:0
log_format: json
leak_check_interval: 0s
server: {host: 127.0.0.1, port: 1, max_connections: 20}
users: [{name: app, password: pw}, {name: worker, password: pw}]
applications:
  - {name: api, user: app}
  - {name: jobs, user: worker, advisory_locks: reject}
`, listen)
	}
	writeFile(t, path, cfg("127.0.0.1:0"))
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"-config", path}, &stdout, &stderr) }()
	up := stderr.waitLine(t, "lockpool listening", done)
	admin, _ := up["admin"].(string)
	if admin == "" || up["version"] == "" {
		t.Fatalf("listening line: %v", up)
	}

	samples := scrape(t, "http://"+admin+"/metrics")
	bi := readBuildInfo()
	if v, ok := series(samples, "lockpool_build_info", map[string]string{"version": bi.Version, "goversion": bi.GoVersion, "revision": bi.Revision}); !ok || v != "1" {
		t.Errorf("lockpool_build_info = %q (present %v), want 1", v, ok)
	}
	budgets := map[string]string{"lockpool_pool_max_connections": "4", "lockpool_pool_max_pinned": "1"}
	documented, err := testenv.DocumentedMetrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range documented {
		name := m.Name
		if m.Kind == "histogram" {
			name += "_count"
		}
		if m.Name == "lockpool_build_info" {
			continue
		}
		if len(m.Labels) == 0 || m.Labels[0] != "app" {
			if _, ok := series(samples, name, nil); !ok {
				t.Errorf("no series %s after start", name)
			}
			continue
		}
		for _, app := range []string{"api", "jobs"} {
			want := []map[string]string{{"app": app}}
			if len(m.Values) > 0 {
				want = want[:0]
				for _, v := range m.Values {
					want = append(want, map[string]string{"app": app, m.Labels[1]: v})
				}
			}
			value := "0"
			if v, ok := budgets[m.Name]; ok {
				value = v // the budgets both applications have by default
			}
			for _, w := range want {
				if v, ok := series(samples, name, w); !ok || v != value {
					t.Errorf("%s%v = %q (present %v), want %s after start", name, w, v, ok, value)
				}
			}
		}
	}

	writeFile(t, path, cfg("127.0.0.1:1"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reload := stderr.waitLine(t, "configuration reloaded; changed keys take full effect only after a restart", done)
	if reload["restart_needed"] != "listen" || reload["level"] != "WARN" {
		t.Errorf("reload line: %v", reload)
	}
	// A second reload of the same file still says listen needs a restart:
	// lockpool still listens where it started.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; n < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("no second reload line naming listen:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // the logger has no event to wait on
		n = 0
		for _, l := range stderr.lines(t) {
			if l["restart_needed"] == "listen" {
				n++
			}
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after SIGTERM", code)
		}
	case <-ctx.Done():
		t.Fatal("lockpool did not stop after SIGTERM")
	}
	stderr.waitLine(t, "stopped", nil)
	if len(stderr.lines(t)) < 4 {
		t.Fatalf("too few log lines:\n%s", stderr.String())
	}
}
