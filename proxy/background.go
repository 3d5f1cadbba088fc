package proxy

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// startBackground starts the leak sweep and the long-pin log.
func (s *Server) startBackground() {
	s.sweeper.Add(2)
	go func() {
		defer s.sweeper.Done()
		s.sweepLoop(s.baseCtx)
	}()
	go func() {
		defer s.sweeper.Done()
		s.pinLogLoop(s.baseCtx)
	}()
}

// sweepLoop runs the backstop sweep every leak_check_interval: idle,
// unpinned server connections that hold advisory locks (taken where the
// lexer cannot see, such as inside a function) are closed.
func (s *Server) sweepLoop(ctx context.Context) {
	for {
		iv := s.rc.Load().cfg.LeakCheckInterval
		if iv <= 0 {
			iv = 10 * time.Second
			if s.rc.Load().cfg.LeakCheckInterval == 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(iv):
					continue
				}
			}
		}
		t := time.NewTimer(iv)
		select {
		case <-ctx.Done():
			t.Stop()
			s.health.close()
			return
		case <-t.C:
		}
		_, err := s.SweepLeaks(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			// An outage is also logged (once) as "PostgreSQL unreachable".
			if s.sweep.Failed() {
				s.log.Warn("leak sweep failed", "err", err)
			} else {
				s.log.Debug("leak sweep failed again", "err", err)
			}
		default:
			if s.sweep.OK() {
				s.log.Info("leak sweep works again")
			}
		}
	}
}

// SweepLeaks runs one sweep now and returns how many connections it closed.
func (s *Server) SweepLeaks(ctx context.Context) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	closed, err := s.pool.SweepIdle(cctx, func(ctx context.Context, pids []uint32) (map[uint32]bool, error) {
		if len(pids) == 0 {
			return nil, nil
		}
		var b strings.Builder
		b.WriteString("SELECT DISTINCT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid IN (")
		for i, p := range pids {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(uint64(p), 10))
		}
		b.WriteString(")")
		rows, err := s.health.query(ctx, s, b.String())
		if err != nil {
			return nil, fmt.Errorf("querying pg_locks on lockpool's own connection: %w", err)
		}
		leaked := make(map[uint32]bool, len(rows))
		for _, r := range rows {
			p, _ := strconv.ParseUint(r[0], 10, 32)
			leaked[uint32(p)] = true
		}
		return leaked, nil
	})
	rc := s.rc.Load()
	for _, c := range closed {
		s.log.Warn("closed an idle server connection that held advisory locks", "app", c.App, "database", c.Database, "last_client", c.LastClient, "backend_pid", c.PID)
		if as := rc.apps[c.App]; as != nil {
			as.NoteLeaked()
		}
	}
	return len(closed), err
}
