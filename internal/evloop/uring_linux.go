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
// (bytes moved, or EAGAIN): nothing stays in flight after submit returns,
// and the buffers need to live only as long as the call. A ring belongs to
// one loop goroutine.
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
	sqMem   []byte
	cqMem   []byte
	sqeMem  []byte
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

	uringEnterGetEvents = 1
	uringFeatSingleMmap = 1
	uringSetupCoopTask  = 1 << 8

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
// reports its result under tag.
func (r *ring) add(op uint8, fd int, p []byte, tag uint64) {
	tail := *r.sqTail + r.pending
	i := tail & r.sqMask
	r.sqes[i] = uringSQE{opcode: op, fd: int32(fd), addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))), len: uint32(len(p)), opFlags: unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL, userData: uint64(r.pending)}
	r.sqArray[i] = i
	r.tags[r.pending] = tag
	r.pending++
}

// submit issues the queued operations with one system call and calls done
// with each one's tag and result (a count, or a negative errno). The
// buffers given to add may be reused when it returns. It reports false when
// the ring is unusable (the caller closes it): the kernel took fewer
// operations than given, or their completions did not all come. done was
// not called for an operation the kernel did not take (it did not happen:
// the caller does that work itself); an operation it took whose completion
// did not come is reported as -ECANCELED (whether it happened is unknown, so
// its connection must fail rather than repeat or lose bytes).
func (r *ring) submit(done func(tag uint64, res int32)) bool {
	n := r.pending
	if n == 0 {
		return true
	}
	tail := *r.sqTail
	atomic.StoreUint32(r.sqTail, tail+n)
	r.pending = 0
	var taken uint32
	for {
		got, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), uintptr(n), uringEnterGetEvents, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e == 0 {
			taken = uint32(got)
		}
		break
	}
	// Taken with MSG_DONTWAIT, an operation completes within the call, so
	// the completions are all there now; the wait below is for a kernel
	// that does otherwise.
	var seen [ringEntries]bool
	want := taken
	for want > 0 {
		head := atomic.LoadUint32(r.cqHead)
		ctail := atomic.LoadUint32(r.cqTail)
		for ; head != ctail && want > 0; head++ {
			c := &r.cqes[head&r.cqMask]
			if k := c.userData; k < uint64(len(seen)) && !seen[k] {
				seen[k] = true
				done(r.tags[k], c.res)
				want--
			}
		}
		atomic.StoreUint32(r.cqHead, head)
		if want > 0 {
			_, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, uintptr(want), uringEnterGetEvents, 0, 0)
			if e != 0 && e != unix.EINTR && e != unix.EAGAIN && e != unix.EBUSY {
				break
			}
		}
	}
	if want > 0 {
		for k := uint32(0); k < taken; k++ {
			if !seen[k] {
				done(r.tags[k], -int32(unix.ECANCELED))
			}
		}
	}
	return taken == n && want == 0
}
