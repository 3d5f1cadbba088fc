//go:build linux

package evloop

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRingSubmit sends through a ring to two sockets and to a descriptor
// that is not open: each operation reports its own result (a count, or
// -EBADF), all within the one call, and the bytes arrive.
func TestRingSubmit(t *testing.T) {
	r := newRing()
	if r == nil {
		t.Skip("io_uring is not available here")
	}
	defer r.close()
	var conns [2]*Conn
	var peers [2]net.Conn
	for i := range conns {
		conns[i], peers[i] = pair(t)
		if err := conns[i].adopt(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(conns[i].fd) })
	}
	msgs := [][]byte{[]byte("first socket"), []byte("second")}
	for i, c := range conns {
		r.add(uringOpSend, c.fd, msgs[i], uint64(i))
	}
	r.add(uringOpSend, 1<<20, msgs[0], 2) // no such descriptor
	got := map[uint64]int32{}
	if !r.submit(func(tag uint64, res int32) { got[tag] = res }) {
		t.Fatal("the kernel took none of the operations")
	}
	want := map[uint64]int32{0: int32(len(msgs[0])), 1: int32(len(msgs[1])), 2: -int32(unix.EBADF)}
	for tag, res := range want {
		if got[tag] != res {
			t.Errorf("operation %d: result %d, want %d (all: %v)", tag, got[tag], res, got)
		}
	}
	for i, p := range peers {
		b := make([]byte, len(msgs[i]))
		_ = p.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(p, b); err != nil || string(b) != string(msgs[i]) {
			t.Errorf("peer %d got %q, %v", i, b, err)
		}
	}
	if r.pending != 0 {
		t.Errorf("%d operations still pending after submit", r.pending)
	}
}
