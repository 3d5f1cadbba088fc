package proxy

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/local"
)

// Signal forwarding between the instances of a cluster: a
// pg_terminate_backend or pg_cancel_backend whose key pid carries another
// live instance's number (sessions.go) is sent to the address that
// instance advertises, as a request on its client listener, like a
// forwarded cancel request:
//
//	→ SignalRequest: int32 length, int32 codeSignalRequest, int32 pid,
//	  byte 'T' (terminate) or 'C' (cancel), int64 timeout in milliseconds,
//	  byte 1 when the caller is an admin user, the caller's user (C string)
//	← 32 random bytes: the challenge
//	→ 32 bytes: HMAC-SHA256 under the receiver's signal key of the
//	  challenge followed by the request from its pid on
//	← one byte: the local.SignalResult (signalWire)
//
// Unlike a CancelRequest, which carries the client's secret key, a signal
// request names a client by its pid alone, and says who asks; so the
// receiver acts only on a request authenticated with its signal key: 32
// random bytes each instance makes at start and writes to its row of
// cluster_instances, where the other instances read it (cluster.Peer). A
// network client that knows no key learns only a challenge, and a
// recorded exchange cannot be replayed (the challenge is new on every
// connection). The key is as secret as the cluster tables: roles that may
// read lockpool's schema in the cluster database could forge requests.

// codeSignalRequest is the startup packet code of a forwarded signal
// request: 1234 in the high half, as PostgreSQL's own request codes, and a
// low half ("LP") none of them uses.
const codeSignalRequest = 1234<<16 | 0x4c50

const (
	signalKeyLen       = 32
	signalRequestMin   = 4 + 1 + 8 + 1 + 1 // pid, action, timeout, admin flag, empty user
	signalForwardSlack = 3 * time.Second   // beyond the timeout: dial, challenge, the kill or the cancel request itself
	// signalMaxWait bounds the timeout a forwarded terminate waits for its
	// client to end (a session ends within it or not at all).
	signalMaxWait = 24 * time.Hour
)

// signalWire is each local.SignalResult's byte on the wire.
var signalWire = [...]byte{local.SignalNoClient: 'n', local.SignalSent: 't', local.SignalStillRunning: 'w', local.SignalDenied: 'p',
	local.SignalCanceled: 'c', local.SignalUnreachable: 'u'}

// newSignalKey makes this instance's signal key.
func newSignalKey() []byte {
	k := make([]byte, signalKeyLen)
	_, _ = rand.Read(k)
	return k
}

// signalMAC authenticates a request body (from its pid on) under key for
// challenge.
func signalMAC(key, challenge, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(challenge)
	m.Write(body)
	return m.Sum(nil)
}

// appendSignalRequest appends r as the body of a SignalRequest (from the
// pid on).
func appendSignalRequest(dst []byte, r signalRequest) []byte {
	dst = binary.BigEndian.AppendUint32(dst, r.pid)
	action := byte('C')
	if r.terminate {
		action = 'T'
	}
	dst = append(dst, action)
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.timeout.Milliseconds()))
	admin := byte(0)
	if r.admin {
		admin = 1
	}
	dst = append(dst, admin)
	return wire.AppendCString(dst, r.user)
}

// parseSignalRequest reads the body of a SignalRequest.
func parseSignalRequest(b []byte) (signalRequest, error) {
	var r signalRequest
	if len(b) < signalRequestMin {
		return r, errors.New("short signal request")
	}
	r.pid = binary.BigEndian.Uint32(b)
	switch b[4] {
	case 'T':
		r.terminate = true
	case 'C':
	default:
		return r, fmt.Errorf("unknown signal action %q", b[4])
	}
	ms := binary.BigEndian.Uint64(b[5:])
	if ms > uint64(signalMaxWait/time.Millisecond) {
		return r, errors.New("signal request timeout out of range")
	}
	r.timeout = time.Duration(ms) * time.Millisecond
	r.admin = b[13] == 1
	user, rest, ok := wire.CString(b[14:])
	if !ok || len(rest) != 0 {
		return r, errors.New("malformed user in signal request")
	}
	r.user = string(user)
	return r, nil
}

// forwardSignal sends r to live instance number n of the cluster and
// returns its answer. A number that names no live instance names no
// client (local.SignalNoClient). The caller's ctx (its cancel request)
// ends the exchange.
func (s *Server) forwardSignal(ctx context.Context, n int, r signalRequest) (local.SignalResult, error) {
	p, ok := s.cluster.PeerInfo(n)
	if !ok {
		return local.SignalNoClient, nil
	}
	key, err := hex.DecodeString(p.SignalKey)
	if err != nil || len(key) != signalKeyLen {
		return local.SignalUnreachable, fmt.Errorf("instance %d takes no signal requests (a lockpool without them?)", n)
	}
	r.timeout = min(r.timeout, signalMaxWait)
	res, err := exchangeSignal(ctx, p.Address, key, r)
	switch {
	case ctx.Err() != nil:
		return local.SignalCanceled, nil
	case err != nil:
		s.log.Warn("cluster: could not forward a signal request", "number", n, "address", p.Address, "err", err)
		return local.SignalUnreachable, err
	case res == local.SignalUnreachable:
		return res, errors.New("the instance is shutting down")
	}
	return res, nil
}

// exchangeSignal runs one SignalRequest exchange with the instance at addr,
// whose signal key is key.
func exchangeSignal(ctx context.Context, addr string, key []byte, r signalRequest) (local.SignalResult, error) {
	d := net.Dialer{Timeout: cancelForwardTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(r.timeout + signalForwardSlack))
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	body := appendSignalRequest(nil, r)
	pkt := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	pkt = binary.BigEndian.AppendUint32(pkt, codeSignalRequest)
	if _, err := c.Write(append(pkt, body...)); err != nil {
		return 0, err
	}
	challenge := make([]byte, signalKeyLen)
	if _, err := io.ReadFull(c, challenge); err != nil {
		return 0, fmt.Errorf("reading the challenge: %w", err)
	}
	if _, err := c.Write(signalMAC(key, challenge, body)); err != nil {
		return 0, err
	}
	var ans [1]byte
	if _, err := io.ReadFull(c, ans[:]); err != nil {
		return 0, fmt.Errorf("reading the answer: %w", err)
	}
	for res, b := range signalWire {
		if b == ans[0] {
			return local.SignalResult(res), nil
		}
	}
	if ans[0] == 'a' {
		return 0, errors.New("the instance did not accept this instance's signal key")
	}
	return 0, fmt.Errorf("unknown answer %q", ans[0])
}

// serveSignalRequest answers a SignalRequest (body: from its pid on) that
// another instance of the cluster forwarded, on the accepting goroutine:
// a challenge, then the request carried out only if its MAC is right. A
// key pid that is not this instance's names no client here.
func (s *Server) serveSignalRequest(conn net.Conn, br *bufio.Reader, body []byte) {
	r, err := parseSignalRequest(body)
	if err != nil || s.cluster == nil || len(s.signalKey) != signalKeyLen {
		s.log.Debug("cluster: signal request refused", "remote", conn.RemoteAddr().String(), "err", err)
		return
	}
	_ = conn.SetDeadline(time.Now().Add(signalForwardSlack))
	challenge := newSignalKey()
	if _, err := conn.Write(challenge); err != nil {
		return
	}
	mac := make([]byte, sha256.Size)
	if _, err := io.ReadFull(br, mac); err != nil {
		return
	}
	if !hmac.Equal(mac, signalMAC(s.signalKey, challenge, body)) {
		s.log.Warn("cluster: signal request with a wrong key refused", "remote", conn.RemoteAddr().String())
		_, _ = conn.Write([]byte{'a'})
		return
	}
	res := local.SignalNoClient
	if pidNumber(r.pid) == s.cluster.Number() {
		ctx, cancel := context.WithTimeout(s.baseCtx, r.timeout+signalForwardSlack)
		res = s.signalClient(ctx, r)
		cancel()
		if res == local.SignalCanceled {
			res = local.SignalUnreachable // this instance is shutting down
		}
	}
	_ = conn.SetDeadline(time.Now().Add(signalForwardSlack))
	_, _ = conn.Write([]byte{signalWire[res]})
}
