// Package console is lockpool's admin console: the commands an operator
// sends to the virtual database lockpool (SHOW …, RELOAD, PAUSE, RESUME,
// KILL_CLIENT, SHUTDOWN), the views those SHOW commands show, their
// rendering as PostgreSQL rows, and the admin HTTP listener that serves
// the same views as JSON under /debug/ (with /metrics, /up, /health/ready
// and Go's profiles).
//
// # What it owns
//
//   - The console connection (Conn) of a client package proxy has already
//     authenticated and found in admin_users: the answer to its login, the
//     simple query protocol, and the commands. It runs on its connection's
//     own goroutine until the client leaves or End closes it.
//   - The views (views.go, cluster.go): one function per view gathers its
//     rows, a slice of a row type whose json tags are the column names.
//     SHOW renders the rows (render.go: a RowDescription typed by the Go
//     types, text-format DataRows) and /debug/<name> encodes them as JSON
//     (http.go), so both show the same columns. SHOW LOCKS is the flat form
//     of the lock report (admin.go), which /debug/locks serves nested.
//   - Nothing else: the console keeps no state beyond its connections'
//     buffers. What it shows it reads through Source (*proxy.Server
//     implements it) at the moment it is asked, and every command with an
//     effect goes through Source or the pool it returns.
//
// # Invariants
//
//   - The console never takes a server connection from an application's
//     pool. The queries behind SHOW LOCKS, SHOW PINS and /debug/locks run
//     on lockpool's own connection (Source.AdminQuery), bounded by
//     queryTimeout (5 s); the other views read memory only.
//   - The console holds none of the server's locks. Source.Clients lists
//     the sessions under the server's lock and reads each session's server
//     link under that link's lock; the pool, the listener hub, the lease
//     store, the lock manager and the cluster coordinator are read through
//     their own locks; the traffic counters are atomic. A view is therefore
//     a consistent picture of each client, not of all of them at one
//     instant.
//   - A console connection's writes go through one writer (out): the
//     replies of its goroutine and the FATAL of End (shutdown) never
//     interleave, and nothing is written after a FATAL.
//   - This package does not import package proxy: proxy imports it,
//     routes a login for the database lockpool to NewConn after
//     authenticating it, and ends the open consoles at shutdown.
package console
