package appstate

import (
	"sync/atomic"
	"time"
)

// Stats counts an application's traffic for SHOW STATS and
// /debug/stats. Its sessions update it on their hot path with atomic adds
// only (no lock, no allocation); it survives reloads.
type Stats struct {
	since    time.Time    // when counting began
	xacts    atomic.Int64 // transactions ended (ReadyForQuery 'I')
	queries  atomic.Int64 // ReadyForQuery relayed: a simple query or an extended batch up to Sync
	received atomic.Int64 // bytes of client messages written to the server
	sent     atomic.Int64 // bytes written to clients
}

func newStats() *Stats { return &Stats{since: time.Now()} }

// Ready counts a ReadyForQuery with transaction status status: one query,
// and a transaction when the status says none is open any more.
func (st *Stats) Ready(status byte) {
	st.queries.Add(1)
	if status == 'I' {
		st.xacts.Add(1)
	}
}

// ToServer counts n bytes written to the server for a client.
func (st *Stats) ToServer(n int) { st.received.Add(int64(n)) }

// ToClient counts n bytes written to a client.
func (st *Stats) ToClient(n int) { st.sent.Add(int64(n)) }
