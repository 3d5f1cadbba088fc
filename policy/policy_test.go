package policy

import "testing"

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		in   Input
		want Action
		code string
	}{
		{"plain statement", Input{}, Forward, ""},
		{"acquire under pin", Input{SessionAcquire: true, AcquireFunc: "pg_advisory_lock"}, PinFirst, ""},
		{"acquire already pinned", Input{SessionAcquire: true, Pinned: true}, Probe, ""},
		{"acquire under reject", Input{AdvisoryLocks: Reject, SessionAcquire: true, AcquireFunc: "pg_try_advisory_lock"}, Refuse, "0A000"},
		{"acquire under allow", Input{AdvisoryLocks: Allow, SessionAcquire: true}, Forward, ""},
		{"unlock under pin probes", Input{Advisory: true, Pinned: true}, Probe, ""},
		{"xact lock under reject forwards", Input{AdvisoryLocks: Reject, Advisory: true}, Forward, ""},
		{"session pool forwards everything", Input{SessionPool: true, AdvisoryLocks: Reject, SessionAcquire: true}, Forward, ""},
		{"state under pin", Input{State: true, StateKind: "listen"}, PinFirst, ""},
		{"state under reject", Input{SessionState: Reject, State: true, StateKind: "listen"}, Refuse, "0A000"},
		{"state under allow", Input{SessionState: Allow, State: true}, Forward, ""},
		{"state end while pinned", Input{StateEnd: true, Pinned: true}, Probe, ""},
		{"state end unpinned", Input{StateEnd: true}, Forward, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.in)
			if d.Action != tt.want {
				t.Fatalf("Decide(%+v) = %v, want %v", tt.in, d.Action, tt.want)
			}
			if tt.code != "" {
				if d.Err == nil || d.Err.Code != tt.code || d.Err.Hint == "" || d.Err.Message[:9] != "lockpool:" {
					t.Fatalf("error = %+v, want code %s with lockpool: message and hint", d.Err, tt.code)
				}
			}
		})
	}
}

func TestRejectHintNamesAlternatives(t *testing.T) {
	e := RejectAdvisory("api", "pg_advisory_lock")
	for _, want := range []string{"pg_advisory_xact_lock", "lease_acquire"} {
		if !contains(e.Hint, want) {
			t.Errorf("hint %q does not name %s", e.Hint, want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"pin", "reject", "allow"} {
		m, err := ParseMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("maybe"); err == nil {
		t.Error("ParseMode(maybe) succeeded")
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
