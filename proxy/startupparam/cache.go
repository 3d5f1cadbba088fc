package startupparam

import (
	"sync"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// maxCachedSets bounds a Cache.
const maxCachedSets = 1024

// Cache remembers the sets of startup settings PostgreSQL accepted, by a
// key the caller makes of the set and of what the answer depends on (the
// server user and the database), and what PostgreSQL made of each value,
// so that a login with a set seen before needs no server connection. Logins
// that bring the same new set at the same time share one check: the first
// to Begin it runs it and calls Finish, the others wait for its Done. The
// zero Cache is empty and ready to use.
type Cache struct {
	mu       sync.Mutex
	sets     map[string]*Checked
	inflight map[string]*Check
}

// Checked is PostgreSQL's answer to one set of settings it accepted.
type Checked struct {
	Values  []string // the value set_config returned for each checked setting, in order
	Notices []byte   // NoticeResponse messages the check produced (PostgreSQL sends them at login)
}

// Check is one check in progress; its outcome is readable once Done is
// closed.
type Check struct {
	done    chan struct{}
	checked *Checked
	verdict *pgerr.Error
	err     error
}

// Done is closed once the check's outcome is known.
func (ch *Check) Done() <-chan struct{} { return ch.done }

// Result is the check's outcome, to be read only after Done is closed:
// PostgreSQL's answer to an accepted set, or the client's FATAL for a
// setting it refused (shared by every waiter: copy it before changing it),
// or the error that kept any server connection from doing the check.
func (ch *Check) Result() (*Checked, *pgerr.Error, error) {
	return ch.checked, ch.verdict, ch.err
}

// Begin returns the remembered answer for key, or the check in progress
// for key and whether the caller owns it: an owner runs the check and must
// call Finish, whatever happens.
func (c *Cache) Begin(key string) (checked *Checked, ch *Check, owner bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.sets[key]; ok {
		return e, nil, false
	}
	if ch, ok := c.inflight[key]; ok {
		return nil, ch, false
	}
	if c.inflight == nil {
		c.inflight = make(map[string]*Check)
	}
	ch = &Check{done: make(chan struct{})}
	c.inflight[key] = ch
	return nil, ch, true
}

// Finish publishes the outcome of the check of key that Begin returned to
// its owner, and remembers an accepted set (checked not nil), forgetting an
// arbitrary one when the cache is full.
func (c *Cache) Finish(key string, ch *Check, checked *Checked, verdict *pgerr.Error, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch.checked, ch.verdict, ch.err = checked, verdict, err
	delete(c.inflight, key)
	if checked != nil {
		if c.sets == nil {
			c.sets = make(map[string]*Checked)
		}
		if len(c.sets) >= maxCachedSets {
			for k := range c.sets {
				delete(c.sets, k)
				break
			}
		}
		c.sets[key] = checked
	}
	close(ch.done)
}
