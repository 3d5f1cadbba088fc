//go:build linux

package evloop

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is a minimal io_uring used to issue several socket sends, or
// several receives, with one system call. Every operation is submitted
// with MSG_DONTWAIT, so the kernel completes it during the submitting call
// (bytes moved, or EAGAIN). Whatever happens, submit returns only when no
// operation it issued is in flight (see submit): the buffers need to live,
// and stay untouched, only as long as the call. A ring belongs to one loop
// goroutine.
type ring struct {
	fd      int
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqArray []uint32
	sqes    []uringSQE
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []uringCQE
	pending uint32              // SQEs filled since the last submit
	tags    [ringEntries]uint64 // the callers' tags of those SQEs, by position
	ops     [ringEntries]uint8  // their opcodes
	// bufs holds the Go buffers of those SQEs from add until their
	// completions are reaped: the SQEs hold only their addresses, which the
	// garbage collector does not see, and a receive's completion tells the
	// race detector what the kernel wrote.
	bufs   [ringEntries][]byte
	sqMem  []byte
	cqMem  []byte
	sqeMem []byte

	// enterFault, when not nil, stands in for io_uring_enter (tests make
	// the kernel's failures with it; it calls enterNow for the real one).
	enterFault func(r *ring, toSubmit, minComplete uint32) (uintptr, unix.Errno)
}

type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

type uringParams struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFd         uint32
	resv         [3]uint32
	sqOff        [10]uint32 // head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr (u64)
	cqOff        [10]uint32 // head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr (u64)
}

const (
	uringOpSend = 26
	uringOpRecv = 27

	uringEnterGetEvents     = 1
	uringRegisterSyncCancel = 24
	uringCancelAll          = 1 << 0
	uringCancelAny          = 1 << 2
	uringFeatSingleMmap     = 1
	uringSetupCoopTask      = 1 << 8

	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000
)

// ringEntries bounds the operations of one batch.
const ringEntries = 256

// newRing sets up a ring, or returns nil when the kernel refuses (no
// io_uring, or disabled by sysctl or seccomp): the caller then uses one
// system call per operation.
func newRing() *ring {
	var p uringParams
	p.flags = uringSetupCoopTask
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, ringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil
	}
	r := &ring{fd: int(fd)}
	sqSize := int(p.sqOff[6]) + int(p.sqEntries)*4
	cqSize := int(p.cqOff[5]) + int(p.cqEntries)*int(unsafe.Sizeof(uringCQE{}))
	var err error
	if p.features&uringFeatSingleMmap != 0 {
		if cqSize > sqSize {
			sqSize = cqSize
		}
		r.sqMem, err = unix.Mmap(r.fd, uringOffSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		r.cqMem = r.sqMem
	} else {
		r.sqMem, err = unix.Mmap(r.fd, uringOffSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err == nil {
			r.cqMem, err = unix.Mmap(r.fd, uringOffCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		}
	}
	if err == nil {
		r.sqeMem, err = unix.Mmap(r.fd, uringOffSQEs, int(p.sqEntries)*int(unsafe.Sizeof(uringSQE{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	}
	if err != nil {
		r.close()
		return nil
	}
	sq, cq := unsafe.Pointer(&r.sqMem[0]), unsafe.Pointer(&r.cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff[0]))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff[1]))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.sqOff[2]))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Add(sq, p.sqOff[6])), p.sqEntries)
	r.sqes = unsafe.Slice((*uringSQE)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Add(cq, p.cqOff[0]))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff[1]))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.cqOff[2]))
	r.cqes = unsafe.Slice((*uringCQE)(unsafe.Add(cq, p.cqOff[5])), p.cqEntries)
	return r
}

func (r *ring) close() {
	if r.sqeMem != nil {
		_ = unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && (r.sqMem == nil || &r.cqMem[0] != &r.sqMem[0]) {
		_ = unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		_ = unix.Munmap(r.sqMem)
	}
	_ = unix.Close(r.fd)
}

// full reports whether the batch has no room for another operation.
func (r *ring) full() bool { return r.pending == uint32(min(len(r.sqes), ringEntries)) }

// add queues operation op (uringOpSend, uringOpRecv) of p on fd; submit
// reports its result under tag. The kernel reads a send's bytes during
// submit, on this goroutine: the race detector is told so now.
func (r *ring) add(op uint8, fd int, p []byte, tag uint64) {
	tail := *r.sqTail + r.pending
	i := tail & r.sqMask
	r.sqes[i] = uringSQE{opcode: op, fd: int32(fd), addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))), len: uint32(len(p)), opFlags: unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL, userData: uint64(r.pending)}
	r.sqArray[i] = i
	if op == uringOpSend {
		raceReadRange(unsafe.Pointer(unsafe.SliceData(p)), len(p))
	}
	r.tags[r.pending] = tag
	r.ops[r.pending] = op
	r.bufs[r.pending] = p
	r.pending++
}

// enter is io_uring_enter(2) with IORING_ENTER_GETEVENTS: it submits up to
// toSubmit queued SQEs and waits until minComplete completions are in the
// completion queue. A raw syscall: with MSG_DONTWAIT nothing waits long.
func (r *ring) enter(toSubmit, minComplete uint32) (uintptr, unix.Errno) {
	if r.enterFault != nil {
		return r.enterFault(r, toSubmit, minComplete)
	}
	return r.enterNow(toSubmit, minComplete)
}

func (r *ring) enterNow(toSubmit, minComplete uint32) (uintptr, unix.Errno) {
	n, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), uringEnterGetEvents, 0, 0)
	return n, e
}

// errUnknown is the result submit reports for an operation whose
// completion it could not read although the kernel has finished with it:
// whether its bytes moved is unknown, so its connection fails.
const errUnknown = unix.EIO

// submit issues the queued operations with one system call and calls done
// with each one's tag and result (a count, or a negative errno; -ECANCELED:
// the operation did not happen, the caller does it itself). It returns only
// when the kernel has finished with every operation it took, on every path:
// the buffers given to add may be reused, or freed, as soon as it returns.
// It reports false when the ring is unusable (the caller closes it): the
// kernel took fewer operations than given, or their completions did not all
// come. done is not called for an operation the kernel did not take (it
// did not happen: the caller does that work itself); one it took whose
// completion could not be read, though the kernel has finished with it, is
// reported as -errUnknown (whether it happened is unknown, so its
// connection must fail rather than repeat or lose bytes).
//
// How many operations the kernel took is read from the submission queue's
// head, not from io_uring_enter's result: the call may fail (or be
// interrupted) after taking some, and an operation taken is in flight until
// its completion is reaped, whatever the call returned.
func (r *ring) submit(done func(tag uint64, res int32)) bool {
	n := r.pending
	if n == 0 {
		return true
	}
	// Every SQE of the earlier batches was taken or withdrawn: the head is
	// where this batch starts.
	head := atomic.LoadUint32(r.sqHead)
	atomic.StoreUint32(r.sqTail, head+n)
	r.pending = 0
	for {
		left := n - (atomic.LoadUint32(r.sqHead) - head)
		if _, e := r.enter(left, n); e != unix.EINTR {
			break
		}
	}
	taken := atomic.LoadUint32(r.sqHead) - head
	if taken < n {
		// Withdraw what the kernel did not take, so that no later call
		// (nor the ring's teardown) issues it: done is not called for it.
		atomic.StoreUint32(r.sqTail, head+taken)
	}
	ok := r.reap(taken, done)
	clear(r.bufs[:n])
	return ok && taken == n
}

// reap calls done for the completions of the first taken operations of the
// batch, waiting for those not in the completion queue yet. Taken with
// MSG_DONTWAIT, an operation completes within the submitting call, so they
// are all there at once; the wait is for a kernel that does otherwise. If
// the wait fails, the operations still in flight are cancelled, and the
// kernel waits for them to end (cancelAll): the caller's buffers are never
// handed back while the kernel may still read or write them. It reports
// whether every completion came.
func (r *ring) reap(taken uint32, done func(tag uint64, res int32)) bool {
	var seen [ringEntries]bool
	want := taken
	cancelled := false
	for want > 0 {
		head := atomic.LoadUint32(r.cqHead)
		ctail := atomic.LoadUint32(r.cqTail)
		for ; head != ctail && want > 0; head++ {
			c := &r.cqes[head&r.cqMask]
			if k := c.userData; k < uint64(taken) && !seen[k] {
				seen[k] = true
				if r.ops[k] == uringOpRecv && c.res > 0 {
					raceWriteRange(unsafe.Pointer(unsafe.SliceData(r.bufs[k])), int(c.res))
				}
				done(r.tags[k], c.res)
				want--
			}
		}
		atomic.StoreUint32(r.cqHead, head)
		if want == 0 {
			break
		}
		switch _, e := r.enter(0, want); e {
		case 0, unix.EINTR, unix.EAGAIN, unix.EBUSY, unix.ETIME:
			continue
		}
		if cancelled {
			break // nothing is in flight any more; the completions are lost
		}
		if err := r.cancelAll(); err != nil {
			// Nothing is known to have stopped the kernel: handing the
			// buffers back now could let it write into memory reused for
			// something else. That is worse than stopping.
			panic("evloop: io_uring operations on Go buffers may still be in flight: " + err.Error())
		}
		cancelled = true
	}
	if want == 0 {
		return true
	}
	for k := uint32(0); k < taken; k++ {
		if !seen[k] {
			done(r.tags[k], -int32(errUnknown))
		}
	}
	return false
}

// uringSyncCancel is struct io_uring_sync_cancel_reg.
type uringSyncCancel struct {
	addr    uint64
	fd      int32
	flags   uint32
	timeout unix.Timespec
	_       [4]uint64
}

// cancelAll cancels every operation of the ring still in flight and returns
// when the kernel has finished with all of them (IORING_REGISTER_SYNC_CANCEL,
// Linux 6.0): their completions (-ECANCELED, or their result if they ended
// first) are then in the completion queue, or lost, but none touches its
// buffer any more.
func (r *ring) cancelAll() error {
	arg := uringSyncCancel{fd: -1, flags: uringCancelAll | uringCancelAny, timeout: unix.Timespec{Sec: -1, Nsec: -1}}
	for {
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uringRegisterSyncCancel, uintptr(unsafe.Pointer(&arg)), 1, 0, 0)
		switch e {
		case 0, unix.ENOENT: // cancelled, or nothing was left to cancel
			return nil
		case unix.EINTR:
			continue
		}
		return unix.Errno(e)
	}
}
