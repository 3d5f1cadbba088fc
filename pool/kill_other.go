//go:build !linux

package pool

import "net"

// killSwitch is not available here: Revalidate cannot end in-use
// connections, which end at their release instead.
type killSwitch struct{}

func newKillSwitch(net.Conn) *killSwitch { return nil }
func (k *killSwitch) pull()              {}
func (k *killSwitch) close()             {}
