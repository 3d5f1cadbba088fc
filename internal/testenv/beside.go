package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// StartLockpoolBeside runs another [LockpoolBinary] process with p's
// configuration file (the same ports), as an operator starts a new
// lockpool beside the running one for a restart (with handover_socket set
// it takes p's listeners over), and waits until it logs that it listens.
// It is killed when t ends, and its log shown if t failed.
func StartLockpoolBeside(t *testing.T, p *LockpoolProcess) *LockpoolProcess {
	t.Helper()
	n := &LockpoolProcess{Port: p.Port, ConfigPath: p.ConfigPath}
	n.launch(t, LockpoolBinary(t))
	t.Cleanup(func() {
		n.Kill()
		if t.Failed() {
			t.Logf("lockpool process %d log:\n%s", n.PID(), n.Log.String())
		}
	})
	if !n.listening() {
		t.Fatalf("lockpool beside pid %d did not start listening (exit: %v):\n%s", p.PID(), n.Err(), n.Log.String())
	}
	return n
}

// ServedBy reports whether process pid holds the other end of conn, a TCP
// connection this process made to 127.0.0.1 (read from /proc: which of
// several processes accepting on one socket took the connection).
func ServedBy(pid int, conn net.Conn) (bool, error) {
	local, ok1 := conn.LocalAddr().(*net.TCPAddr)
	remote, ok2 := conn.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return false, fmt.Errorf("ServedBy: %v is not a TCP connection", conn.RemoteAddr())
	}
	inode, err := tcpInode(remote.Port, local.Port)
	if err != nil {
		return false, err
	}
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return false, err
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name())); err == nil && l == want {
			return true, nil
		}
	}
	return false, nil
}

// tcpInode is the inode of the IPv4 socket with local port lport and
// remote port rport, from /proc/net/tcp (searched as bytes: the file has a
// line per socket, thousands under connection churn).
func tcpInode(lport, rport int) (string, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	// "  sl  local_address rem_address ...": ":LPORT XXXXXXXX:RPORT ".
	local, remote := []byte(fmt.Sprintf(":%04X ", lport)), []byte(fmt.Sprintf(":%04X ", rport))
	for rest := b; ; {
		i := bytes.Index(rest, local)
		if i < 0 {
			break
		}
		after := rest[i+len(local):]
		rest = after
		if j := bytes.IndexByte(after, ' '); j >= len(remote)-1 && bytes.HasPrefix(after[j-len(remote)+1:], remote) {
			end := bytes.IndexByte(after, '\n')
			if end < 0 {
				end = len(after)
			}
			if fields := strings.Fields(string(after[:end])); len(fields) > 7 {
				return fields[7], nil // rem_address st tx:rx tr:when retrnsmt uid timeout inode
			}
		}
	}
	return "", fmt.Errorf("no socket from port %d to port %d in /proc/net/tcp", lport, rport)
}
