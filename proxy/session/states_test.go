package session

import "testing"

// TestPositionSafePoints checks the position's answers about safe points
// for the states a conversation with the server passes through.
func TestPositionSafePoints(t *testing.T) {
	for _, c := range []struct {
		name                  string
		p                     position
		owed, unsent          int
		idle, clean, answered bool
	}{
		{"fresh", position{txStatus: 'I'}, 0, 0, true, true, true},
		{"replies owed", position{txStatus: 'I'}, 2, 0, true, false, false},
		{"bytes not yet sent", position{txStatus: 'I'}, 0, 5, true, true, false},
		{"in a transaction block", position{txStatus: 'T'}, 0, 0, false, false, true},
		{"in a failed block", position{txStatus: 'E'}, 0, 0, false, false, true},
		{"extended messages after the last Sync", position{txStatus: 'I', unsynced: true}, 0, 0, false, false, false},
		{"COPY from the client", position{txStatus: 'I', copyIn: true}, 0, 0, true, false, true},
		{"FATAL seen", position{txStatus: 'I', sawFatal: true}, 0, 0, true, false, true},
	} {
		if got := c.p.idle(); got != c.idle {
			t.Errorf("%s: idle() = %v, want %v", c.name, got, c.idle)
		}
		if got := c.p.clean(c.owed); got != c.clean {
			t.Errorf("%s: clean(%d) = %v, want %v", c.name, c.owed, got, c.clean)
		}
		if got := c.p.answered(c.owed, c.unsent); got != c.answered {
			t.Errorf("%s: answered(%d, %d) = %v, want %v", c.name, c.owed, c.unsent, got, c.answered)
		}
	}
	if got := lifeResting.String(); got != "resting" {
		t.Errorf("lifeResting.String() = %q", got)
	}
}
