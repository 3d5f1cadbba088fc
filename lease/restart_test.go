package lease

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// TestLeaseCallsRetryAfterServerEndedConnections: a shutdown (a switchover
// stops the old primary with -m fast) ends every idle lease connection
// with FATAL 57P01, which the client reads at the connection's next use.
// Lease calls then go on, on a new connection, without an error.
func TestLeaseCallsRetryAfterServerEndedConnections(t *testing.T) {
	pgtest.Require(t)
	ctx := ctxT(t, 2*time.Minute)
	c, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	if err := c.CreateRole(ctx, appUser, appPW); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateDatabase(ctx, appDB, appUser); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{
		Schema:     "lp_fatal",
		InstanceID: "fatal",
		ConnConfig: func(db string) (*pgx.ConnConfig, error) { return pgx.ParseConfig(c.DSN(appUser, appPW, db)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	a := s.NewSession(appDB, 1)
	// Both of the store's connections open and idle.
	var wg sync.WaitGroup
	toks := make([]int64, 2)
	for i := range toks {
		wg.Add(1)
		go func() { defer wg.Done(); toks[i] = mustAcquire(t, a, fmt.Sprint("r", i), time.Minute, time.Second) }()
	}
	wg.Wait()
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	for i, tok := range toks {
		if ok, err := a.Renew(ctx, fmt.Sprint("r", i)); !ok || err != nil {
			t.Fatalf("renew r%d after the server ended the store's connections: %v, %v", i, ok, err)
		}
		if got := mustAcquire(t, a, fmt.Sprint("r", i), time.Minute, 0); got != tok {
			t.Fatalf("r%d: token %d after the restart, was %d", i, got, tok)
		}
	}
}
