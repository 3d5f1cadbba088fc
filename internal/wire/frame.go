package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// ErrProtocol marks a malformed message. Every framing and parsing error of
// this package wraps it; lockpool answers it with SQLSTATE 08P01 and closes
// the connection.
var ErrProtocol = errors.New("protocol violation")

// ProtocolErrorf returns an error wrapping ErrProtocol with a reason.
func ProtocolErrorf(format string, args ...any) error {
	return &protocolError{reason: fmt.Sprintf(format, args...)}
}

type protocolError struct{ reason string }

func (e *protocolError) Error() string { return ErrProtocol.Error() + ": " + e.reason }
func (e *protocolError) Unwrap() error { return ErrProtocol }

// malformed is the error of a message body that does not parse.
func malformed(msg, reason string) error {
	return &protocolError{reason: "invalid " + msg + " message: " + reason}
}

// MaxMessageLen is the largest length word ReadHeader and Frame accept (the
// body plus the 4 bytes of the length itself), as PostgreSQL's 1 GB limit.
const MaxMessageLen = 1 << 30

// headerLen is the size of a typed message's header: type byte and length.
const headerLen = 5

// HeaderReader is what ReadHeader needs; *bufio.Reader and *Reader have it.
type HeaderReader interface {
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
}

// BodyReader is what ReadBody needs; *bufio.Reader and *Reader have it.
// Size is the buffer size: bodies up to it are returned without a copy.
type BodyReader interface {
	HeaderReader
	io.Reader
	Size() int
}

// ReadHeader reads and consumes the 5-byte header of a typed message and
// returns its type and body length n (without the length word). A length
// word below 4 or above MaxMessageLen is an error wrapping ErrProtocol, and
// the header is then not consumed. EOF inside the header is
// io.ErrUnexpectedEOF; EOF before it is io.EOF.
func ReadHeader(r HeaderReader) (typ byte, n int, err error) {
	hdr, err := r.Peek(headerLen)
	if err != nil {
		if len(hdr) > 0 && errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	typ = hdr[0]
	l := binary.BigEndian.Uint32(hdr[1:headerLen])
	if l < 4 || l > MaxMessageLen {
		return 0, 0, ProtocolErrorf("invalid message length %d for message type %q", l, typ)
	}
	_, _ = r.Discard(headerLen)
	return typ, int(l) - 4, nil
}

// keepScratch is the largest scratch buffer ReadBody keeps for reuse.
const keepScratch = 64 << 10

// ReadBody reads and consumes the n-byte body of the message whose header
// was just read. A body that fits r's buffer aliases it; a larger one is
// read into *scratch (scratch may be nil), which ReadBody grows as the
// bytes arrive, so a length word alone never makes it allocate, and which it
// keeps for reuse up to 64 KiB. Either way the body is valid until the next
// call on r or the next ReadBody with the same scratch. EOF before the
// whole body is io.ErrUnexpectedEOF.
func ReadBody(r BodyReader, n int, scratch *[]byte) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	if n <= r.Size() {
		b, err := r.Peek(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		_, _ = r.Discard(n)
		return b[:n:n], nil
	}
	var b []byte
	if scratch != nil {
		b = (*scratch)[:0]
	}
	for len(b) < n {
		// Grow by what is there already (at least 64 KiB): memory follows
		// the bytes received, and copying stays linear.
		step := min(n-len(b), max(len(b), keepScratch))
		b = slices.Grow(b, step)
		if _, err := io.ReadFull(r, b[len(b):len(b)+step]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		b = b[:len(b)+step]
	}
	if scratch != nil && cap(b) <= keepScratch {
		*scratch = b
	}
	return b[:n:n], nil
}

// ReadMessage reads one whole typed message: ReadHeader, then ReadBody.
func ReadMessage(r BodyReader, scratch *[]byte) (typ byte, body []byte, err error) {
	typ, n, err := ReadHeader(r)
	if err != nil {
		return 0, nil, err
	}
	body, err = ReadBody(r, n, scratch)
	return typ, body, err
}

// Frame cuts the first whole typed message off b and returns its type, its
// body and the bytes after it, all aliasing b. An empty b is io.EOF, an
// incomplete message io.ErrUnexpectedEOF (read more and call again), and a
// bad length word an error wrapping ErrProtocol.
func Frame(b []byte) (typ byte, body, rest []byte, err error) {
	if len(b) == 0 {
		return 0, nil, nil, io.EOF
	}
	if len(b) < headerLen {
		return 0, nil, nil, io.ErrUnexpectedEOF
	}
	l := binary.BigEndian.Uint32(b[1:headerLen])
	if l < 4 || l > MaxMessageLen {
		return 0, nil, nil, ProtocolErrorf("invalid message length %d for message type %q", l, b[0])
	}
	end := 1 + int(l)
	if len(b) < end {
		return 0, nil, nil, io.ErrUnexpectedEOF
	}
	return b[0], b[headerLen:end:end], b[end:], nil
}

// CString splits the NUL-terminated string at the start of b: s is the
// string without its NUL, rest what follows. ok is false when b holds no NUL.
func CString(b []byte) (s, rest []byte, ok bool) {
	if len(b) > 0 && b[0] == 0 {
		return b[:0:0], b[1:], true // the empty name of unnamed statements and portals
	}
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, nil, false
	}
	return b[:i:i], b[i+1:], true
}
