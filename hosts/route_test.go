package hosts

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockpool/lockpool/config"
)

// TestPreferStandbyFallbackEnds: a prefer-standby connection to the
// primary, dialed while no standby replayed within max_lag, serves only
// while none does: once a standby qualifies again it is not usable (so the
// application's transactions go back to the standbys), and it is again
// when the standby stops answering. Connections of target any to the
// primary stay usable throughout. No PostgreSQL: the checks' results are
// applied directly.
func TestPreferStandbyFallbackEnds(t *testing.T) {
	m, err := New(Options{Hosts: []config.HostAddr{{Host: "p", Port: 5432}, {Host: "s", Port: 5432}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p, s := m.Hosts()[0], m.Hosts()[1]
	m.apply(p, result{})
	m.apply(s, result{inRecovery: true, lag: 5 * time.Second})

	prefer := Target{Kind: config.TargetPreferStandby, MaxLag: time.Second}
	anyHost := Target{Kind: config.TargetAny, MaxLag: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ep, err := m.Route(ctx, prefer)
	if err != nil || ep.Host != p {
		t.Fatalf("Route(prefer-standby) with the standby lagging = %v, %v; want the primary", ep.Addr(), err)
	}
	if !m.Usable(ep, prefer) || !m.Usable(ep, anyHost) {
		t.Fatal("the primary's connection is not usable while the standby lags")
	}

	m.apply(s, result{inRecovery: true}) // caught up
	if m.Usable(ep, prefer) {
		t.Error("prefer-standby's connection to the primary is still usable once the standby replays within max_lag")
	}
	if !m.Usable(ep, anyHost) {
		t.Error("target any's connection to the primary is not usable once the standby caught up")
	}
	if ep2, err := m.Route(ctx, prefer); err != nil || ep2.Host != s {
		t.Errorf("Route(prefer-standby) with the standby caught up = %v, %v; want the standby", ep2.Addr(), err)
	}

	m.apply(s, result{err: errors.New("no answer")})
	if !m.Usable(ep, prefer) {
		t.Error("prefer-standby's connection to the primary is not usable while the standby does not answer")
	}
}
