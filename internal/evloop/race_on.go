//go:build race

package evloop

import (
	"runtime"
	"unsafe"
)

// raceEnabled reports whether the race detector is built in.
const raceEnabled = true

// raceWriteRange tells the race detector that the kernel wrote n bytes at
// p on behalf of the calling goroutine (a raw receive, a ring receive's
// completion): a system call made without the syscall package's
// annotations is otherwise invisible to it.
func raceWriteRange(p unsafe.Pointer, n int) {
	if n > 0 {
		runtime.RaceWriteRange(p, n)
	}
}

// raceReadRange tells the race detector that the kernel reads (or may
// read) n bytes at p on behalf of the calling goroutine (a raw send, a
// ring send at its submission).
func raceReadRange(p unsafe.Pointer, n int) {
	if n > 0 {
		runtime.RaceReadRange(p, n)
	}
}
