package auth

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
)

const (
	scramKeyLen          = sha256.Size // SCRAM_KEY_LEN
	scramDefaultSaltLen  = 16          // SCRAM_DEFAULT_SALT_LEN
	scramDefaultIter     = 4096        // scram_iterations default
	scramMaxIter         = 1 << 24     // sanity bound for verifiers from config
	scramVerifierPrefix  = "SCRAM-SHA-256$"
	md5HashPrefix        = "md5"
	md5HashLen           = len(md5HashPrefix) + 2*md5.Size
	clientKeyLabel       = "Client Key"
	serverKeyLabel       = "Server Key"
	maxVerifierSaltBytes = 1024
)

// Credential is what the proxy knows about a user's secret, prepared once at
// config load. It is immutable and safe for concurrent use.
type Credential struct {
	user      string
	plaintext string
	hasPlain  bool
	scram     *scramSecret // nil when no SCRAM secret is known (md5 hash, empty)
	md5       string       // "md5"+32 lowercase hex when the secret was an md5 hash
}

type scramSecret struct {
	iterations int
	salt       []byte
	storedKey  []byte
	serverKey  []byte
	// storedMAC and serverMAC hold HMAC-SHA-256s keyed with StoredKey and
	// ServerKey, their inner and outer pads hashed once: a login takes one,
	// Resets it to the keyed state and puts it back, instead of keying a
	// new HMAC (macs). As secret as the keys.
	storedMAC, serverMAC *sync.Pool
	// serverFirstTail is ",s=<salt base64>,i=<iterations>", the end of
	// every server-first-message for this secret.
	serverFirstTail string
}

// macs prepares what every login with s uses (once, when the secret is
// made).
func (s *scramSecret) macs() *scramSecret {
	stored, server := s.storedKey, s.serverKey
	s.storedMAC = &sync.Pool{New: func() any { return keyedMAC(stored) }}
	s.serverMAC = &sync.Pool{New: func() any { return keyedMAC(server) }}
	s.serverFirstTail = ",s=" + base64.StdEncoding.EncodeToString(s.salt) + ",i=" + strconv.Itoa(s.iterations)
	return s
}

// keyedMAC is an HMAC-SHA-256 with key whose pads are hashed already (the
// first Reset does that: FIPS 198-1 section 6).
func keyedMAC(key []byte) hash.Hash {
	m := hmac.New(sha256.New, key)
	m.Reset()
	return m
}

// macWith is HMAC(key, msg) with an HMAC of pool (a pool of keyedMACs of
// key); with no pool (the mock secret of an unknown user), a new HMAC.
func macWith(pool *sync.Pool, key, msg []byte) []byte {
	if pool == nil {
		return hmacSHA256(key, msg)
	}
	h := pool.Get().(hash.Hash)
	h.Reset() // back to the keyed state (the pads' hashes saved by the first Reset)
	h.Write(msg)
	sum := h.Sum(make([]byte, 0, scramKeyLen))
	pool.Put(h)
	return sum
}

// NewCredential prepares the secret of user. secret is one of:
//
//   - a SCRAM verifier as stored in pg_authid:
//     "SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>";
//     a malformed verifier is an error;
//   - an MD5 hash "md5" + 32 hex digits (md5(password || user));
//   - a plaintext password; SCRAM keys are derived once (SASLprep, random
//     16-byte salt, 4096 iterations);
//   - "" meaning no password: every password method fails (as in
//     PostgreSQL, for a role without a password), "trust" still works.
func NewCredential(user, secret string) (*Credential, error) {
	c := &Credential{user: user}
	switch {
	case secret == "":
		return c, nil
	case strings.HasPrefix(secret, scramVerifierPrefix):
		s, err := parseSCRAMVerifier(secret)
		if err != nil {
			return nil, fmt.Errorf("auth: user %q: %w", user, err)
		}
		c.scram = s
		return c, nil
	case isMD5Hash(secret):
		c.md5 = strings.ToLower(secret)
		return c, nil
	}
	c.plaintext, c.hasPlain = secret, true
	salt := make([]byte, scramDefaultSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return nil, fmt.Errorf("auth: generating SCRAM salt: %w", err)
	}
	s, err := deriveSCRAMSecret(secret, salt, scramDefaultIter)
	if err != nil {
		return nil, fmt.Errorf("auth: user %q: %w", user, err)
	}
	c.scram = s
	return c, nil
}

// User returns the user name the credential was created for.
func (c *Credential) User() string {
	if c == nil {
		return ""
	}
	return c.user
}

// Plaintext returns the plaintext password, if the credential was created
// from one.
func (c *Credential) Plaintext() (string, bool) {
	if c == nil || !c.hasPlain {
		return "", false
	}
	return c.plaintext, true
}

// SCRAMSecret returns copies of the SCRAM-SHA-256 secret (salt, iteration
// count, StoredKey, ServerKey), if known. Together with Result.ClientKey it
// allows a SCRAM login to a server holding the same verifier.
func (c *Credential) SCRAMSecret() (salt []byte, iterations int, storedKey, serverKey []byte, ok bool) {
	if c == nil || c.scram == nil {
		return nil, 0, nil, nil, false
	}
	s := c.scram
	return clone(s.salt), s.iterations, clone(s.storedKey), clone(s.serverKey), true
}

// Verifier returns the SCRAM secret in pg_authid form, if known.
func (c *Credential) Verifier() (string, bool) {
	if c == nil || c.scram == nil {
		return "", false
	}
	s := c.scram
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("%s%d:%s$%s:%s", scramVerifierPrefix, s.iterations,
		b64(s.salt), b64(s.storedKey), b64(s.serverKey)), true
}

// String never reveals the secret.
func (c *Credential) String() string {
	if c == nil {
		return "auth.Credential(nil)"
	}
	kind := "none"
	switch {
	case c.hasPlain:
		kind = "plaintext"
	case c.scram != nil:
		kind = "scram-sha-256"
	case c.md5 != "":
		kind = "md5"
	}
	return fmt.Sprintf("auth.Credential(user=%q, %s)", c.user, kind)
}

// canMD5 reports whether an MD5 challenge can be verified.
func (c *Credential) canMD5() bool {
	return c != nil && (c.hasPlain || c.md5 != "")
}

// md5Hash returns "md5"+hex(md5(password||user)) for the MD5 method.
func (c *Credential) md5Hash(user string) string {
	if c.md5 != "" {
		return c.md5
	}
	return md5Hex(c.plaintext, user)
}

func md5Hex(password, user string) string {
	sum := md5.Sum([]byte(password + user))
	return md5HashPrefix + hex.EncodeToString(sum[:])
}

func isMD5Hash(s string) bool {
	if len(s) != md5HashLen || !strings.HasPrefix(s, md5HashPrefix) {
		return false
	}
	_, err := hex.DecodeString(s[len(md5HashPrefix):])
	return err == nil
}

// parseSCRAMVerifier parses "SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>"
// like PostgreSQL's parse_scram_secret.
func parseSCRAMVerifier(v string) (*scramSecret, error) {
	rest := strings.TrimPrefix(v, scramVerifierPrefix)
	iterSalt, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return nil, errors.New("malformed SCRAM verifier: missing '$' before keys")
	}
	iterStr, saltStr, ok := strings.Cut(iterSalt, ":")
	if !ok {
		return nil, errors.New("malformed SCRAM verifier: missing ':' after iteration count")
	}
	storedStr, serverStr, ok := strings.Cut(keys, ":")
	if !ok {
		return nil, errors.New("malformed SCRAM verifier: missing ':' between keys")
	}
	iter, err := strconv.Atoi(iterStr)
	if err != nil || iter < 1 || iter > scramMaxIter {
		return nil, fmt.Errorf("malformed SCRAM verifier: bad iteration count %q", iterStr)
	}
	salt, err := base64.StdEncoding.DecodeString(saltStr)
	if err != nil || len(salt) == 0 || len(salt) > maxVerifierSaltBytes {
		return nil, errors.New("malformed SCRAM verifier: bad salt")
	}
	stored, err := base64.StdEncoding.DecodeString(storedStr)
	if err != nil || len(stored) != scramKeyLen {
		return nil, errors.New("malformed SCRAM verifier: bad StoredKey")
	}
	server, err := base64.StdEncoding.DecodeString(serverStr)
	if err != nil || len(server) != scramKeyLen {
		return nil, errors.New("malformed SCRAM verifier: bad ServerKey")
	}
	return (&scramSecret{iterations: iter, salt: salt, storedKey: stored, serverKey: server}).macs(), nil
}

// deriveSCRAMSecret computes StoredKey and ServerKey like PostgreSQL's
// scram_build_secret.
func deriveSCRAMSecret(password string, salt []byte, iter int) (*scramSecret, error) {
	salted, err := saltedPassword(password, salt, iter)
	if err != nil {
		return nil, err
	}
	clientKey := hmacSHA256(salted, []byte(clientKeyLabel))
	stored := sha256.Sum256(clientKey)
	return (&scramSecret{
		iterations: iter,
		salt:       clone(salt),
		storedKey:  stored[:],
		serverKey:  hmacSHA256(salted, []byte(serverKeyLabel)),
	}).macs(), nil
}

func saltedPassword(password string, salt []byte, iter int) ([]byte, error) {
	return pbkdf2.Key(sha256.New, saslPrep(password), salt, iter, scramKeyLen)
}

func hmacSHA256(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
