package proxy

import (
	"encoding/binary"
	"net"
	"time"

	"github.com/lockpool/lockpool/proxy/session"
)

// Key pids. The pid of a client's BackendKeyData is its identity for
// cancel requests, pg_cancel_backend and pg_terminate_backend (sessions.go),
// so it must never be a PostgreSQL backend's pid: every key pid is at
// least 2^22 (Linux's PID_MAX_LIMIT; no process id reaches it) and a
// positive int32, as libpq expects. Bits 23–30 carry the number of the
// cluster instance serving the client (1–255, from cluster_instances); a
// pid without a number (no cluster, or not registered yet) lies in
// [2^22, 2^23) and is always this instance's. The low bits count sessions.
//
// Cancel forwarding between the instances of a cluster: a CancelRequest
// whose pid names another live instance is sent on, as the same 16-byte
// packet, to the address that instance advertises; the receiving instance
// finds the number is its own and cancels locally.

const (
	pidNumberShift = 23
	pidLowMask     = 1<<pidNumberShift - 1
	keyPIDBase     = session.KeyPIDBase
	// cancelForwardTimeout bounds the connection to the peer and the write.
	cancelForwardTimeout = 500 * time.Millisecond
)

// keyPID is the pid lockpool hands a new session, from its session
// counter: with a cluster number the number goes in the high bits.
func (s *Server) keyPID(counter uint32) uint32 {
	n := 0
	if s.cluster != nil {
		n = s.cluster.Number()
	}
	return keyPIDOf(n, counter)
}

// keyPIDOf is the key pid of session counter on instance number n (0: no
// number).
func keyPIDOf(n int, counter uint32) uint32 {
	if n <= 0 || n > 255 {
		return keyPIDBase | counter&(keyPIDBase-1)
	}
	return uint32(n)<<pidNumberShift | counter&pidLowMask
}

// pidNumber is the cluster instance number a key pid carries (0: none).
func pidNumber(pid uint32) int { return int(pid >> pidNumberShift) }

// forwardCancel sends a CancelRequest for another instance's client on to
// that instance and reports whether it did (false: the key is this
// instance's, or names no live peer).
func (s *Server) forwardCancel(pid, secret uint32) bool {
	if s.cluster == nil {
		return false
	}
	n := pidNumber(pid)
	if n == 0 || n == s.cluster.Number() {
		return false
	}
	addr, ok := s.cluster.Peer(n)
	if !ok {
		s.log.Debug("cancel request for an unknown cluster instance", "number", n)
		return false
	}
	c, err := net.DialTimeout("tcp", addr, cancelForwardTimeout)
	if err != nil {
		s.log.Warn("cluster: could not forward a cancel request", "number", n, "address", addr, "err", err)
		return true
	}
	defer c.Close()
	var pkt [16]byte
	binary.BigEndian.PutUint32(pkt[0:], 16)
	binary.BigEndian.PutUint32(pkt[4:], codeCancelRequest)
	binary.BigEndian.PutUint32(pkt[8:], pid)
	binary.BigEndian.PutUint32(pkt[12:], secret)
	_ = c.SetWriteDeadline(time.Now().Add(cancelForwardTimeout))
	if _, err := c.Write(pkt[:]); err != nil {
		s.log.Warn("cluster: could not forward a cancel request", "number", n, "address", addr, "err", err)
	}
	return true
}
