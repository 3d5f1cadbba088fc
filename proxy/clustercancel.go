package proxy

import (
	"encoding/binary"
	"net"
	"time"
)

// Cancel forwarding between the instances of a cluster. A client's
// BackendKeyData pid carries the number of the instance serving it in bits
// 23–30 (numbers 1–255, from cluster_instances; the low 23 bits count
// sessions, bit 31 stays 0 so the pid is a positive int32 as libpq expects).
// A CancelRequest whose pid names another live instance is sent on, as the
// same 16-byte packet, to the address that instance advertises; the
// receiving instance finds the number is its own and cancels locally. A pid
// without a number (no cluster, or not registered yet) is always local.

const (
	pidNumberShift = 23
	pidLowMask     = 1<<pidNumberShift - 1
	// cancelForwardTimeout bounds the connection to the peer and the write.
	cancelForwardTimeout = 500 * time.Millisecond
)

// keyPID is the pid lockpool hands a new session, from its session
// counter: with a cluster number the number goes in the high bits.
func (s *Server) keyPID(counter uint32) uint32 {
	if s.cluster == nil {
		return counter
	}
	n := s.cluster.Number()
	if n <= 0 {
		return counter & pidLowMask // no number: never forwarded
	}
	low := counter & pidLowMask
	if low == 0 {
		low = 1
	}
	return uint32(n)<<pidNumberShift | low
}

// forwardCancel sends a CancelRequest for another instance's client on to
// that instance and reports whether it did (false: the key is this
// instance's, or names no live peer).
func (s *Server) forwardCancel(pid, secret uint32) bool {
	if s.cluster == nil {
		return false
	}
	n := int(pid >> pidNumberShift)
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
