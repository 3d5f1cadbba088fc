//go:build linux

package evloop

import (
	"net"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BenchmarkSocketCallPair is one 64-byte write and the read that takes it
// on a loopback TCP pair, made with the calls the loop uses (sendto and
// recvfrom) and with write(2) and read(2), which also pass the file layer:
//
//	go test ./internal/evloop -run '^$' -bench SocketCallPair
func BenchmarkSocketCallPair(b *testing.B) {
	srv, peer := pair(b)
	defer srv.Close()
	if err := srv.adopt(); err != nil {
		b.Fatal(err)
	}
	f, err := peer.(*net.TCPConn).File() // a blocking duplicate
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	wfd, rfd := int(f.Fd()), srv.fd
	msg, buf := make([]byte, 64), make([]byte, 16<<10)
	calls := []struct {
		name        string
		write, read func() error
	}{
		{"sendto-recvfrom",
			func() error { _, err := rawWrite(wfd, msg); return err },
			func() error { _, err := rawRead(rfd, buf); return err }},
		{"write-read",
			func() error {
				return errOf(unix.RawSyscall(unix.SYS_WRITE, uintptr(wfd), uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg))))
			},
			func() error {
				return errOf(unix.RawSyscall(unix.SYS_READ, uintptr(rfd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf))))
			}},
	}
	for _, c := range calls {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.write(); err != nil {
					b.Fatal(err)
				}
				if err := c.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func errOf(_, _ uintptr, e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// BenchmarkEmptySyscall is the floor under every socket call: getppid(2), a
// system call that does no work. Where the kernel switches page tables on
// every entry and exit without PCID (pti=on on a CPU or hypervisor that
// hides PCID) it is a large part of a pooler's CPU per transaction:
//
//	go test ./internal/evloop -run '^$' -bench EmptySyscall
func BenchmarkEmptySyscall(b *testing.B) {
	for b.Loop() {
		_, _, _ = unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	}
}
