// Package backend is what lockpool knows of a pooled server connection and
// the exchanges it runs on one itself, on a session's behalf or its own:
//
//   - State (kept in pool.Conn.Aux): the connection's settings as far as
//     lockpool knows them, its prepared statements and their result types,
//     the fingerprint of the client settings it matches;
//   - ClientParams: a client's settings, and Sync and ReadBack, which bring
//     a connection's settings to the client's before its first statement
//     there and the client's to what its transaction left after it;
//   - Probe: whether the connection holds advisory locks or session state
//     (ProbeReasons), and Reset, which cleans a connection a pinned session
//     leaves;
//   - CheckStartup: PostgreSQL's verdict on a client's startup settings;
//   - StmtCatalog and ServerStmtName: server statements known across
//     sessions, named by their text and the statement epoch;
//   - reading the server's answers (ReadUntilReady, IsStalePlan,
//     DroppedAll, EndsConnection, LoginError) and quoting SQL text
//     (SQLLiteral, EscapedLiteral, QuoteGUC, RaiseSQL).
//
// # Invariants
//   - An exchange runs on a connection nobody else uses meanwhile (the
//     session's attached connection, or one just taken from the pool), and
//     reads up to ReadyForQuery: afterwards the connection is in step with
//     its replies, or the error says it is not (ErrRefused marks a refusal
//     the server completed, after which it is still in step).
//   - A State is changed only by the one session attached to its
//     connection; a StmtCatalog has its own lock.
//   - Messages that are not the exchange's (a notification for a listening
//     client) go to the session through its Relay, never to the exchange.
package backend
