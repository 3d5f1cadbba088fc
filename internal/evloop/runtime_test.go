//go:build linux

package evloop

import (
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"
	"time"
)

// The tests here check what the package needs of the Go runtime (doc.go,
// "What evloop needs of the Go runtime"), so that a Go release that changes
// it fails a test rather than a production process.

// TestRunRaisesGOMAXPROCS: each running loop keeps a P while it waits, so
// Run raises GOMAXPROCS to one more than the running loops: the rest of the
// process always has a P.
func TestRunRaisesGOMAXPROCS(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	for range 2 {
		l := startLoop(t)
		ran := make(chan struct{})
		l.Post(func() { close(ran) }) // Run has started when this runs
		<-ran
	}
	if n, loops := runtime.GOMAXPROCS(0), int(running.Load()); n < loops+1 || loops < 2 {
		t.Fatalf("GOMAXPROCS %d with %d loops running, want at least %d", n, loops, loops+1)
	}
}

// TestStopTheWorldInterruptsParkedLoops: a loop waiting in epoll_wait on
// its own thread holds its P (a raw system call), so a stop-the-world must
// end that wait: the runtime's preemption signal makes epoll_wait return
// EINTR. Were it not so, every garbage collection would wait for each
// loop's wait to time out (busyWait). The check is loose, for a loaded
// machine: the median time to stop the world over a few collections must
// stay well under busyWait.
func TestStopTheWorldInterruptsParkedLoops(t *testing.T) {
	for range 2 {
		l, err := New(Options{NoRing: true})
		if err != nil {
			t.Fatal(err)
		}
		l.idleAfter = time.Hour // stay in epoll_wait, never hand the wait to the netpoller
		go l.Run()
		t.Cleanup(l.Stop)
		ran := make(chan struct{})
		l.Post(func() { close(ran) })
		<-ran
	}
	const name = "/sched/pauses/stopping/gc:seconds"
	read := func() *metrics.Float64Histogram {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		if s[0].Value.Kind() != metrics.KindFloat64Histogram {
			t.Skipf("this runtime has no metric %s", name)
		}
		return s[0].Value.Float64Histogram()
	}
	before := read()
	for range 20 {
		runtime.GC()
	}
	after := read()
	// The median of the pauses in the difference of the histograms (the
	// upper bound of its bucket).
	counts := slices.Clone(after.Counts)
	total := uint64(0)
	for i := range counts {
		counts[i] -= before.Counts[i]
		total += counts[i]
	}
	if total == 0 {
		t.Fatal("no stop-the-world recorded")
	}
	seen, median := uint64(0), 0.0
	for i, c := range counts {
		if seen += c; seen*2 >= total {
			median = after.Buckets[i+1]
			break
		}
	}
	t.Logf("%d stops, median time to stop %v", total, time.Duration(median*1e9))
	if time.Duration(median*1e9) >= busyWait/2 {
		t.Fatalf("the median time to stop the world is %v with two loops parked in epoll_wait (busyWait %v): their waits do not end when the runtime preempts them", time.Duration(median*1e9), busyWait)
	}
}
