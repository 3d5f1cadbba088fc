package pool

import (
	"sort"
	"time"
)

// DatabaseStats is one database of an application's pool, for the admin
// console's SHOW POOLS.
type DatabaseStats struct {
	Database string
	Idle     int           // idle server connections to this database
	Waiting  int           // Acquire and AcquireWithPin calls for it queued or paused
	MaxWait  time.Duration // how long the oldest of them has waited
}

// DatabaseStats returns app's pool per database that has idle connections
// or waiters, sorted by database.
func (m *Manager) DatabaseStats(app string) []DatabaseStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.apps[app]
	if a == nil {
		return nil
	}
	now := time.Now()
	by := map[string]*DatabaseStats{}
	get := func(db string) *DatabaseStats {
		d := by[db]
		if d == nil {
			d = &DatabaseStats{Database: db}
			by[db] = d
		}
		return d
	}
	for db, st := range a.idle {
		if len(st.conns) > 0 {
			get(db).Idle = len(st.conns)
		}
	}
	for _, q := range []*waitQueue{&a.waiters, &a.bothWaiters, &a.pauseWaiters} {
		for w := q.head; w != nil; w = w.next {
			d := get(w.db)
			d.Waiting++
			if !w.since.IsZero() {
				d.MaxWait = max(d.MaxWait, now.Sub(w.since))
			}
		}
	}
	out := make([]DatabaseStats, 0, len(by))
	for _, d := range by {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Database < out[j].Database })
	return out
}

// IdleConn describes an idle server connection, for SHOW SERVERS.
type IdleConn struct {
	App, Database, User string
	PID                 uint32
	Created, IdleSince  time.Time
	LastClient          string // the last client that used it
}

// IdleConns lists the idle server connections of every application,
// sorted by application, database and backend pid.
func (m *Manager) IdleConns() []IdleConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []IdleConn
	for _, a := range m.appList {
		for _, st := range a.idle {
			for _, c := range st.conns {
				out = append(out, IdleConn{App: c.App, Database: c.Database, User: c.User, PID: c.PID,
					Created: c.created, IdleSince: c.idleSince, LastClient: c.LastClient})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.App != y.App {
			return x.App < y.App
		}
		if x.Database != y.Database {
			return x.Database < y.Database
		}
		return x.PID < y.PID
	})
	return out
}

// observeWait records how long an Acquire waited (zero for none).
func (a *appPool) observeWait(d time.Duration) {
	a.am.observeWait(d)
	a.waitCount.Add(1)
	a.waitNanos.Add(int64(d))
}

// WaitTotals returns how many Acquire calls app had and how long they
// waited in all (queued or paused; dials are not counted).
func (m *Manager) WaitTotals(app string) (acquires int64, waited time.Duration) {
	m.mu.Lock()
	a := m.apps[app]
	var immediate int64
	if a != nil {
		immediate = a.immediate
	}
	m.mu.Unlock()
	if a == nil {
		return 0, 0
	}
	return immediate + a.waitCount.Load(), time.Duration(a.waitNanos.Load())
}

// Created is when the connection was logged in.
func (c *Conn) Created() time.Time { return c.created }
