package auth

import (
	"bytes"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Authentication methods accepted by Authenticate (pg_hba.conf names).
const (
	MethodSCRAMSHA256 = "scram-sha-256"
	MethodMD5         = "md5"
	MethodPassword    = "password"
	MethodTrust       = "trust"
)

// SQLSTATE codes used in *Error.
const (
	CodeInvalidPassword                   = "28P01" // invalid_password
	CodeInvalidAuthorizationSpecification = "28000" // invalid_authorization_specification
	CodeProtocolViolation                 = "08P01" // protocol_violation
	CodeFeatureNotSupported               = "0A000" // feature_not_supported
)

// MechanismSCRAMSHA256 is the only SASL mechanism advertised.
const MechanismSCRAMSHA256 = "SCRAM-SHA-256"

// maxAuthTokenLen mirrors PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH.
const maxAuthTokenLen = 65535

// Conn is what Authenticate needs from the client connection.
type Conn interface {
	// Send encodes msg, appends it and flushes.
	Send(msg pgproto3.BackendMessage) error
	// ReceivePassword reads the next client message, which must be type 'p'
	// (PasswordMessage, SASLInitialResponse and SASLResponse all use 'p'),
	// and returns its body (without type byte and length). Any other type
	// is a protocol error, reported by the implementation. The body may
	// live in a buffer the next call reuses: Authenticate copies what it
	// keeps of a message before it asks for the next.
	ReceivePassword() (body []byte, err error)
}

// Result is the outcome of a successful Authenticate.
type Result struct {
	// ClientKey is set after a successful SCRAM exchange: the ClientKey
	// recovered from the client's proof (ClientProof XOR ClientSignature),
	// with H(ClientKey) == StoredKey. It is as sensitive as a password.
	ClientKey []byte
}

// Error is an authentication failure or protocol error to report to the
// client as a FATAL ErrorResponse.
type Error struct {
	Code    string // SQLSTATE
	Message string
	Detail  string // optional
	Hint    string // optional
}

func (e *Error) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("%s (SQLSTATE %s): %s", e.Message, e.Code, e.Detail)
	}
	return fmt.Sprintf("%s (SQLSTATE %s)", e.Message, e.Code)
}

// ErrorResponse returns the FATAL ErrorResponse to send to the client.
func (e *Error) ErrorResponse() *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{
		Severity:            "FATAL",
		SeverityUnlocalized: "FATAL",
		Code:                e.Code,
		Message:             e.Message,
		Detail:              e.Detail,
		Hint:                e.Hint,
	}
}

func authFailed(user string) *Error {
	return &Error{
		Code:    CodeInvalidPassword,
		Message: `lockpool: password authentication failed for user "` + user + `"`,
		Hint:    "Check the user name and password in the connection string against lockpool's users.",
	}
}

func protocolError(msg, detail string) *Error {
	return &Error{Code: CodeProtocolViolation, Message: "lockpool: " + msg, Detail: detail}
}

func malformedSCRAM(detail string) *Error {
	return protocolError("malformed SCRAM message", detail)
}

// Authenticate runs the authentication exchange for method ("scram-sha-256",
// "md5", "password" or "trust") with the client on c, whose startup message
// named user. cred may be nil for an unknown user: the exchange still runs
// (a mock SCRAM exchange, like PostgreSQL) and fails.
//
// On success it returns a nil error and does NOT send AuthenticationOk. On
// failure it returns an *Error (28P01 with message
// `lockpool: password authentication failed for user "NAME"`, 08P01 for a
// malformed client message, 0A000 for unsupported SCRAM features, 28000 for
// an unknown method) which the caller sends (Error.ErrorResponse) before
// closing. Errors from c (I/O, wrong message type) are returned wrapped and
// are not *Error.
//
// "trust" does not consult cred at all. With "md5", a credential that only
// has a SCRAM secret (or a nil/empty one) gets the SCRAM exchange, as in
// PostgreSQL.
func Authenticate(c Conn, method, user string, cred *Credential) (Result, error) {
	switch method {
	case MethodTrust:
		return Result{}, nil
	case MethodSCRAMSHA256:
		return scramExchange(c, user, cred)
	case MethodMD5:
		if cred.canMD5() {
			return Result{}, md5Exchange(c, user, cred)
		}
		return scramExchange(c, user, cred)
	case MethodPassword:
		return Result{}, passwordExchange(c, user, cred)
	default:
		return Result{}, &Error{
			Code:    CodeInvalidAuthorizationSpecification,
			Message: fmt.Sprintf("lockpool: unsupported authentication method %q", method),
		}
	}
}

func send(c Conn, msg pgproto3.BackendMessage) error {
	if err := c.Send(msg); err != nil {
		return fmt.Errorf("auth: send %T: %w", msg, err)
	}
	return nil
}

func receive(c Conn) ([]byte, error) {
	body, err := c.ReceivePassword()
	if err != nil {
		return nil, fmt.Errorf("auth: receive password message: %w", err)
	}
	return body, nil
}

// parsePasswordMessage checks a PasswordMessage body is exactly one
// NUL-terminated string (PostgreSQL: "invalid password packet size").
func parsePasswordMessage(body []byte) (string, error) {
	if len(body) == 0 || len(body) > maxAuthTokenLen+1 || bytes.IndexByte(body, 0) != len(body)-1 {
		return "", protocolError("invalid password packet size", "")
	}
	return string(body[:len(body)-1]), nil
}

// askPassword sends an authentication request and reads the client's
// password message.
func askPassword(c Conn, req pgproto3.BackendMessage) (string, error) {
	if err := send(c, req); err != nil {
		return "", err
	}
	body, err := receive(c)
	if err != nil {
		return "", err
	}
	return parsePasswordMessage(body)
}

func md5Exchange(c Conn, user string, cred *Credential) error {
	var salt [4]byte
	rand.Read(salt[:])
	got, err := askPassword(c, &pgproto3.AuthenticationMD5Password{Salt: salt})
	if err != nil {
		return err
	}
	stored := cred.md5Hash(user)
	sum := md5.Sum(append([]byte(stored[len(md5HashPrefix):]), salt[:]...))
	want := md5HashPrefix + hex.EncodeToString(sum[:])
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return authFailed(user)
	}
	return nil
}

func passwordExchange(c Conn, user string, cred *Credential) error {
	got, err := askPassword(c, &pgproto3.AuthenticationCleartextPassword{})
	if err != nil {
		return err
	}
	if got == "" || cred == nil {
		return authFailed(user)
	}
	ok := false
	switch {
	case cred.hasPlain:
		ok = subtle.ConstantTimeCompare([]byte(got), []byte(cred.plaintext)) == 1
	case cred.scram != nil: // scram_verify_plain_password
		s := cred.scram
		salted, err := saltedPassword(got, s.salt, s.iterations)
		if err == nil {
			clientKey := hmacSHA256(salted, []byte(clientKeyLabel))
			stored := sha256.Sum256(clientKey)
			ok = subtle.ConstantTimeCompare(stored[:], s.storedKey) == 1
		}
	case cred.md5 != "":
		ok = subtle.ConstantTimeCompare([]byte(md5Hex(got, user)), []byte(cred.md5)) == 1
	}
	if !ok {
		return authFailed(user)
	}
	return nil
}

// parseSASLInitialResponse splits a SASLInitialResponse body into the
// mechanism name and the initial data; hasData is false when the client
// sent length -1 (no initial response).
func parseSASLInitialResponse(body []byte) (mech string, data []byte, hasData bool, err error) {
	idx := bytes.IndexByte(body, 0)
	if idx < 0 || len(body) < idx+1+4 {
		return "", nil, false, protocolError("invalid SASLInitialResponse message", "")
	}
	mech = string(body[:idx])
	rest := body[idx+1:]
	n := int32(binary.BigEndian.Uint32(rest))
	rest = rest[4:]
	if n == -1 && len(rest) == 0 {
		return mech, nil, false, nil
	}
	if n < 0 || int(n) != len(rest) {
		return "", nil, false, protocolError("invalid SASLInitialResponse message", "")
	}
	return mech, rest, true, nil
}
