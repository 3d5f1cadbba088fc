package proxy

import (
	"testing"
	"unsafe"

	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/session"
)

// TestIdleClientObjectSizes keeps the objects every logged-in client holds
// within the allocation size classes the idle-client memory figures in the
// README were measured with. A field added to one of them moves every
// client's copy to the next class (64 or 16 bytes more per client): state
// few sessions use belongs in sessionExtras, made at first use.
func TestIdleClientObjectSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		// Above 512 bytes an object with pointers carries an 8-byte
		// header: the session's class is 640 for up to 632 bytes.
		{"session", unsafe.Sizeof(session.Session{}), 632},
		// 224: its pointer to the state of a connection shared between
		// a reader and a closer (UnbindShared) took it past 208.
		{"evloop.Conn", unsafe.Sizeof(evloop.Conn{}), 224},
		{"wire.Reader", unsafe.Sizeof(wire.Reader{}), 160},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, more than the %d that fit its allocation class", c.name, c.size, c.max)
		}
	}
}
