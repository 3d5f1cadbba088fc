package proxy

import (
	"context"
	"time"

	"github.com/lockpool/lockpool/rewrite"
)

// LeaseStore is what the proxy needs from the lease package.
type LeaseStore interface {
	NewSession(database string, id uint64) LeaseSession
	Schema() string
	Close()
}

// LeaseSession is one client session's leases.
type LeaseSession interface {
	Acquire(ctx context.Context, name string, ttl, wait time.Duration) (token int64, ok bool, err error)
	Renew(ctx context.Context, name string) (bool, error)
	Release(ctx context.Context, name string) (bool, error)
	List(ctx context.Context) ([]LeaseRow, error)
	TakeWarnings() []string
	Close(ctx context.Context)
}

// LeaseRow is one row of lease_list().
type LeaseRow struct {
	Name, Holder       string
	Token              int64
	TakenAt, ExpiresAt time.Time
	Mine               bool
}

var errLeasesOff = &pgError{Code: "0A000", Message: "lockpool: leases are not available on this lockpool instance", Hint: "Configure the leases section, or call the lease functions through a lockpool that serves them."}

var errLeaseWhole = &pgError{Code: "0A000", Message: "lockpool: lease functions must be the whole statement", Hint: "Call them alone: SELECT lease_acquire('name', ttl_seconds) or SELECT * FROM lease_list()."}

// onLeaseQuery answers a simple-protocol lease call.
func (s *session) onLeaseQuery(f *rewrite.Findings, sql string) error {
	if f.Lease == nil {
		return s.fail(errLeaseWhole, true)
	}
	return s.fail(errLeasesOff, true)
}

// onLeaseParse answers an extended-protocol lease call.
func (s *session) onLeaseParse(f *rewrite.Findings, name string, rest []byte) error {
	if f.Lease == nil {
		return s.fail(errLeaseWhole, false)
	}
	return s.fail(errLeasesOff, false)
}

// closeLeases releases the session's leases when it ends.
func (s *session) closeLeases() {}

// trackSets notes SET/RESET statements so the relay reads the values back
// once the statement completes.
func (s *session) trackSets(f *rewrite.Findings) {
	if len(f.Sets) == 0 && !hasRoleChange(f) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range f.Sets {
		if c.Local {
			continue
		}
		s.setsPending = true
		if c.All {
			s.setsAll = true
			continue
		}
		s.setNames = append(s.setNames, c.Name)
	}
	for _, c := range f.State {
		if c.Kind == rewrite.SetConfig {
			// set_config with computed arguments: read back what we know of.
			s.setsPending = true
			if c.Name != "" {
				s.setNames = append(s.setNames, c.Name)
			}
		}
	}
}

func hasRoleChange(f *rewrite.Findings) bool {
	for _, c := range f.State {
		if c.Kind == rewrite.SetConfig {
			return true
		}
	}
	return false
}
