//go:build linux

package evloop

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
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

// inFlightRecv queues on r a receive into buf from fd that the kernel
// cannot finish at once: without MSG_DONTWAIT, on a blocking socket with
// nothing to read, it stays in flight (the kernel waits for the socket)
// until bytes come or it is cancelled.
func inFlightRecv(r *ring, fd int, buf []byte, tag uint64) {
	i := (*r.sqTail + r.pending) & r.sqMask
	r.add(uringOpRecv, fd, buf, tag)
	r.sqes[i].opFlags &^= unix.MSG_DONTWAIT
}

// blockingPair returns the two ends of a blocking Unix socket pair.
func blockingPair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// assertNotInFlight checks that no receive of the ring is left on fd: bytes
// its peer writes now stay on the socket for the next reader, and buf (the
// receive's buffer) is not written.
func assertNotInFlight(t *testing.T, fd, peer int, buf, before []byte) {
	t.Helper()
	if _, err := unix.Write(peer, []byte("late")); err != nil {
		t.Fatal(err)
	}
	// A receive still in flight takes the bytes as they arrive: the socket
	// never becomes readable. This wait bounds the failure; with nothing in
	// flight it returns at once.
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 10_000); err != nil || n != 1 {
		t.Fatalf("the socket never became readable (%d, %v): a receive of the ring took the bytes written after submit returned", n, err)
	}
	got := make([]byte, 16)
	n, err := unix.Read(fd, got)
	if err != nil || string(got[:n]) != "late" {
		t.Fatalf("read %q, %v; want \"late\"", got[:n], err)
	}
	if !bytes.Equal(buf, before) {
		t.Fatalf("the receive's buffer changed after submit returned: %q", buf)
	}
}

// TestRingSubmitFailingAfterTaking: io_uring_enter fails although the kernel
// took the batch's receive. submit must not hand the buffer back while the
// receive is in flight: it waits for the completion and reports it.
func TestRingSubmitFailingAfterTaking(t *testing.T) {
	r := newRing()
	if r == nil {
		t.Skip("io_uring is not available here")
	}
	defer r.close()
	fd, peer := blockingPair(t)
	buf := make([]byte, 16)
	inFlightRecv(r, fd, buf, 7)
	waiting := make(chan struct{})
	calls := 0
	r.enterFault = func(r *ring, toSubmit, minComplete uint32) (uintptr, unix.Errno) {
		calls++
		if calls == 1 {
			// Submit without waiting, then fail: the receive is in flight.
			if _, e := r.enterNow(toSubmit, 0); e != 0 {
				t.Errorf("io_uring_enter: %v", e)
			}
			if atomic.LoadUint32(r.cqTail) != atomic.LoadUint32(r.cqHead) {
				t.Error("the receive completed at once: the test needs it in flight")
			}
			return 0, unix.EINVAL
		}
		if calls == 2 {
			close(waiting) // submit waits for the receive
		}
		return r.enterNow(toSubmit, minComplete)
	}
	type result struct {
		ok   bool
		tags []uint64
		res  []int32
	}
	returned := make(chan result, 1)
	go func() {
		var x result
		x.ok = r.submit(func(tag uint64, res int32) { x.tags, x.res = append(x.tags, tag), append(x.res, res) })
		returned <- x
	}()
	select {
	case x := <-returned:
		t.Fatalf("submit returned (%+v) while the receive it issued was in flight", x)
	case <-waiting:
	}
	if _, err := unix.Write(peer, []byte("data")); err != nil {
		t.Fatal(err)
	}
	x := <-returned
	if len(x.tags) != 1 || x.tags[0] != 7 || x.res[0] != 4 || string(buf[:4]) != "data" {
		t.Fatalf("submit reported tags %v results %v (buffer %q); want tag 7 with the 4 bytes \"data\"", x.tags, x.res, buf)
	}
	assertNotInFlight(t, fd, peer, buf, append([]byte(nil), buf...))
}

// TestRingSubmitWaitFailing: the kernel took the receive, but waiting for
// its completion fails, every time. submit cancels the receive and waits
// for the kernel to finish with it before it returns: the buffer is not
// written after, and bytes arriving later stay on the socket.
func TestRingSubmitWaitFailing(t *testing.T) {
	r := newRing()
	if r == nil {
		t.Skip("io_uring is not available here")
	}
	defer r.close()
	fd, peer := blockingPair(t)
	buf := make([]byte, 16)
	inFlightRecv(r, fd, buf, 3)
	calls := 0
	r.enterFault = func(r *ring, toSubmit, minComplete uint32) (uintptr, unix.Errno) {
		if calls++; calls == 1 {
			// Submit without waiting: the completion is missing.
			return r.enterNow(toSubmit, 0)
		}
		return 0, unix.EINVAL
	}
	var tags []uint64
	var results []int32
	ok := r.submit(func(tag uint64, res int32) { tags, results = append(tags, tag), append(results, res) })
	if len(tags) != 1 || tags[0] != 3 || (results[0] != -int32(unix.ECANCELED) && results[0] != -int32(errUnknown)) {
		t.Fatalf("submit reported tags %v results %v; want tag 3, cancelled (or unknown)", tags, results)
	}
	t.Logf("submit: %v, result %v", ok, unix.Errno(-results[0]))
	assertNotInFlight(t, fd, peer, buf, make([]byte, len(buf)))
}
