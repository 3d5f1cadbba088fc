package testenv

import (
	"sort"
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

// LockConflict is two holds of one key by different clients whose periods
// overlap: for an exclusive lock, two clients believed they held the key at
// once.
type LockConflict struct {
	Key          int64
	A, B         int       // the clients; A's hold began first
	AFrom, ATo   time.Time // ATo is zero while A's hold is open
	BFrom, BTo   time.Time
	AHold, BHold *LockHold // the holds, as Open returned them
}

// Conflicts returns the overlapping holds of the same key by different
// clients, each overlap once (with the earlier hold that lasts longest). A
// period is [from, to): a hold that ends at the instant another begins does
// not conflict with it, and an open hold lasts until now. For a belief
// oracle open a hold when the acquiring statement answered and close it
// just before the releasing statement is sent (or when the session's error
// arrived); Prune must not have run.
func (g *LockLog) Conflicts() []LockConflict {
	g.mu.Lock()
	defer g.mu.Unlock()
	end := func(h *LockHold) time.Time {
		if h.to.IsZero() {
			return time.Now().Add(time.Hour)
		}
		return h.to
	}
	var out []LockConflict
	for k, hs := range g.byKey {
		hs = append([]*LockHold(nil), hs...)
		sort.SliceStable(hs, func(i, j int) bool { return hs[i].from.Before(hs[j].from) })
		var last *LockHold // of the holds so far, the one that ends last
		for _, h := range hs {
			if last != nil && h.from.Before(end(last)) && h.client != last.client {
				out = append(out, LockConflict{Key: k, A: last.client, AFrom: last.from, ATo: last.to, B: h.client, BFrom: h.from, BTo: h.to, AHold: last, BHold: h})
			}
			if last == nil || end(h).After(end(last)) {
				last = h
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].BFrom.Before(out[j].BFrom) })
	return out
}
