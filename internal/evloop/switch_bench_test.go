package evloop

import (
	"iter"
	"testing"
)

// BenchmarkCoroutineSwitch is one round trip between a loop and a
// coroutine, as a session makes twice per transaction (resumed for the
// client's message, suspended waiting for the server; resumed for the
// reply, suspended or ended): iter.Pull's next and the coroutine's yield.
// It is the most that running a transaction without a coroutine could save
// per round trip:
//
//	go test ./internal/evloop -run '^$' -bench CoroutineSwitch
func BenchmarkCoroutineSwitch(b *testing.B) {
	next, stop := iter.Pull(func(yield func(struct{}) bool) {
		for yield(struct{}{}) {
		}
	})
	defer stop()
	for b.Loop() {
		if _, ok := next(); !ok {
			b.Fatal("coroutine ended")
		}
	}
}
