//go:build linux

package evloop

import (
	"net"
	"net/netip"
	"testing"
)

// RemoteString prints an address as net.TCPAddr does, an IPv4 client of a
// dual-stack listener (an IPv4-mapped IPv6 address) included.
func TestRemoteStringAsTCPAddr(t *testing.T) {
	for _, s := range []string{"127.0.0.1:5432", "[::1]:6432", "[::ffff:10.1.2.3]:40000", "[fe80::1%lo]:7"} {
		ap := netip.MustParseAddrPort(s)
		c := &Conn{fd: -1, addrs: endpoints{local: ap, remote: ap}}
		want := net.TCPAddrFromAddrPort(ap).String()
		if got := c.RemoteString(); got != want {
			t.Errorf("%s: RemoteString %q, TCPAddr %q", s, got, want)
		}
	}
}
