package console

import (
	"net"
	"sync"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// out is the one road to the console client's socket: Serve's replies and
// End's FATAL never interleave, and once a FATAL went out nothing else
// does.
type out struct {
	mu     sync.Mutex
	conn   net.Conn
	closed bool
}

// write writes b. A failed write closes the client.
func (o *out) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return net.ErrClosed
	}
	if _, err := o.conn.Write(b); err != nil {
		o.closed = true
		_ = o.conn.Close()
		return err
	}
	return nil
}

// end writes pe (when not nil) as a FATAL and closes the client.
func (o *out) end(pe *pgerr.Error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.closed = true
	if pe != nil {
		_ = o.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = o.conn.Write(pe.Fatal().AppendTo(nil, 'E'))
	}
	_ = o.conn.Close()
}
