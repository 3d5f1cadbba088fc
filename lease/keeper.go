package lease

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// kentry is one held lease in the keeper's schedule.
type kentry struct {
	ss       *Session
	name     string
	token    int64
	ttl      time.Duration
	due      time.Time
	idx      int  // heap index; -1 when not in the heap
	inflight bool // being renewed right now (not in the heap)
}

type kheap []*kentry

func (h kheap) Len() int           { return len(h) }
func (h kheap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h kheap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *kheap) Push(x any)        { e := x.(*kentry); e.idx = len(*h); *h = append(*h, e) }
func (h *kheap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}

// keeper is the store's single renewal goroutine. Every lease a session
// holds is renewed every ttl/4; all leases of a database that are due
// together are renewed with one UPDATE.
type keeper struct {
	s    *Store
	mu   sync.Mutex
	h    kheap
	poke chan struct{}

	gcEvery time.Duration
	lastGC  time.Time
}

const batchWindow = 20 * time.Millisecond

func newKeeper(s *Store) *keeper {
	return &keeper{s: s, poke: make(chan struct{}, 1), gcEvery: 10 * time.Minute, lastGC: time.Now()}
}

// schedule (re)schedules e at due unless it is being renewed right now (the
// renewal's outcome reschedules it). Called with the session's lock held.
func (k *keeper) schedule(e *kentry, due time.Time) {
	k.mu.Lock()
	e.due = due
	if e.inflight {
		k.mu.Unlock()
		return
	}
	if e.idx >= 0 {
		heap.Fix(&k.h, e.idx)
	} else {
		heap.Push(&k.h, e)
	}
	first := k.h[0] == e
	k.mu.Unlock()
	if first {
		select {
		case k.poke <- struct{}{}:
		default:
		}
	}
}

// remove takes e out of the schedule. Called with the session's lock held.
func (k *keeper) remove(e *kentry) {
	k.mu.Lock()
	if e.idx >= 0 {
		heap.Remove(&k.h, e.idx)
	}
	k.mu.Unlock()
}

func (k *keeper) run() {
	s := k.s
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*kentry
		k.mu.Lock()
		for len(k.h) > 0 && !k.h[0].due.After(now.Add(batchWindow)) {
			e := heap.Pop(&k.h).(*kentry)
			e.inflight = true
			due = append(due, e)
		}
		var next time.Duration = time.Minute
		if len(k.h) > 0 {
			next = k.h[0].due.Sub(now)
		}
		k.mu.Unlock()

		if len(due) > 0 {
			k.renew(due)
			continue
		}
		if time.Since(k.lastGC) >= k.gcEvery {
			k.lastGC = time.Now()
			s.mu.Lock()
			if !s.closed {
				s.wg.Add(1)
				go func() { defer s.wg.Done(); k.gc() }()
			}
			s.mu.Unlock()
		}
		timer.Reset(max(next, time.Millisecond))
		select {
		case <-s.ctx.Done():
			return
		case <-k.poke:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// renew renews the due entries, one batch per database, databases in
// parallel.
func (k *keeper) renew(due []*kentry) {
	byDB := map[string][]*kentry{}
	for _, e := range due {
		byDB[e.ss.database] = append(byDB[e.ss.database], e)
	}
	var wg sync.WaitGroup
	for db, es := range byDB {
		wg.Add(1)
		go func() { defer wg.Done(); k.renewDB(db, es) }()
	}
	wg.Wait()
}

type renewOutcome int

const (
	renewOK renewOutcome = iota
	renewLost
	renewRetry   // error: try again soon
	renewBlocked // the row is locked by a lease_fence transaction: try again soon
)

func (k *keeper) renewDB(database string, es []*kentry) {
	s := k.s
	minTTL := es[0].ttl
	for _, e := range es {
		minTTL = min(minTTL, e.ttl)
	}
	ctx, cancel := context.WithTimeout(s.ctx, min(max(minTTL/4, time.Second), 10*time.Second))
	defer cancel()

	start := time.Now()
	names := make([]string, len(es))
	holders := make([]string, len(es))
	tokens := make([]int64, len(es))
	ttls := make([]float64, len(es))
	for i, e := range es {
		names[i], holders[i], tokens[i], ttls[i] = e.name, e.ss.holder, e.token, e.ttl.Seconds()
	}
	// A renewal matches name, holder and token: a row that is missing (a
	// grant whose commit was lost in a failover), or that has another
	// holder or token, is not renewed, and the lease is lost.
	type key struct {
		name  string
		token int64
	}
	renewed := map[key]bool{}
	err := s.withConn(ctx, database, func(c *pgx.Conn) error {
		clear(renewed)
		rows, err := c.Query(ctx, s.names.renewMany, names, holders, tokens, ttls)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k key
			if err := rows.Scan(&k.name, &k.token); err != nil {
				return err
			}
			renewed[k] = true
		}
		return rows.Err()
	})
	outcomes := make([]renewOutcome, len(es))
	switch {
	case err == nil:
		if s.opts.RenewTask.OK() {
			s.log.Info("lockpool: lease renewal works again", "database", database)
		}
		for i, e := range es {
			if renewed[key{e.name, e.token}] {
				outcomes[i] = renewOK
			} else {
				outcomes[i] = renewLost
			}
		}
	case isLockTimeout(err) && len(es) > 1:
		// One row is fenced by an open transaction: renew one by one so
		// the others are not held back.
		for i, e := range es {
			var n int64
			err := s.withConn(ctx, database, func(c *pgx.Conn) error {
				tag, err := c.Exec(ctx, s.names.renew, e.name, e.ss.holder, e.token, e.ttl.Seconds())
				n = tag.RowsAffected()
				return err
			})
			switch {
			case isLockTimeout(err):
				outcomes[i] = renewBlocked
			case err != nil:
				outcomes[i] = renewRetry
				s.renewFailed(database, 1, err)
			case n == 1:
				outcomes[i] = renewOK
			default:
				outcomes[i] = renewLost
			}
		}
	case isLockTimeout(err):
		outcomes[0] = renewBlocked
	default:
		if s.ctx.Err() == nil {
			s.renewFailed(database, len(es), err)
		}
		for i := range es {
			outcomes[i] = renewRetry
		}
	}
	for i, e := range es {
		k.settle(e, outcomes[i], start)
	}
}

// settle applies a renewal outcome to the session and reschedules.
func (k *keeper) settle(e *kentry, o renewOutcome, start time.Time) {
	s := k.s
	ss := e.ss
	ss.lock()
	defer ss.unlock()
	k.mu.Lock()
	e.inflight = false
	k.mu.Unlock()
	h := ss.held[e.name]
	current := h != nil && h.k == e && !h.releasing && !ss.closed
	switch o {
	case renewOK:
		s.m.op(OpKeeperRenew, ResultOK)
		if current {
			k.schedule(e, start.Add(e.ttl/4))
		}
	case renewLost:
		if current {
			s.m.op(OpKeeperRenew, ResultLost)
			ss.dropLocked(e.name, h)
			ss.warnLostLocked(e.name, e.token)
			s.log.Warn("lockpool: lease lost", "database", ss.database, "holder", ss.holder, "lease", e.name, "token", e.token)
		}
	case renewRetry, renewBlocked:
		if o == renewRetry {
			s.m.op(OpKeeperRenew, ResultError)
		}
		if current {
			k.schedule(e, time.Now().Add(min(max(e.ttl/8, 50*time.Millisecond), time.Second)))
		}
	}
}

// gc deletes rows that have been free or expired for over an hour, in every
// database the store has used (at most 1000 per run and database).
func (k *keeper) gc() {
	s := k.s
	s.mu.Lock()
	var dbs []string
	for name, d := range s.dbs {
		if d.migrated.Load() {
			dbs = append(dbs, name)
		}
	}
	s.mu.Unlock()
	for _, db := range dbs {
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		err := s.withConn(ctx, db, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, s.names.gc)
			return err
		})
		cancel()
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("lockpool: lease table cleanup failed", "database", db, "err", err)
		}
	}
}

// renewFailed logs a failed renewal of n leases: WARN at the first failure
// and every minute while they go on (RenewTask), DEBUG in between.
func (s *Store) renewFailed(database string, n int, err error) {
	if s.opts.RenewTask.Failed() {
		s.log.Warn("lockpool: lease renewal failed; retrying", "database", database, "leases", n, "err", err)
		return
	}
	s.log.Debug("lockpool: lease renewal failed again; retrying", "database", database, "leases", n, "err", err)
}
