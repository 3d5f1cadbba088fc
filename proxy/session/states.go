package session

import "fmt"

// The session's own states, beside its server link's (link.go): where it
// is in its life on its event loop (lifeState), and where its
// conversation with the server stands (position). Both belong to the
// session's coroutine; other goroutines reach the session through its loop
// (kill, wake) and never read them.
//
//	            Run                 the client is idle, no server
//	lifeNew ──────────> lifeRunning ────────────────────────────> lifeResting
//	                       │   ▲        connection, nothing owed      │
//	                       │   └──────────────────────────────────────┘
//	                       │       the client speaks (or a kill, a wake)
//	                       ▼
//	                   lifeEnded (cleaned up; a kill or wake finds nothing)

// lifeState is where a session is in its life on its event loop.
type lifeState uint8

const (
	lifeNew     lifeState = iota // logging in, or logged in and not running yet (a kill is kept for Run)
	lifeRunning                  // a coroutine serves it (Session.co)
	lifeResting                  // idle with no coroutine: its loop resumes it when the client speaks
	lifeEnded                    // cleaned up: nothing runs it again
)

var lifeStateNames = [...]string{"new", "running", "resting", "ended"}

func (l lifeState) String() string {
	if int(l) < len(lifeStateNames) {
		return lifeStateNames[l]
	}
	return fmt.Sprintf("lifeState(%d)", uint8(l))
}

// position is where the session's conversation with its server connection
// stands: what was asked, what the server said last, and the modes a
// statement put it in (COPY, the skip after an error in a batch). Replies
// still owed are the reply queue's (Session.q); position answers the
// questions about safe points from its fields and the queue's count.
type position struct {
	asked      int  // server entries of q the server was asked to answer (Sync, Query or Flush sent)
	askPending bool // sout ends with a Sync, Query, FunctionCall or Flush
	unsynced   bool // extended-protocol messages went to the server after the last Sync
	txStatus   byte // the server's last ReadyForQuery status
	copyIn     bool // the server waits for COPY data from the client
	copyData   bool // Session.sout holds COPY messages: written now (WriteDraining), not deferred
	sawFatal   bool // the server sent a FATAL error: the connection is about to close
	settled    bool // the last ReadyForQuery left nothing owed: run safePoint
	skipping   bool // discarding client messages until Sync after an error
}

// idle reports whether the server is outside a transaction block with no
// extended-protocol message unsynced: the client's next statement may go
// to any connection.
func (p *position) idle() bool { return p.txStatus == 'I' && !p.unsynced }

// clean reports whether a connection in this position, owing owed replies
// to the client, holds nothing of the client's: every message answered, no
// transaction block, no COPY, no FATAL on its way. Such a connection may
// serve another client (when nothing else holds it: a pin, a probe).
func (p *position) clean(owed int) bool {
	return owed == 0 && p.idle() && !p.copyIn && !p.sawFatal
}

// answered reports whether the server has answered everything the client
// sent it (owed: server entries left in the queue; unsent: bytes buffered
// for the server): the point after which safePoint runs.
func (p *position) answered(owed, unsent int) bool {
	return owed == 0 && !p.unsynced && unsent == 0
}
