//go:build !race

package evloop

import "unsafe"

// raceEnabled reports whether the race detector is built in.
const raceEnabled = false

// raceWriteRange is a no-op without the race detector (see race_on.go).
func raceWriteRange(unsafe.Pointer, int) {}

// raceReadRange is a no-op without the race detector (see race_on.go).
func raceReadRange(unsafe.Pointer, int) {}
