// Package proxy is lockpool's client side: the listener, startup (SSL/GSS
// negotiation, TLS, authentication against the configured users), cancel
// requests, and the session loop that relays each transaction to a pooled
// server connection and answers lockpool's own functions.
//
// A session runs two goroutines while it holds a server connection: the
// session goroutine reads client messages and writes them to the server; the
// relay goroutine reads server messages and writes them to the client. They
// share a small state under session.mu: the queue of responses still owed by
// the server (one boundary per Query, Sync or FunctionCall, and one entry per
// Parse, Bind and Close whose reply lockpool must pass, swallow or translate),
// whether messages were written after the last Sync, and the pin state.
//
// Invariants:
//   - A server connection goes back to the pool only at a safe point: every
//     Query/Sync the client sent has been answered, nothing was written after
//     the last Sync, the server said ReadyForQuery 'I', and the session is not
//     pinned. Any other server connection a session lets go of is destroyed.
//   - Messages lockpool itself answers are written only when the server owes
//     the client nothing, so the client sees replies in the order it asked.
//     Errors that must land in the middle of a server conversation are raised
//     by the server itself (a DO block that RAISEs), which keeps the client's
//     and the server's transaction states in agreement.
//   - Frames are forwarded as raw bytes; only Query, Parse, Bind, Describe and
//     Close from the client, and ReadyForQuery, ParameterStatus and the
//     Parse/Bind/Close completions from the server are decoded. Writes are
//     buffered and flushed once per batch.
//   - A decoded client message is valid only until the next read: whatever is
//     kept (statement text, names) is copied.
//   - Client writes happen under session.wmu; lock order is wmu, then mu.
package proxy
