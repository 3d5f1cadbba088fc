package testenv

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Forwarder relays TCP connections from a port of its own to a target
// address. Down closes its listener and cuts every relayed connection (new
// connections are refused); Up listens on the same port again. A test puts
// one between lockpool and the shared cluster to make PostgreSQL
// unreachable and reachable again without stopping the cluster.
type Forwarder struct {
	Port   int
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewForwarder starts a Forwarder on a free port of 127.0.0.1 to target
// (host:port). It stops when t ends.
func NewForwarder(t testing.TB, target string) *Forwarder {
	t.Helper()
	f := &Forwarder{target: target, conns: map[net.Conn]struct{}{}}
	if err := f.listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	f.Port = f.ln.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		f.Down()
		f.wg.Wait()
	})
	return f
}

// Addr is the forwarder's own host:port.
func (f *Forwarder) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Port)) }

func (f *Forwarder) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.ln = ln
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.relay(c)
			}()
		}
	}()
	return nil
}

// relay copies between c and a new connection to the target until either
// side ends or Down cuts both.
func (f *Forwarder) relay(c net.Conn) {
	s, err := net.Dial("tcp", f.target)
	if err != nil {
		_ = c.Close()
		return
	}
	f.mu.Lock()
	if f.ln == nil { // went down meanwhile
		f.mu.Unlock()
		_ = c.Close()
		_ = s.Close()
		return
	}
	f.conns[c], f.conns[s] = struct{}{}, struct{}{}
	f.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done
	<-done
	f.mu.Lock()
	delete(f.conns, c)
	delete(f.conns, s)
	f.mu.Unlock()
}

// Down stops accepting and cuts every relayed connection.
func (f *Forwarder) Down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln != nil {
		_ = f.ln.Close()
		f.ln = nil
	}
	for c := range f.conns {
		_ = c.Close()
	}
}

// Up accepts connections on the same port again.
func (f *Forwarder) Up(t testing.TB) {
	t.Helper()
	if err := f.listen(f.Addr()); err != nil {
		t.Fatal(err)
	}
}
