package wire

import (
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"time"
)

// DefaultReleaseAfter is how long a new Reader's client may stay silent
// before the Reader gives its buffer back.
const DefaultReleaseAfter = 2 * time.Second

// BufferPool lends read buffers of one size to Readers. One pool serves
// all the Readers of a listener.
type BufferPool struct {
	size int
	p    sync.Pool
}

// NewBufferPool returns a pool of size-byte buffers (size > 0).
func NewBufferPool(size int) *BufferPool {
	bp := &BufferPool{size: size}
	bp.p.New = func() any { b := make([]byte, size); return &b }
	return bp
}

// Size is the size of the pool's buffers.
func (p *BufferPool) Size() int { return p.size }

func (p *BufferPool) get() *[]byte { return p.p.Get().(*[]byte) }

func (p *BufferPool) put(b *[]byte) {
	if len(*b) == p.size {
		p.p.Put(b)
	}
}

// Conn is what a Reader reads: a net.Conn has it.
type Conn interface {
	Read(p []byte) (int, error)
	SetReadDeadline(t time.Time) error
}

// Reader is a buffered reader of one client connection that borrows its
// buffer from a BufferPool only while data flows: it gives the buffer back
// whenever the buffer is empty and the client stays silent for the release
// delay, so thousands of idle clients hold no read buffers. Peek, Discard
// and Read behave like bufio.Reader's. A Reader is used by one goroutine.
//
// Everything Peek and Body return aliases the buffer and is valid until the
// next call on the Reader (see the package documentation).
type Reader struct {
	c            Conn
	pool         *BufferPool
	bp           *[]byte // nil while idle
	r, w         int
	err          error // sticky read error (not timeouts)
	releaseAfter time.Duration
	one          [1]byte // the first byte after an idle wait
	scratch      []byte  // bodies larger than the buffer
	// deadline is the owner's limit for the client's next byte (say an
	// idle-in-transaction timeout); zero for none. The Reader is the only
	// one that sets the connection's read deadline: it combines this one
	// with its own release delay.
	deadline time.Time
	applied  time.Time // the read deadline last set on c
	// waiting: Borrow was told bytes are waiting, so the next read goes
	// straight into the buffer with no release delay (and no clock read).
	waiting bool
}

// SetDeadline sets the limit for the client's next byte: a read that
// passes it fails with a timeout error (the zero time: no limit). Set read
// deadlines only through it.
func (b *Reader) SetDeadline(t time.Time) { b.deadline = t }

// setReadDeadline sets c's read deadline when it changes. The common case,
// no deadline before or after, is decided by comparing the values as
// stored (Equal, which asks about the clock readings, is the fallback).
func (b *Reader) setReadDeadline(t time.Time) {
	if t != b.applied && !t.Equal(b.applied) {
		_ = b.c.SetReadDeadline(t)
		b.applied = t
	}
}

// NewReader returns a Reader of c with buffers from pool. initial holds
// bytes already read from c (say by a startup reader) that come first.
func NewReader(c Conn, pool *BufferPool, initial []byte) *Reader {
	r := &Reader{c: c, pool: pool, releaseAfter: DefaultReleaseAfter}
	if len(initial) > 0 {
		if len(initial) > pool.size {
			b := append([]byte(nil), initial...)
			r.bp = &b
		} else {
			r.bp = pool.get()
		}
		r.w = copy(*r.bp, initial)
	}
	return r
}

// SetReleaseAfter sets how long the client may stay silent, with the buffer
// empty, before the Reader gives its buffer back; 0 never gives it back.
// While it is above 0 the Reader owns c's read deadline: it sets one for
// the silent wait and clears it before any other read. Turn it off when
// the caller sets read deadlines itself, and for TLS connections (a read
// that timed out may leave TLS state unusable).
func (b *Reader) SetReleaseAfter(d time.Duration) { b.releaseAfter = d }

// Size is the buffer size: messages up to it can be peeked whole.
func (b *Reader) Size() int { return b.pool.size }

// Buffered is the number of bytes read from the client and not consumed.
func (b *Reader) Buffered() int { return b.w - b.r }

// Borrowed reports whether the Reader holds a buffer now.
func (b *Reader) Borrowed() bool { return b.bp != nil }

// Release gives the buffer back if it is empty (the client is idle).
func (b *Reader) Release() {
	if b.bp != nil && b.r == b.w {
		b.pool.put(b.bp)
		b.bp = nil
		b.r, b.w = 0, 0
	}
}

// Borrow takes a buffer now, for a caller that knows bytes are waiting
// (an event loop woke it for them): the next read fills the buffer at
// once, with the owner's deadline only, instead of first waiting the
// release delay or reading one byte without a buffer.
func (b *Reader) Borrow() {
	b.take()
	b.waiting = true
}

func (b *Reader) take() {
	if b.bp == nil {
		b.bp = b.pool.get()
		b.r, b.w = 0, 0
	}
}

// fill reads at least one more byte. An active client reads straight into
// the buffer; one that stays silent for the release delay gives the buffer
// back and then waits for its next byte without holding one.
func (b *Reader) fill() error {
	if b.err != nil {
		return b.err
	}
	// idleWait: the buffer is empty and the client may stay silent, so
	// the read may give the buffer back.
	idleWait := b.r == b.w && b.releaseAfter > 0 && !b.waiting
	b.waiting = false
	if b.bp != nil && idleWait {
		b.r, b.w = 0, 0
		// The release delay is for this wait only; the next read goes
		// back to the owner's deadline (setReadDeadline below), so the
		// rest of a message may arrive slowly.
		release := time.Now().Add(b.releaseAfter)
		if !b.deadline.IsZero() && b.deadline.Before(release) {
			release = b.deadline
		}
		b.setReadDeadline(release)
		n, err := b.c.Read(*b.bp)
		b.w = n
		switch {
		case n > 0:
			if err != nil && !isTimeout(err) {
				b.err = err
			}
			return nil
		case err == nil:
			return nil
		case !isTimeout(err):
			return err
		case !b.deadline.IsZero() && !time.Now().Before(b.deadline):
			return err // the owner's deadline passed
		}
		// Silent for releaseAfter: wait on without the buffer.
	}
	b.setReadDeadline(b.deadline)
	if b.bp == nil || idleWait {
		b.Release()
		n, err := b.c.Read(b.one[:])
		if n == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			return err
		}
		b.take()
		(*b.bp)[0] = b.one[0]
		b.w = 1
		if err != nil && !isTimeout(err) {
			b.err = err
		}
		return nil
	}
	buf := *b.bp
	if b.r > 0 {
		copy(buf, buf[b.r:b.w])
		b.w -= b.r
		b.r = 0
	}
	n, err := b.c.Read(buf[b.w:])
	b.w += n
	if err != nil {
		if n > 0 {
			if !isTimeout(err) {
				b.err = err
			}
			return nil
		}
		return err
	}
	return nil
}

// Peek returns the next n bytes without consuming them (n ≤ Size). With
// fewer bytes available it returns them with the read error.
func (b *Reader) Peek(n int) ([]byte, error) {
	if n > b.pool.size {
		return nil, io.ErrShortBuffer
	}
	if n <= 0 {
		return nil, nil
	}
	for b.w-b.r < n {
		if err := b.fill(); err != nil {
			if b.bp == nil {
				return nil, err
			}
			return (*b.bp)[b.r:b.w], err
		}
	}
	return (*b.bp)[b.r : b.r+n], nil
}

// Discard consumes n buffered-or-future bytes.
func (b *Reader) Discard(n int) (int, error) {
	done := 0
	for done < n {
		if b.w == b.r {
			if err := b.fill(); err != nil {
				return done, err
			}
		}
		k := min(n-done, b.w-b.r)
		b.r += k
		done += k
	}
	return done, nil
}

// Read reads into p, from the buffer first. With the buffer empty, a read
// of at least Size bytes goes straight to the connection (a Reader that may
// release its buffer gives it back first).
func (b *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.w == b.r {
		if b.bp != nil && len(p) >= b.pool.size && b.releaseAfter > 0 {
			b.Release()
		}
		if b.bp == nil || len(p) >= b.pool.size {
			if b.err != nil {
				return 0, b.err
			}
			b.setReadDeadline(b.deadline)
			return b.c.Read(p)
		}
		if err := b.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, (*b.bp)[b.r:b.w])
	b.r += n
	return n, nil
}

// bufferedLen is the length word of the next message when its header is
// in the buffer, else -1.
func (b *Reader) bufferedLen() int {
	if b.w-b.r < headerLen {
		return -1
	}
	return int(binary.BigEndian.Uint32((*b.bp)[b.r+1 : b.r+headerLen]))
}

// Next cuts the next message off the buffer in place when all of it is
// there (header and body), with no read: its type and body (nil when
// empty), valid until the next call on the Reader. ok is false when the
// message is not all buffered or its length word is bad; Header and Body
// (or ReadHeader and ReadBody) then read it, or report it.
func (b *Reader) Next() (typ byte, body []byte, ok bool) {
	l := b.bufferedLen()
	if l < 4 || l+1 > b.w-b.r {
		return 0, nil, false
	}
	buf := (*b.bp)[b.r : b.r+l+1]
	b.r += l + 1
	if l == 4 {
		return buf[0], nil, true // as Body: no body is nil
	}
	return buf[0], buf[headerLen : l+1 : l+1], true
}

// NextReady reports, without reading or consuming anything, the next
// message's type and whether all of it is in the buffer (whole), or its
// length word says it never fits the buffer or is bad (large: Header and
// Body read it, or report it). Both are false while not even its header
// is all buffered.
func (b *Reader) NextReady() (typ byte, whole, large bool) {
	l := b.bufferedLen()
	if l < 0 {
		return 0, false, false
	}
	typ = (*b.bp)[b.r]
	if l < 4 || l+1 > b.pool.size {
		return typ, false, true
	}
	return typ, l+1 <= b.w-b.r, false
}

// FillOnce reads once into the buffer, however little arrives: for a
// caller that knows the connection is readable and must not wait for the
// rest of a message.
func (b *Reader) FillOnce() error { return b.fill() }

// Fill reads until the next message is all in the buffer, when it can be:
// after ok, Next returns it. ok is false, with nothing read, when the
// message's length word is bad or the message is larger than the buffer;
// Header and Body (or ReadHeader and ReadBody) then read it, or report it.
// An error is the read's (io.ErrUnexpectedEOF for an end inside a message).
func (b *Reader) Fill() (ok bool, err error) {
	for {
		if l := b.bufferedLen(); l >= 0 {
			if l < 4 || l+1 > b.pool.size {
				return false, nil
			}
			if l+1 <= b.w-b.r {
				return true, nil
			}
		}
		if err := b.fill(); err != nil {
			if err == io.EOF && b.w > b.r {
				err = io.ErrUnexpectedEOF // the end came inside a message
			}
			return false, err
		}
	}
}

// Header reads and consumes the next message's header, as ReadHeader does;
// a header already in the buffer is cut off it in place.
func (b *Reader) Header() (typ byte, n int, err error) {
	if l := b.bufferedLen(); l >= 4 && l <= MaxMessageLen {
		typ = (*b.bp)[b.r]
		b.r += headerLen
		return typ, l - 4, nil
	}
	return ReadHeader(b)
}

// Body reads and consumes the n-byte body of the message whose header was
// just read (ReadBody with the Reader's own scratch buffer); a body already
// in the buffer is cut off it in place.
func (b *Reader) Body(n int) ([]byte, error) {
	if n > 0 && b.w-b.r >= n {
		p := (*b.bp)[b.r : b.r+n : b.r+n]
		b.r += n
		return p, nil
	}
	return ReadBody(b, n, &b.scratch)
}

// isTimeout reports a deadline error (net.Error and os.ErrDeadlineExceeded
// both have Timeout).
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
