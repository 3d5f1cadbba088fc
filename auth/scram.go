package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
)

// scramRawNonceLen is PostgreSQL's SCRAM_RAW_NONCE_LEN.
const scramRawNonceLen = 18

// mockAuthNonce plays the role of PostgreSQL's cluster mock_auth_nonce: it
// makes the mock salt of an unknown user stable for the process lifetime and
// unpredictable to clients.
var mockAuthNonce = func() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}()

// mockSCRAMSecret is PostgreSQL's mock_scram_secret: a salt derived from the
// user name, the default iteration count and keys nobody can match.
func mockSCRAMSecret(user string) *scramSecret {
	h := sha256.New()
	h.Write([]byte(user))
	h.Write(mockAuthNonce)
	salt := h.Sum(nil)[:scramDefaultSaltLen]
	return &scramSecret{
		iterations: scramDefaultIter,
		salt:       salt,
		storedKey:  hmacSHA256(mockAuthNonce, []byte("stored\x00"+user)),
		serverKey:  hmacSHA256(mockAuthNonce, []byte("server\x00"+user)),
	}
}

// saslRequest is the AuthenticationSASL every SCRAM exchange starts with
// (encoded, never changed).
var saslRequest = &pgproto3.AuthenticationSASL{AuthMechanisms: []string{MechanismSCRAMSHA256}}

// scramExchange runs SCRAM-SHA-256 as PostgreSQL's CheckSASLAuth +
// auth-scram.c. When cred has no SCRAM secret the exchange is doomed: it
// runs with a mock secret and fails at the end.
func scramExchange(c Conn, user string, cred *Credential) (Result, error) {
	var secret *scramSecret
	if cred != nil {
		secret = cred.scram
	}
	doomed := secret == nil
	if doomed {
		secret = mockSCRAMSecret(user)
	}

	if err := send(c, saslRequest); err != nil {
		return Result{}, err
	}
	body, err := receive(c)
	if err != nil {
		return Result{}, err
	}
	mech, input, hasData, err := parseSASLInitialResponse(body)
	if err != nil {
		return Result{}, err
	}
	if mech != MechanismSCRAMSHA256 {
		return Result{}, protocolError("client selected an invalid SASL authentication mechanism", "")
	}
	if !hasData {
		// No initial response: send an empty challenge, the next
		// SASLResponse carries the client-first-message.
		if err := send(c, &pgproto3.AuthenticationSASLContinue{}); err != nil {
			return Result{}, err
		}
		if input, err = receive(c); err != nil {
			return Result{}, err
		}
	}
	if err := checkSCRAMInput(input); err != nil {
		return Result{}, err
	}
	cf, perr := parseClientFirst(string(input))
	if perr != nil {
		return Result{}, perr
	}

	var raw [scramRawNonceLen]byte
	rand.Read(raw[:])
	tail := secret.serverFirstTail
	if tail == "" { // the mock secret of an unknown user
		tail = ",s=" + base64.StdEncoding.EncodeToString(secret.salt) + ",i=" + strconv.Itoa(secret.iterations)
	}
	// One buffer for the AuthMessage (client-first-message-bare "," server-
	// first-message "," client-final-message-without-proof): the
	// server-first-message is sent from its middle, the client's final
	// part appended when it comes.
	b64 := base64.StdEncoding
	authMessage := make([]byte, 0, len(cf.bare)+1+2+len(cf.nonce)+b64.EncodedLen(scramRawNonceLen)+len(tail)+1+128)
	authMessage = append(authMessage, cf.bare...)
	authMessage = append(authMessage, ',')
	sfStart := len(authMessage)
	authMessage = append(authMessage, "r="...)
	authMessage = append(authMessage, cf.nonce...)
	nonceStart := len(authMessage)
	authMessage = b64.AppendEncode(authMessage, raw[:])
	serverNonce := authMessage[nonceStart:]
	authMessage = append(authMessage, tail...)
	serverFirst := authMessage[sfStart:]
	if err := send(c, &pgproto3.AuthenticationSASLContinue{Data: serverFirst}); err != nil {
		return Result{}, err
	}

	if input, err = receive(c); err != nil {
		return Result{}, err
	}
	if err := checkSCRAMInput(input); err != nil {
		return Result{}, err
	}
	fin, perr := parseClientFinal(string(input), cf.cbindFlag)
	if perr != nil {
		return Result{}, perr
	}

	authMessage = append(authMessage, ',')
	authMessage = append(authMessage, fin.withoutProof...)

	// verify_final_nonce: constant-time, whole-string comparison (of the
	// client's nonce and ours as sent: "r=" is before it in the message).
	sentNonce := serverFirst[2 : nonceStart-sfStart+len(serverNonce)]
	nonceOK := subtle.ConstantTimeCompare([]byte(fin.nonce), sentNonce) == 1

	// verify_client_proof: ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage),
	// then H(ClientKey) must equal StoredKey.
	clientSig := macWith(secret.storedMAC, secret.storedKey, authMessage) // no pool: the mock secret of an unknown user
	clientKey := make([]byte, scramKeyLen)
	subtle.XORBytes(clientKey, fin.proof, clientSig)
	computed := sha256.Sum256(clientKey)
	proofOK := subtle.ConstantTimeCompare(computed[:], secret.storedKey) == 1

	if !nonceOK || !proofOK || doomed {
		return Result{}, authFailed(user)
	}

	serverSig := macWith(secret.serverMAC, secret.serverKey, authMessage)
	final := make([]byte, 0, 2+b64.EncodedLen(len(serverSig)))
	final = b64.AppendEncode(append(final, "v="...), serverSig)
	if err := send(c, &pgproto3.AuthenticationSASLFinal{Data: final}); err != nil {
		return Result{}, err
	}
	return Result{ClientKey: clientKey}, nil
}

// checkSCRAMInput applies the checks of scram_exchange on a raw message.
func checkSCRAMInput(input []byte) *Error {
	if len(input) == 0 {
		return malformedSCRAM("The message is empty.")
	}
	if len(input) > maxAuthTokenLen || bytes.IndexByte(input, 0) >= 0 {
		return malformedSCRAM("Message length does not match input length.")
	}
	return nil
}

type clientFirst struct {
	cbindFlag byte   // 'n' or 'y'
	bare      string // client-first-message-bare
	nonce     string
}

// parseClientFirst follows read_client_first_message.
func parseClientFirst(in string) (clientFirst, *Error) {
	var cf clientFirst
	p := in
	switch p[0] {
	case 'p':
		// We never advertise SCRAM-SHA-256-PLUS.
		return cf, malformedSCRAM("The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.")
	case 'y', 'n':
		cf.cbindFlag = p[0]
		p = p[1:]
		if p == "" || p[0] != ',' {
			return cf, malformedSCRAM("Comma expected, but found character " + sanitizeChar(p) + ".")
		}
		p = p[1:]
	default:
		return cf, malformedSCRAM("Unexpected channel-binding flag " + sanitizeChar(p) + ".")
	}

	// authzid
	if p != "" && p[0] == 'a' {
		return cf, &Error{Code: CodeFeatureNotSupported, Message: "lockpool: client uses authorization identity, but it is not supported"}
	}
	if p == "" || p[0] != ',' {
		return cf, malformedSCRAM("Unexpected attribute " + sanitizeChar(p) + " in client-first-message.")
	}
	p = p[1:]

	cf.bare = p
	if p != "" && p[0] == 'm' {
		return cf, &Error{Code: CodeFeatureNotSupported, Message: "lockpool: client requires an unsupported SCRAM extension"}
	}
	// The user name is ignored, as in PostgreSQL: the startup user counts.
	var err *Error
	if _, p, err = readAttrValue(p, 'n'); err != nil {
		return cf, err
	}
	if cf.nonce, p, err = readAttrValue(p, 'r'); err != nil {
		return cf, err
	}
	if !isSCRAMPrintable(cf.nonce) {
		return cf, malformedSCRAM("Non-printable characters in SCRAM nonce.") // PostgreSQL: "non-printable characters in SCRAM nonce"
	}
	// Optional extensions are ignored.
	for p != "" {
		if _, _, p, err = readAnyAttr(p); err != nil {
			return cf, err
		}
	}
	return cf, nil
}

type clientFinal struct {
	nonce        string
	proof        []byte
	withoutProof string
}

// parseClientFinal follows read_client_final_message (without channel
// binding).
func parseClientFinal(in string, cbindFlag byte) (clientFinal, *Error) {
	var fin clientFinal
	p := in
	cbind, p, err := readAttrValue(p, 'c')
	if err != nil {
		return fin, err
	}
	if !(cbind == "biws" && cbindFlag == 'n') && !(cbind == "eSws" && cbindFlag == 'y') {
		return fin, protocolError("unexpected SCRAM channel-binding attribute in client-final-message", "")
	}
	if fin.nonce, p, err = readAttrValue(p, 'r'); err != nil {
		return fin, err
	}
	// Skip optional extensions up to the proof, which must come last.
	var attr byte
	var value string
	for {
		proofStart := len(in) - len(p) - 1 // position of the ',' before the attribute
		if attr, value, p, err = readAnyAttr(p); err != nil {
			return fin, err
		}
		if attr == 'p' {
			fin.withoutProof = in[:proofStart]
			break
		}
	}
	proof, derr := base64.StdEncoding.DecodeString(value)
	if derr != nil || len(proof) != scramKeyLen {
		return fin, malformedSCRAM("Malformed proof in client-final-message.")
	}
	if p != "" {
		return fin, malformedSCRAM("Garbage found at the end of client-final-message.")
	}
	fin.proof = proof
	return fin, nil
}

// readAttrValue reads "attr=value" up to the next ',' (consumed) or the end,
// like PostgreSQL's read_attr_value.
func readAttrValue(p string, attr byte) (value, rest string, err *Error) {
	if p == "" || p[0] != attr {
		return "", p, malformedSCRAM(fmt.Sprintf("Expected attribute %q but found %s.", string(attr), sanitizeStr(p)))
	}
	if len(p) < 2 || p[1] != '=' {
		return "", p, malformedSCRAM(fmt.Sprintf("Expected character \"=\" for attribute %q.", string(attr)))
	}
	value, rest = splitValue(p[2:])
	return value, rest, nil
}

// readAnyAttr reads "x=value" for any attribute letter x, like
// PostgreSQL's read_any_attr.
func readAnyAttr(p string) (attr byte, value, rest string, err *Error) {
	if p == "" {
		return 0, "", p, malformedSCRAM("Attribute expected, but found end of string.")
	}
	attr = p[0]
	if !(attr >= 'A' && attr <= 'Z' || attr >= 'a' && attr <= 'z') {
		return 0, "", p, malformedSCRAM("Attribute expected, but found invalid character " + sanitizeChar(p) + ".")
	}
	if len(p) < 2 || p[1] != '=' {
		return 0, "", p, malformedSCRAM(fmt.Sprintf("Expected character \"=\" for attribute %q.", string(attr)))
	}
	value, rest = splitValue(p[2:])
	return attr, value, rest, nil
}

func splitValue(s string) (value, rest string) {
	if i := strings.IndexByte(s, ','); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// isSCRAMPrintable: printable ASCII except ','.
func isSCRAMPrintable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}

func sanitizeChar(p string) string {
	if p == "" {
		return "end of string"
	}
	c := p[0]
	if c >= 0x21 && c <= 0x7e {
		return fmt.Sprintf("%q", string(c))
	}
	return fmt.Sprintf("0x%02x", c)
}

func sanitizeStr(p string) string {
	if p == "" {
		return "end of string"
	}
	return sanitizeChar(p)
}
