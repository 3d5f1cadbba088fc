package main

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

// killGrace is how long lockpool may take, after a client's socket was
// closed, to give up that client's locks and leases.
const killGrace = 2 * time.Second

// opTimeout bounds every single client operation; running into it is an
// unexpected error (a hang).
const opTimeout = 15 * time.Second

// base is what every soak client shares: one pgx connection through
// lockpool that the killer may close under it at any moment.
type base struct {
	s    *soak
	kind string
	id   int

	mu       sync.Mutex // guards conn (the pointer) against the killer
	conn     *pgx.Conn
	killedAt atomic.Int64 // unix nanoseconds of the last kill; 0 = alive
	holding  atomic.Bool  // holds a lock or lease (the killer prefers these)

	// beforeKill runs under mu just before the killer closes the socket.
	beforeKill func()
	// afterConnect runs once per new connection (session settings).
	afterConnect func(ctx context.Context, c *pgx.Conn) error
}

func (b *base) name() string { return fmt.Sprintf("%s client %d", b.kind, b.id) }

// kill closes the client's socket abruptly (no Terminate), as a crashed
// client or a dropped network would. It reports whether it did.
func (b *base) kill() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn == nil || b.killedAt.Load() != 0 {
		return false
	}
	if b.beforeKill != nil {
		b.beforeKill()
	}
	b.killedAt.Store(time.Now().UnixNano())
	_ = b.conn.PgConn().Conn().Close()
	return true
}

// killed returns when the client was killed, if it was since it last
// connected.
func (b *base) killed() (time.Time, bool) {
	n := b.killedAt.Load()
	if n == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}

// drop forgets the connection (closing it politely when it still works).
func (b *base) drop() {
	b.mu.Lock()
	c := b.conn
	b.conn = nil
	b.killedAt.Store(0)
	b.mu.Unlock()
	b.holding.Store(false)
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = c.Close(ctx)
		cancel()
	}
}

// ensure connects when the client has no connection. It returns false once
// the soak is stopping.
func (b *base) ensure() bool {
	for {
		if b.s.stopping() {
			return false
		}
		b.mu.Lock()
		have := b.conn != nil
		b.mu.Unlock()
		if have {
			return true
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		c, err := pgx.Connect(ctx, b.s.e.DSN())
		if err == nil && b.afterConnect != nil {
			if err = b.afterConnect(ctx, c); err != nil {
				_ = c.Close(ctx)
			}
		}
		cancel()
		if err != nil {
			if sqlState(err) == "53300" {
				// The session setting needs a server connection.
				b.s.count(b.kind + ": 53300 while connecting")
			} else {
				b.s.unexpectedf("%s: connect: %v", b.name(), err)
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		b.mu.Lock()
		b.conn = c
		b.killedAt.Store(0)
		b.mu.Unlock()
		b.s.count(b.kind + ": connects")
	}
}

// c returns the current connection (only the client's own goroutine calls
// this; the killer never replaces the pointer).
func (b *base) c() *pgx.Conn {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.conn
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// killable is what the killer picks from.
type killable interface {
	kill() bool
	isHolding() bool
	connected() bool
	kindName() string
}

func (b *base) isHolding() bool { return b.holding.Load() }

func (b *base) connected() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.conn != nil && b.killedAt.Load() == 0
}

func (b *base) kindName() string { return b.kind }
