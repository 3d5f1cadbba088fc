// Package auth implements the server side of PostgreSQL client
// authentication for lockpool: when a client logs in to the proxy, the proxy
// plays the PostgreSQL server and uses this package to challenge the client.
//
// Supported methods (the pg_hba.conf names):
//
//   - "scram-sha-256": SASL SCRAM-SHA-256 per RFC 5802 / RFC 7677, following
//     PostgreSQL's src/backend/libpq/auth-scram.c. Only "SCRAM-SHA-256" is
//     advertised (no channel binding, no -PLUS); a client-first-message with
//     gs2 header "n,," or "y,," is accepted, "p=..." is refused (08P01).
//   - "md5": the MD5 challenge. As in PostgreSQL, when the stored secret is a
//     SCRAM verifier (or the user is unknown) the SCRAM exchange is run
//     instead, which every modern client follows.
//   - "password": cleartext password (only over a trusted transport).
//   - "trust": no exchange.
//
// Secrets are prepared once with NewCredential, from a plaintext password, a
// pg_authid style SCRAM verifier or an "md5..." hash. Plaintext passwords get
// SCRAM keys derived at that time (random salt, 4096 iterations) so that
// logins never run PBKDF2.
//
// Authenticate never sends AuthenticationOk nor the ErrorResponse: on
// success the caller continues the startup sequence, on failure it sends
// the returned *Error (see Error.ErrorResponse) and closes the connection.
// Unknown users (nil *Credential) go through a mock exchange that fails at
// the end, so the client cannot tell unknown users from wrong passwords.
//
// After a successful SCRAM exchange, Result.ClientKey holds the ClientKey
// recovered from the client's proof (ClientProof XOR ClientSignature). It is
// enough to authenticate, with SCRAM, to a PostgreSQL server whose verifier
// has the same salt and iteration count (for example when the credential was
// built from that server's pg_authid verifier) without knowing the plaintext.
package auth
