package pool

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgproto3"
)

// PassThroughLogin wraps nc, a server connection a PostgreSQL client
// library is about to log in on (pgconn.Config.AfterNetConnect), so that
// the server's SCRAM-SHA-256 request is answered with keys instead of a
// password: the library sends its StartupMessage, the wrapper does the
// SCRAM exchange and hands the library the server's AuthenticationOk and
// everything after it. Any other request (trust, a password, an error) is
// handed to the library as the server sent it. lockpool's own connections
// log in so as a user configured with a SCRAM verifier only, with the keys
// a client's login proved (SCRAMKeys); keys is asked for them only when
// the server asks for SCRAM, and its error ends the login.
func PassThroughLogin(nc net.Conn, keys func() (SCRAMKeys, error)) net.Conn {
	return &passThroughConn{Conn: nc, keys: keys, br: bufio.NewReader(nc), ready: make(chan struct{})}
}

// passThroughConn is PassThroughLogin's wrapper. The library writes its
// StartupMessage once; Write answers the login before it returns, and
// closes ready. A read waits for ready (pgconn starts reading in the
// background when a write is slow, as this one is), then returns what the
// login left for the library, then the server's bytes.
type passThroughConn struct {
	net.Conn
	keys func() (SCRAMKeys, error)
	br   *bufio.Reader

	started bool          // the StartupMessage went by (the writer's)
	ready   chan struct{} // closed when the login is answered
	pending []byte        // what the library reads before br; set before ready
	err     error         // the login's failure; set before ready
}

// Write passes p on; the first write is the StartupMessage, after which
// the login is answered here before Write returns.
func (c *passThroughConn) Write(p []byte) (int, error) {
	if c.started {
		return c.Conn.Write(p)
	}
	c.started = true
	defer close(c.ready)
	if _, err := c.Conn.Write(p); err != nil {
		c.err = err
		return 0, err
	}
	c.pending, c.err = c.login()
	if c.err != nil {
		return 0, c.err
	}
	return len(p), nil
}

// Read returns what login left for the library, then the server's bytes.
func (c *passThroughConn) Read(p []byte) (int, error) {
	<-c.ready
	if c.err != nil {
		return 0, c.err
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.br.Read(p)
}

// login reads the server's answer to the StartupMessage and, for a SCRAM
// request, does the exchange. It returns what the library is to read
// first: the server's AuthenticationOk, or its first answer when that is
// no SCRAM request, as the server sent it. It reads exactly the messages
// it handles from br, so that everything after them is the library's.
func (c *passThroughConn) login() ([]byte, error) {
	raw, err := readMessage(c.br)
	if err != nil {
		return nil, err
	}
	var sasl pgproto3.AuthenticationSASL
	if authCode(raw) != 10 || sasl.Decode(raw[5:]) != nil {
		return raw, nil
	}
	has := false
	for _, mech := range sasl.AuthMechanisms {
		has = has || mech == "SCRAM-SHA-256"
	}
	if !has {
		return nil, fmt.Errorf("pool: the server offers %v, not SCRAM-SHA-256, for a user configured with a SCRAM verifier", sasl.AuthMechanisms)
	}
	keys, err := c.keys()
	if err != nil {
		return nil, err
	}
	sc := newSCRAMClient(keys)
	if err := c.send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: sc.first()}); err != nil {
		return nil, err
	}
	for {
		raw, err := readMessage(c.br)
		if err != nil {
			return nil, err
		}
		switch authCode(raw) {
		case 11: // SASLContinue
			var m pgproto3.AuthenticationSASLContinue
			if err := m.Decode(raw[5:]); err != nil {
				return nil, err
			}
			final, err := sc.final(m.Data)
			if err != nil {
				return nil, err
			}
			if err := c.send(&pgproto3.SASLResponse{Data: final}); err != nil {
				return nil, err
			}
		case 12: // SASLFinal
			var m pgproto3.AuthenticationSASLFinal
			if err := m.Decode(raw[5:]); err != nil {
				return nil, err
			}
			if !sc.verify(m.Data) {
				return nil, errors.New("pool: the server's SCRAM signature does not match the configured verifier")
			}
		default: // AuthenticationOk, or an ErrorResponse: the library's
			return raw, nil
		}
	}
}

// send writes one frontend message.
func (c *passThroughConn) send(m pgproto3.FrontendMessage) error {
	b, err := m.Encode(nil)
	if err != nil {
		return err
	}
	_, err = c.Conn.Write(b)
	return err
}

// readMessage reads one whole backend message (type, length, body) from
// br, and nothing after it.
func readMessage(br *bufio.Reader) ([]byte, error) {
	hdr, err := br.Peek(5)
	if err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:5]))
	if n < 4 || n > 1<<20 {
		return nil, fmt.Errorf("pool: a server login message of %d bytes", n)
	}
	raw := make([]byte, 1+n)
	if _, err := io.ReadFull(br, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// authCode is the code of an Authentication message raw, or -1 for
// another message.
func authCode(raw []byte) int {
	if raw[0] != 'R' || len(raw) < 9 {
		return -1
	}
	return int(binary.BigEndian.Uint32(raw[5:9]))
}
