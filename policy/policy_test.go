package policy

import (
	"strings"
	"testing"

	"github.com/lockpool/lockpool/internal/pgerr"
)

func TestDecide(t *testing.T) {
	tests := []struct {
		name   string
		in     Input
		want   Action
		code   string
		reason string
	}{
		{"plain statement", Input{}, Forward, "", ""},
		{"acquire under pin", Input{SessionAcquire: true, AcquireFunc: "pg_advisory_lock"}, PinFirst, "", "advisory_lock"},
		{"acquire already pinned", Input{SessionAcquire: true, Pinned: true}, Probe, "", "advisory_lock"},
		{"acquire under reject", Input{AdvisoryLocks: Reject, SessionAcquire: true, AcquireFunc: "pg_try_advisory_lock"}, Refuse, pgerr.FeatureNotSupported, ""},
		{"acquire under allow", Input{AdvisoryLocks: Allow, SessionAcquire: true}, Forward, "", ""},
		{"unlock under pin probes", Input{Advisory: true, Pinned: true}, Probe, "", "advisory_lock"},
		{"xact lock under reject forwards", Input{AdvisoryLocks: Reject, Advisory: true}, Forward, "", ""},
		{"session pool forwards everything", Input{SessionPool: true, AdvisoryLocks: Reject, SessionAcquire: true}, Forward, "", ""},
		{"state under pin", Input{State: true, StateKind: "listen"}, PinFirst, "", "listen"},
		{"state under reject", Input{SessionState: Reject, State: true, StateKind: "listen"}, Refuse, pgerr.FeatureNotSupported, ""},
		{"state under allow", Input{SessionState: Allow, State: true}, Forward, "", ""},
		{"listen under listen: reject", Input{Listen: true}, Refuse, pgerr.FeatureNotSupported, ""},
		{"state end while pinned", Input{StateEnd: true, Pinned: true}, Probe, "", ""},
		{"state end unpinned", Input{StateEnd: true}, Forward, "", ""},
		{"holdable call under hold", Input{AdvisoryLocks: Hold, Advisory: true, SessionAcquire: true, Holdable: true}, Answer, "", ""},
		{"holdable unlock under hold", Input{AdvisoryLocks: Hold, Advisory: true, Unlock: true, Holdable: true}, Answer, "", ""},
		{"holdable call in a session pool forwards", Input{SessionPool: true, AdvisoryLocks: Hold, SessionAcquire: true, Holdable: true}, Forward, "", ""},
		{"xact lock under hold probes as under pin", Input{AdvisoryLocks: Hold, Advisory: true}, Probe, "", "advisory_lock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.in)
			if d.Action != tt.want || d.Reason != tt.reason {
				t.Fatalf("Decide(%+v) = %v %q, want %v %q", tt.in, d.Action, d.Reason, tt.want, tt.reason)
			}
			if tt.code == "" {
				if d.Err != nil {
					t.Fatalf("error %v with action %v", d.Err, d.Action)
				}
				return
			}
			checkError(t, d.Err, tt.code)
		})
	}
}

// checkError asserts the contract of every policy error.
func checkError(t *testing.T, e *pgerr.Error, code string) {
	t.Helper()
	if e == nil {
		t.Fatalf("no error, want %s", code)
	}
	if e.Code != code || e.Severity != "" || e.Hint == "" || !strings.HasPrefix(e.Message, "lockpool: ") {
		t.Fatalf("error = %+v, want code %s, severity ERROR, a lockpool: message and a hint", *e, code)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name     string
		make     func() *pgerr.Error
		code     string
		contains []string
	}{
		{"RejectAdvisory", func() *pgerr.Error { return RejectAdvisory("api", "pg_advisory_lock") }, pgerr.FeatureNotSupported,
			[]string{"pg_advisory_lock", `"api"`, "pg_advisory_xact_lock", "lease_acquire"}},
		{"RejectAdvisory without function", func() *pgerr.Error { return RejectAdvisory("api", "") }, pgerr.FeatureNotSupported,
			[]string{"session-level advisory lock is not allowed"}},
		{"RejectState", func() *pgerr.Error { return RejectState("api", "temp_table") }, pgerr.FeatureNotSupported,
			[]string{"temp_table", "session_state: pin"}},
		{"PinTimeout", func() *pgerr.Error { return PinTimeout("api", 2, "5s") }, pgerr.TooManyConnections,
			[]string{"no pin slot", "5s", "max_pinned 2", "raise max_pinned"}},
		{"PoolTimeout", func() *pgerr.Error { return PoolTimeout("api", 4, "5s") }, pgerr.TooManyConnections,
			[]string{"no server connection", "max_connections 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := tt.make()
			checkError(t, e, tt.code)
			for _, want := range tt.contains {
				if !strings.Contains(e.Message+" "+e.Hint, want) {
					t.Errorf("message %q / hint %q lacks %q", e.Message, e.Hint, want)
				}
			}
			e.Message = "changed"
			if tt.make().Message == "changed" {
				t.Error("constructor returned a shared value")
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"pin", "reject", "allow", "hold"} {
		m, err := ParseMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if m, err := ParseMode(""); err != nil || m != Pin {
		t.Errorf("ParseMode(\"\") = %v, %v; want pin", m, err)
	}
	if _, err := ParseMode("maybe"); err == nil {
		t.Error("ParseMode(maybe) succeeded")
	}
}

func TestDecideHoldFallback(t *testing.T) {
	tests := []struct {
		name     string
		in       Input
		want     Action
		fallback bool
	}{
		{"acquire in a larger statement pins", Input{AdvisoryLocks: Hold, Advisory: true, SessionAcquire: true}, PinFirst, true},
		{"acquire in a larger statement while pinned", Input{AdvisoryLocks: Hold, Advisory: true, SessionAcquire: true, Pinned: true}, Probe, true},
		{"unlock in a larger statement probes", Input{AdvisoryLocks: Hold, Advisory: true, Unlock: true}, Probe, true},
		{"xact lock is no fallback", Input{AdvisoryLocks: Hold, Advisory: true}, Probe, false},
		{"whole call answered", Input{AdvisoryLocks: Hold, Advisory: true, SessionAcquire: true, Holdable: true}, Answer, false},
		{"whole unlock while pinned by a fallback goes to the pinned connection", Input{AdvisoryLocks: Hold, Advisory: true, Unlock: true, Holdable: true, Pinned: true, AdvisoryPinned: true}, Probe, true},
		{"whole call while pinned for session state is answered", Input{AdvisoryLocks: Hold, Advisory: true, SessionAcquire: true, Holdable: true, Pinned: true}, Answer, false},
		{"pin policy has no fallback", Input{Advisory: true, SessionAcquire: true}, PinFirst, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.in)
			if d.Action != tt.want || d.Fallback != tt.fallback {
				t.Fatalf("Decide = %v fallback %v, want %v fallback %v", d.Action, d.Fallback, tt.want, tt.fallback)
			}
		})
	}
}
