package integration

// 200 random pg_terminate_backend calls on
// lockpool's server connections during load from 20 clients, four of them
// pinned by session advisory locks. A client whose backend was terminated
// gets an error for its own transaction only; a client whose backend was
// not terminated sees no error; a pinned session gets an error, is
// disconnected, and its locks are gone; no lock survives.

import (
	"context"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// TestFaultTerminateBackends runs with the event loops' sends batched
// through io_uring (the default) and sent one by one: a terminated
// backend makes a deferred query write fail in either.
func TestFaultTerminateBackends(t *testing.T) {
	for _, ring := range []string{"true", "false"} {
		t.Run("io_uring_"+ring, func(t *testing.T) { faultTerminateBackends(t, "io_uring: "+ring) })
	}
}

func faultTerminateBackends(t *testing.T, top string) {
	c := pgtest.Require(t)
	const role, db = "flterm", "appdb"
	testenv.EnsureRole(t, c, role)
	const plain, pinnedN, kills = 16, 4, 200
	yaml := testenv.UserYAML(c, top, 30, "  connect_timeout: 2s", role, appPassword,
		"    database: appdb\n    max_connections: 12\n    max_pinned: 4\n    wait_timeout: 5s")
	l, _ := startYAML(t, yaml)
	ctx := context.Background()
	su := superConn(t, "appdb")
	suCheck := superConn(t, "appdb") // for the client goroutines, under suMu
	var suMu sync.Mutex

	var (
		mu         sync.Mutex
		terminated = map[uint32]bool{} // pids handed to pg_terminate_backend
		wg         sync.WaitGroup
		stop       = make(chan struct{})
		plainOK    int
		plainErr   int
		unknownErr int
		pinErrs    int
		relocks    int
	)
	// worked[i] is when client i (the pinned ones after the plain ones)
	// last began a transaction that committed.
	worked := make([]time.Time, plain+pinnedN)
	didWork := func(i int, began time.Time) {
		mu.Lock()
		worked[i] = began
		mu.Unlock()
	}
	// allWork waits until every client has committed a transaction begun
	// after since, and says so (without stopping the test) if they have
	// not after 15 s.
	allWork := func(since time.Time, what string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			n := 0
			for _, w := range worked {
				if w.After(since) {
					n++
				}
			}
			mu.Unlock()
			if n == len(worked) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("timed out after 15s waiting for every client to commit a transaction %s: %d of %d did", what, n, len(worked))
				return
			}
		}
	}
	wasTerminated := func(pid uint32) bool {
		mu.Lock()
		defer mu.Unlock()
		return terminated[pid]
	}
	// connLost: the kinds of error a lost server connection may produce.
	connLost := func(err error, conn *pgx.Conn) bool {
		switch sqlState(err) {
		case "57P01", "08006", "08003", "08000":
			return true
		}
		return conn.IsClosed()
	}
	// connect retries a login whose server side was hit: lockpool may need
	// a server connection at login, and the killer may terminate it while
	// it logs in.
	connect := func() (*pgx.Conn, error) {
		var err error
		for try := 0; try < 5; try++ {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var conn *pgx.Conn
			conn, err = pgx.Connect(cctx, l.dsn(role, db))
			cancel()
			if err == nil {
				return conn, nil
			}
			if s := sqlState(err); s != "57P01" && s != "08006" {
				return nil, err
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil, err
	}

	// Unpinned clients: short transactions that know their backend.
	for i := 0; i < plain; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					_ = conn.Close(ctx)
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if conn == nil || conn.IsClosed() {
					var err error
					if conn, err = connect(); err != nil {
						t.Errorf("client %d: reconnect: %v", i, err)
						return
					}
				}
				var pid uint32
				began := time.Now()
				qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := pgx.BeginFunc(qctx, conn, func(tx pgx.Tx) error {
					if err := tx.QueryRow(qctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
						return err
					}
					_, err := tx.Exec(qctx, "SELECT pg_sleep(0.005)")
					return err
				})
				if err != nil {
					rollbackFailedBegin(qctx, conn)
				}
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					worked[i] = began
					plainOK++
				case pid == 0:
					unknownErr++
				default:
					plainErr++
				}
				mu.Unlock()
				if err == nil {
					continue
				}
				if pid != 0 && !wasTerminated(pid) {
					t.Errorf("client %d: error although its backend %d was not terminated: %v", i, pid, err)
				} else if !connLost(err, conn) {
					t.Errorf("client %d: backend %d terminated, but the error is not a lost connection: %v (%s)", i, pid, err, sqlState(err))
				}
			}
		}(i)
	}

	// Pinned clients: hold a session lock, run transactions on the pinned
	// backend, and check that losing it is reported and ends the session.
	for i := 0; i < pinnedN; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := int64(7_000_000 + i)
			for {
				select {
				case <-stop:
					return
				default:
				}
				conn, err := connect()
				if err != nil {
					t.Errorf("pinned %d: connect: %v", i, err)
					return
				}
				var pid uint32
				lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err = conn.QueryRow(lctx, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1)) x", key).Scan(&pid)
				cancel()
				if err != nil {
					// The backend may be terminated under the lock call itself.
					_ = conn.Close(ctx)
					continue
				}
				mu.Lock()
				relocks++
				mu.Unlock()
				for {
					select {
					case <-stop:
						_ = conn.Close(ctx)
						return
					default:
					}
					var now uint32
					began := time.Now()
					qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					err := pgx.BeginFunc(qctx, conn, func(tx pgx.Tx) error {
						return tx.QueryRow(qctx, "SELECT pg_backend_pid()").Scan(&now)
					})
					if err != nil {
						rollbackFailedBegin(qctx, conn)
					}
					cancel()
					if err == nil && now != pid {
						// The lock died with backend pid, yet the session
						// went on (see TestFaultBackendDiesDuringPinProbe).
						t.Errorf("pinned %d: backend changed from %d to %d while the client believes it holds a lock (terminated: %v)", i, pid, now, wasTerminated(pid))
						_ = conn.Close(ctx)
						break
					}
					if err == nil {
						didWork(plain+i, began)
						time.Sleep(5 * time.Millisecond) // the pinned client's pace
						continue
					}
					mu.Lock()
					pinErrs++
					mu.Unlock()
					if !wasTerminated(pid) {
						t.Errorf("pinned %d: error although backend %d was not terminated: %v", i, pid, err)
					}
					// The session must be over: the next statement fails
					// without reaching a server.
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err2 := conn.Exec(cctx, "SELECT 1")
					cancel()
					if err2 == nil {
						t.Errorf("pinned %d: the session lived on after its pinned backend %d died (first error %v)", i, pid, err)
					}
					_ = conn.Close(ctx)
					// Its lock died with the backend (pg_terminate_backend
					// only signals: allow the backend a moment to exit).
					var held int
					for try := 0; try < 100; try++ {
						suMu.Lock()
						err = suCheck.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", pid).Scan(&held)
						suMu.Unlock()
						if err != nil || held == 0 {
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
					if err != nil {
						t.Error(err)
					} else if held != 0 {
						t.Errorf("pinned %d: backend %d still holds %d advisory locks 2 s after its session was dropped", i, pid, held)
					}
					break
				}
			}
		}(i)
	}

	// The killer, once the load runs: every client has committed.
	allWork(time.Time{}, "before the first kill")
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	done := 0
	for done < kills {
		rows, err := su.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND application_name NOT LIKE 'lockpool%' AND backend_type = 'client backend'", role)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 0 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		pid := pids[rng.Intn(len(pids))]
		mu.Lock()
		terminated[pid] = true
		mu.Unlock()
		if _, err := su.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		done++
		time.Sleep(time.Duration(20+rng.Intn(40)) * time.Millisecond) // a random moment for the next kill
	}
	// Every client is past the last kill: it noticed a lost backend and
	// carried on, committing again.
	allWork(time.Now(), "after the last kill")
	close(stop)
	wg.Wait()
	t.Logf("%d kills: plain ok %d, plain errors %d (+%d before the backend was known), pinned sessions lost %d, locks taken %d",
		kills, plainOK, plainErr, unknownErr, pinErrs, relocks)
	if plainOK == 0 || relocks == 0 {
		t.Errorf("no load ran")
	}

	// No lock survives.
	eventually(t, 10*time.Second, "no advisory lock left", func() bool {
		var n int
		err := su.QueryRow(ctx, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND a.usename = $1", role).Scan(&n)
		return err == nil && n == 0
	})
	// lockpool sees a client's close when it reads the socket: the gauge
	// comes down soon after the clients left, not at once.
	eventually(t, 10*time.Second, "lockpool_pinned_sessions 0 after every client left", func() bool {
		return l.metric("lockpool_pinned_sessions", map[string]string{"app": role}) == 0
	})
}
