package handover

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuffer is a logger's output, safe for the exchange goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newLogger() (*slog.Logger, *logBuffer) {
	var b logBuffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

func listenTCP(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

func serve(t *testing.T, path string, addrs Addrs, client, admin net.Listener) (*Offer, *logBuffer) {
	t.Helper()
	log, buf := newLogger()
	o, err := Serve(path, addrs, client, admin, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o, buf
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Nothing answers on the path: no file, or a socket file a crashed
// process left. Take says so, and Serve replaces the stale file.
func TestTakeWhenNothingAnswers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"no file", func(*testing.T, string) {}},
		{"stale socket of a crashed process", func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			_ = ln.Close()
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
				t.Fatalf("stale socket file: %v %v", fi, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handover.sock")
			tc.setup(t, path)
			addrs := Addrs{Listen: "127.0.0.1:0"}
			if _, err := Take(ctxFor(t, 5*time.Second), path, addrs); !errors.Is(err, ErrNoOffer) {
				t.Fatalf("Take: %v, want ErrNoOffer", err)
			}
			// The process that binds itself then serves the path.
			ln := listenTCP(t)
			serve(t, path, addrs, ln, nil)
			got, err := Take(ctxFor(t, 5*time.Second), path, addrs)
			if err != nil {
				t.Fatalf("Take after Serve on the same path: %v", err)
			}
			defer got.Abandon()
			if got.Client.Addr().String() != ln.Addr().String() || got.PID != os.Getpid() {
				t.Fatalf("took %s from pid %d, want %s from pid %d", got.Client.Addr(), got.PID, ln.Addr(), os.Getpid())
			}
		})
	}
}

// The successor receives both listeners; connections that queued in the
// backlog while only the old process held them, and connections made
// after it closed its copy, are all accepted by the successor. The socket
// file is 0600, and the offer reports the successor once it confirmed.
func TestHandOverKeepsQueuedConnections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	client, admin := listenTCP(t), listenTCP(t)
	addrs := Addrs{Listen: "127.0.0.1:6432", AdminListen: "127.0.0.1:9930"}
	o, logs := serve(t, path, addrs, client, admin)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("handover socket %s: mode %v, want a socket with 0600", path, fi.Mode())
	}

	got, err := Take(ctxFor(t, 5*time.Second), path, addrs)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Abandon()
	if got.Client.Addr().String() != client.Addr().String() || got.Admin == nil || got.Admin.Addr().String() != admin.Addr().String() {
		t.Fatalf("took client %v admin %v, want %v and %v", got.Client.Addr(), got.Admin, client.Addr(), admin.Addr())
	}
	if err := got.Confirm(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for o.HandedTo() != os.Getpid() {
		if time.Now().After(deadline) {
			t.Fatalf("HandedTo = %d after the confirmation, want %d; log:\n%s", o.HandedTo(), os.Getpid(), logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Queued while both hold the socket and neither accepts.
	const queued = 5
	for i := 0; i < queued; i++ {
		c, err := net.DialTimeout("tcp", client.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		defer c.Close()
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// The old process stops accepting: it closes its copies only.
	_ = client.Close()
	_ = admin.Close()
	c, err := net.DialTimeout("tcp", got.Client.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial after the old listener closed: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{queued}); err != nil {
		t.Fatal(err)
	}
	seen := map[byte]bool{}
	for i := 0; i <= queued; i++ {
		_ = got.Client.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
		ac, err := got.Client.Accept()
		if err != nil {
			t.Fatalf("successor accepted %d of %d connections: %v", i, queued+1, err)
		}
		b := make([]byte, 1)
		_ = ac.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(ac, b); err != nil {
			t.Fatalf("reading accepted connection %d: %v", i, err)
		}
		seen[b[0]] = true
		_ = ac.Close()
	}
	if len(seen) != queued+1 {
		t.Fatalf("successor got connections %v, want 0..%d", seen, queued)
	}
	ac, err := net.DialTimeout("tcp", got.Admin.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the admin address after the old listener closed: %v", err)
	}
	_ = ac.Close()
}

// A successor whose configuration asks for other addresses is refused with
// both values named; the running process keeps its listeners.
func TestTakeRefusedWhenAddrsDiffer(t *testing.T) {
	running := Addrs{Listen: "127.0.0.1:6432", AdminListen: "127.0.0.1:9930"}
	for _, tc := range []struct {
		name string
		want Addrs
		says []string
	}{
		{"listen differs", Addrs{Listen: "127.0.0.1:6433", AdminListen: "127.0.0.1:9930"}, []string{"listen differs", `"127.0.0.1:6432"`, `"127.0.0.1:6433"`}},
		{"admin_listen differs", Addrs{Listen: "127.0.0.1:6432", AdminListen: "127.0.0.1:9931"}, []string{"admin_listen differs", `"127.0.0.1:9930"`, `"127.0.0.1:9931"`}},
		{"admin off in the new config", Addrs{Listen: "127.0.0.1:6432"}, []string{"admin_listen differs", `new: ""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handover.sock")
			client := listenTCP(t)
			o, logs := serve(t, path, running, client, listenTCP(t))
			_, err := Take(ctxFor(t, 5*time.Second), path, tc.want)
			var re *RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("Take: %v, want a RefusedError", err)
			}
			if re.PID != os.Getpid() {
				t.Errorf("refused by pid %d, want %d", re.PID, os.Getpid())
			}
			for _, s := range tc.says {
				if !strings.Contains(re.Error(), s) {
					t.Errorf("refusal %q does not say %q", re.Error(), s)
				}
			}
			if !strings.Contains(logs.String(), "handover refused") {
				t.Errorf("the running side did not log the refusal:\n%s", logs.String())
			}
			if o.HandedTo() != 0 {
				t.Errorf("HandedTo = %d after a refusal", o.HandedTo())
			}
			c, err := net.DialTimeout("tcp", client.Addr().String(), 5*time.Second)
			if err != nil {
				t.Fatalf("the running listener after a refusal: %v", err)
			}
			_ = c.Close()
		})
	}
}

// The running process exits or stops answering mid-exchange, answers
// nonsense, or is shutting down: Take fails (not ErrNoOffer) and returns
// by the context's deadline.
func TestTakeFailsWhenTheRunningProcessDoesNotHandOver(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(c *net.UnixConn) // a fake running process; nil: a real Offer whose listener is closed
		says string
	}{
		{"exits after the request", func(c *net.UnixConn) {
			_ = readJSON(c, &request{})
			_ = c.Close()
		}, "without an answer"},
		{"hangs", func(c *net.UnixConn) {
			_ = readJSON(c, &request{})
			time.Sleep(time.Second)
			_ = c.Close()
		}, "did not answer in time"},
		{"answers nonsense", func(c *net.UnixConn) {
			_ = readJSON(c, &request{})
			_, _, _ = c.WriteMsgUnix([]byte("{not json"), nil, nil)
			_ = c.Close()
		}, "malformed answer"},
		{"answers without descriptors", func(c *net.UnixConn) {
			_ = readJSON(c, &request{})
			_ = writeJSON(c, answer{PID: 1, Listeners: []string{"client"}}, nil)
			_ = c.Close()
		}, "0 descriptors"},
		{"is shutting down", nil, "no longer listening"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handover.sock")
			addrs := Addrs{Listen: "127.0.0.1:6432"}
			if tc.peer == nil {
				client := listenTCP(t)
				serve(t, path, addrs, client, nil)
				_ = client.Close()
			} else {
				ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					c, err := ln.AcceptUnix()
					if err == nil {
						tc.peer(c)
					}
				}()
				t.Cleanup(func() { _ = ln.Close(); <-done })
			}
			start := time.Now()
			got, err := Take(ctxFor(t, 500*time.Millisecond), path, addrs)
			took := time.Since(start)
			if err == nil {
				got.Abandon()
				t.Fatal("Take succeeded")
			}
			if errors.Is(err, ErrNoOffer) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Take: %v, want an error saying %q", err, tc.says)
			}
			if took > 1500*time.Millisecond {
				t.Fatalf("Take took %v with a 500ms context", took)
			}
		})
	}
}

// Serve does not replace a path that is not a socket.
func TestServeRefusesAPathThatIsNotASocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("listen: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log, _ := newLogger()
	o, err := Serve(path, Addrs{Listen: "x"}, listenTCP(t), nil, log)
	if err == nil {
		_ = o.Close()
		t.Fatal("Serve replaced a regular file")
	}
	if !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("error %q does not say the path is not a socket", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "listen: x\n" {
		t.Errorf("the file changed: %q", b)
	}
}

// A successor takes the path over; the process it took over from removes
// the path on Close only while the path is its own.
func TestCloseRemovesOnlyItsOwnSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	addrs := Addrs{Listen: "127.0.0.1:6432"}
	first, _ := serve(t, path, addrs, listenTCP(t), nil)
	second := listenTCP(t)
	next, _ := serve(t, path, addrs, second, nil)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := Take(ctxFor(t, 5*time.Second), path, addrs)
	if err != nil {
		t.Fatalf("Take after the first process closed: %v", err)
	}
	got.Abandon()
	if got.Client.Addr().String() != second.Addr().String() {
		t.Fatalf("took %v, want the second process's %v", got.Client.Addr(), second.Addr())
	}
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("path after the last Close: %v, want it removed", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 0 {
		t.Fatalf("files left beside the path: %v", entries)
	}
}
