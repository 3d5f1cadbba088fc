// Package startupparam reads the settings a client asks for at login, as a
// PostgreSQL 15 backend reads them, and holds lockpool's rules for them
// before any server connection sees them.
//
// The package owns:
//
//   - Param, one setting as the client spelled it, and CanonicalName, the
//     key a parameter has among a session's values (lower case, old
//     aliases such as sort_mem replaced);
//   - ParseOptions: the startup "options" parameter read as
//     pg_split_opts and process_postgres_switches read it (glibc getopt's
//     permutation of arguments included), with the settings each switch
//     stands for and PostgreSQL's 42601 error for a switch or argument it
//     does not accept;
//   - ParseBool, PostgreSQL's parse_bool (the startup packet's replication
//     key uses it);
//   - lockpool's login rules: CheckUnsupported refuses the parameters a
//     pooled server connection cannot carry (role, session_authorization),
//     NeedsCheck says which settings the server must see before a login is
//     accepted, LazilyCheckable which sets may be accepted unchecked when
//     no server connection can be had;
//   - Cache: the sets of settings PostgreSQL accepted and its spelling of
//     each value, so that a login with a set seen before needs no server,
//     and one check shared by the logins that bring the same new set at
//     the same time.
//
// Invariants:
//
//   - Pure: nothing here touches a connection or a session. Running the
//     check on a server connection, and what a session makes of the
//     values, belong to package proxy (startupcheck.go).
//   - Settings keep the client's spelling and their order: PostgreSQL
//     applies them in order, so a later setting of a parameter wins, and
//     quotes the client's spelling in its messages.
//   - ParseOptions never panics, whatever the input. With an error it
//     returns the settings PostgreSQL applied before it saw the bad switch,
//     so the caller can report a setting the server refuses first, as
//     PostgreSQL does; the error is always a *pgerr.Error with SQLSTATE
//     42601. A name given with -c or --name=value has its dashes turned
//     into underscores, as PostgreSQL's ParseLongOption does.
//   - A Cache holds at most 1024 sets and remembers only accepted ones: a
//     refused set or a failed check is asked again at the next login.
package startupparam
