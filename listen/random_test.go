package listen

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// sentNote is one notification a sender of the randomized test sent.
type sentNote struct {
	channel     string
	start, done time.Time // the sending transaction was committed (or rolled back) in between
	committed   bool
}

// epoch is one subscription of a subscriber to a channel in the
// randomized test: Listen was called at listenCall and returned at
// listened; sync (when set) is when the Sync before its end was called;
// unlistened is when Unlisten or UnlistenAll returned (zero: still
// listening at the end, when sync is the final Sync).
type epoch struct {
	channel              string
	listenCall, listened time.Time
	sync, unlistened     time.Time
	synced, ended        bool
}

// TestRandomized: subscribers listen and unlisten at random on several
// channels while senders notify; an oracle checks what each subscriber got
// against what was committed when (each notification carries a sequence
// number) and against the order a direct listening session saw:
//
//   - everything committed after its Listen returned and before the Sync
//     it called before Unlisten (or before the end) reaches it;
//   - nothing committed before its Listen call, nothing after its Unlisten
//     returned, nothing rolled back, nothing twice;
//   - in the stream's order, which is commit order.
//
// PostgreSQL reads its queue in order and stops at a transaction still
// committing, so a notification queued behind one may come later than its
// own commit; the oracle excuses exactly that (an earlier queue entry whose
// commit ended after the moment in question) and counts it.
func TestRandomized(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("LISTEN_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (LISTEN_SEED reruns it, up to scheduling)", seed)
	cl := pgtest.Require(t)
	h, _ := newHub(t)
	ctx := testCtx(t)
	channels := []string{"r0", "r1", "R1", `r "3"`, "r 4 ü"}
	const (
		senders     = 3
		subscribers = 6
		ops         = 150 // Listen, Unlisten or UnlistenAll calls per subscriber
	)

	// The observer: a direct session listening on every channel, whose
	// stream order is the queue order.
	obsConn, err := pgx.Connect(ctx, cl.DSN(appUser, appPW, randDB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obsConn.Close(context.Background()) })
	for _, ch := range channels {
		if _, err := obsConn.Exec(ctx, "LISTEN "+quoteIdent(ch)); err != nil {
			t.Fatal(err)
		}
	}
	var (
		obsMu    sync.Mutex
		observed []int // ids in stream order
		obsWake  = make(chan struct{})
	)
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		for {
			n, err := obsConn.WaitForNotification(obsCtx)
			if err != nil {
				return
			}
			id, _ := strconv.Atoi(n.Payload)
			obsMu.Lock()
			observed = append(observed, id)
			close(obsWake)
			obsWake = make(chan struct{})
			obsMu.Unlock()
		}
	}()

	// Senders.
	var (
		sentMu    sync.Mutex
		sent      = map[int]*sentNote{}
		nextID    int
		committed int // committed notifications so far
		progress  = sync.NewCond(&sentMu)
		sending   = true
		failed    bool // a sender failed: the subscribers stop waiting for progress
	)
	var sendWG sync.WaitGroup
	for s := range senders {
		conn := sender(t, randDB)
		rng := rand.New(rand.NewSource(seed + int64(s)))
		sendWG.Add(1)
		go func() {
			defer sendWG.Done()
			for {
				k := 1 + rng.Intn(3)
				rollback := rng.Intn(10) == 0
				notes := make([]*sentNote, k)
				ids := make([]int, k)
				var sql strings.Builder
				sql.WriteString("BEGIN;")
				sentMu.Lock()
				if !sending {
					sentMu.Unlock()
					return
				}
				for i := range notes {
					ids[i] = nextID
					nextID++
					notes[i] = &sentNote{channel: channels[rng.Intn(len(channels))]}
					sent[ids[i]] = notes[i]
					fmt.Fprintf(&sql, "NOTIFY %s, '%d';", quoteIdent(notes[i].channel), ids[i])
				}
				sentMu.Unlock()
				if rollback {
					sql.WriteString("ROLLBACK")
				} else {
					sql.WriteString("COMMIT")
				}
				start := time.Now()
				_, err := conn.Exec(ctx, sql.String())
				done := time.Now()
				if err != nil {
					t.Error(err)
					sentMu.Lock()
					failed = true
					progress.Broadcast()
					sentMu.Unlock()
					return
				}
				sentMu.Lock()
				for _, n := range notes {
					n.start, n.done, n.committed = start, done, !rollback
				}
				if !rollback {
					committed += k
				}
				progress.Broadcast()
				sentMu.Unlock()
			}
		}()
	}
	// awaitProgress waits until steps more notifications were committed
	// (the subscribers' pace).
	awaitProgress := func(steps int) {
		sentMu.Lock()
		defer sentMu.Unlock()
		target := committed + steps
		for committed < target && !failed {
			progress.Wait()
		}
	}

	// Subscribers.
	recs := make([]*recorder, subscribers)
	epochs := make([][]*epoch, subscribers)
	var subWG sync.WaitGroup
	for i := range recs {
		r := newRecorder(fmt.Sprintf("sub %d", i))
		recs[i] = r
		rng := rand.New(rand.NewSource(seed + 100 + int64(i)))
		subWG.Add(1)
		go func() {
			defer subWG.Done()
			open := map[string]*epoch{}
			for range ops {
				awaitProgress(1 + rng.Intn(12))
				ch := channels[rng.Intn(len(channels))]
				switch e := open[ch]; {
				case rng.Intn(25) == 0 && len(open) > 0: // everything
					var s time.Time
					synced := rng.Intn(2) == 0
					if synced {
						s = time.Now()
						if err := h.Sync(ctx, randDB); err != nil {
							t.Error(err)
							return
						}
					}
					h.UnlistenAll(randDB, r)
					end := time.Now()
					for c, e := range open {
						e.sync, e.synced, e.unlistened, e.ended = s, synced, end, true
						delete(open, c)
					}
				case e == nil:
					e = &epoch{channel: ch, listenCall: time.Now()}
					if err := h.Listen(ctx, randDB, ch, r); err != nil {
						t.Error(err)
						return
					}
					e.listened = time.Now()
					open[ch] = e
					epochs[i] = append(epochs[i], e)
				default:
					if rng.Intn(10) < 7 {
						e.sync, e.synced = time.Now(), true
						if err := h.Sync(ctx, randDB); err != nil {
							t.Error(err)
							return
						}
					}
					h.Unlisten(randDB, ch, r)
					e.unlistened, e.ended = time.Now(), true
					delete(open, ch)
				}
			}
		}()
	}

	subWG.Wait()
	sentMu.Lock()
	sending = false
	sentMu.Unlock()
	sendWG.Wait()
	want := committed
	if t.Failed() {
		return
	}
	// The end: one more Sync, after which everything committed has reached
	// every subscription still open.
	final := time.Now()
	if err := h.Sync(ctx, randDB); err != nil {
		t.Fatal(err)
	}
	for i := range epochs {
		for _, e := range epochs[i] {
			if !e.ended {
				e.sync, e.synced = final, true
			}
		}
	}
	for {
		obsMu.Lock()
		n, w := len(observed), obsWake
		obsMu.Unlock()
		if n >= want {
			break
		}
		select {
		case <-w:
		case <-ctx.Done():
			t.Fatalf("the observer got %d of %d notifications", n, want)
		}
	}
	stopObs()
	<-obsDone

	// The stream order, and for each notification the latest commit end of
	// the entries queued before it (what PostgreSQL may wait for).
	pos := map[int]int{}
	before := map[int]time.Time{}
	var latest, latestStart time.Time
	for p, id := range observed {
		n := sent[id]
		if n == nil || !n.committed {
			t.Fatalf("observer got %d, not committed", id)
		}
		if _, dup := pos[id]; dup {
			t.Fatalf("observer got %d twice", id)
		}
		if n.done.Before(latestStart) {
			t.Fatalf("observer got %d after a transaction that began after it committed", id)
		}
		pos[id], before[id] = p, latest
		if n.done.After(latest) {
			latest = n.done
		}
		if n.start.After(latestStart) {
			latestStart = n.start
		}
	}
	if len(observed) != want {
		t.Fatalf("observer got %d notifications, %d were committed", len(observed), want)
	}

	var delivered, excused, checked int
	for i, r := range recs {
		got, lost := r.snapshot()
		r.mu.Lock()
		at := append([]time.Time(nil), r.at...)
		r.mu.Unlock()
		delivered += len(got)
		if len(lost) > 0 {
			t.Errorf("%s: Lost %v", r.name, lost)
		}
		seen := map[int]*epoch{}
		last := -1
		for k, n := range got {
			id, err := strconv.Atoi(n.Payload)
			note := sent[id]
			if err != nil || note == nil {
				t.Errorf("%s: unknown notification %+v", r.name, n)
				continue
			}
			if !note.committed {
				t.Errorf("%s: got %d, rolled back", r.name, id)
				continue
			}
			if n.Channel != note.channel {
				t.Errorf("%s: got %d on %q, sent on %q", r.name, id, n.Channel, note.channel)
			}
			if _, dup := seen[id]; dup {
				t.Errorf("%s: got %d twice", r.name, id)
				continue
			}
			if pos[id] <= last {
				t.Errorf("%s: got %d out of the stream's order", r.name, id)
			}
			last = pos[id]
			var in *epoch
			for _, e := range epochs[i] {
				if e.channel == n.Channel && !at[k].Before(e.listenCall) && (!e.ended || !at[k].After(e.unlistened)) {
					in = e
				}
			}
			seen[id] = in
			switch {
			case in == nil:
				t.Errorf("%s: got %d on %q while not listening on it", r.name, id, n.Channel)
			case note.done.Before(in.listenCall):
				if before[id].After(in.listenCall) {
					excused++
				} else {
					t.Errorf("%s: got %d on %q, committed %v before Listen was called", r.name, id, n.Channel, in.listenCall.Sub(note.done))
				}
			}
		}
		for _, e := range epochs[i] {
			if !e.synced {
				continue
			}
			for id, note := range sent {
				if !note.committed || note.channel != e.channel || !note.start.After(e.listened) || !note.done.Before(e.sync) {
					continue
				}
				checked++
				if seen[id] == e {
					continue
				}
				if before[id].After(e.sync) {
					excused++
					continue
				}
				t.Errorf("%s: missed %d on %q, committed %v after Listen returned and %v before Sync", r.name, id, e.channel,
					note.start.Sub(e.listened), e.sync.Sub(note.done))
			}
		}
	}
	if s := h.Stats(); s.Delivered != uint64(delivered) {
		t.Errorf("Stats().Delivered = %d, the subscribers got %d", s.Delivered, delivered)
	}
	nEpochs := 0
	for _, es := range epochs {
		nEpochs += len(es)
	}
	t.Logf("%d notifications committed, %d subscriptions, %d deliveries, %d of them required, %d excused by PostgreSQL's queue order (%.2f%%)",
		want, nEpochs, delivered, checked, excused, 100*float64(excused)/math.Max(1, float64(checked)))
}
