package listen

import (
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDelivery(t *testing.T) {
	h, _ := newHub(t)
	snd := sender(t, appDB)
	sndPID := snd.PgConn().PID()
	cases := []struct {
		name     string
		channel  string
		payloads []string
		already  bool // another subscriber listens on the channel first
	}{
		{name: "first subscriber", channel: "events", payloads: []string{"a", "b", "c"}},
		{name: "second subscriber on a listened channel", channel: "shared", payloads: []string{"x", "y"}, already: true},
		{name: "quotes and case", channel: `Mixed "Case" ch`, payloads: []string{"q"}},
		{name: "unicode name", channel: "ünïcödé·通知", payloads: []string{"ü"}},
		{name: "empty payload", channel: "empty", payloads: []string{"", ""}},
		{name: "longest name", channel: strings.Repeat("n", MaxChannelLen), payloads: []string{"long"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			var first *recorder
			if tc.already {
				first = newRecorder("first")
				mustListen(t, h, appDB, tc.channel, first)
			}
			r := newRecorder("sub")
			mustListen(t, h, appDB, tc.channel, r)
			mustListen(t, h, appDB, tc.channel, r) // idempotent
			for _, p := range tc.payloads {
				notify(t, snd, tc.channel, p)
			}
			// A name that differs only in case is another channel.
			variant := strings.ToUpper(tc.channel)
			if variant == tc.channel {
				variant = strings.ToLower(tc.channel)
			}
			if variant != tc.channel {
				notify(t, snd, variant, "other")
			}
			notify(t, snd, tc.channel, "marker")
			got := r.waitPayload(t, ctx, tc.channel, "marker")
			want := append(slices.Clone(tc.payloads), "marker")
			if !slices.Equal(payloads(got), want) {
				t.Fatalf("got %s, want payloads %q", describe(got), want)
			}
			for _, n := range got {
				if n.Channel != tc.channel || n.PID != sndPID || n.Own {
					t.Errorf("notification %+v: want channel %q, pid %d, not own", n, tc.channel, sndPID)
				}
			}
			if first != nil {
				if got := first.waitPayload(t, ctx, tc.channel, "marker"); !slices.Equal(payloads(got), want) {
					t.Errorf("first subscriber got %s, want %q", describe(got), want)
				}
				h.UnlistenAll(appDB, first)
			}
			h.Unlisten(appDB, tc.channel, r)
		})
	}
}

func TestConcurrentListenOfOneSubscriber(t *testing.T) {
	h, _ := newHub(t)
	r := newRecorder("sub")
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = h.Listen(testCtx(t), appDB, "dup", r)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Listen %d: %v", i, err)
		}
	}
	notify(t, sender(t, appDB), "dup", "once")
	got := r.waitPayload(t, testCtx(t), "dup", "once")
	if len(got) != 1 {
		t.Fatalf("got %s, want one notification", describe(got))
	}
	if rows := h.Channels(); len(rows) != 1 || rows[0].Clients != 1 {
		t.Fatalf("Channels() = %+v, want one channel with one client", rows)
	}
}

// TestNoneBeforeListen: a notification committed before Listen is called
// never reaches the new subscriber, whether the listener connection already
// listens on the channel or not.
func TestNoneBeforeListen(t *testing.T) {
	cases := []struct {
		name    string
		already bool // another subscriber keeps the channel listened
		tx      bool // the early notification comes from a transaction block
	}{
		{name: "channel not listened yet"},
		{name: "channel not listened yet, transaction block", tx: true},
		{name: "channel listened by another subscriber", already: true},
		{name: "channel listened by another subscriber, transaction block", already: true, tx: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newHub(t)
			ctx := testCtx(t)
			snd := sender(t, appDB)
			const ch = "early"
			var keeper *recorder
			if tc.already {
				keeper = newRecorder("keeper")
				mustListen(t, h, appDB, ch, keeper)
			}
			for round := range 40 {
				early, late := fmt.Sprintf("early %d", round), fmt.Sprintf("late %d", round)
				if tc.tx {
					if _, err := snd.Exec(ctx, "BEGIN; SELECT pg_notify('early', '"+early+"'); COMMIT"); err != nil {
						t.Fatal(err)
					}
				} else {
					notify(t, snd, ch, early)
				}
				r := newRecorder(fmt.Sprintf("round %d", round))
				mustListen(t, h, appDB, ch, r)
				notify(t, snd, ch, late)
				if got := r.waitPayload(t, ctx, ch, late); !slices.Equal(payloads(got), []string{late}) {
					t.Fatalf("round %d: new subscriber got %s, want only %q", round, describe(got), late)
				}
				if keeper != nil {
					got := keeper.waitPayload(t, ctx, ch, late)
					if n := len(got); n < 2 || got[n-2].Payload != early {
						t.Fatalf("round %d: the other subscriber got %s, want …%q %q", round, describe(got), early, late)
					}
				}
				// Without a keeper the listener UNLISTENs, maybe while the
				// next round's LISTEN is queued.
				h.Unlisten(appDB, ch, r)
			}
		})
	}
}

func TestUnlisten(t *testing.T) {
	h, _ := newHub(t)
	cmds := newCommandLog(h)
	ctx := testCtx(t)
	snd := sender(t, appDB)
	a, b := newRecorder("a"), newRecorder("b")
	for _, ch := range []string{"x", "y"} {
		mustListen(t, h, appDB, ch, a)
		mustListen(t, h, appDB, ch, b)
	}

	// Unlisten ends a's subscription to x at once; y stays.
	h.Unlisten(appDB, "x", a)
	notify(t, snd, "x", "x1")
	notify(t, snd, "y", "y1")
	notify(t, snd, "x", "marker1")
	b.waitPayload(t, ctx, "x", "marker1")
	// b got marker1, so a would have got x1 and marker1 by now.
	got := a.waitPayload(t, ctx, "y", "y1")
	if got, _ := a.snapshot(); !slices.Equal(payloads(got), []string{"y1"}) {
		t.Fatalf("a after Unlisten(x) got %s, want only y1", describe(got))
	}
	_ = got

	// UnlistenAll ends the rest.
	h.UnlistenAll(appDB, a)
	notify(t, snd, "y", "y2")
	notify(t, snd, "x", "marker2")
	b.waitPayload(t, ctx, "x", "marker2")
	if got, _ := a.snapshot(); !slices.Equal(payloads(got), []string{"y1"}) {
		t.Fatalf("a after UnlistenAll got %s, want only y1", describe(got))
	}
	if got, _ := b.snapshot(); !slices.Equal(payloads(got), []string{"x1", "y1", "marker1", "y2", "marker2"}) {
		t.Fatalf("b got %s", describe(got))
	}
	if rows := h.Channels(); len(rows) != 2 || rows[0].Clients != 1 || rows[1].Clients != 1 {
		t.Fatalf("Channels() = %+v, want x and y with one client each", rows)
	}

	// Unlisten of what is not subscribed, or in a database never used, is a no-op.
	h.Unlisten(appDB, "x", a)
	h.Unlisten("nodb", "x", a)
	h.UnlistenAll("nodb", a)
	h.Forget("nodb", 1, a)

	// The last subscriber leaves: the listener UNLISTENs, later.
	from := cmds.len()
	h.UnlistenAll(appDB, b)
	if s := h.Stats(); s.Clients != 0 || s.Channels != 0 || s.Connections != 1 {
		t.Fatalf("Stats() = %+v after the last UnlistenAll", s)
	}
	cmds.waitFor(t, ctx, from, `appdb: UNLISTEN "x"`)
	cmds.waitFor(t, ctx, from, `appdb: UNLISTEN "y"`)
	if s := h.Servers(); len(s) != 1 || s[0].Channels != 0 || s[0].State != "listening" {
		t.Fatalf("Servers() = %+v after the UNLISTENs, want one listener on no channel", s)
	}

	// Listening again works.
	mustListen(t, h, appDB, "x", a)
	notify(t, snd, "x", "again")
	a.waitPayload(t, ctx, "x", "again")
}

// TestOrderOneTransaction: the notifications of one transaction arrive in
// the order they were sent, across channels.
func TestOrderOneTransaction(t *testing.T) {
	h, _ := newHub(t)
	ctx := testCtx(t)
	snd := sender(t, appDB)
	both, onlyA := newRecorder("a and b"), newRecorder("a")
	mustListen(t, h, appDB, "a", both)
	mustListen(t, h, appDB, "b", both)
	mustListen(t, h, appDB, "a", onlyA)
	var sql strings.Builder
	var wantBoth, wantA []string
	sql.WriteString("BEGIN;")
	for i := range 50 {
		ch := "a"
		if i%3 == 1 {
			ch = "b"
		}
		p := strconv.Itoa(i)
		fmt.Fprintf(&sql, "NOTIFY %s, '%s';", ch, p)
		wantBoth = append(wantBoth, p)
		if ch == "a" {
			wantA = append(wantA, p)
		}
	}
	sql.WriteString("NOTIFY a, 'end'; COMMIT")
	if _, err := snd.Exec(ctx, sql.String()); err != nil {
		t.Fatal(err)
	}
	if got := both.waitPayload(t, ctx, "a", "end"); !slices.Equal(payloads(got), append(wantBoth, "end")) {
		t.Errorf("a and b: got %s", describe(got))
	}
	if got := onlyA.waitPayload(t, ctx, "a", "end"); !slices.Equal(payloads(got), append(wantA, "end")) {
		t.Errorf("a: got %s", describe(got))
	}
}

// TestOrderAcrossSenders: transactions of several senders arrive in commit
// order: each sender's in its order, and one that committed before another
// began comes first.
func TestOrderAcrossSenders(t *testing.T) {
	h, _ := newHub(t)
	ctx := testCtx(t)
	r := newRecorder("sub")
	mustListen(t, h, appDB, "o1", r)
	mustListen(t, h, appDB, "o2", r)
	const senders, each = 4, 150
	type span struct{ start, done time.Time }
	spans := make([][]span, senders)
	var wg sync.WaitGroup
	for s := range senders {
		conn := sender(t, appDB)
		spans[s] = make([]span, each)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ch := []string{"o1", "o2"}[(s+i)%2]
				start := time.Now()
				_, err := conn.Exec(ctx, fmt.Sprintf("BEGIN; NOTIFY %s, '%d %d'; COMMIT", ch, s, i))
				spans[s][i] = span{start, time.Now()}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r.waitUntil(t, ctx, "every notification", func(got []Notification, _ []error) bool { return len(got) >= senders*each })
	got, _ := r.snapshot()
	if len(got) != senders*each {
		t.Fatalf("got %d notifications, want %d", len(got), senders*each)
	}
	next := make([]int, senders)
	var seen []span
	for _, n := range got {
		var s, i int
		if _, err := fmt.Sscanf(n.Payload, "%d %d", &s, &i); err != nil {
			t.Fatalf("payload %q: %v", n.Payload, err)
		}
		if i != next[s] {
			t.Fatalf("sender %d: got %d, want %d next", s, i, next[s])
		}
		next[s]++
		sp := spans[s][i]
		for _, prev := range seen {
			if sp.done.Before(prev.start) {
				t.Fatalf("%q came after a transaction that began after it committed", n.Payload)
			}
		}
		seen = append(seen, sp)
	}
}

func TestLargePayload(t *testing.T) {
	h, _ := newHub(t)
	ctx := testCtx(t)
	snd := sender(t, appDB)
	r := newRecorder("sub")
	mustListen(t, h, appDB, "big", r)
	const max = 7999 // PostgreSQL's limit with 8 kB pages
	p := randomText(rand.New(rand.NewSource(1)), max)
	notify(t, snd, "big", p)
	if _, err := snd.Exec(ctx, "SELECT pg_notify('big', $1)", p+"x"); err == nil {
		t.Fatal("a payload of 8000 bytes was accepted")
	}
	notify(t, snd, "big", "end")
	got := r.waitPayload(t, ctx, "big", "end")
	if len(got) != 2 || got[0].Payload != p {
		t.Fatalf("got %s, want the %d-byte payload and end", describe(got), max)
	}
}

func randomText(rng *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.Intn(len(letters))]
	}
	return string(b)
}

// TestCancelledWaitKeepsStream: waits for notifications are cancelled all
// the time (every Listen and Unlisten queues a command) while large
// notifications stream in; none is lost, cut or reordered.
func TestCancelledWaitKeepsStream(t *testing.T) {
	h, _ := newHub(t)
	ctx := testCtx(t)
	r := newRecorder("stream")
	mustListen(t, h, appDB, "stream", r)
	churn := newRecorder("churn")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ch := fmt.Sprintf("churn%d", i%3)
			if err := h.Listen(ctx, appDB, ch, churn); err != nil {
				t.Error(err)
				return
			}
			h.Unlisten(appDB, ch, churn)
		}
	}()
	snd := sender(t, appDB)
	rng := rand.New(rand.NewSource(2))
	const count = 300
	want := make([]string, count)
	for i := range want {
		want[i] = strconv.Itoa(i) + " " + randomText(rng, 7000+rng.Intn(990))
		notify(t, snd, "stream", want[i])
	}
	r.waitUntil(t, ctx, "every notification", func(got []Notification, _ []error) bool { return len(got) >= count })
	close(stop)
	wg.Wait()
	got, _ := r.snapshot()
	if !slices.Equal(payloads(got), want) {
		t.Fatalf("got %d notifications, not the %d sent in order", len(got), count)
	}
}

func TestExpect(t *testing.T) {
	h, _ := newHub(t)
	var clock atomic.Int64 // added to the expectations' clock
	h.now = func() time.Time { return time.Now().Add(time.Duration(clock.Load())) }
	snd, other := sender(t, appDB), sender(t, appDB)
	pid, otherPID := snd.PgConn().PID(), other.PgConn().PID()
	type note struct {
		channel, payload string
	}
	cases := []struct {
		name   string
		setup  func(t *testing.T, a, b *recorder)
		send   []note
		ownA   []bool // per notification sent: a's Own
		ownB   []bool // nil: b's Own always false
		expire bool
	}{
		{
			name:  "same pid, channel and payload",
			setup: func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, pid, a, "e1", "p", false) },
			send:  []note{{"e1", "p"}},
			ownA:  []bool{true},
		},
		{
			name:  "any payload",
			setup: func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, pid, a, "e1", "", true) },
			send:  []note{{"e1", "whatever"}},
			ownA:  []bool{true},
		},
		{
			name:  "other payload first",
			setup: func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, pid, a, "e1", "q", false) },
			send:  []note{{"e1", "p"}, {"e1", "q"}},
			ownA:  []bool{false, true},
		},
		{
			name:  "other channel",
			setup: func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, pid, a, "e2", "p", false) },
			send:  []note{{"e1", "p"}, {"e2", "p"}},
			ownA:  []bool{false, true},
		},
		{
			name:  "other pid",
			setup: func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, otherPID, a, "e1", "p", false) },
			send:  []note{{"e1", "p"}},
			ownA:  []bool{false},
		},
		{
			name: "forgotten",
			setup: func(_ *testing.T, a, _ *recorder) {
				h.Expect(appDB, pid, a, "e1", "p", false)
				h.Forget(appDB, pid, a)
			},
			send: []note{{"e1", "p"}},
			ownA: []bool{false},
		},
		{
			name: "forget keeps others' expectations",
			setup: func(_ *testing.T, a, b *recorder) {
				h.Expect(appDB, pid, b, "e1", "p", false)
				h.Expect(appDB, pid, a, "e1", "p", false)
				h.Forget(appDB, pid, b)
			},
			send: []note{{"e1", "p"}},
			ownA: []bool{true},
		},
		{
			name:  "first match only",
			setup: func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, pid, a, "e1", "p", false) },
			send:  []note{{"e1", "p"}, {"e1", "p"}},
			ownA:  []bool{true, false},
		},
		{
			name: "two subscribers in the order they expected",
			setup: func(_ *testing.T, a, b *recorder) {
				h.Expect(appDB, pid, a, "e1", "p", false)
				h.Expect(appDB, pid, b, "e1", "p", false)
			},
			send: []note{{"e1", "p"}, {"e1", "p"}},
			ownA: []bool{true, false},
			ownB: []bool{false, true},
		},
		{
			name: "used up by a channel the subscriber does not listen on",
			setup: func(_ *testing.T, a, _ *recorder) {
				h.Expect(appDB, pid, a, "e3", "p", false)
				h.Expect(appDB, pid, a, "e1", "p", false)
			},
			send: []note{{"e3", "p"}, {"e1", "p"}, {"e3", "p"}},
			ownA: []bool{true}, // e1's; e3 never reaches a
		},
		{
			name: "committed before anyone listened: dropped",
			setup: func(t *testing.T, a, _ *recorder) {
				h.Expect(appDB, pid, a, "e4", "p", false)
				h.Committed(appDB, pid, a, "e4", "p", false)
				mustListen(t, h, appDB, "e4", a)
			},
			send: []note{{"e4", "p"}},
			ownA: []bool{false},
		},
		{
			name: "listened before the commit: kept",
			setup: func(t *testing.T, a, _ *recorder) {
				h.Expect(appDB, pid, a, "e4", "p", false)
				mustListen(t, h, appDB, "e4", a)
				h.Committed(appDB, pid, a, "e4", "p", false)
			},
			send: []note{{"e4", "p"}},
			ownA: []bool{true},
		},
		{
			name:   "expired after a minute",
			setup:  func(_ *testing.T, a, _ *recorder) { h.Expect(appDB, pid, a, "e1", "p", false) },
			send:   []note{{"e1", "p"}},
			ownA:   []bool{false},
			expire: true,
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			clock.Store(0)
			a, b, third := newRecorder("a"), newRecorder("b"), newRecorder("third")
			for _, ch := range []string{"e1", "e2"} {
				mustListen(t, h, appDB, ch, a)
				mustListen(t, h, appDB, ch, b)
			}
			mustListen(t, h, appDB, "e3", third)
			tc.setup(t, a, b)
			if tc.expire {
				clock.Store(int64(expectTTL + time.Second))
			}
			for _, n := range tc.send {
				notify(t, snd, n.channel, n.payload)
			}
			marker := fmt.Sprintf("marker %d", i)
			notify(t, other, "e1", marker)
			for _, r := range []*recorder{a, b} {
				want := tc.ownA
				if r == b {
					want = tc.ownB
				}
				got := r.waitPayload(t, ctx, "e1", marker)
				got = got[:len(got)-1]
				var own []bool
				for _, n := range got {
					own = append(own, n.Own)
				}
				if want == nil {
					want = make([]bool, len(got))
				}
				if !slices.Equal(own, want) {
					t.Errorf("%s got %s, want Own %v", r.name, describe(got), want)
				}
			}
			h.UnlistenAll(appDB, a)
			h.UnlistenAll(appDB, b)
			h.UnlistenAll(appDB, third)
			h.Forget(appDB, pid, a)
			h.Forget(appDB, pid, b)
		})
	}
}
