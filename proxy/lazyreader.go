package proxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// clientBufSize is the read buffer a session borrows while its client
// sends; an idle session holds none.
const clientBufSize = 8 << 10

var clientBufPool = sync.Pool{New: func() any { b := make([]byte, clientBufSize); return &b }}

// lazyReader is a buffered reader that gives its buffer back whenever it
// is empty and must wait for the client, so thousands of idle clients cost
// no read buffers. Its Peek and Discard behave like bufio.Reader's: a
// peeked slice is valid until the next Peek or Read.
type lazyReader struct {
	rd   net.Conn
	bp   *[]byte // nil while idle
	r, w int
	err  error
	// releaseAfter: a client silent this long gives its buffer back (0:
	// never).
	releaseAfter time.Duration
	// deadline is the session's own limit for the next byte
	// (idle_transaction_timeout); zero for none. The reader is the only
	// owner of the connection's read deadline: it combines this one with
	// its own buffer-release timer.
	deadline time.Time
	applied  time.Time // the read deadline last set on rd
}

// SetDeadline sets the session's limit for the client's next byte; a read
// that passes it fails with a timeout error.
func (b *lazyReader) SetDeadline(t time.Time) { b.deadline = t }

// setReadDeadline sets rd's read deadline when it changes.
func (b *lazyReader) setReadDeadline(t time.Time) {
	if !t.Equal(b.applied) {
		_ = b.rd.SetReadDeadline(t)
		b.applied = t
	}
}

func newLazyReader(rd net.Conn, initial []byte) *lazyReader {
	lr := &lazyReader{rd: rd, releaseAfter: 2 * time.Second}
	if len(initial) > 0 {
		lr.take()
		lr.w = copy(*lr.bp, initial)
	}
	return lr
}

func (b *lazyReader) take() {
	if b.bp == nil {
		b.bp = clientBufPool.Get().(*[]byte)
		b.r, b.w = 0, 0
	}
}

// Size is the buffer size: messages up to it can be peeked whole.
func (b *lazyReader) Size() int { return clientBufSize }

// Buffered is the number of bytes read from the client and not consumed.
func (b *lazyReader) Buffered() int { return b.w - b.r }

// Release gives the buffer back if it is empty (the session is idle).
func (b *lazyReader) Release() {
	if b.bp != nil && b.r == b.w {
		clientBufPool.Put(b.bp)
		b.bp = nil
		b.r, b.w = 0, 0
	}
}

// fill reads at least one more byte. An active client reads straight into
// the buffer; one that stays silent for releaseAfter gives the buffer back
// and then waits for its next byte without holding one.
func (b *lazyReader) fill() error {
	if b.err != nil {
		return b.err
	}
	if b.bp != nil && b.r == b.w && b.releaseAfter > 0 {
		b.r, b.w = 0, 0
		release := time.Now().Add(b.releaseAfter)
		if !b.deadline.IsZero() && b.deadline.Before(release) {
			release = b.deadline
		}
		b.setReadDeadline(release)
		n, err := b.rd.Read(*b.bp)
		b.w = n
		if n > 0 || err == nil || !isTimeout(err) {
			if err != nil && n == 0 {
				return err
			}
			return nil
		}
		if !b.deadline.IsZero() && !time.Now().Before(b.deadline) {
			return err
		}
	}
	b.setReadDeadline(b.deadline)
	if b.bp == nil || (b.r == b.w && b.releaseAfter > 0) {
		b.Release()
		var one [1]byte
		n, err := b.rd.Read(one[:])
		if n == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			return err
		}
		b.take()
		(*b.bp)[0] = one[0]
		b.w = 1
		if err != nil {
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
	n, err := b.rd.Read(buf[b.w:])
	b.w += n
	if err != nil {
		b.err = err
		if n > 0 {
			return nil
		}
		b.err = nil // a timeout may be retried
		return err
	}
	return nil
}

// Peek returns the next n bytes without consuming them (n ≤ Size).
func (b *lazyReader) Peek(n int) ([]byte, error) {
	if n > clientBufSize {
		return nil, io.ErrShortBuffer
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
func (b *lazyReader) Discard(n int) (int, error) {
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

// Read reads into p, from the buffer first.
func (b *lazyReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.w == b.r {
		if b.bp != nil && len(p) >= clientBufSize {
			b.Release()
		}
		if b.bp == nil {
			return b.rd.Read(p)
		}
		if err := b.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, (*b.bp)[b.r:b.w])
	b.r += n
	return n, nil
}
