package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/lockpool/lockpool/internal/pgerr"
	"io"
)

// errProtocol marks a malformed client message: the session answers 08P01
// and closes that client.
var errProtocol = errors.New("protocol violation")

// protoErrorf returns a protocol error carrying a human-readable reason.
func protoErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errProtocol}, args...)...)
}

// readHeader peeks and consumes the 5-byte header of a typed message. n is
// the body length (without the length word itself).
// peeker is what readHeader needs: bufio.Reader (server side) and
// lazyReader (client side).
type peeker interface {
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
}

func readHeader(r peeker) (typ byte, n int, err error) {
	hdr, err := r.Peek(5)
	if err != nil {
		if len(hdr) > 0 && errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	typ = hdr[0]
	l := binary.BigEndian.Uint32(hdr[1:5])
	if l < 4 || l > 1<<30 {
		return 0, 0, protoErrorf("invalid message length %d for message type %q", l, typ)
	}
	_, _ = r.Discard(5)
	return typ, int(l) - 4, nil
}

// appendHeader appends a message header with a placeholder length and
// returns the index to patch with finishMsg.
func appendHeader(dst []byte, typ byte) ([]byte, int) {
	start := len(dst)
	dst = append(dst, typ, 0, 0, 0, 0)
	return dst, start
}

// finishMsg patches the length word of the message that starts at start.
func finishMsg(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// appendFrame appends one whole message from its type and body.
func appendFrame(dst []byte, typ byte, body []byte) []byte {
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)+4))
	return append(dst, body...)
}

func appendCString(dst []byte, s string) []byte {
	dst = append(dst, s...)
	return append(dst, 0)
}

// cstring splits the NUL-terminated string at the start of b.
func cstring(b []byte) (s []byte, rest []byte, ok bool) {
	for i, c := range b {
		if c == 0 {
			return b[:i], b[i+1:], true
		}
	}
	return nil, nil, false
}

// pgError is an error lockpool itself reports to a client: the one
// SQLSTATE error type of internal/pgerr.
type pgError = pgerr.Error

// appendError appends an ErrorResponse (or NoticeResponse when typ is 'N').
func appendError(dst []byte, typ byte, e *pgError) []byte { return e.AppendTo(dst, typ) }

// errShutdown is the FATAL a client gets when lockpool shuts down.
func errShutdown() *pgError { return pgerr.Shutdown() }

// errCanceled ends a wait in lockpool that a cancel request stopped.
func errCanceled() *pgError { return pgerr.Canceled() }

// errAborted answers a statement in a failed transaction block.
func errAborted() *pgError { return pgerr.InFailedTransaction() }

// Replies lockpool sends as they are; never modified.
var (
	msgParseComplete = []byte{'1', 0, 0, 0, 4}
	msgBindComplete  = []byte{'2', 0, 0, 0, 4}
	msgCloseComplete = []byte{'3', 0, 0, 0, 4}
	msgNoData        = []byte{'n', 0, 0, 0, 4}
)

func appendReadyForQuery(dst []byte, status byte) []byte {
	return append(dst, 'Z', 0, 0, 0, 5, status)
}

func appendParameterStatus(dst []byte, name, value string) []byte {
	dst, start := appendHeader(dst, 'S')
	dst = appendCString(dst, name)
	dst = appendCString(dst, value)
	return finishMsg(dst, start)
}

func appendQuery(dst []byte, sql string) []byte {
	dst, start := appendHeader(dst, 'Q')
	dst = appendCString(dst, sql)
	return finishMsg(dst, start)
}

func appendParse(dst []byte, name, sql string, paramOIDs []byte) []byte {
	dst, start := appendHeader(dst, 'P')
	dst = appendCString(dst, name)
	dst = appendCString(dst, sql)
	if len(paramOIDs) == 0 {
		dst = append(dst, 0, 0)
	} else {
		dst = append(dst, paramOIDs...)
	}
	return finishMsg(dst, start)
}

func appendClose(dst []byte, kind byte, name string) []byte {
	dst, start := appendHeader(dst, 'C')
	dst = append(dst, kind)
	dst = appendCString(dst, name)
	return finishMsg(dst, start)
}

// appendBindExecute appends Bind of the unnamed portal to the named
// statement with no parameters and an Execute of it.
func appendBindExecute(dst []byte, stmt string) []byte {
	dst, start := appendHeader(dst, 'B')
	dst = appendCString(dst, "")
	dst = appendCString(dst, stmt)
	dst = append(dst, 0, 0, 0, 0, 0, 0)
	dst = finishMsg(dst, start)
	dst = append(dst, 'E', 0, 0, 0, 9, 0, 0, 0, 0, 0)
	return dst
}

// dataRowColumns calls fn for each column of a DataRow body, in order, with
// null set for SQL NULL. It stops at a malformed column.
func dataRowColumns(body []byte, fn func(i int, v []byte, null bool)) {
	if len(body) < 2 {
		return
	}
	n := int(binary.BigEndian.Uint16(body))
	p := body[2:]
	for i := 0; i < n && len(p) >= 4; i++ {
		l := int(int32(binary.BigEndian.Uint32(p)))
		p = p[4:]
		if l < 0 {
			fn(i, nil, true)
			continue
		}
		if l > len(p) {
			return
		}
		fn(i, p[:l], false)
		p = p[l:]
	}
}
