package session

import (
	"testing"
)

// TestSeenPIDs checks which client a backend's pid names after a sequence
// of reads (note) and ends (forget).
func TestSeenPIDs(t *testing.T) {
	type step struct {
		note    bool   // else forget
		backend uint32 // note only
		client  uint32
	}
	n := func(b, c uint32) step { return step{true, b, c} }
	f := func(c uint32) step { return step{client: c} }
	cases := []struct {
		name  string
		steps []step
		want  map[uint32]uint32 // backend → client; absent: none
	}{
		{"one read", []step{n(100, 1)}, map[uint32]uint32{100: 1}},
		{"the last reader owns it", []step{n(100, 1), n(100, 2)}, map[uint32]uint32{100: 2}},
		{"a reader of another pid gives up the first", []step{n(100, 1), n(200, 1)}, map[uint32]uint32{200: 1}},
		{"an ended client owns nothing", []step{n(100, 1), f(1)}, map[uint32]uint32{}},
		{"an earlier reader's end leaves the last reader", []step{n(100, 1), n(100, 2), f(1)}, map[uint32]uint32{100: 2}},
		{"the last reader's end frees the pid", []step{n(100, 1), n(100, 2), f(2)}, map[uint32]uint32{}},
		{"a displaced reader reading again", []step{n(100, 1), n(100, 2), n(200, 1), n(100, 1)}, map[uint32]uint32{100: 1}},
	}
	for _, c := range cases {
		var v SeenPIDs
		for _, s := range c.steps {
			if s.note {
				v.note(s.backend, s.client)
			} else {
				v.Forget(s.client)
			}
		}
		for _, b := range []uint32{100, 200} {
			got, ok := v.client(b)
			want, wantOK := c.want[b]
			if ok != wantOK || got != want {
				t.Errorf("%s: backend %d names client %d (%v), want %d (%v)", c.name, b, got, ok, want, wantOK)
			}
		}
	}
}
