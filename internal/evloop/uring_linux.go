//go:build linux

package evloop

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is a minimal io_uring used to issue several socket sends with one
// system call. Every operation is submitted with MSG_DONTWAIT, so the
// kernel completes it during the submitting call (data taken or EAGAIN):
// nothing stays in flight after submit returns, and
// the buffers need to live only as long as the call. A ring belongs to one
// loop goroutine.
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
	pending uint32 // SQEs filled since the last submit
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
func (r *ring) full() bool { return r.pending == uint32(len(r.sqes)) }

// add queues operation op (uringOpSend) of p on fd.
func (r *ring) add(op uint8, fd int, p []byte, tag uint64) {
	tail := *r.sqTail + r.pending
	i := tail & r.sqMask
	r.sqes[i] = uringSQE{opcode: op, fd: int32(fd), addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))), len: uint32(len(p)), opFlags: unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL, userData: tag}
	r.sqArray[i] = i
	r.pending++
}

// submit issues the queued operations with one system call and calls done
// with each one's tag and result (a count, or a negative errno). The
// buffers given to add may be reused when it returns. It reports false
// when the kernel took none of them (done was not called; the ring is
// unusable): the caller then does the work itself.
func (r *ring) submit(done func(tag uint64, res int32)) bool {
	n := r.pending
	if n == 0 {
		return true
	}
	atomic.StoreUint32(r.sqTail, *r.sqTail+n)
	r.pending = 0
	for {
		got, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), uintptr(n), uringEnterGetEvents, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || uint32(got) != n {
			// Taken with MSG_DONTWAIT, an operation completes within
			// the call, so a kernel that took fewer than all (or none,
			// with an error) is not one this code understands.
			return false
		}
		break
	}
	for want := n; want > 0; {
		head := atomic.LoadUint32(r.cqHead)
		tail := atomic.LoadUint32(r.cqTail)
		for ; head != tail && want > 0; head++ {
			c := &r.cqes[head&r.cqMask]
			done(c.userData, c.res)
			want--
		}
		atomic.StoreUint32(r.cqHead, head)
		if want > 0 {
			// Not expected (all completed inline); wait for the rest.
			_, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, uintptr(want), uringEnterGetEvents, 0, 0)
			if e != 0 && e != unix.EINTR {
				return true
			}
		}
	}
	return true
}
