package handover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Addrs are the listening addresses a configuration asks for, as written
// (listen and admin_listen; AdminListen "" when the admin server is off).
type Addrs struct {
	Listen      string `json:"listen"`
	AdminListen string `json:"admin_listen"`
}

// ErrNoOffer is [Take]'s error when nothing answers on the handover socket:
// there is no file, or a stale one that a crashed process left. The caller
// binds its listeners itself.
var ErrNoOffer = errors.New("handover: no running lockpool answers on the handover socket")

// RefusedError is a running process's refusal to hand its listeners over.
type RefusedError struct {
	PID    int    // the running process
	Reason string // why, naming both sides' values
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("handover: the running lockpool (pid %d) refused: %s", e.PID, e.Reason)
}

// exchangeTimeout bounds one exchange on the running process's side: a
// successor that stops talking does not hold a goroutine forever.
const exchangeTimeout = 10 * time.Second

// maxMessage is the largest message either side sends.
const maxMessage = 4096

// The messages, one SOCK_SEQPACKET packet each, as JSON.
type (
	// request: successor -> running process.
	request struct {
		PID int `json:"pid"`
		Addrs
	}
	// answer: running process -> successor, with the descriptors named by
	// Listeners attached (SCM_RIGHTS) in that order.
	answer struct {
		PID       int      `json:"pid"`
		Error     string   `json:"error,omitempty"`
		Listeners []string `json:"listeners,omitempty"` // "client", then "admin" if any
	}
	// confirmation: successor -> running process, once it accepts.
	confirmation struct {
		Accepting bool `json:"accepting"`
	}
)

// Offer serves a process's listeners on the handover socket until Close.
type Offer struct {
	path   string
	addrs  Addrs
	client net.Listener
	admin  net.Listener // nil when admin_listen is ""
	log    *slog.Logger
	ln     *net.UnixListener
	self   fs.FileInfo // the socket file as placed, to recognise it at Close

	handedTo atomic.Int64 // pid of the last successor that confirmed
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

// Serve puts a handover socket at path (replacing a stale socket or the
// socket of the process this one took over from) and offers client and
// admin (nil when the admin server is off) to successors asking for addrs.
// It refuses to replace a path that is not a socket.
func Serve(path string, addrs Addrs, client, admin net.Listener, log *slog.Logger) (*Offer, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, self, err := place(path)
	if err != nil {
		return nil, err
	}
	o := &Offer{path: path, addrs: addrs, client: client, admin: admin, log: log, ln: ln, self: self}
	o.ctx, o.cancel = context.WithCancel(context.Background())
	o.wg.Add(1)
	go o.accept()
	return o, nil
}

// place binds a Unix socket under a temporary name beside path, makes it
// 0600 and renames it to path, so path never names a socket others could
// reach or no socket at all.
func place(path string) (*net.UnixListener, fs.FileInfo, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return nil, nil, fmt.Errorf("handover: %s exists and is not a socket; not replacing it", path)
	}
	tmp := path + "." + strconv.Itoa(os.Getpid())
	if fi, err := os.Lstat(tmp); err == nil && fi.Mode().Type() == fs.ModeSocket {
		_ = os.Remove(tmp) // left by a crashed process that had this pid
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return nil, nil, fmt.Errorf("handover: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, fs.FileInfo, error) {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, nil, fmt.Errorf("handover: %w", err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	self, err := os.Lstat(tmp)
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return ln, self, nil
}

// HandedTo is the pid of the last successor that confirmed it accepts on
// the listeners handed to it (0: none).
func (o *Offer) HandedTo() int { return int(o.handedTo.Load()) }

// Path is the handover socket's path.
func (o *Offer) Path() string { return o.path }

// Close stops offering: it closes the handover socket, removes its path
// unless another process has placed its own socket there since, and waits
// for running exchanges to end. The listeners are not touched.
func (o *Offer) Close() error {
	o.once.Do(func() {
		o.cancel()
		_ = o.ln.Close()
		if fi, err := os.Lstat(o.path); err == nil && os.SameFile(fi, o.self) {
			_ = os.Remove(o.path)
		}
		o.wg.Wait()
	})
	return nil
}

func (o *Offer) accept() {
	defer o.wg.Done()
	for {
		c, err := o.ln.AcceptUnix()
		if err != nil {
			if o.ctx.Err() == nil {
				o.log.Error("handover socket: accept failed; no more handovers from this process", "path", o.path, "err", err)
			}
			return
		}
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			o.exchange(c)
		}()
	}
}

// exchange answers one successor.
func (o *Offer) exchange(c *net.UnixConn) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(o.ctx, exchangeTimeout)
	defer cancel()
	stop := bindDeadline(ctx, c)
	defer stop()
	pid, err := checkPeer(c)
	if err != nil {
		o.log.Warn("handover socket: peer refused", "path", o.path, "err", err)
		return
	}
	var req request
	if err := readJSON(c, &req); err != nil {
		o.log.Warn("handover: no request from the successor", "pid", pid, "err", err)
		return
	}
	if reason := o.mismatch(req.Addrs); reason != "" {
		o.log.Error("handover refused: the new process's configuration asks for other listeners; it binds its own", "successor_pid", pid, "reason", reason)
		_ = writeJSON(c, answer{PID: os.Getpid(), Error: reason}, nil)
		return
	}
	names := []string{"client"}
	lns := []net.Listener{o.client}
	if o.admin != nil {
		names = append(names, "admin")
		lns = append(lns, o.admin)
	}
	err = withFDs(lns, nil, func(fds []int) error {
		return writeJSON(c, answer{PID: os.Getpid(), Listeners: names}, syscall.UnixRights(fds...))
	})
	if err != nil {
		o.log.Warn("handover: could not send the listeners", "successor_pid", pid, "err", err)
		_ = writeJSON(c, answer{PID: os.Getpid(), Error: "this lockpool is no longer listening (shutting down)"}, nil)
		return
	}
	var conf confirmation
	if err := readJSON(c, &conf); err != nil || !conf.Accepting {
		o.log.Warn("handover: the successor took the listeners but did not confirm; this process keeps accepting", "successor_pid", pid, "err", err)
		return
	}
	o.handedTo.Store(int64(pid))
	o.log.Info("handover: listeners handed over; the successor accepts. Send SIGTERM to this process to finish the restart",
		"successor_pid", pid, "listen", o.addrs.Listen, "admin", o.addrs.AdminListen)
}

// mismatch says why a successor asking for want may not have this
// process's listeners ("" if it may).
func (o *Offer) mismatch(want Addrs) string {
	if want.Listen != o.addrs.Listen {
		return fmt.Sprintf("listen differs (running: %q, new: %q)", o.addrs.Listen, want.Listen)
	}
	if want.AdminListen != o.addrs.AdminListen {
		return fmt.Sprintf("admin_listen differs (running: %q, new: %q)", o.addrs.AdminListen, want.AdminListen)
	}
	return ""
}

// withFDs runs f with the descriptors of lns, each held open (not
// duplicated, not made blocking) while f runs.
func withFDs(lns []net.Listener, fds []int, f func([]int) error) error {
	if len(lns) == 0 {
		return f(fds)
	}
	sc, ok := lns[0].(syscall.Conn)
	if !ok {
		return fmt.Errorf("handover: %T has no descriptor", lns[0])
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = withFDs(lns[1:], append(fds, int(fd)), f) }); err != nil {
		return err
	}
	return ferr
}

// Taken are the listeners a successor received.
type Taken struct {
	PID    int          // the process that handed them over
	Client net.Listener // the client listener
	Admin  net.Listener // the admin listener; nil when admin_listen is ""
	conn   *net.UnixConn
}

// Take asks the process serving the handover socket at path for its
// listeners, for a configuration asking for want. It returns [ErrNoOffer]
// when nothing answers, a [*RefusedError] when the running process refuses,
// and another error when the exchange fails (the running process exited
// in the middle, ctx ended). The caller starts accepting on the listeners,
// then calls Confirm.
func Take(ctx context.Context, path string, want Addrs) (*Taken, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (%s: %v)", ErrNoOffer, path, errors.Unwrap(err))
		}
		return nil, fmt.Errorf("handover: %w", err)
	}
	c := nc.(*net.UnixConn)
	stop := bindDeadline(ctx, c)
	t, err := take(c, want)
	stop()
	if err != nil {
		_ = c.Close()
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("handover: the running lockpool did not answer in time: %w", err)
		}
		return nil, err
	}
	return t, nil
}

func take(c *net.UnixConn, want Addrs) (*Taken, error) {
	if _, err := checkPeer(c); err != nil {
		return nil, err
	}
	if err := writeJSON(c, request{PID: os.Getpid(), Addrs: want}, nil); err != nil {
		return nil, fmt.Errorf("handover: sending the request: %w", err)
	}
	buf := make([]byte, maxMessage)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, flags, _, rerr := c.ReadMsgUnix(buf, oob)
	if rerr != nil {
		n, oobn = 0, 0
	}
	fds, perr := parseRights(oob[:oobn])
	ans, err := decodeAnswer(buf[:n], flags, rerr, perr)
	if err != nil {
		closeFDs(fds)
		return nil, err
	}
	lns, err := listenersFrom(fds, ans.Listeners, want)
	if err != nil {
		return nil, err
	}
	t := &Taken{PID: ans.PID, Client: lns[0], conn: c}
	if len(lns) > 1 {
		t.Admin = lns[1]
	}
	return t, nil
}

// decodeAnswer reads the running process's answer.
func decodeAnswer(b []byte, flags int, rerr, perr error) (answer, error) {
	var ans answer
	switch {
	case rerr != nil || len(b) == 0:
		if rerr == nil {
			rerr = errors.New("closed by the peer")
		}
		return ans, fmt.Errorf("handover: the running lockpool ended the exchange without an answer (did it exit?): %w", rerr)
	case perr != nil || flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0:
		return ans, fmt.Errorf("handover: malformed answer (flags %#x): %v", flags, perr)
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return ans, fmt.Errorf("handover: malformed answer: %w", err)
	}
	if ans.Error != "" {
		return ans, &RefusedError{PID: ans.PID, Reason: ans.Error}
	}
	return ans, nil
}

// listenersFrom makes listeners of the descriptors received (it closes
// them all, and on failure the listeners made too).
func listenersFrom(fds []int, names []string, want Addrs) ([]net.Listener, error) {
	defer closeFDs(fds)
	wantNames := []string{"client"}
	if want.AdminListen != "" {
		wantNames = append(wantNames, "admin")
	}
	if len(fds) != len(names) || !slices.Equal(names, wantNames) {
		return nil, fmt.Errorf("handover: the answer names listeners %v with %d descriptors, want %v", names, len(fds), wantNames)
	}
	var lns []net.Listener
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "handover-"+names[i])
		ln, err := net.FileListener(f) // a duplicate, non-blocking, in Go's poller
		_ = f.Close()
		fds[i] = -1
		if err == nil {
			if _, ok := ln.(*net.TCPListener); !ok {
				_ = ln.Close()
				err = fmt.Errorf("a %s socket, want TCP", ln.Addr().Network())
			}
		}
		if err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			return nil, fmt.Errorf("handover: %s listener: %w", names[i], err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
}

// Confirm tells the process that handed the listeners over that this one
// accepts on them, and ends the exchange.
func (t *Taken) Confirm(ctx context.Context) error {
	defer t.conn.Close()
	stop := bindDeadline(ctx, t.conn)
	defer stop()
	if err := writeJSON(t.conn, confirmation{Accepting: true}, nil); err != nil {
		return fmt.Errorf("handover: confirming to pid %d: %w", t.PID, err)
	}
	return nil
}

// Abandon ends the exchange without confirming (the caller failed to start
// serving) and closes the listeners received; the running process keeps
// accepting.
func (t *Taken) Abandon() {
	_ = t.conn.Close()
	_ = t.Client.Close()
	if t.Admin != nil {
		_ = t.Admin.Close()
	}
}

// parseRights returns the descriptors of the SCM_RIGHTS messages in oob.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := syscall.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func writeJSON(c *net.UnixConn, v any, oob []byte) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

func readJSON(c *net.UnixConn, v any) error {
	buf := make([]byte, maxMessage)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil || n < 0 {
		return err
	}
	if n == 0 {
		return errors.New("closed by the peer")
	}
	if flags&syscall.MSG_TRUNC != 0 {
		return errors.New("message too long")
	}
	return json.Unmarshal(buf[:n], v)
}

// bindDeadline makes c's reads and writes fail once ctx ends (its
// deadline, or a cancel); stop undoes it.
func bindDeadline(ctx context.Context, c net.Conn) (stop func() bool) {
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
}
