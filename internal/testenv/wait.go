package testenv

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 10 ms until it holds, and fails t if it still
// does not after d. what says what was awaited.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Context is a context that ends after d or when t ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// UniqueName is a lower-case SQL identifier unique to the running test:
// prefix, "_", and the test's name with / - . # as _, at most 63 bytes
// (PostgreSQL's limit).
func UniqueName(t testing.TB, prefix string) string {
	r := strings.NewReplacer("/", "_", "-", "_", ".", "_", "#", "_")
	n := strings.ToLower(prefix + "_" + r.Replace(t.Name()))
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := UnusedPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// UnusedPort is a TCP port on 127.0.0.1 that was free a moment ago.
func UnusedPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// SkipOrFail skips a test whose client tool is missing on a developer's
// machine, and fails it under CI (where .ci/run installs the tools), so a
// missing tool never hides a test in CI. Under -short (the quick tier, no
// external tools) it skips.
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" && !testing.Short() {
		t.Fatalf("%s (CI is set: .ci/run installs it)", why)
	}
	t.Skip(why)
}

// Long reports whether the full-size runs were asked for (LOCKPOOL_LONG
// set); by default tests use sizes that keep the suite fast.
func Long() bool { return os.Getenv("LOCKPOOL_LONG") != "" }

// SettleGoroutines waits up to d until runtime.NumGoroutine() is at most
// limit, and returns the last count.
func SettleGoroutines(limit int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		n := runtime.NumGoroutine()
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DumpGoroutines writes every goroutine's stack to a file in the temporary
// directory (for a hang) and returns a phrase saying where.
func DumpGoroutines(t testing.TB) string {
	name := filepath.Join(os.TempDir(), fmt.Sprintf("lockpool-%s-%d.goroutines", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()))
	f, err := os.Create(name)
	if err != nil {
		return "goroutine dump failed: " + err.Error()
	}
	defer f.Close()
	_ = pprof.Lookup("goroutine").WriteTo(f, 2)
	return "goroutines in " + name
}

// SendCancel sends a CancelRequest for backend pid with key secret to addr
// and waits until the server closes the connection.
func SendCancel(t testing.TB, addr string, pid, secret uint32) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := binary.BigEndian.AppendUint32(nil, 16)
	b = binary.BigEndian.AppendUint32(b, 80877102)
	b = binary.BigEndian.AppendUint32(b, pid)
	b = binary.BigEndian.AppendUint32(b, secret)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, c)
}

// LogBuffer collects what a logger or a process writes, safe for one writer
// and concurrent readers. With Echo set it also copies every write to
// stderr.
type LogBuffer struct {
	Echo bool

	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // closed by the next Write; nil if no one waits
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Echo {
		_, _ = os.Stderr.Write(p)
	}
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return l.b.Write(p)
}

// WaitFor waits until s has been written, ctx ends or stop is closed, and
// reports whether s was written.
func (l *LogBuffer) WaitFor(ctx context.Context, s string, stop <-chan struct{}) bool {
	for {
		l.mu.Lock()
		if strings.Contains(l.b.String(), s) {
			l.mu.Unlock()
			return true
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		case <-stop:
			return strings.Contains(l.String(), s)
		}
	}
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
