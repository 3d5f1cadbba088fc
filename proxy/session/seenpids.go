package session

import "sync"

// SeenPIDs maps the pid of a server backend to the key pid of the client
// that last read it from pg_backend_pid(), and back. On a direct
// connection the pid pg_backend_pid() answers names the caller's session
// for good; through lockpool it names the backend of the client's
// transaction at the time, which goes back to the pool after it. So that
// pg_terminate_backend(pid) and pg_cancel_backend(pid) of such a pid
// through lockpool act on the session the pid was given to, as they do on
// PostgreSQL, the signal kind looks the pid up here (session.ClientPID)
// and signals that client by its key pid. A pid read by several clients
// (the backend served each of them) names the last of them; a client that
// reads another pid no longer owns the first one; a client that ends owns
// none.
//
// SeenPIDs is shared by every session of a Server: its methods lock it.
type SeenPIDs struct {
	mu        sync.Mutex
	byBackend map[uint32]uint32 // backend pid → key pid of the client that last read it
	byClient  map[uint32]uint32 // key pid → the backend pid it last read
}

// note records that client (a key pid) read backend's pid.
func (v *SeenPIDs) note(backend, client uint32) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.byBackend == nil {
		v.byBackend = make(map[uint32]uint32)
		v.byClient = make(map[uint32]uint32)
	}
	if old, ok := v.byClient[client]; ok && old != backend && v.byBackend[old] == client {
		delete(v.byBackend, old)
	}
	if prev, ok := v.byBackend[backend]; ok && prev != client && v.byClient[prev] == backend {
		delete(v.byClient, prev)
	}
	v.byBackend[backend] = client
	v.byClient[client] = backend
}

// Forget drops what client (a key pid) read: it has ended.
func (v *SeenPIDs) Forget(client uint32) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if b, ok := v.byClient[client]; ok {
		delete(v.byClient, client)
		if v.byBackend[b] == client {
			delete(v.byBackend, b)
		}
	}
}

// client returns the key pid of the client that last read backend's pid.
func (v *SeenPIDs) client(backend uint32) (uint32, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, ok := v.byBackend[backend]
	return c, ok
}
