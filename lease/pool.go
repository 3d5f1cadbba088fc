package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// errPoolClosed is returned by connPool.get after close.
var errPoolClosed = errors.New("lockpool: lease store is closed")

// connPool is the store's own connection set: at most max connections,
// idle or in use, across all databases. A request for a database with no
// idle connection opens one when below the cap, else closes an idle
// connection of another database to make room, else waits.
type connPool struct {
	max  int
	dial func(ctx context.Context, database string) (*pgx.Conn, error)

	mu      sync.Mutex
	open    int
	idle    map[string][]*pgx.Conn
	changed chan struct{} // closed and replaced whenever a slot may have freed
	closed  bool
}

func newConnPool(max int, dial func(context.Context, string) (*pgx.Conn, error)) *connPool {
	return &connPool{max: max, dial: dial, idle: map[string][]*pgx.Conn{}, changed: make(chan struct{})}
}

func (p *connPool) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

func (p *connPool) get(ctx context.Context, database string) (*pgx.Conn, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		if l := p.idle[database]; len(l) > 0 {
			c := l[len(l)-1]
			p.idle[database] = l[:len(l)-1]
			p.mu.Unlock()
			return c, nil
		}
		var victim *pgx.Conn
		take := false
		if p.open < p.max {
			p.open++
			take = true
		} else {
			for db, l := range p.idle {
				if len(l) > 0 {
					victim = l[0]
					p.idle[db] = l[1:]
					take = true // the victim's slot becomes ours
					break
				}
			}
		}
		if take {
			p.mu.Unlock()
			if victim != nil {
				closeConn(victim)
			}
			c, err := p.dial(ctx, database)
			if err != nil {
				p.mu.Lock()
				p.open--
				p.broadcastLocked()
				p.mu.Unlock()
				return nil, err
			}
			return c, nil
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// put returns a connection; a broken one (or one left inside a
// transaction) is closed and its slot freed.
func (p *connPool) put(database string, c *pgx.Conn) {
	broken := c.IsClosed() || c.PgConn().TxStatus() != 'I'
	p.mu.Lock()
	if broken || p.closed {
		p.open--
		p.broadcastLocked()
		p.mu.Unlock()
		go closeConn(c)
		return
	}
	p.idle[database] = append(p.idle[database], c)
	p.broadcastLocked()
	p.mu.Unlock()
}

func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	var all []*pgx.Conn
	for db, l := range p.idle {
		all = append(all, l...)
		p.open -= len(l)
		delete(p.idle, db)
	}
	p.broadcastLocked()
	p.mu.Unlock()
	for _, c := range all {
		closeConn(c)
	}
}
