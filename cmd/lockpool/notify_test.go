package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// sdNotify sends its state as one datagram to $NOTIFY_SOCKET (a path, or
// @name in the abstract namespace), and does nothing without it.
func TestSDNotify(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) (env, listen string) // "" env: unset
	}{
		{"unset", func(*testing.T) (string, string) { return "", "" }},
		{"path", func(t *testing.T) (string, string) {
			p := filepath.Join(t.TempDir(), "notify.sock")
			return p, p
		}},
		{"abstract", func(*testing.T) (string, string) {
			n := fmt.Sprintf("lockpool-notify-test-%d", os.Getpid())
			return "@" + n, "\x00" + n
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, listen := tc.addr(t)
			t.Setenv("NOTIFY_SOCKET", env)
			if env == "" {
				if err := sdNotify("READY=1"); err != nil {
					t.Fatalf("sdNotify without NOTIFY_SOCKET: %v", err)
				}
				return
			}
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: listen, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := sdNotify("READY=1"); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 64)
			n, err := c.Read(b)
			if err != nil || string(b[:n]) != "READY=1" {
				t.Fatalf("received %q, %v; want READY=1", b[:n], err)
			}
		})
	}
}
