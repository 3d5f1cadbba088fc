// Package proxy is lockpool's front door and the owner of its sessions:
// the listener and accept loop, startup (SSL/GSS negotiation, TLS,
// authentication against the configured users, the check of startup
// settings), cancel requests, the registry of sessions by key pid, reload,
// shutdown and handoff, and the glue to the cluster coordinator. A session
// itself (the relay of a client's transactions, its server link and its
// states, the path of one query) is package session's; the statements
// lockpool answers itself are package local's; the admin console is package
// console's. Imports go one way: proxy → console, session → appstate →
// local, backend (go list -deps shows it).
//
// # Who owns what
//
// Server owns the registry of sessions (sessions, by key pid, under mu),
// the runtime configuration (rc: an atomic pointer swapped by Reload), and
// what every session shares (session.Shared: the pool, lease store, lock
// manager, listener hub, statement catalog, seen pids, read buffers),
// built once in New. A session reaches the server only through
// session.Host (sessionHost, sessions.go); other goroutines reach a
// session only through its exported methods (Kill, Drain, CancelRunning,
// View), which post to its loop or take its link's lock.
//
// The event loops accept on a TCP listener themselves (evloop.Listen): a
// connection goes through the login pipeline (logingate.go: a bounded
// number of logins at once, the rest wait in a queue within
// client_login_timeout), its login runs on a coroutine of the loop that
// accepted it, what may block on something else than the client (a lookup,
// a dial, a TLS handshake) offloaded to a goroutine, and its session then
// runs on the same coroutine (session.Run). A listener the loops cannot take
// gets an accept goroutine and a goroutine per login, whose socket is then
// handed to a loop (startup.go).
//
// A client that asks for the database lockpool is no session: it is an
// admin console (package proxy/console), served on its connection's
// goroutine after the same authentication (consolelogin.go), for users
// listed in admin_users; Shutdown ends the open consoles with 57P01. It
// takes no server connection. Its views, shown by SHOW … and as JSON under
// /debug/ (AdminHandler), read what the Server hands out as a
// console.Source (consolesource.go): the sessions, listed under the
// server's lock with each link read under the link's lock, and the pool,
// lease store and traffic counters (appstate.Stats: atomic counters the
// sessions add to) through their own locks. KILL_CLIENT ends a session as
// shutdown does (Server.KillClient: session.kill).
//
// Shutdown stops accepting, lets running transactions finish and closes
// idle clients with 57P01. Handoff (handoff.go) is the shutdown of a
// process whose listening sockets a successor now holds (cmd/lockpool,
// internal/handover): it stops accepting first and waits for the accept
// loop, so no accepted connection is dropped, and a client it accepted
// that was not served a statement yet runs one before its 57P01.
//
// With a cluster section and a budget_scope: cluster application, New starts
// the cluster package's Coordinator (cluster.go): it moves those
// applications' pool limits at run time, SHOW CLUSTER shows its last
// picture, and a CancelRequest whose key names another instance of the
// cluster is forwarded to it (clustercancel.go: the instance's number rides
// in bits 23–30 of the pid register hands out; every such key pid is at
// least 2^22, so none is a backend's pid), as is a pg_terminate_backend or
// pg_cancel_backend of its client (clustersignal.go).
package proxy
