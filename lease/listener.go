package lease

import (
	"time"

	"github.com/jackc/pgx/v5"
)

// addWaiter registers a waiter for name before its first acquire attempt, so
// a release between a failed attempt and the sleep is not missed.
func (s *Store) addWaiter(d *dbState, name string) *waiter {
	w := &waiter{ch: make(chan struct{}, 1)}
	d.lmu.Lock()
	m := d.waiters[name]
	if m == nil {
		m = map[*waiter]struct{}{}
		d.waiters[name] = m
	}
	m[w] = struct{}{}
	d.lmu.Unlock()
	s.mu.Lock()
	if !d.started && !s.closed {
		d.started = true
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.listen(d) }()
	}
	s.mu.Unlock()
	return w
}

func (s *Store) removeWaiter(d *dbState, name string, w *waiter) {
	d.lmu.Lock()
	if m := d.waiters[name]; m != nil {
		delete(m, w)
		if len(m) == 0 {
			delete(d.waiters, name)
		}
	}
	d.lmu.Unlock()
}

func (d *dbState) listening() bool {
	d.lmu.Lock()
	defer d.lmu.Unlock()
	return d.ready
}

func (d *dbState) wake(name string) {
	d.lmu.Lock()
	for w := range d.waiters[name] {
		w.wake()
	}
	d.lmu.Unlock()
}

func (d *dbState) wakeAll() {
	d.lmu.Lock()
	for _, m := range d.waiters {
		for w := range m {
			w.wake()
		}
	}
	d.lmu.Unlock()
}

func (d *dbState) setReady(v bool) {
	d.lmu.Lock()
	d.ready = v
	d.lmu.Unlock()
}

// listen keeps one LISTEN connection for the database until the store
// closes, fanning notifications out to waiters by lease name. After every
// (re)connect all waiters are woken, since a release may have gone unheard.
// A lost connection is logged at WARN once, and again every minute while
// it stays down ("lost", then "back" when it is listening again); while it is lost and no one waits, the goroutine ends
// and the next waiter starts it again.
func (s *Store) listen(d *dbState) {
	backoff := 100 * time.Millisecond
	for s.ctx.Err() == nil {
		c, err := s.dial(s.ctx, d.name)
		if err == nil {
			_, err = c.Exec(s.ctx, "LISTEN "+s.names.qchannel)
			if err == nil {
				backoff = 100 * time.Millisecond
				s.opts.ListenTask.OK()
				if d.lost {
					d.lost = false
					s.log.Info("lockpool: lease LISTEN connection back", "database", d.name)
				}
				d.setReady(true)
				d.wakeAll()
				err = s.listenLoop(c, d)
			}
			d.setReady(false)
			closeConn(c)
		}
		if s.ctx.Err() != nil {
			return
		}
		warn := s.opts.ListenTask.Failed()
		if !d.lost || (s.opts.ListenTask != nil && warn) {
			d.lost = true
			s.log.Warn("lockpool: lease LISTEN connection lost; waiters poll until it is back", "database", d.name, "err", err)
		} else {
			s.log.Debug("lockpool: lease LISTEN connection still down", "database", d.name, "err", err)
		}
		d.wakeAll()
		if s.stopListening(d) {
			return
		}
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// stopListening ends the LISTEN goroutine of d when no one waits: it
// reports true after marking d not started, so the next addWaiter starts a
// new one (addWaiter registers its waiter before it looks at started).
func (s *Store) stopListening(d *dbState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	d.lmu.Lock()
	n := len(d.waiters)
	d.lmu.Unlock()
	if n > 0 {
		return false
	}
	d.started = false
	return true
}

func (s *Store) listenLoop(c *pgx.Conn, d *dbState) error {
	for {
		n, err := c.WaitForNotification(s.ctx)
		if err != nil {
			return err
		}
		d.wake(n.Payload)
	}
}
