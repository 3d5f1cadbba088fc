package proxy

import (
	"testing"

	"github.com/lockpool/lockpool/proxy/session"
)

// Every key pid is at least 2^22 (no Linux process has such a pid) and a
// positive int32, and keeps the instance's number in bits 23–30.
func TestKeyPIDRange(t *testing.T) {
	counters := []uint32{0, 1, 0x10000, keyPIDBase - 1, keyPIDBase, pidLowMask, pidLowMask + 1, 0x7fffffff, 0xffffffff}
	for _, n := range []int{0, 1, 2, 128, 255} {
		for _, c := range counters {
			pid := keyPIDOf(n, c)
			if !session.IsKeyPID(int64(pid)) || int32(pid) <= 0 {
				t.Errorf("keyPIDOf(%d, %#x) = %#x: not a key pid in [2^22, 2^31)", n, c, pid)
			}
			if got := pidNumber(pid); got != n {
				t.Errorf("keyPIDOf(%d, %#x) = %#x carries number %d", n, c, pid, got)
			}
		}
	}
	if keyPIDOf(0, 5) == keyPIDOf(0, 6) || keyPIDOf(3, 5) == keyPIDOf(3, 6) {
		t.Error("consecutive counters give the same key pid")
	}
	for _, pid := range []int64{0, 1, 99999, keyPIDBase - 1, -keyPIDBase, 1 << 31} {
		if session.IsKeyPID(pid) {
			t.Errorf("session.IsKeyPID(%d) = true", pid)
		}
	}
}
