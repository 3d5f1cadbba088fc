//go:build race

package integration

// leaseRaceEnabled: the race detector slows the lease stress tests ~2.5x.
const leaseRaceEnabled = true
