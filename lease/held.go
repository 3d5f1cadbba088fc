package lease

import (
	"sort"
	"time"
)

// HeldLease is a lease one of this store's sessions holds, as the admin
// console's SHOW LEASES lists it.
type HeldLease struct {
	Database  string
	Name      string
	Token     int64
	Holder    string
	SessionID uint64 // the id given to NewSession (lockpool's client id)
	TTL       time.Duration
}

// Held lists the leases this store's sessions hold (not those being
// released), sorted by database and name. It reads memory only.
func (s *Store) Held() []HeldLease {
	s.mu.Lock()
	list := make([]*Session, 0, len(s.sessions))
	for ss := range s.sessions {
		list = append(list, ss)
	}
	s.mu.Unlock()
	var out []HeldLease
	for _, ss := range list {
		ss.lock()
		for name, h := range ss.held {
			if !h.releasing {
				out = append(out, HeldLease{Database: ss.database, Name: name, Token: h.token, Holder: ss.holder, SessionID: ss.id, TTL: h.ttl})
			}
		}
		ss.unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Database != out[j].Database {
			return out[i].Database < out[j].Database
		}
		return out[i].Name < out[j].Name
	})
	return out
}
