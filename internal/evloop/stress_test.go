//go:build linux

package evloop

import (
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// stressEnv lengthens TestStressTwoLoops: a duration for each of its two
// modes (io_uring and one call each), e.g. EVLOOP_STRESS=2m.
const stressEnv = "EVLOOP_STRESS"

// streamByte is byte off of the stream a pair's side sends: a hash of the
// offset, so that a byte lost, repeated or moved anywhere shows.
func streamByte(pair, side, off int) byte {
	x := uint64(off)<<20 ^ uint64(pair)<<4 ^ uint64(side)
	x *= 0x9e3779b97f4a7c15
	return byte(x >> 56)
}

// stressSchedule is what both sides of a pair draw, in the same order, from
// generators with the same seed: the messages of each exchange.
type stressSchedule struct{ rng *rand.Rand }

func (s stressSchedule) size() int {
	switch s.rng.Intn(20) {
	case 0:
		return 70 << 10 // past maxDeferred: written at once
	case 1, 2:
		return 8<<10 + s.rng.Intn(24<<10)
	}
	return 1 + s.rng.Intn(2000)
}

// batch is an exchange: the sizes of the initiator's messages and of the
// responder's replies.
func (s stressSchedule) batch() (msgs, replies []int) {
	for k := 1 + s.rng.Intn(4); k > 0; k-- {
		msgs = append(msgs, s.size())
	}
	for k := 1 + s.rng.Intn(3); k > 0; k-- {
		replies = append(replies, s.size())
	}
	return msgs, replies
}

// stressSide is one side of a pair: its connection, the stream it sends
// and the one it checks.
type stressSide struct {
	c         *Conn
	pair      int
	side      int
	rng       *rand.Rand // how to write and read (not shared with the peer)
	sent, got int
}

// send writes sizes' messages of the side's stream, each with
// WriteDeferred or Write, some in pieces.
func (s *stressSide) send(sizes []int) error {
	for _, n := range sizes {
		b := make([]byte, n)
		for k := range b {
			b[k] = streamByte(s.pair, s.side, s.sent+k)
		}
		for len(b) > 0 {
			piece := len(b)
			if s.rng.Intn(3) == 0 {
				piece = 1 + s.rng.Intn(len(b))
			}
			write := s.c.WriteDeferred
			if s.rng.Intn(6) == 0 {
				write = s.c.Write
			}
			if w, err := write(b[:piece]); err != nil || w != piece {
				return fmt.Errorf("wrote %d of %d bytes: %v", w, piece, err)
			}
			s.sent += piece
			b = b[piece:]
		}
	}
	return nil
}

// receive reads total bytes of the peer's stream into buffers of random
// sizes and checks each against the stream. atStart says a clean end
// before any byte is the end of the conversation (io.EOF returned).
func (s *stressSide) receive(total int, atStart bool) error {
	for want := total; want > 0; {
		b := make([]byte, 1+s.rng.Intn(16<<10))
		n, err := s.c.Read(b)
		if err == io.EOF && n == 0 && atStart && want == total {
			return io.EOF
		}
		if err != nil {
			return err
		}
		if n > want {
			return errors.New("the peer sent more than the exchange holds")
		}
		for k := 0; k < n; k++ {
			if b[k] != streamByte(s.pair, 1-s.side, s.got+k) {
				return fmt.Errorf("byte %d is not the stream's: bytes lost, repeated or out of order", s.got+k)
			}
		}
		s.got += n
		want -= n
	}
	return nil
}

func sum(ns []int) int {
	t := 0
	for _, n := range ns {
		t += n
	}
	return t
}

// TestStressTwoLoops runs many pairs of coroutines on two loops (some
// pairs on one loop, some across the two; some over TCP, some over Unix
// socket pairs) that exchange batches of messages of random sizes, written
// with WriteDeferred (several a turn, so the ring sends them together),
// with Write, or in pieces, and read into buffers of random sizes (several
// Reads wait at once, so the ring receives for them): every byte must
// arrive once and in order (the streams are a hash of the offset). With
// io_uring and without; it runs for a second or two in each mode, longer
// with EVLOOP_STRESS set to a duration. Run it under go test -race: the
// loops, their coroutines and the kernel's accesses to the buffers are all
// visible to the race detector.
func TestStressTwoLoops(t *testing.T) {
	d := 1500 * time.Millisecond
	if v := os.Getenv(stressEnv); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s: %v", stressEnv, err)
		}
	}
	for _, tc := range ringModes {
		t.Run(tc.name, func(t *testing.T) {
			loops := [2]*Loop{newLoopIn(t, tc.o), newLoopIn(t, tc.o)}
			ring := loops[0].UsesRing()
			for _, l := range loops {
				go l.Run()
			}
			stopped := false
			defer func() {
				if !stopped {
					loops[0].Stop()
					loops[1].Stop()
				}
			}()
			const pairs = 32
			seed := time.Now().UnixNano()
			t.Logf("seed %d, %v", seed, d)
			end := time.Now().Add(d)
			var done []chan struct{}
			var mu sync.Mutex
			exchanged, bytesMoved := 0, 0
			for i := 0; i < pairs; i++ {
				var a *Conn
				var peer net.Conn
				if i%3 == 0 {
					a, peer = unixPair(t)
				} else {
					a, peer = pair(t)
				}
				b := Wrap(peer)
				// Pairs 0..3 cover: both on loop 0, across, across, both on 1.
				la, lb := loops[i%2], loops[(i/2)%2]
				initiator := &stressSide{c: a, pair: i, side: 0, rng: rand.New(rand.NewSource(seed + 2*int64(i)))}
				responder := &stressSide{c: b, pair: i, side: 1, rng: rand.New(rand.NewSource(seed + 2*int64(i) + 1))}
				sched := func() stressSchedule { return stressSchedule{rand.New(rand.NewSource(seed - int64(i)))} }
				done = append(done, run(la, func(co *Co) {
					if err := a.Bind(co); err != nil {
						t.Error(err)
						return
					}
					defer a.Close()
					_ = a.SetReadDeadline(end.Add(time.Minute))
					s, n := sched(), 0
					for ; n == 0 || time.Now().Before(end); n++ {
						msgs, replies := s.batch()
						if err := initiator.send(msgs); err != nil {
							t.Errorf("pair %d exchange %d: initiator: %v", i, n, err)
							return
						}
						if err := initiator.receive(sum(replies), false); err != nil {
							t.Errorf("pair %d exchange %d: initiator: %v", i, n, err)
							return
						}
					}
					mu.Lock()
					exchanged += n
					bytesMoved += initiator.sent + initiator.got
					mu.Unlock()
				}), run(lb, func(co *Co) {
					if err := b.Bind(co); err != nil {
						t.Error(err)
						return
					}
					defer b.Close()
					_ = b.SetReadDeadline(end.Add(time.Minute))
					s := sched()
					for n := 0; ; n++ {
						msgs, replies := s.batch()
						err := responder.receive(sum(msgs), true)
						if err == io.EOF {
							return // the initiator ended after a whole exchange
						}
						if err != nil {
							t.Errorf("pair %d exchange %d: responder: %v", i, n, err)
							return
						}
						if err := responder.send(replies); err != nil {
							t.Errorf("pair %d exchange %d: responder: %v", i, n, err)
							return
						}
					}
				}))
			}
			for _, c := range done {
				<-c
			}
			// A ring that failed would have been closed (the loop goes on
			// with one call each): in the io_uring mode both must have kept it.
			for k, l := range loops {
				kept := make(chan bool, 1)
				l.Post(func() { kept <- l.ring != nil })
				if !<-kept && ring {
					t.Errorf("loop %d gave up its ring", k)
				}
			}
			loops[0].Stop()
			loops[1].Stop()
			stopped = true
			receives := loops[0].ringReceives + loops[1].ringReceives
			sends := loops[0].ringSends + loops[1].ringSends
			t.Logf("%d exchanges, %d bytes; through io_uring: %d receives, %d sends", exchanged, bytesMoved, receives, sends)
			if exchanged < pairs {
				t.Errorf("%d exchanges by %d pairs", exchanged, pairs)
			}
			if ring && (receives == 0 || sends == 0) {
				t.Errorf("the loops used io_uring for %d receives and %d sends; the test needs both", receives, sends)
			}
		})
	}
}
