package advisory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ApplicationName is the application_name of every lock connection.
const ApplicationName = "lockpool locks"

// errConnLost marks an operation whose lock connection died.
var errConnLost = errors.New("advisory: lock connection lost")

// lockConn is one lock connection slot of a database: dialled at first use,
// dialled again after a loss. Its mutex serialises statements.
type lockConn struct {
	db   *database
	slot int

	mu   sync.Mutex
	c    *pgx.Conn
	pid  uint32
	gen  uint64 // bumped at every (re)dial: holds record the generation they were taken on
	stop chan struct{}
	// live is gen while the connection is open and not found dead, else 0.
	live atomic.Uint64
}

// connLocked returns the live connection, dialling one if needed (never
// after the manager's Close). Call with lc.mu held.
func (lc *lockConn) connLocked(ctx context.Context) (*pgx.Conn, error) {
	if lc.c != nil {
		if !lc.c.IsClosed() {
			return lc.c, nil
		}
		// It died under an operation that has not called lost yet: its
		// holds go before a new generation can take locks.
		lc.deadLocked()
	}
	lc.db.m.mu.Lock()
	closed := lc.db.m.closed
	lc.db.m.mu.Unlock()
	if closed {
		return nil, errClosed() // no new connection after Close
	}
	cfg, err := lc.db.m.connConfig(lc.db.name)
	if err != nil {
		return nil, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("advisory: connect to database %q: %w", lc.db.name, err)
	}
	lc.c = c
	lc.pid = c.PgConn().PID()
	lc.gen++
	lc.live.Store(lc.gen)
	lc.stop = make(chan struct{})
	go lc.watch(c, lc.gen, lc.stop)
	return c, nil
}

// run runs op on the live connection, dialling one if needed; the
// connection's mutex serialises it with every other statement. An error
// that closed the connection (or is not a server's statement error)
// reports the loss to the database and comes back wrapped in errConnLost.
// gen is the connection generation op ran on (0: none could be had).
func (lc *lockConn) run(ctx context.Context, op func(c *pgconn.PgConn) error) (gen uint64, err error) {
	lc.mu.Lock()
	c, err := lc.connLocked(ctx)
	if err != nil {
		lc.mu.Unlock()
		return 0, err
	}
	gen = lc.gen
	err = op(c.PgConn())
	dead := err != nil && (c.PgConn().IsClosed() || isConnError(err))
	lc.mu.Unlock()
	if dead {
		lc.lost(gen)
		return gen, fmt.Errorf("%w: %v", errConnLost, err)
	}
	return gen, err
}

// query runs sql (text results) on the connection and returns the first
// row's values (nil for NULL).
func (lc *lockConn) query(ctx context.Context, sql string, params [][]byte, oids []uint32, formats []int16) ([][]byte, uint64, error) {
	var row [][]byte
	gen, err := lc.run(ctx, func(c *pgconn.PgConn) error {
		res := c.ExecParams(ctx, sql, params, oids, formats, nil).Read()
		if res.Err == nil && len(res.Rows) > 0 {
			row = res.Rows[0]
		}
		return res.Err
	})
	return row, gen, err
}

// simple runs sql (one or more statements, simple protocol) on the
// connection.
func (lc *lockConn) simple(ctx context.Context, sql string) (uint64, error) {
	return lc.run(ctx, func(c *pgconn.PgConn) error {
		_, err := c.Exec(ctx, sql).ReadAll()
		return err
	})
}

// eval runs a key evaluation (text results) and, in the same round trip,
// pg_advisory_unlock_all(), so that whatever the client's expression did
// to advisory locks does not stay on the connection. It returns the first
// row's values (nil for NULL).
func (lc *lockConn) eval(ctx context.Context, sql string, params [][]byte, oids []uint32, formats []int16) ([][]byte, error) {
	var row [][]byte
	_, err := lc.run(ctx, func(c *pgconn.PgConn) error {
		b := &pgconn.Batch{}
		b.ExecParams(sql, params, oids, formats, nil)
		b.ExecParams("SELECT pg_catalog.pg_advisory_unlock_all()", nil, nil, nil, nil)
		res, err := c.ExecBatch(ctx, b).ReadAll()
		if err == nil && len(res) > 0 && res[0].Err == nil && len(res[0].Rows) > 0 {
			row = res[0].Rows[0]
		}
		return err
	})
	return row, err
}

// isConnError reports an error that is not a server's statement error.
func isConnError(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Severity == "FATAL" || pe.Severity == "PANIC"
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// watch notices the death of an idle connection that holds locks: every
// watchInterval it pings the server (an empty statement).
func (lc *lockConn) watch(c *pgx.Conn, gen uint64, stop chan struct{}) {
	t := time.NewTicker(lc.db.m.watchInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !lc.db.holdsOn(lc.slot) {
			continue
		}
		lc.mu.Lock()
		if lc.gen != gen {
			lc.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.PgConn().Ping(ctx)
		cancel()
		dead := err != nil || c.IsClosed()
		lc.mu.Unlock()
		if dead {
			lc.lost(gen)
			return
		}
	}
}

// lost closes generation gen of the connection (if still current) and
// tells the database, which drops every hold on it. The database is told
// before the connection's mutex is let go, so no later generation is
// dialled (and no lock recorded on it) while holds of gen remain.
func (lc *lockConn) lost(gen uint64) {
	lc.mu.Lock()
	if lc.gen != gen || lc.c == nil {
		lc.mu.Unlock()
		return
	}
	c := lc.deadLocked()
	lc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = c.Close(ctx)
	cancel()
}

// deadLocked ends the current generation, whose connection died: it is
// marked dead (alive is false from now on) and the database drops every
// hold on it before lc.mu is let go, so nothing dials a later generation
// (or records a lock on it) while holds of this one remain. It returns the
// connection for the caller to close. Call with lc.mu held and lc.c set;
// it takes the database's mutex, which is never held while waiting for
// lc.mu.
func (lc *lockConn) deadLocked() *pgx.Conn {
	c := lc.c
	lc.c = nil
	lc.live.Store(0)
	close(lc.stop)
	lc.db.connLost(lc.slot, lc.gen)
	return c
}

// close ends the connection. Its locks are given back first, so they are
// free when close returns (PostgreSQL would release them too, a moment
// after the connection ends).
func (lc *lockConn) close() {
	lc.mu.Lock()
	c := lc.c
	lc.c = nil
	lc.live.Store(0)
	if c != nil {
		close(lc.stop)
	}
	lc.gen++
	lc.mu.Unlock()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.PgConn().Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock_all()").Close()
		_ = c.Close(ctx)
		cancel()
	}
}

// alive reports whether generation gen is the connection's current one and
// has not been found dead. Call it with the database's mutex held: a lock
// taken on gen and recorded in the table in the same critical section is
// dropped by connLost when gen dies (lost marks gen dead before connLost
// takes that mutex); a lock whose generation is not alive must not be
// recorded. It takes no lock of the connection's, whose mutex may be held
// for a whole statement.
func (lc *lockConn) alive(gen uint64) bool { return gen != 0 && lc.live.Load() == gen }

// backendPID is the PostgreSQL pid of the connection (0 when not open).
func (lc *lockConn) backendPID() uint32 {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.c == nil {
		return 0
	}
	return lc.pid
}

// paramTypes prepares sql (unnamed) on the connection and returns the
// parameter types PostgreSQL resolved.
func (lc *lockConn) paramTypes(ctx context.Context, sql string, declared []uint32) ([]uint32, error) {
	var oids []uint32
	_, err := lc.run(ctx, func(c *pgconn.PgConn) error {
		sd, err := c.Prepare(ctx, "", sql, declared)
		if err == nil {
			oids = sd.ParamOIDs
		}
		return err
	})
	return oids, err
}
