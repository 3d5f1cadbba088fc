// Package hosts follows the roles of the PostgreSQL hosts behind lockpool:
// which one is the primary, which are standbys and how far behind they
// replay, and which do not answer.
//
// # What it owns
//
//   - One check connection per host (lockpool's own login, application_name
//     "lockpool-health"), on which every Options.Interval it runs
//     pg_is_in_recovery() and the replay lag, bounded by Options.Timeout. A
//     host whose check fails is down until a check answers again.
//   - The status of every host ([Status]): role, up, lag, generation. A
//     status is an immutable value behind an atomic pointer, so [Monitor.Usable]
//     costs two atomic loads on the path of every transaction (one more
//     per host for a prefer-standby connection to the primary).
//   - The current primary: the one host that is up and not in recovery.
//     With none, or with two or more (split brain), there is no primary:
//     [Monitor.Route] waits for one and lockpool uses none of the claimants.
//   - The connections lockpool dials for its own work through
//     [Monitor.DialPrimary]: each is tracked under the host it reached and
//     closed when that host stops being the primary.
//
// # Generations
//
// Each host has a generation, bumped when the host's role changes
// (primary to standby or back), when another host replaces it as the
// primary, and when it takes part in a split brain. A server connection
// remembers the generation of its host when it was dialed ([Endpoint]); it
// may start a transaction only while that generation is current and the
// host still fits the application's target ([Monitor.Usable]). A host that
// merely misses checks keeps its generation: a short outage does not close
// connections that still work, and a host that is really gone closes them
// itself.
//
// # Invariants
//
//   - At most one host is the primary at a time, and only while no other
//     host that answers claims to be one.
//   - A split brain is called only on checks that all ended after every
//     claimant's claim began: a claimant last checked before another
//     host's claim is checked again first (a switchover stops the old
//     primary, then promotes the standby, within one interval). Meanwhile
//     there is no primary, and the one there was has its generation
//     bumped.
//   - A primary change bumps the old primary's generation before the new
//     primary is published, so no connection to the old one is handed out
//     after a connection to the new one could be.
//   - OnChange runs on the monitor's goroutine, once per change, in order;
//     the statuses it sees are the ones that caused it.
//   - Every wait ([Monitor.Route]) honours its context.
package hosts
