package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// scriptConn is a client connection under the test's control. Chunks the
// test queued are the client's bytes; a read with a deadline set finds the
// client silent (timeout) when none is queued, so "the client stays silent
// for the release delay" needs no clock. A read without a deadline reports
// its buffer size on reads, then blocks until the test sends a chunk.
type scriptConn struct {
	data     chan []byte // closed: EOF
	reads    chan int    // len(p) of each blocking read (nil: not reported)
	pending  []byte
	eof      bool
	deadline bool
	setCalls int // SetReadDeadline calls
}

func newScriptConn(chunks ...string) *scriptConn {
	c := &scriptConn{data: make(chan []byte, len(chunks)+8), reads: make(chan int, 1024)}
	for _, s := range chunks {
		c.data <- []byte(s)
	}
	return c
}

func (c *scriptConn) SetReadDeadline(t time.Time) error {
	c.deadline = !t.IsZero()
	c.setCalls++
	return nil
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 && !c.eof {
		var b []byte
		var ok bool
		if c.deadline {
			select {
			case b, ok = <-c.data:
			default:
				return 0, os.ErrDeadlineExceeded
			}
		} else {
			select {
			case c.reads <- len(p):
			default: // nobody looks at this many
			}
			b, ok = <-c.data
		}
		c.pending, c.eof = b, !ok
	}
	if len(c.pending) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// waitRead waits until the Reader blocks in a read and returns that read's
// size; a read that ends first (under a deadline that should not be there)
// fails the test.
func waitRead(t *testing.T, c *scriptConn, res <-chan readResult) int {
	t.Helper()
	select {
	case n := <-c.reads:
		return n
	case got := <-res:
		t.Fatalf("the read ended instead of waiting for the client: %+v", got)
	}
	return 0
}

type readResult struct {
	typ  byte
	body string
	err  error
}

// readAsync reads one message on another goroutine.
func readAsync(r *Reader) <-chan readResult {
	res := make(chan readResult, 1)
	go func() {
		typ, n, err := ReadHeader(r)
		var body []byte
		if err == nil {
			body, err = r.Body(n)
		}
		res <- readResult{typ, string(body), err}
	}()
	return res
}

func TestReaderReadsMessagesInAnyChunks(t *testing.T) {
	var stream []byte
	stream = AppendQuery(stream, "SELECT 1")
	stream = AppendParse(stream, "s1", "SELECT $1", []uint32{23})
	stream = AppendQuery(stream, bytes.Repeat([]byte("y"), 200)) // larger than the buffer
	stream = AppendSync(stream)
	for _, chunk := range []int{1, 3, 7, 64, len(stream)} {
		var chunks []string
		for b := stream; len(b) > 0; {
			k := min(chunk, len(b))
			chunks = append(chunks, string(b[:k]))
			b = b[k:]
		}
		c := newScriptConn(chunks...)
		close(c.data)
		r := NewReader(c, NewBufferPool(32), nil)
		rest := stream
		for {
			typ, n, err := ReadHeader(r)
			if err == io.EOF && len(rest) == 0 {
				break
			}
			if err != nil {
				t.Fatalf("chunk %d: ReadHeader: %v", chunk, err)
			}
			body, err := r.Body(n)
			if err != nil {
				t.Fatalf("chunk %d: Body: %v", chunk, err)
			}
			wtyp, wbody, wrest, _ := Frame(rest)
			if typ != wtyp || !bytes.Equal(body, wbody) {
				t.Fatalf("chunk %d: got %q %q, want %q %q", chunk, typ, body, wtyp, wbody)
			}
			rest = wrest
		}
	}
}

func TestReaderGivesBufferBackWhenIdle(t *testing.T) {
	c := newScriptConn(string(AppendQuery(nil, "SELECT 1")))
	pool := NewBufferPool(64)
	r := NewReader(c, pool, nil)
	if r.Borrowed() {
		t.Fatal("a new Reader holds a buffer")
	}
	res := readAsync(r)
	if n := <-c.reads; n != 1 {
		t.Fatalf("first read of %d bytes, want a 1-byte read without a buffer", n)
	}
	if got := <-res; got.err != nil || got.typ != 'Q' || got.body != "SELECT 1\x00" {
		t.Fatalf("first message: %+v", got)
	}
	if !r.Borrowed() || r.Buffered() != 0 {
		t.Fatalf("after a message: borrowed %v, buffered %d", r.Borrowed(), r.Buffered())
	}

	// The client stays silent: the Reader gives its buffer back and waits
	// with a 1-byte read.
	res = readAsync(r)
	if n := waitRead(t, c, res); n != 1 {
		t.Fatalf("idle wait reads %d bytes, want 1", n)
	}
	if r.Borrowed() {
		t.Fatal("the Reader holds its buffer while the client is silent")
	}
	c.data <- AppendSync(nil)
	if got := <-res; got.err != nil || got.typ != 'S' || got.body != "" {
		t.Fatalf("second message: %+v", got)
	}
	if !r.Borrowed() {
		t.Error("no buffer after data came")
	}
	if c.deadline {
		t.Error("read deadline left set")
	}
}

func TestReaderClearsDeadlineAfterIdleWait(t *testing.T) {
	msg := AppendQuery(nil, "SELECT pg_sleep(1)")
	// The Reader holds a buffer (initial bytes) and has consumed it; the
	// start of the next message comes within the idle wait.
	c := newScriptConn(string(msg[:7]))
	r := NewReader(c, NewBufferPool(64), []byte("x"))
	if b, err := r.Peek(1); err != nil || string(b) != "x" {
		t.Fatalf("Peek = %q, %v", b, err)
	}
	_, _ = r.Discard(1)
	res := readAsync(r) // idle wait with a deadline, gets the first 7 bytes
	// The rest comes later than the release delay: the read for it must
	// not run under the idle wait's deadline.
	if n := waitRead(t, c, res); n < len(msg)-7 {
		t.Fatalf("read for the rest of the message: %d bytes", n)
	}
	c.data <- msg[7:]
	if got := <-res; got.err != nil || got.body != "SELECT pg_sleep(1)\x00" {
		t.Fatalf("message sent slowly: %+v", got)
	}
}

func TestReaderBorrowReadsAtOnce(t *testing.T) {
	// An event loop woke the owner because bytes are waiting: the read
	// goes into the whole buffer with no release delay, so no clock read
	// and no deadline set. The message after it waits idle as usual.
	c := newScriptConn(string(AppendQuery(nil, "SELECT 1")))
	r := NewReader(c, NewBufferPool(64), nil)
	r.Borrow()
	if got := <-readAsync(r); got.err != nil || got.typ != 'Q' || got.body != "SELECT 1\x00" {
		t.Fatalf("message: %+v", got)
	}
	select {
	case n := <-c.reads:
		if n != 64 {
			t.Fatalf("borrowed read of %d bytes, want the whole buffer (64)", n)
		}
	default:
		t.Fatal("the borrowed read ran under a deadline (the release delay)")
	}
	if c.setCalls != 0 {
		t.Fatalf("%d SetReadDeadline calls for a borrowed read, want 0", c.setCalls)
	}
	res := readAsync(r)
	if n := waitRead(t, c, res); n != 1 {
		t.Fatalf("next idle wait reads %d bytes, want 1 (the buffer given back)", n)
	}
	c.data <- AppendSync(nil)
	if got := <-res; got.err != nil || got.typ != 'S' {
		t.Fatalf("second message: %+v", got)
	}
}

func TestReaderWithoutRelease(t *testing.T) {
	c := newScriptConn(string(AppendQuery(nil, "a")))
	r := NewReader(c, NewBufferPool(64), nil)
	r.SetReleaseAfter(0)
	if got := <-readAsync(r); got.err != nil || got.body != "a\x00" {
		t.Fatalf("first message: %+v", got)
	}
	<-c.reads
	res := readAsync(r)
	if n := waitRead(t, c, res); n != 64 {
		t.Fatalf("wait reads %d bytes, want the whole buffer (64)", n)
	}
	if !r.Borrowed() {
		t.Error("buffer given back with release off")
	}
	c.data <- AppendQuery(nil, "b")
	if got := <-res; got.err != nil || got.body != "b\x00" {
		t.Fatalf("second message: %+v", got)
	}
	if c.setCalls != 0 {
		t.Errorf("%d SetReadDeadline calls with release off", c.setCalls)
	}
}

func TestReaderInitialBytes(t *testing.T) {
	msgs := AppendQuery(AppendQuery(nil, "one"), "two")
	for _, size := range []int{16, 64} { // initial larger than and within the buffer
		c := newScriptConn()
		close(c.data)
		r := NewReader(c, NewBufferPool(size), msgs)
		for _, want := range []string{"one\x00", "two\x00"} {
			typ, body, err := ReadMessage(r, nil)
			if err != nil || typ != 'Q' || string(body) != want {
				t.Fatalf("size %d: %q %q %v, want %q", size, typ, body, err, want)
			}
		}
		if _, _, err := ReadMessage(r, nil); err != io.EOF {
			t.Errorf("size %d: after the initial bytes: %v, want io.EOF", size, err)
		}
		r.Release()
		if r.Borrowed() {
			t.Errorf("size %d: Release kept the buffer", size)
		}
	}
}

func TestReaderPeekDiscardRead(t *testing.T) {
	c := newScriptConn("abcdef")
	close(c.data)
	r := NewReader(c, NewBufferPool(16), nil)
	if _, err := r.Peek(17); err != io.ErrShortBuffer {
		t.Errorf("Peek beyond Size: %v", err)
	}
	if b, err := r.Peek(0); err != nil || len(b) != 0 {
		t.Errorf("Peek(0) = %q, %v", b, err)
	}
	if b, err := r.Peek(3); err != nil || string(b) != "abc" {
		t.Errorf("Peek(3) = %q, %v", b, err)
	}
	if n, err := r.Discard(2); n != 2 || err != nil {
		t.Errorf("Discard(2) = %d, %v", n, err)
	}
	p := make([]byte, 10)
	if n, err := r.Read(p); err != nil || string(p[:n]) != "cdef" {
		t.Errorf("Read = %q, %v", p[:n], err)
	}
	if b, err := r.Peek(1); err != io.EOF || len(b) != 0 {
		t.Errorf("Peek at EOF = %q, %v", b, err)
	}
	if n, err := r.Discard(1); n != 0 || err != io.EOF {
		t.Errorf("Discard at EOF = %d, %v", n, err)
	}
}

func TestReaderLargeReadSkipsBuffer(t *testing.T) {
	big := bytes.Repeat([]byte("z"), 40)
	c := newScriptConn(string(big))
	close(c.data)
	r := NewReader(c, NewBufferPool(16), nil)
	p := make([]byte, 40)
	n, err := io.ReadFull(r, p)
	if err != nil || n != 40 || !bytes.Equal(p, big) {
		t.Fatalf("ReadFull = %d, %v", n, err)
	}
	if r.Borrowed() {
		t.Error("a read of at least Size borrowed a buffer")
	}
	if <-c.reads != 40 {
		t.Error("the read did not go straight to the connection")
	}
}

func TestReaderStickyError(t *testing.T) {
	boom := errors.New("connection reset")
	c := &failConn{data: []byte("Q\x00\x00\x00\x09SEL"), err: boom}
	r := NewReader(c, NewBufferPool(64), nil)
	r.SetReleaseAfter(0)
	if _, _, err := ReadMessage(r, nil); !errors.Is(err, boom) {
		t.Fatalf("ReadMessage = %v, want %v", err, boom)
	}
	// What was read before the error stays readable, then the error again.
	if b, err := r.Peek(1); err != nil || string(b) != "Q" {
		t.Errorf("Peek(1) after the error = %q, %v", b, err)
	}
	if b, err := r.Peek(2); !errors.Is(err, boom) || string(b) != "Q" {
		t.Errorf("Peek(2) after the error = %q, %v; want Q, %v", b, err, boom)
	}
}

// failConn returns its data with an error, then the error.
type failConn struct {
	data []byte
	err  error
}

func (c *failConn) Read(p []byte) (int, error) {
	n := copy(p, c.data)
	c.data = c.data[n:]
	return n, c.err
}

func (c *failConn) SetReadDeadline(time.Time) error { return nil }

// SetDeadline: the owner's deadline ends a wait with a timeout error (also
// while the release delay is running), and after it is cleared the Reader
// reads on normally.
func TestReaderOwnerDeadline(t *testing.T) {
	for _, release := range []time.Duration{0, DefaultReleaseAfter} {
		client, server := net.Pipe()
		r := NewReader(server, NewBufferPool(64), []byte("x"))
		r.SetReleaseAfter(release)
		_, _ = r.Discard(1)
		r.SetDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := r.Peek(5)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("release %v: Peek past the deadline = %v, want a timeout", release, err)
		}
		r.SetDeadline(time.Time{})
		go func() { _, _ = client.Write(AppendQuery(nil, "a")) }()
		typ, n, err := ReadHeader(r)
		if err != nil || typ != 'Q' || n != 2 {
			t.Fatalf("release %v: after clearing: %q %d %v", release, typ, n, err)
		}
		client.Close()
		server.Close()
	}
}
