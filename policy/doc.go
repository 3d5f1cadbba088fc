// Package policy decides what the proxy does with a statement that touches
// advisory locks or session state: forward it, pin the session to its server
// connection first, forward it and then probe whether the session still holds
// something, or reject it.
//
// Invariants:
//   - Decide is a pure function of its Input: no I/O, no clocks, no globals.
//     The proxy gathers the facts (lexer findings, session state, the
//     application's policy) and carries out the Decision.
//   - Under advisory_locks: hold, a statement that is one whole call of a
//     session-level advisory function is answered by lockpool (Answer);
//     any other statement is decided as under pin, and one that touches a
//     session-level function says so (Decision.Fallback).
//   - Transaction-level advisory locks (the _xact_ functions) are always
//     allowed: they end with their transaction, so pooling is safe.
//   - Every error this package produces is a fresh *pgerr.Error (severity
//     ERROR) with a SQLSTATE, a message that starts with "lockpool:", and a
//     hint.
package policy
