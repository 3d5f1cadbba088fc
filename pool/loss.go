package pool

import (
	"errors"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
)

// lossWindow is how long the server connections lost after a first loss
// are gathered into its log line. A PostgreSQL restart or shutdown closes
// every backend within milliseconds; the sessions using one notice at once.
const lossWindow = time.Second

// lossLog gathers server connections closed by PostgreSQL or the network
// into one INFO line per burst (see [Manager.ServerLost]).
type lossLog struct {
	mu      sync.Mutex
	armed   bool // a burst is being gathered: its line is due
	reasons map[string]int
}

// add counts one loss; first reports whether it started a burst.
func (l *lossLog) add(reason string) (first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.armed {
		l.armed, l.reasons = true, map[string]int{}
		first = true
	}
	l.reasons[reason]++
	return first
}

// take ends the burst and returns its losses.
func (l *lossLog) take() (n int, reasons map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.reasons {
		n += k
	}
	reasons = l.reasons
	l.armed, l.reasons = false, nil
	return n, reasons
}

// ServerLost records that a server connection in use was closed by
// PostgreSQL or the network (the caller destroys it). reason is the
// SQLSTATE and message of the FATAL PostgreSQL sent before it closed, when
// it sent one (a restart or shutdown: "57P01 terminating connection due to
// administrator command"), else the error ("EOF", "connection reset by
// peer").
//
// Losses are logged together: lossWindow after the first of a burst one
// INFO line, "server connections lost", gives how many connections were
// lost and why. The first loss of a burst also checks every idle connection
// at once, so those PostgreSQL closed too are counted in the same line
// (and never handed to a client); the check runs again before the line.
func (m *Manager) ServerLost(reason string) {
	if !m.loss.add(reason) {
		return
	}
	go m.closeDeadIdle()
	time.AfterFunc(lossWindow, func() {
		m.closeDeadIdle()
		n, reasons := m.loss.take()
		m.log.Info("server connections lost", "count", n, "reasons", reasonList(reasons), "server", m.serverAddr(),
			"within", lossWindow.String())
	})
}

// reasonList writes reasons as "count× reason" items, most frequent first.
func reasonList(reasons map[string]int) string {
	keys := make([]string, 0, len(reasons))
	for r := range reasons {
		keys = append(keys, r)
	}
	sort.Slice(keys, func(i, j int) bool {
		if reasons[keys[i]] != reasons[keys[j]] {
			return reasons[keys[i]] > reasons[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, r := range keys {
		parts[i] = strconv.Itoa(reasons[r]) + "× " + r
	}
	return strings.Join(parts, "; ")
}

// closeDeadIdle closes the idle connections whose server has gone (a
// peek finds them closed or with a message pending), counting each as
// lost with the FATAL PostgreSQL sent it.
func (m *Manager) closeDeadIdle() {
	var dead []*Conn
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	for _, a := range m.appList {
		for _, st := range a.idle {
			kept := st.conns[:0]
			for _, c := range st.conns {
				if c.alive() {
					kept = append(kept, c)
					continue
				}
				a.idleN--
				dead = append(dead, m.closeConnLocked(c))
			}
			clear(st.conns[len(kept):])
			st.conns = kept
		}
	}
	m.mu.Unlock()
	for _, c := range dead {
		m.loss.add(goneReason(c))
	}
	m.finishClose(dead, false)
}

// goneReason reads what a closed idle connection's server sent last: the
// SQLSTATE and message of its FATAL, or the error the read met.
func goneReason(c *Conn) string {
	if c.Reader == nil {
		return "closed"
	}
	_ = c.Net.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	defer c.Net.SetReadDeadline(time.Time{})
	for range 4 { // a NOTICE or ParameterStatus may come first
		typ, n, err := wire.ReadHeader(c.Reader)
		if err != nil {
			return ErrReason(err)
		}
		var scratch []byte
		body, err := wire.ReadBody(c.Reader, n, &scratch)
		if err != nil {
			return ErrReason(err)
		}
		if typ == 'E' {
			return FatalReason(body)
		}
	}
	return "unexpected messages"
}

// FatalReason is a loss's reason from the body of the ErrorResponse
// PostgreSQL sent before it closed the connection: "SQLSTATE message".
func FatalReason(body []byte) string {
	e := pgerr.FromBody(body)
	return e.Code + " " + e.Message
}

// ErrReason is a loss's reason from the error that ended the connection.
func ErrReason(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed by the server"
	case isTimeout(err):
		return "timed out"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:] // "read tcp a->b: connection reset by peer" → the cause
	}
	return s
}
