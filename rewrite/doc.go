// Package rewrite is lockpool's SQL lexer and analyser. It runs on the body
// of every Query and Parse message, so it is built to be cheap: MayHit is a
// few allocation-free byte passes, and only when it reports true does Analyze
// lex the SQL.
//
// The package owns:
//
//   - the PostgreSQL lexer: 'strings' with doubled quotes, E'…' strings with
//     backslash escapes, U&'…' strings and U&"…" identifiers (with UESCAPE),
//     N'…', B'…' and X'…' literals, dollar quotes $tag$…$tag$ and $$…$$ (while
//     $1 is a parameter and a$$ an identifier), "quoted identifiers" with ""
//     doubling and case preserved, -- comments, nested /* */ comments,
//     numbers, operators, :: casts and ; between statements (except inside
//     a BEGIN ATOMIC … END function body);
//   - Analyze: calls of the eleven advisory-lock functions, the lease virtual
//     functions (whole-statement calls, other mentions, lease_fence),
//     session-state statements (LISTEN, temp tables, WITH HOLD cursors, SQL
//     PREPARE, SET ROLE, LOAD, DISCARD …), GUC changes (SET, RESET,
//     set_config) to replay, and what the proxy needs to answer LISTEN,
//     UNLISTEN and pg_listening_channels() itself and to recognise a
//     client's own notifications: where each top-level LISTEN/UNLISTEN is
//     and its channel as PostgreSQL names it, every NOTIFY statement and
//     pg_notify call (channel and payload when literal, or their $n), and
//     every pg_listening_channels() call (a byte span to replace, and
//     whether the whole text is one such call);
//   - RewriteFence: qualifying lease_fence calls with the lease schema.
//
// Invariants:
//
//   - Never fooled by strings or comments: a name inside a string literal, a
//     quoted identifier of another spelling, or a comment is never a call, and
//     text inside them never starts or ends a statement. The one string that
//     is analysed is the body of a DO block (and, inside it, a literal
//     EXECUTE string), lexed recursively after decoding. Bodies of CREATE
//     FUNCTION/PROCEDURE are not analysed: creating a function runs nothing.
//   - Identifiers follow PostgreSQL: unquoted ones fold to lower case,
//     quoted ones must match exactly, so PG_ADVISORY_LOCK(1) is a call and
//     "PG_ADVISORY_LOCK"(1) is not. A call is an identifier followed by "("
//     (comments and whitespace may sit between), unqualified or qualified by
//     pg_catalog (advisory, set_config, pg_notify, pg_listening_channels)
//     or lockpool (lease functions). Channel names are also cut to 63
//     bytes as PostgreSQL truncates identifiers, and a LISTEN, UNLISTEN or
//     NOTIFY that PostgreSQL's grammar rejects is reported as such (see
//     StateChange and NotifyCall), never with a guessed name.
//   - Statement positions (SetCmd, StateChange, the pg_listening_channels
//     spans) are byte offsets into the analysed text; things found inside
//     a DO body have none (and NOTIFY, pg_notify and pg_listening_channels
//     are not reported there at all: whether that code runs is unknown).
//   - The prefilter never misses: MayHit(sql) is true whenever Analyze(sql)
//     would find anything, and whenever ChangesSchema(sql) is true (a
//     statement starting with ALTER, CREATE, DROP or IMPORT), so a caller
//     asks ChangesSchema only after a hit (tested over every table case and
//     by FuzzAnalyze).
//     It runs SIMD strings.IndexByte passes for bytes rare in ordinary SQL
//     and checks around each: '(' preceded by a word ending in one of the
//     function names (falling back to a per-byte search for "advisory",
//     "lease_", "set_config", "pg_notify" and "pg_listening_channels" when
//     a comment may separate name and '('), ';' or the start followed by a
//     statement-leading keyword (DO, SET, RESET, ALTER, CREATE, DROP,
//     IMPORT, LISTEN, UNLISTEN, NOTIFY, DECLARE, CLOSE, PREPARE,
//     DEALLOCATE, LOAD, DISCARD), U&' or U&", and the word temp/temporary.
//     Analyze runs MayHit first, so the common no-hit path costs one
//     allocation-free pass.
//   - Never panics, whatever the input: unterminated strings, identifiers and
//     comments run to the end of the input.
//   - The no-hit path allocates nothing; returned strings that need no
//     decoding are sub-strings of the input.
//
// Assumptions: standard_conforming_strings is on (the default since
// PostgreSQL 9.1), so a backslash in a plain '…' string is an ordinary
// character; the server encoding is UTF-8 (identifier truncation keeps
// whole UTF-8 characters).
package rewrite
