package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// Randomized waits for pin slots and connections on a budget where both
// are scarce (3 connections, 2 pin slots, 10 clients): clients run random
// mixes of plain transactions and pinning statements (temp tables,
// session advisory locks, WITH HOLD cursors, SQL PREPARE) inside and
// outside transactions, in the simple protocol, with unnamed statements
// and with pgx's statement cache. Every pin ends after at most three more
// steps, so no client stays pinned while it waits: every wait must end in
// a grant (no 53300), and every statement must return what it should.

// poKind is a kind of session state that pins.
type poKind int

const (
	poTemp poKind = iota
	poLock
	poCursor
	poPrepare
	poKinds
)

var poKindNames = [poKinds]string{"temp table", "advisory lock", "cursor", "prepared statement"}

// poPinned is the state a client holds: what it is, how many more steps
// it lives, and what the client expects of it next.
type poPinned struct {
	kind poKind
	left int
	sum  int // poTemp: the sum of the rows inserted
	next int // poCursor: the next row FETCH returns
}

// poClient is one client of the randomized test.
type poClient struct {
	id    int
	c     *pgx.Conn
	rng   *rand.Rand
	modes []any // query options of this client's statements (exec mode)
	pin   *poPinned
	steps int
}

func (p *poClient) name(prefix string) string { return fmt.Sprintf("%s_%d", prefix, p.id) }

func (p *poClient) lockKey() int64 { return 880000 + int64(p.id) }

// exec runs sql (no result wanted).
func (p *poClient) exec(ctx context.Context, sql string, args ...any) error {
	_, err := p.c.Exec(ctx, sql, append(append([]any(nil), p.modes...), args...)...)
	if err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// int1 runs sql and scans one integer.
func (p *poClient) int1(ctx context.Context, sql string, args ...any) (int64, error) {
	var v int64
	if err := p.c.QueryRow(ctx, sql, append(append([]any(nil), p.modes...), args...)...).Scan(&v); err != nil {
		return 0, fmt.Errorf("%s: %w", sql, err)
	}
	return v, nil
}

// want runs sql and checks that it returns want.
func (p *poClient) want(ctx context.Context, want int64, sql string, args ...any) error {
	got, err := p.int1(ctx, sql, args...)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%s returned %d, want %d", sql, got, want)
	}
	return nil
}

// create makes state of kind k (inside or outside a transaction).
func (p *poClient) create(ctx context.Context, k poKind) (*poPinned, error) {
	st := &poPinned{kind: k}
	switch k {
	case poTemp:
		v := p.rng.Intn(1000)
		if err := p.exec(ctx, "CREATE TEMP TABLE "+p.name("po_tmp")+" (v int)"); err != nil {
			return nil, err
		}
		if err := p.exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d)", p.name("po_tmp"), v)); err != nil {
			return nil, err
		}
		st.sum = v
	case poLock:
		if err := p.exec(ctx, "SELECT pg_advisory_lock($1::int8)", p.lockKey()); err != nil {
			return nil, err
		}
	case poCursor:
		if err := p.exec(ctx, "DECLARE "+p.name("po_cur")+" CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 1000) AS g"); err != nil {
			return nil, err
		}
		st.next = 1
	case poPrepare:
		if err := p.exec(ctx, fmt.Sprintf("PREPARE %s (int) AS SELECT $1 + %d", p.name("po_prep"), p.id)); err != nil {
			return nil, err
		}
	}
	return st, p.check(ctx, st)
}

// check uses the state and checks what it returns.
func (p *poClient) check(ctx context.Context, st *poPinned) error {
	switch st.kind {
	case poTemp:
		v := p.rng.Intn(1000)
		if err := p.exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d)", p.name("po_tmp"), v)); err != nil {
			return err
		}
		st.sum += v
		return p.want(ctx, int64(st.sum), "SELECT sum(v) FROM "+p.name("po_tmp"))
	case poLock:
		return p.want(ctx, 1, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() AND objid = $1::int8", p.lockKey())
	case poCursor:
		err := p.want(ctx, int64(st.next), "FETCH 1 FROM "+p.name("po_cur"))
		st.next++
		return err
	case poPrepare:
		x := p.rng.Intn(1000)
		return p.want(ctx, int64(x+p.id), fmt.Sprintf("EXECUTE %s(%d)", p.name("po_prep"), x))
	}
	return nil
}

// drop ends the state.
func (p *poClient) drop(ctx context.Context, st *poPinned) error {
	switch st.kind {
	case poTemp:
		return p.exec(ctx, "DROP TABLE "+p.name("po_tmp"))
	case poLock:
		var ok bool
		if err := p.c.QueryRow(ctx, "SELECT pg_advisory_unlock($1::int8)", append(append([]any(nil), p.modes...), p.lockKey())...).Scan(&ok); err != nil {
			return fmt.Errorf("pg_advisory_unlock: %w", err)
		}
		if !ok {
			return errors.New("pg_advisory_unlock returned false: the lock was not on this backend")
		}
		return nil
	case poCursor:
		return p.exec(ctx, "CLOSE "+p.name("po_cur"))
	case poPrepare:
		return p.exec(ctx, "DEALLOCATE "+p.name("po_prep"))
	}
	return nil
}

// step runs one random step.
func (p *poClient) step(ctx context.Context) error {
	p.steps++
	if st := p.pin; st != nil {
		// Pinned: use the state, and end it when its time is up (in a
		// transaction or not).
		if err := p.check(ctx, st); err != nil {
			return err
		}
		if st.left--; st.left > 0 {
			return p.plainTx(ctx)
		}
		p.pin = nil
		return p.drop(ctx, st)
	}
	k := poKind(p.rng.Intn(int(poKinds)))
	switch r := p.rng.Intn(10); {
	case r < 4:
		return p.plainTx(ctx)
	case r < 7: // a pinning statement outside a transaction
		st, err := p.create(ctx, k)
		if err != nil {
			return fmt.Errorf("%s outside a transaction: %w", poKindNames[k], err)
		}
		st.left = 1 + p.rng.Intn(3)
		p.pin = st
		return nil
	default: // inside a transaction: kept past COMMIT, or ended before it
		if err := p.exec(ctx, "BEGIN"); err != nil {
			return err
		}
		v := int64(p.id*100000 + p.steps)
		if err := p.want(ctx, v, "SELECT $1::int8", v); err != nil {
			return err
		}
		st, err := p.create(ctx, k)
		if err != nil {
			return fmt.Errorf("%s inside a transaction: %w", poKindNames[k], err)
		}
		keep := p.rng.Intn(2) == 0
		if !keep {
			if err := p.drop(ctx, st); err != nil {
				return err
			}
		}
		if err := p.exec(ctx, "COMMIT"); err != nil {
			return err
		}
		if keep {
			st.left = 1 + p.rng.Intn(3)
			p.pin = st
		}
		return nil
	}
}

// plainTx runs a transaction that pins nothing and checks its result.
func (p *poClient) plainTx(ctx context.Context) error {
	tx, err := p.c.Begin(ctx)
	if err != nil {
		return fmt.Errorf("BEGIN: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	v := int64(p.id*100000 + p.steps)
	var got int64
	if err := tx.QueryRow(ctx, "SELECT $1::int8 * 2", append(append([]any(nil), p.modes...), v)...).Scan(&got); err != nil {
		return fmt.Errorf("plain transaction: %w", err)
	}
	if got != 2*v {
		return fmt.Errorf("plain transaction: SELECT %d * 2 returned %d", v, got)
	}
	return tx.Commit(ctx)
}

func TestPinAndConnectionWaitsRandomizedAllGranted(t *testing.T) {
	t.Parallel()
	const (
		clients = 10
		steps   = 30
		wait    = 5 * time.Second
	)
	app := poApp("pinorderrnd", wait.String())
	l := startLockpool(t, 10, "", app)
	ctx := testenv.Context(t, 5*time.Minute)
	seed := lkrSeed(t, 20260418)
	pool := l.srv.Pool()
	modes := [][]any{{pgx.QueryExecModeSimpleProtocol}, {pgx.QueryExecModeExec}, nil}

	cs := make([]*poClient, clients)
	for i := range cs {
		cs[i] = &poClient{id: i, c: l.connect(t, "app", "appdb"), rng: rand.New(rand.NewSource(seed + int64(i))), modes: modes[i%len(modes)]}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var longest time.Duration
	for _, p := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < steps || p.pin != nil; i++ {
				t0 := time.Now()
				if err := p.step(ctx); err != nil {
					t.Errorf("client %d (exec mode %v) step %d: %v", p.id, p.modes, i, err)
					return
				}
				mu.Lock()
				longest = max(longest, time.Since(t0))
				mu.Unlock()
				if st := pool.Stats(app.name); st.Pinned > 2 || st.Open > 3 {
					t.Errorf("pool stats %+v exceed the budget (3 connections, 2 pins)", st)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("seed %d: %d clients × %d steps; the longest step took %v (wait_timeout %v)", seed, clients, steps, longest, wait)

	if n := l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "timeout"}); n != 0 {
		t.Errorf("lockpool_pin_waits_total{outcome=\"timeout\"} = %v, want 0", n)
	}
	if n := l.metric("lockpool_pool_wait_timeouts_total", map[string]string{"app": app.name}); n != 0 {
		t.Errorf("lockpool_pool_wait_timeouts_total = %v, want 0", n)
	}
	waited := l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "waited"})
	immediate := l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "immediate"})
	t.Logf("pin slot requests: %v immediate, %v waited", immediate, waited)
	if t.Failed() {
		return
	}
	if waited == 0 {
		t.Errorf("no pin slot request had to wait: the test did not make slots scarce")
	}
	l.wantPinned(t, app.name, "", 0)
	if st := pool.Stats(app.name); st.Pinned != 0 || st.PinWaiting != 0 || st.Waiting != 0 || st.InUse != 0 {
		t.Errorf("at the end: pool stats %+v, want nothing pinned, waiting or in use", st)
	}
}
