// Command relayfloor is the least work a pooler written in Go can do per
// transaction: one epoll loop that copies bytes between each client and a
// server connection of its own (opened when the client connects, closed
// with it), with no protocol parsing, no pooling and no authentication of
// its own (the client logs in to PostgreSQL through it). Its non-blocking
// reads and writes and its wait are raw system calls, as in lockpool's
// event loop (internal/evloop), so the Go runtime hands no thread over per
// event.
//
// It is a measuring stick, not a pooler: tools/bench runs it as the
// "relay" target (-relay-max-clients) beside lockpool and PgBouncer, and
// its CPU per transaction is a floor for any Go design of lockpool's hot
// path on the machine at hand (same system calls per transaction as
// lockpool and PgBouncer: one read and one write on each side).
//
//	go run ./tools/relayfloor -listen 127.0.0.1:6433 -server 127.0.0.1:5432
//
// A write that would block is retried at once (the benchmark's replies are
// small); a socket that fails or ends closes both sides of its pair.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:6433", "address to accept clients on")
	server := flag.String("server", "127.0.0.1:5432", "PostgreSQL's address")
	flag.Parse()
	if err := run(*listen, *server); err != nil {
		fmt.Fprintln(os.Stderr, "relayfloor:", err)
		os.Exit(1)
	}
}

// pair is one client and its server connection: fds[0] the client, fds[1]
// the server.
type pair struct{ fds [2]int }

// relay is the loop's state; only the loop's goroutine touches it, except
// incoming, which the accepting goroutine fills.
type relay struct {
	epfd, wake int
	peer       map[int]int // fd -> the other end of its pair
	incoming   chan pair
}

func run(listen, server string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	r := &relay{peer: map[int]int{}, incoming: make(chan pair, 1024)}
	if r.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return err
	}
	if r.wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return err
	}
	if err := r.watch(r.wake); err != nil {
		return err
	}
	go r.accept(ln, server)
	return r.loop()
}

// accept pairs every client with a new server connection and hands the pair
// to the loop.
func (r *relay) accept(ln net.Listener, server string) {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		s, err := net.Dial("tcp", server)
		if err != nil {
			log.Printf("dial %s: %v", server, err)
			c.Close()
			continue
		}
		cfd, err1 := detach(c)
		sfd, err2 := detach(s)
		if err1 != nil || err2 != nil {
			log.Printf("detach: %v %v", err1, err2)
			continue
		}
		r.incoming <- pair{fds: [2]int{cfd, sfd}}
		_, _ = unix.Write(r.wake, one)
	}
}

// detach takes a socket out of Go's netpoller: a non-blocking duplicate of
// its descriptor, the original closed.
func detach(c net.Conn) (int, error) {
	defer c.Close()
	sc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := sc.Control(func(orig uintptr) { fd, dupErr = unix.Dup(int(orig)) }); err != nil {
		return -1, err
	}
	if dupErr != nil {
		return -1, dupErr
	}
	unix.CloseOnExec(fd)
	return fd, unix.SetNonblock(fd, true)
}

func (r *relay) watch(fd int) error {
	return unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)})
}

// loop waits for ready sockets and relays what each has to its peer.
func (r *relay) loop() error {
	runtime.LockOSThread()
	events := make([]unix.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	var drain [8]byte
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(r.epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 1000, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == r.wake {
				_, _, _ = unix.RawSyscall(unix.SYS_READ, uintptr(r.wake), uintptr(unsafe.Pointer(&drain[0])), 8)
				r.adopt()
				continue
			}
			if peer, ok := r.peer[fd]; ok && !r.forward(fd, peer, buf) {
				r.drop(fd, peer)
			}
		}
	}
}

// adopt watches the pairs the accepting goroutine made.
func (r *relay) adopt() {
	for {
		select {
		case p := <-r.incoming:
			r.peer[p.fds[0]], r.peer[p.fds[1]] = p.fds[1], p.fds[0]
			if r.watch(p.fds[0]) != nil || r.watch(p.fds[1]) != nil {
				r.drop(p.fds[0], p.fds[1])
			}
		default:
			return
		}
	}
}

// forward reads what fd has (one read, as a short read means it is drained)
// and writes it to peer. It reports false when the pair must close.
func (r *relay) forward(fd, peer int, buf []byte) bool {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
		if errno == unix.EAGAIN {
			return true
		}
		if errno != 0 || n == 0 {
			return false
		}
		for out := buf[:n]; len(out) > 0; {
			w, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(peer), uintptr(unsafe.Pointer(&out[0])), uintptr(len(out)), unix.MSG_NOSIGNAL, 0, 0)
			if errno == unix.EAGAIN {
				continue
			}
			if errno != 0 {
				return false
			}
			out = out[w:]
		}
		if int(n) < len(buf) {
			return true
		}
	}
}

func (r *relay) drop(a, b int) {
	for _, fd := range []int{a, b} {
		delete(r.peer, fd)
		_ = unix.Close(fd) // closing removes it from the epoll set
	}
}
