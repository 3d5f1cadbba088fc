package proxy

import "context"

// Handoff ends a server whose listening sockets live on in a successor
// process that accepts on them (handover_socket; internal/handover). It
// closes this process's copy of the listener, so the successor accepts
// everything from then on, including the connections queued in the
// shared accept backlog, and waits until Serve returned (it returns nil).
// Then it shuts down as Shutdown does: running transactions finish, and
// idle clients get 57P01 at once, except the clients this process
// accepted before it stopped accepting that were not served a statement
// yet (still logging in, logged in and idle, only prepared statements, or
// their first statement on its way): each runs its first statement
// (Query, or Execute up to its Sync; with the transaction it opens) and
// gets 57P01 at the idle point after it, so no client sees a restart
// before it was served once. Clients that stay idle without running one
// get 57P01 when ctx ends, like any client left then.
func (s *Server) Handoff(ctx context.Context) error {
	s.mu.Lock()
	if !s.draining {
		s.handedOff.Store(true)
		s.stopAcceptingLocked()
	}
	s.mu.Unlock()
	s.acceptors.Wait()
	return s.Shutdown(ctx)
}
