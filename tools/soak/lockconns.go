package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/advisory"
)

// Lock-connection terminations (advisory_locks: hold): every so often the
// soak terminates one of lockpool's lock connections that holds soak keys,
// as an administrator or a failover would. lockpool must end the session of
// every client whose locks were there (its locks are gone, and a session
// that goes on would believe it holds them), keep every other session, and
// give the keys to other clients afterwards as usual.
//
// The lock clients pause around it (lockGate), so what the model says each
// client holds is exact while the connection is chosen: its holders are
// marked lost and forgotten by the exclusive-holder check before the
// backend is terminated (lockpool may give their keys to others as soon as
// it notices). The pause lasts until lockpool's table (/debug/locks) no
// longer lists a hold on that backend, at most lossDeadline: a client that
// ran meanwhile could release its key there before lockpool noticed, and
// then rightly keep its session. A marked client's next operations must
// fail within lossDeadline; one that still gets answers after that is a
// violation, and so is a table that still lists the dead backend.

// lossDeadline is how long lockpool may take to end the session of a client
// whose locks died with a terminated lock connection.
const lossDeadline = 10 * time.Second

// lockConnKeysSQL lists the soak keys granted to lockpool's lock
// connections, by backend.
var lockConnKeysSQL = "SELECT l.pid, " + lockKeyExpr + " FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid" +
	" WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND a.application_name = $1 AND " +
	lockKeyExpr + fmt.Sprintf(" BETWEEN %d AND %d", lockKeyBase, lockKeyBase+lockKeyN-1)

// lockConnKillNote describes the lock-connection terminations for the
// printed settings of a run ("" when there are none).
func (o *options) lockConnKillNote() string {
	if o.advisory != "hold" || o.killLockConn <= 0 {
		return ""
	}
	return fmt.Sprintf(", a lock connection terminated every %v on average", o.killLockConn)
}

// runLockConnKiller terminates a lock connection holding soak keys every
// -kill-lock-conn (on average) until the soak stops.
func (s *soak) runLockConnKiller(rng *rand.Rand, su *pgx.Conn, clients []*lockClient) {
	for {
		d := s.o.killLockConn/2 + time.Duration(rng.Int63n(int64(s.o.killLockConn)+1))
		select {
		case <-s.stopCh:
			return
		case <-time.After(d):
		}
		s.lockGate.Lock()
		s.killLockConn(rng, su, clients)
		s.lockGate.Unlock()
	}
}

// killLockConn terminates one lock connection holding soak keys, with every
// lock client paused between operations.
func (s *soak) killLockConn(rng *rand.Rand, su *pgx.Conn, clients []*lockClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := su.Query(ctx, lockConnKeysSQL, advisory.ApplicationName)
	if err != nil {
		s.unexpectedf("lock-connection killer: %v", err)
		return
	}
	keysOf := map[int32][]int64{}
	for rows.Next() {
		var pid int32
		var key int64
		if err := rows.Scan(&pid, &key); err != nil {
			rows.Close()
			s.unexpectedf("lock-connection killer: %v", err)
			return
		}
		keysOf[pid] = append(keysOf[pid], key)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		s.unexpectedf("lock-connection killer: %v", err)
		return
	}
	if len(keysOf) == 0 {
		return
	}
	pids := make([]int32, 0, len(keysOf))
	for pid := range keysOf {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	pid := pids[rng.Intn(len(pids))]
	now := time.Now()
	var marked []int
	model := s.held.dump()
	table := s.lockpoolTable()
	for _, id := range s.held.holdersOf(keysOf[pid]) {
		if id < len(clients) && clients[id].markLost(now) {
			marked = append(marked, id)
		}
	}

	if _, err := su.Exec(ctx, "SELECT pg_catalog.pg_terminate_backend($1)", pid); err != nil {
		s.unexpectedf("lock-connection killer: terminate %d: %v", pid, err)
		return
	}
	s.count("lock: lock connections terminated")
	for deadline := time.Now().Add(lossDeadline); ; {
		holds, err := s.lockpoolHolds()
		if err != nil {
			s.unexpectedf("lock-connection killer: /debug/locks: %v", err)
			break
		}
		if !slices.ContainsFunc(holds, func(h tableHold) bool { return h.PID == uint32(pid) }) {
			break
		}
		if time.Now().After(deadline) {
			s.violatef("lock", "lockpool's lock table still lists holds on lock connection %d %v after it was terminated: %s", pid, lossDeadline, formatHolds(holds))
			break
		}
		select {
		case <-s.stopCh:
			return
		case <-time.After(10 * time.Millisecond): // polling lockpool's table; it has no signal to wait for
		}
	}
	s.countN("lock: clients whose locks died with their lock connection", int64(len(marked)))
	logf("terminated lock connection %d (soak keys %v); lock clients whose locks were there: %v; the model (key: client: holds) %s; lockpool's table %s",
		pid, keysOf[pid], marked, model, table)
}

// markLost records that the client's locks are about to die with their
// lock connection: it holds nothing from now on, for the exclusive-holder
// check, and its session must end. It reports whether the client was
// connected and not already killed.
func (c *lockClient) markLost(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil || c.killedAt.Load() != 0 || c.lostAt.Load() != 0 {
		return false
	}
	c.s.held.forget(c.id)
	c.lostAt.Store(at.UnixNano())
	return true
}

// lost returns when the client was marked lost, if it was.
func (c *lockClient) lost() (time.Time, bool) {
	n := c.lostAt.Load()
	if n == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}

// checkLost reports a client marked lost whose session still answers after
// lossDeadline, and ends that connection itself.
func (c *lockClient) checkLost() {
	at, ok := c.lost()
	if !ok || c.c() == nil || time.Since(at) < lossDeadline {
		return
	}
	c.s.violatef("lock", "%s: its session still answers %v after the lock connection that held its locks was terminated (lockpool must end it)", c.name(), time.Since(at).Round(time.Millisecond))
	c.cut(time.Now().Add(killGrace), "lock: sessions lockpool kept after their locks died (ended by the soak)", nil)
}

// tableHold is one hold in lockpool's lock table (/debug/locks).
type tableHold struct {
	Client string
	Key    any
	Count  int
	PID    uint32 // the lock connection's backend
}

// lockpoolHolds reads lockpool's lock table from /debug/locks.
func (s *soak) lockpoolHolds() ([]tableHold, error) {
	resp, err := metricsClient.Get(s.e.AdminURL + "/debug/locks")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var rep struct {
		Held []struct {
			Client string `json:"client"`
			Held   []struct {
				Key   any    `json:"key"`
				Count int    `json:"count"`
				PID   uint32 `json:"pid"`
			} `json:"held"`
		} `json:"held"`
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	if err := dec.Decode(&rep); err != nil {
		return nil, err
	}
	var out []tableHold
	for _, c := range rep.Held {
		for _, h := range c.Held {
			out = append(out, tableHold{Client: c.Client, Key: h.Key, Count: h.Count, PID: h.PID})
		}
	}
	return out, nil
}

// formatHolds describes holds compactly: "[client: key×count@pid …]".
func formatHolds(holds []tableHold) string {
	var b strings.Builder
	last := ""
	for _, h := range holds {
		if h.Client != last {
			if last != "" {
				b.WriteString("]")
			}
			b.WriteString("[" + h.Client + ":")
			last = h.Client
		}
		fmt.Fprintf(&b, " %v×%d@%d", h.Key, h.Count, h.PID)
	}
	if last != "" {
		b.WriteString("]")
	}
	return b.String()
}

// lockpoolTable is lockpool's lock table for the log of a termination.
func (s *soak) lockpoolTable() string {
	holds, err := s.lockpoolHolds()
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return formatHolds(holds)
}
