package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// loginOutcome is what one client saw of its connection during a shutdown.
type loginOutcome struct {
	readyForQuery bool   // its login ended (ReadyForQuery)
	lastError     string // the SQLSTATE of the last ErrorResponse ("" none)
	afterError    bool   // a message came after that ErrorResponse
	err           error  // how the reading ended, when not at EOF
}

// loginAndRead sends a startup packet for user and database bench on a new
// connection to addr and reads until the server closes it (or, with
// untilReady, until its ReadyForQuery). ready, when not nil, hears of the
// ReadyForQuery.
func loginAndRead(addr string, untilReady bool, ready chan<- struct{}) (out loginOutcome, dialed bool) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return out, false // the listener is closed
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	pkt := binary.BigEndian.AppendUint32(nil, 0)
	pkt = binary.BigEndian.AppendUint32(pkt, protocol30)
	for _, s := range []string{"user", "bench", "database", "bench", ""} {
		pkt = append(append(pkt, s...), 0)
	}
	binary.BigEndian.PutUint32(pkt, uint32(len(pkt)))
	if _, err := c.Write(pkt); err != nil {
		if !isConnReset(err) && !errors.Is(err, syscall.EPIPE) {
			out.err = err // else: closed at once, as the server stopped accepting
		}
		return out, true
	}
	r := bufio.NewReader(c)
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) && !isConnReset(err) {
				out.err = err
			}
			return out, true
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
		if _, err := io.ReadFull(r, body); err != nil {
			out.err = err
			return out, true
		}
		if out.lastError != "" {
			out.afterError = true
		}
		switch hdr[0] {
		case 'Z':
			out.readyForQuery = true
			if ready != nil {
				ready <- struct{}{}
			}
			if untilReady {
				return out, true
			}
		case 'E':
			for _, f := range strings.Split(string(body), "\x00") {
				if strings.HasPrefix(f, "C") {
					out.lastError = f[1:]
				}
			}
		}
	}
}

func isConnReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// TestShutdownDuringLogins shuts a server down while clients keep logging
// in and leaving, so that sessions are drained at every step of their
// login, between their registration and their first turn on the loop among
// them (the kill must reach them through their loop, not close the socket
// under the login's writes: -race checks that; how often a round catches a
// login in that window is up to the scheduler). Every such client either
// logs in, or ends with the shutdown's FATAL 57P01 as its last message, or
// is closed without a word as the server stops accepting; no reading
// hangs. Beside them, clients that logged in and stay idle each get
// ReadyForQuery and then the 57P01, and nothing after it.
func TestShutdownDuringLogins(t *testing.T) {
	const rounds, clients, idlers = 40, 32, 4
	refusedAtShutdown := 0
	for round := 0; round < rounds; round++ {
		f := startFakePG(t)
		srv, addr := fakeServer(t, f.ln.Addr().(*net.TCPAddr).Port, 4, f.dial)
		// One login first: the server parameters are cached, so later
		// logins need no server connection.
		if out, _ := loginAndRead(addr, true, nil); !out.readyForQuery {
			t.Fatalf("first login: %+v", out)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var outcomes, idle []loginOutcome
		started := make(chan struct{}, clients+idlers)
		for i := 0; i < clients+idlers; i++ {
			wg.Add(1)
			go func(idler bool) {
				defer wg.Done()
				if idler {
					out, _ := loginAndRead(addr, false, started)
					mu.Lock()
					idle = append(idle, out)
					mu.Unlock()
					return
				}
				for n := 0; ; n++ {
					if n == 1 {
						started <- struct{}{}
					}
					out, dialed := loginAndRead(addr, true, nil)
					if !dialed {
						return // the listener is closed
					}
					mu.Lock()
					outcomes = append(outcomes, out)
					mu.Unlock()
				}
			}(i < idlers)
		}
		for i := 0; i < clients+idlers; i++ {
			<-started // every client logged in (a churning one once): the storm is on
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		cancel()
		wg.Wait()
		served, shutdownFatal, silent := 0, 0, 0
		for _, out := range outcomes {
			switch {
			case out.err != nil:
				t.Errorf("a client's reading ended with %v (%+v)", out.err, out)
			case out.afterError:
				t.Errorf("a message after the ErrorResponse: %+v", out)
			case out.readyForQuery && out.lastError == "":
				served++
			case out.lastError == "57P01":
				shutdownFatal++
			case out.lastError == "" && !out.readyForQuery:
				silent++ // accepted as the server stopped: closed without a word
			default:
				t.Errorf("a client's login ended with neither ReadyForQuery nor the shutdown's FATAL: %+v", out)
			}
		}
		idleDrained := 0
		for _, out := range idle {
			switch {
			case out.err != nil || out.afterError:
				t.Errorf("an idle client: %+v", out)
			case out.lastError == "57P01" && out.readyForQuery:
				idleDrained++
			default:
				t.Errorf("an idle client did not end with the shutdown's FATAL: %+v", out)
			}
		}
		refusedAtShutdown += shutdownFatal
		t.Logf("round %d: %d logins, %d refused with 57P01, %d closed silently; %d of %d idle clients drained", round, served, shutdownFatal, silent, idleDrained, idlers)
	}
	t.Logf("%d logins under way at a shutdown were refused with 57P01", refusedAtShutdown)
}

// TestShutdownEndsLoginsInProgress: a client in the middle of its startup
// packet when the server shuts down gets the shutdown's FATAL 57P01 at
// once, rather than holding the shutdown until client_login_timeout and
// being closed without a word.
func TestShutdownEndsLoginsInProgress(t *testing.T) {
	f := startFakePG(t)
	srv, addr := fakeServer(t, f.ln.Addr().(*net.TCPAddr).Port, 4, f.dial)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{0, 0, 0, 40}); err != nil { // a length word, then nothing
		t.Fatal(err)
	}
	// Its login runs once a loop accepted it (no signal of that: poll).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if srv.logins.running() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection's login did not start")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the client: %v (got %q)", err, b)
	}
	if len(b) == 0 || b[0] != 'E' || !strings.Contains(string(b), "C57P01\x00") {
		t.Fatalf("the client got %q, want the shutdown's ErrorResponse 57P01", b)
	}
}
