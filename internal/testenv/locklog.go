package testenv

import (
	"sync"
	"time"
)

// LockHold is one period in which a client may hold an advisory lock key on
// a backend: from just before the acquiring statement was sent until just
// after the releasing statement answered (or the client went away, plus a
// grace). Its backend is unknown (any) until [LockLog.SetPID].
type LockHold struct {
	key    int64
	client int
	pid    uint32    // 0 until the acquiring statement answered: any backend
	from   time.Time // when it was opened
	to     time.Time // zero while open
}

// LockLog is the model of the advisory locks clients believe they hold,
// which a checker compares with pg_locks: every granted lock there must be
// explained by a hold here. It is safe for concurrent use.
type LockLog struct {
	mu    sync.Mutex
	byKey map[int64][]*LockHold
}

// NewLockLog is an empty log.
func NewLockLog() *LockLog { return &LockLog{byKey: map[int64][]*LockHold{}} }

// Open starts a hold of key by client, now.
func (g *LockLog) Open(client int, key int64) *LockHold {
	h := &LockHold{key: key, client: client, from: time.Now()}
	g.mu.Lock()
	g.byKey[key] = append(g.byKey[key], h)
	g.mu.Unlock()
	return h
}

// SetPID records the backend the hold's lock was taken on.
func (g *LockLog) SetPID(h *LockHold, pid uint32) {
	g.mu.Lock()
	h.pid = pid
	g.mu.Unlock()
}

// Close ends the hold at at; a hold already closed keeps its end.
func (g *LockLog) Close(h *LockHold, at time.Time) {
	g.mu.Lock()
	if h.to.IsZero() {
		h.to = at
	}
	g.mu.Unlock()
}

// Explains reports whether some client may have held key on backend pid at
// some moment between qs and qe (when the pg_locks query was sent and when
// it answered).
func (g *LockLog) Explains(pid uint32, key int64, qs, qe time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range g.byKey[key] {
		if h.from.After(qe) || (!h.to.IsZero() && h.to.Before(qs)) {
			continue
		}
		if h.pid == 0 || h.pid == pid {
			return true
		}
	}
	return false
}

// Prune forgets the holds that ended before t.
func (g *LockLog) Prune(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, hs := range g.byKey {
		keep := hs[:0]
		for _, h := range hs {
			if h.to.IsZero() || h.to.After(t) {
				keep = append(keep, h)
			}
		}
		g.byKey[k] = keep
	}
}
