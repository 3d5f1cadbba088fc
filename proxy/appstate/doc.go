// Package appstate is an application's state as its sessions and the server
// use it: the configuration it was built from, its policy modes parsed once,
// the children of its metrics bound once (Metrics, NewApp), its traffic
// counters (Stats) and the count of its logged-in clients.
//
// # Invariants
//   - An App is built by the server from the configuration at start and at
//     each reload, and not changed after, except for its counters, which
//     are atomic (sessions add to them on their hot path with no lock and
//     no allocation).
//   - A reload's new App takes the previous one's client count and
//     counters, so they survive reloads.
package appstate
