package integration

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/testenv"
)

// TestCancelNeverReachesNextHolder: on a budget of one connection, client
// A runs short statements and a canceller sends CancelRequests for A at
// random moments, many of them while A's statement is ending and the
// connection is about to pass to client B. Oracle: B never sees 57014 (a
// cancel meant for A never lands on B's statement), A sees only success
// or 57014, and some of A's statements were in fact cancelled (so the
// cancels reach the server at all).
func TestCancelNeverReachesNextHolder(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned = "cnr", 1, 0
	l := startLockpool(t, 10, "", app)
	a, b := l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")
	ctx := testenv.Context(t, 60*time.Second)
	const runFor = 4 * time.Second
	deadline := time.Now().Add(runFor)
	var aDone, aCancelled, bDone, cancels atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	stopA := make(chan struct{})
	wg.Add(3)
	go func() { // A
		defer wg.Done()
		defer close(stopA)
		for time.Now().Before(deadline) {
			_, err := a.Exec(ctx, "SELECT pg_sleep($1::float8)", rand.Float64()*0.004)
			var pe *pgconn.PgError
			switch {
			case err == nil:
				aDone.Add(1)
			case errors.As(err, &pe) && pe.Code == "57014":
				aCancelled.Add(1)
			default:
				errc <- err
				return
			}
		}
	}()
	go func() { // B
		defer wg.Done()
		for time.Now().Before(deadline) {
			var n int
			if err := b.QueryRow(ctx, "SELECT 1 FROM pg_sleep($1::float8)", rand.Float64()*0.004).Scan(&n); err != nil || n != 1 {
				errc <- errors.Join(errors.New("client B's statement"), err)
				return
			}
			bDone.Add(1)
		}
	}()
	go func() { // the canceller, for A only
		defer wg.Done()
		for {
			select {
			case <-stopA:
				return
			case <-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond):
			}
			if err := a.PgConn().CancelRequest(ctx); err != nil {
				errc <- err
				return
			}
			cancels.Add(1)
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("A: %d done, %d cancelled; B: %d done; %d cancel requests", aDone.Load(), aCancelled.Load(), bDone.Load(), cancels.Load())
	if aCancelled.Load() == 0 || bDone.Load() == 0 || aDone.Load() == 0 {
		t.Fatalf("no contest: A done %d cancelled %d, B done %d", aDone.Load(), aCancelled.Load(), bDone.Load())
	}
}

// TestCancelEndsConnectionWait: on a budget of one connection held by
// client A's open transaction, client B's statement waits in lockpool for
// a connection; a CancelRequest for B ends that wait at once with 57014
// (as PostgreSQL answers a cancelled statement), the wait is gone from the
// pool, and B's next statement runs once A commits. Rounds cancel at a
// random moment after B starts waiting.
func TestCancelEndsConnectionWait(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "cew", 1, 0, "30s"
	l := startLockpool(t, 10, "", app)
	a, b := l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")
	ctx := testenv.Context(t, 60*time.Second)
	for round := 0; round < 8; round++ {
		if _, err := a.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Exec(ctx, "SELECT 1"); err != nil { // A holds the connection
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := b.Exec(ctx, "SELECT 1")
			errc <- err
		}()
		eventually(t, 5*time.Second, "B waiting for a connection", func() bool {
			return l.srv.Pool().Stats(app.name).Waiting == 1
		})
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // a random moment of the wait
		t0 := time.Now()
		if err := b.PgConn().CancelRequest(ctx); err != nil {
			t.Fatalf("CancelRequest: %v", err)
		}
		select {
		case err := <-errc:
			pgErr(t, err, "57014")
			if el := time.Since(t0); el > 2*time.Second {
				t.Errorf("round %d: the cancelled wait ended after %v", round, el)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: B's wait not ended 10 s after its CancelRequest", round)
		}
		if w := l.srv.Pool().Stats(app.name).Waiting; w != 0 {
			t.Fatalf("round %d: %d waiters left in the pool after the cancel", round, w)
		}
		if _, err := a.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
		var one int
		if err := b.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("round %d: B after its cancel: %d, %v", round, one, err)
		}
	}
}
