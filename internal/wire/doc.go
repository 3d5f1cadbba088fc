// Package wire is lockpool's framing layer for the PostgreSQL protocol 3.0:
// reading typed messages (ReadHeader, ReadBody, ReadMessage, Frame, and
// Reader, the buffered reader of client and server connections: a client's
// borrows its buffer only while data flows, a server connection's keeps
// one; its Next, Header and Body cut buffered messages in place),
// appending messages (the Append functions), and zero-copy views of the
// messages lockpool inspects (ParseQuery, ParseParse, ParseBind,
// ParseDescribe, ParseClose, ParseExecute on the frontend side;
// ParseReadyForQuery, ParseParameterStatus, ParseFields, ParseDataRow and
// ParseCommandComplete on the backend side).
//
// # How long a body or a view is valid
//
// One rule for everything this package hands out: a body returned by
// ReadBody, ReadMessage, Reader.Next, Reader.Body or Reader.Peek aliases
// the reader's buffer and is valid until the next call on that reader (any
// method: a read, Peek, Discard, Release). A view (Query, Parse, Bind, ...)
// aliases the body it was parsed from and lives exactly as long as that
// body; the same holds for Frame's results, which alias the slice they were
// cut from.
// Copy what you keep: the Clone methods make views that own their bytes.
// Every []byte field of a view is capacity-limited to its own bytes, so
// appending to one never writes into the body.
//
// Appenders never retain their arguments, grow dst as append does, and
// take names and SQL as either string or []byte (the Text constraint), so
// a view's fields can be written back without conversion.
//
// # Errors
//
// A malformed message length or body is reported by an error that wraps
// ErrProtocol and names the message ("invalid Bind message: ..."). A
// parser validates its message fully: when ParseX(body) succeeds, the
// view's AppendTo writes back exactly the frame the body came from.
// Semantic checks that PostgreSQL answers with a plain ERROR (an unknown
// Describe kind, a format code other than 0 or 1, a parameter format count
// that matches neither 1 nor the parameter count) are left to the caller.
package wire
