package session

import (
	"bytes"
	"fmt"
	"testing"
)

// TestParseMemo checks the memo of plain unnamed Parses: what it finds,
// what it forgets (the oldest, round robin), what it does not take, and
// that the slot holding the session's unnamed statement stops being
// current when add reuses it.
func TestParseMemo(t *testing.T) {
	rest := func(i int) []byte { return []byte(fmt.Sprintf("SELECT %d\x00\x00\x00", i)) }
	m := &parseMemo{current: -1}
	if _, _, ok := m.find(rest(0)); ok {
		t.Fatal("an empty memo found something")
	}
	if _, _, ok := m.find(nil); ok {
		t.Fatal("found an empty Parse")
	}
	for i := 0; i < parseMemoSlots; i++ {
		if slot := m.add(rest(i), i == 3); slot != i {
			t.Fatalf("add #%d took slot %d", i, slot)
		}
	}
	for i := 0; i < parseMemoSlots; i++ {
		slot, begins, ok := m.find(rest(i))
		if !ok || slot != i || begins != (i == 3) {
			t.Fatalf("find #%d = %d, %v, %v; want %d, %v, true", i, slot, begins, ok, i, i == 3)
		}
	}
	m.current = 0
	if slot := m.add(rest(100), false); slot != 0 || m.current != -1 {
		t.Fatalf("add over the current slot: slot %d, current %d; want 0, -1", slot, m.current)
	}
	if _, _, ok := m.find(rest(0)); ok {
		t.Fatal("the oldest entry was not forgotten")
	}
	if slot, _, ok := m.find(rest(100)); !ok || slot != 0 {
		t.Fatalf("the newest entry: slot %d, %v", slot, ok)
	}
	long := bytes.Repeat([]byte("x"), parseMemoMax+1)
	if slot := m.add(long, false); slot != -1 {
		t.Fatalf("a Parse over parseMemoMax was remembered in slot %d", slot)
	}
	if _, _, ok := m.find(long); ok {
		t.Fatal("found a Parse over parseMemoMax")
	}
	// A prefix or an extension of a remembered Parse is another Parse.
	if _, _, ok := m.find(rest(100)[:5]); ok {
		t.Fatal("found a prefix")
	}
	if _, _, ok := m.find(append(rest(100), 0)); ok {
		t.Fatal("found an extension")
	}
}
