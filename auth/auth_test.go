package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// backendConn adapts pgproto3.Backend to Conn. Since every authentication
// response uses type 'p', it tells the Backend which one to expect and
// re-encodes the decoded message to hand back its raw body.
type backendConn struct {
	be *pgproto3.Backend
}

func (b *backendConn) Send(msg pgproto3.BackendMessage) error {
	switch msg.(type) {
	case *pgproto3.AuthenticationSASL:
		b.be.SetAuthType(pgproto3.AuthTypeSASL)
	case *pgproto3.AuthenticationSASLContinue:
		b.be.SetAuthType(pgproto3.AuthTypeSASLContinue)
	case *pgproto3.AuthenticationSASLFinal:
		b.be.SetAuthType(pgproto3.AuthTypeSASLFinal)
	case *pgproto3.AuthenticationMD5Password:
		b.be.SetAuthType(pgproto3.AuthTypeMD5Password)
	case *pgproto3.AuthenticationCleartextPassword:
		b.be.SetAuthType(pgproto3.AuthTypeCleartextPassword)
	}
	b.be.Send(msg)
	return b.be.Flush()
}

func (b *backendConn) ReceivePassword() ([]byte, error) {
	msg, err := b.be.Receive()
	if err != nil {
		return nil, err
	}
	switch msg.(type) {
	case *pgproto3.PasswordMessage, *pgproto3.SASLInitialResponse, *pgproto3.SASLResponse:
	default:
		return nil, fmt.Errorf("expected password message, got %T", msg)
	}
	buf, err := msg.Encode(nil)
	if err != nil {
		return nil, err
	}
	return buf[5:], nil
}

type serverOutcome struct {
	user   string
	result Result
	err    error
}

// startServer runs a one-connection-at-a-time fake PostgreSQL server that
// authenticates with method and the credential returned by lookup.
func startServer(t *testing.T, method string, lookup func(user string) *Credential) (port int, outcomes <-chan serverOutcome) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan serverOutcome, 16)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go serveOne(nc, method, lookup, ch)
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, ch
}

func serveOne(nc net.Conn, method string, lookup func(string) *Credential, ch chan<- serverOutcome) {
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	be := pgproto3.NewBackend(nc, nc)
	msg, err := be.ReceiveStartupMessage()
	if err != nil {
		ch <- serverOutcome{err: err}
		return
	}
	sm, ok := msg.(*pgproto3.StartupMessage)
	if !ok {
		ch <- serverOutcome{err: fmt.Errorf("unexpected %T", msg)}
		return
	}
	user := sm.Parameters["user"]
	res, err := Authenticate(&backendConn{be: be}, method, user, lookup(user))
	ch <- serverOutcome{user: user, result: res, err: err}
	if err != nil {
		var ae *Error
		if errors.As(err, &ae) {
			be.Send(ae.ErrorResponse())
			be.Flush()
		}
		return
	}
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15"})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{1, 2, 3, 4}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		return
	}
	for { // until Terminate / EOF
		if _, err := be.Receive(); err != nil {
			return
		}
	}
}

func connect(t *testing.T, port int, user, password string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s sslmode=disable", port, user, password))
	if err != nil {
		return err
	}
	if got := conn.ParameterStatus("server_version"); got != "15" {
		t.Errorf("server_version = %q", got)
	}
	conn.Close(ctx)
	return nil
}

func wantAuthFailed(t *testing.T, err error, user string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("want PgError, got %v", err)
	}
	want := `lockpool: password authentication failed for user "` + user + `"`
	if pgErr.Code != "28P01" || pgErr.Message != want || pgErr.Severity != "FATAL" {
		t.Fatalf("got %s %s %q, want FATAL 28P01 %q", pgErr.Severity, pgErr.Code, pgErr.Message, want)
	}
}

func mustCred(t *testing.T, user, secret string) *Credential {
	t.Helper()
	c, err := NewCredential(user, secret)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pgVerifier computes a verifier the way PostgreSQL's scram_build_secret does.
func pgVerifier(t *testing.T, password string, iter int) (verifier string, salt, clientKey []byte) {
	t.Helper()
	salt = make([]byte, 16)
	rand.Read(salt)
	salted, err := pbkdf2.Key(sha256.New, password, salt, iter, 32)
	if err != nil {
		t.Fatal(err)
	}
	clientKey = hmacSHA256(salted, []byte("Client Key"))
	stored := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, []byte("Server Key"))
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iter, b64(salt), b64(stored[:]), b64(serverKey)), salt, clientKey
}

func outcome(t *testing.T, ch <-chan serverOutcome) serverOutcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no server outcome")
		return serverOutcome{}
	}
}

func TestPgconnLogins(t *testing.T) {
	verifier, _, _ := pgVerifier(t, "s3cret", 4096)
	creds := map[string]*Credential{
		"plain":    mustCred(t, "alice", "s3cret"),
		"verifier": mustCred(t, "alice", verifier),
		"md5hash":  mustCred(t, "alice", md5Hex("s3cret", "alice")),
	}
	cases := []struct {
		name, method, cred string
		scram              bool
	}{
		{"scram/plaintext", MethodSCRAMSHA256, "plain", true},
		{"scram/verifier", MethodSCRAMSHA256, "verifier", true},
		{"md5/plaintext", MethodMD5, "plain", false},
		{"md5/md5hash", MethodMD5, "md5hash", false},
		{"md5/verifier-falls-back-to-scram", MethodMD5, "verifier", true},
		{"password/plaintext", MethodPassword, "plain", false},
		{"password/verifier", MethodPassword, "verifier", false},
		{"password/md5hash", MethodPassword, "md5hash", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cred := creds[tc.cred]
			port, ch := startServer(t, tc.method, func(string) *Credential { return cred })

			if err := connect(t, port, "alice", "s3cret"); err != nil {
				t.Fatalf("connect: %v", err)
			}
			o := outcome(t, ch)
			if o.err != nil {
				t.Fatalf("server: %v", o.err)
			}
			if tc.scram != (o.result.ClientKey != nil) {
				t.Fatalf("ClientKey = %x, scram = %v", o.result.ClientKey, tc.scram)
			}

			err := connect(t, port, "alice", "wrong")
			wantAuthFailed(t, err, "alice")
			if o := outcome(t, ch); o.err == nil {
				t.Fatal("server accepted a wrong password")
			}
		})
	}
}

func TestPgconnTrust(t *testing.T) {
	port, ch := startServer(t, MethodTrust, func(string) *Credential { return nil })
	if err := connect(t, port, "alice", "whatever"); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, ch); o.err != nil || o.result.ClientKey != nil {
		t.Fatalf("trust: %+v", o)
	}
}

func TestPgconnUnknownUser(t *testing.T) {
	for _, method := range []string{MethodSCRAMSHA256, MethodMD5, MethodPassword} {
		t.Run(method, func(t *testing.T) {
			port, ch := startServer(t, method, func(string) *Credential { return nil })
			wantAuthFailed(t, connect(t, port, "mallory", "s3cret"), "mallory")
			o := outcome(t, ch)
			var ae *Error
			if !errors.As(o.err, &ae) || ae.Code != CodeInvalidPassword {
				t.Fatalf("server err = %v", o.err)
			}
		})
	}
}

func TestPgconnEmptyCredentialFails(t *testing.T) {
	for _, method := range []string{MethodSCRAMSHA256, MethodMD5, MethodPassword} {
		t.Run(method, func(t *testing.T) {
			cred := mustCred(t, "alice", "")
			port, _ := startServer(t, method, func(string) *Credential { return cred })
			wantAuthFailed(t, connect(t, port, "alice", "x"), "alice")
		})
	}
}

func TestMD5HashWithSCRAMMethodFails(t *testing.T) {
	// Like PostgreSQL: an md5 secret cannot serve scram-sha-256 (mock exchange).
	cred := mustCred(t, "alice", md5Hex("s3cret", "alice"))
	port, _ := startServer(t, MethodSCRAMSHA256, func(string) *Credential { return cred })
	wantAuthFailed(t, connect(t, port, "alice", "s3cret"), "alice")
}

func TestPgconnNonASCIIPassword(t *testing.T) {
	// pgx normalizes with PRECIS OpaqueString; for this password it agrees
	// with SASLprep (U+00A0 -> ' ', NFC-stable).
	pw := "p\u00e4ss\u00a0w\u00f6rd"
	verifier, _, _ := pgVerifier(t, saslPrep(pw), 4096)
	for _, secret := range []string{pw, verifier} {
		cred := mustCred(t, "alice", secret)
		port, _ := startServer(t, MethodSCRAMSHA256, func(string) *Credential { return cred })
		if err := connect(t, port, "alice", "'"+pw+"'"); err != nil {
			t.Fatalf("secret %q: %v", secret, err)
		}
	}
}

func TestClientKey(t *testing.T) {
	verifier, _, wantClientKey := pgVerifier(t, "s3cret", 4096)
	for _, secret := range []string{"s3cret", verifier} {
		cred := mustCred(t, "alice", secret)
		port, ch := startServer(t, MethodSCRAMSHA256, func(string) *Credential { return cred })
		if err := connect(t, port, "alice", "s3cret"); err != nil {
			t.Fatal(err)
		}
		o := outcome(t, ch)
		if o.err != nil {
			t.Fatal(o.err)
		}
		_, _, storedKey, _, ok := cred.SCRAMSecret()
		if !ok {
			t.Fatal("no SCRAM secret")
		}
		h := sha256.Sum256(o.result.ClientKey)
		if !bytes.Equal(h[:], storedKey) {
			t.Fatalf("H(ClientKey) != StoredKey")
		}
		if secret == verifier && !bytes.Equal(o.result.ClientKey, wantClientKey) {
			t.Fatalf("ClientKey = %x, want %x", o.result.ClientKey, wantClientKey)
		}
	}
}

func TestNewCredential(t *testing.T) {
	c := mustCred(t, "alice", "pw")
	if p, ok := c.Plaintext(); !ok || p != "pw" {
		t.Fatalf("Plaintext = %q %v", p, ok)
	}
	salt, iter, stored, server, ok := c.SCRAMSecret()
	if !ok || len(salt) != 16 || iter != 4096 || len(stored) != 32 || len(server) != 32 {
		t.Fatalf("derived secret: %d %d %d %d %v", len(salt), iter, len(stored), len(server), ok)
	}
	v, _ := c.Verifier()
	c2 := mustCred(t, "alice", v)
	if _, ok := c2.Plaintext(); ok {
		t.Fatal("verifier credential has plaintext")
	}
	if v2, _ := c2.Verifier(); v2 != v {
		t.Fatalf("verifier round trip: %q != %q", v2, v)
	}
	if strings.Contains(c.String(), "pw") {
		t.Fatal("String leaks password")
	}
	var nilCred *Credential
	if _, ok := nilCred.Plaintext(); ok {
		t.Fatal("nil Plaintext")
	}
	m := mustCred(t, "alice", "md5"+strings.Repeat("AB", 16))
	if _, ok := m.Plaintext(); ok || !m.canMD5() {
		t.Fatal("md5 hash not recognised")
	}
	for _, bad := range []string{
		"SCRAM-SHA-256$",
		"SCRAM-SHA-256$4096:c2FsdA==",
		"SCRAM-SHA-256$x:c2FsdA==$AAAA:AAAA",
		"SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
		"SCRAM-SHA-256$0:c2FsdA==$" + strings.Repeat("A", 43) + "=:" + strings.Repeat("A", 43) + "=",
	} {
		if _, err := NewCredential("alice", bad); err == nil {
			t.Errorf("NewCredential(%q) succeeded", bad)
		}
	}
}

// --- scripted exchanges with a hand-written SCRAM client ---

// scriptConn is a Conn whose client side is a function reacting to each
// server message.
type scriptConn struct {
	sent    []pgproto3.BackendMessage
	respond func(msg pgproto3.BackendMessage) []byte // nil: no reply expected
	pending [][]byte
}

func (s *scriptConn) Send(msg pgproto3.BackendMessage) error {
	if _, err := msg.Encode(nil); err != nil {
		return err
	}
	s.sent = append(s.sent, msg)
	if r := s.respond(msg); r != nil {
		s.pending = append(s.pending, r)
	}
	return nil
}

func (s *scriptConn) ReceivePassword() ([]byte, error) {
	if len(s.pending) == 0 {
		return nil, errors.New("client has nothing to say")
	}
	b := s.pending[0]
	s.pending = s.pending[1:]
	return b, nil
}

func saslInitial(mech string, data []byte, noData bool) []byte {
	b := append([]byte(mech), 0)
	if noData {
		return binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// scramClient is a minimal RFC 5802 client with knobs to misbehave.
type scramClient struct {
	password  string
	gs2       string // "n,," by default
	cbind     string // c= value; default base64(gs2)
	mech      string
	noInitial bool
	finalExt  string // signed extension attributes before the proof, e.g. ",x=1"
	finalHook func(withoutProof, proof string) string

	bare, nonce string
	salted      []byte
	authMessage string
	serverFinal string
}

func (c *scramClient) respond(msg pgproto3.BackendMessage) []byte {
	switch m := msg.(type) {
	case *pgproto3.AuthenticationSASL:
		c.nonce = "fyko+d2lbbFgONRv9qkxdawL"
		if c.gs2 == "" {
			c.gs2 = "n,,"
		}
		if c.mech == "" {
			c.mech = "SCRAM-SHA-256"
		}
		c.bare = "n=ignored,r=" + c.nonce
		if c.noInitial {
			return saslInitial(c.mech, nil, true)
		}
		return saslInitial(c.mech, []byte(c.gs2+c.bare), false)
	case *pgproto3.AuthenticationSASLContinue:
		if len(m.Data) == 0 {
			c.noInitial = false
			return []byte(c.gs2 + c.bare)
		}
		serverFirst := string(m.Data)
		var r, s, i string
		for _, kv := range strings.Split(serverFirst, ",") {
			switch kv[:2] {
			case "r=":
				r = kv[2:]
			case "s=":
				s = kv[2:]
			case "i=":
				i = kv[2:]
			}
		}
		salt, _ := base64.StdEncoding.DecodeString(s)
		var iter int
		fmt.Sscan(i, &iter)
		c.salted, _ = pbkdf2.Key(sha256.New, c.password, salt, iter, 32)
		cb := c.cbind
		if cb == "" {
			cb = base64.StdEncoding.EncodeToString([]byte(c.gs2))
		}
		withoutProof := "c=" + cb + ",r=" + r + c.finalExt
		c.authMessage = c.bare + "," + serverFirst + "," + withoutProof
		clientKey := hmacSHA256(c.salted, []byte("Client Key"))
		stored := sha256.Sum256(clientKey)
		sig := hmacSHA256(stored[:], []byte(c.authMessage))
		proof := make([]byte, 32)
		for k := range proof {
			proof[k] = clientKey[k] ^ sig[k]
		}
		p := base64.StdEncoding.EncodeToString(proof)
		if c.finalHook != nil {
			return []byte(c.finalHook(withoutProof, p))
		}
		return []byte(withoutProof + ",p=" + p)
	case *pgproto3.AuthenticationSASLFinal:
		c.serverFinal = string(m.Data)
	}
	return nil
}

func (c *scramClient) verifyServer(t *testing.T) {
	t.Helper()
	serverKey := hmacSHA256(c.salted, []byte("Server Key"))
	want := "v=" + base64.StdEncoding.EncodeToString(hmacSHA256(serverKey, []byte(c.authMessage)))
	if !hmac.Equal([]byte(c.serverFinal), []byte(want)) {
		t.Fatalf("server-final %q, want %q", c.serverFinal, want)
	}
}

func runScript(t *testing.T, cred *Credential, c *scramClient) (*scriptConn, Result, error) {
	t.Helper()
	sc := &scriptConn{respond: c.respond}
	res, err := Authenticate(sc, MethodSCRAMSHA256, "alice", cred)
	return sc, res, err
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("err = %v, want SQLSTATE %s", err, code)
	}
}

func TestSCRAMScripted(t *testing.T) {
	cred := mustCred(t, "alice", "pencil")

	t.Run("n", func(t *testing.T) {
		c := &scramClient{password: "pencil"}
		sc, res, err := runScript(t, cred, c)
		if err != nil {
			t.Fatal(err)
		}
		c.verifyServer(t)
		sasl := sc.sent[0].(*pgproto3.AuthenticationSASL)
		if len(sasl.AuthMechanisms) != 1 || sasl.AuthMechanisms[0] != "SCRAM-SHA-256" {
			t.Fatalf("mechanisms %v", sasl.AuthMechanisms)
		}
		sf := string(sc.sent[1].(*pgproto3.AuthenticationSASLContinue).Data)
		if !strings.HasPrefix(sf, "r="+c.nonce) || !strings.HasSuffix(sf, ",i=4096") ||
			len(strings.SplitN(sf, ",", 2)[0]) != len("r=")+len(c.nonce)+24 {
			t.Fatalf("server-first %q", sf)
		}
		h := sha256.Sum256(res.ClientKey)
		_, _, stored, _, _ := cred.SCRAMSecret()
		if !bytes.Equal(h[:], stored) {
			t.Fatal("H(ClientKey) != StoredKey")
		}
	})
	t.Run("y", func(t *testing.T) {
		c := &scramClient{password: "pencil", gs2: "y,,"}
		if _, _, err := runScript(t, cred, c); err != nil {
			t.Fatal(err)
		}
		c.verifyServer(t)
	})
	t.Run("no initial response", func(t *testing.T) {
		c := &scramClient{password: "pencil", noInitial: true}
		if _, _, err := runScript(t, cred, c); err != nil {
			t.Fatal(err)
		}
		c.verifyServer(t)
	})
	t.Run("extensions ignored", func(t *testing.T) {
		c := &scramClient{password: "pencil", finalExt: ",x=ext,y=1"}
		if _, _, err := runScript(t, cred, c); err != nil {
			t.Fatal(err)
		}
		c.verifyServer(t)
	})
	t.Run("unsigned extension", func(t *testing.T) {
		// The extension is part of client-final-message-without-proof but
		// was not signed: authentication failure, not a protocol error.
		c := &scramClient{password: "pencil", finalHook: func(w, p string) string { return w + ",x=ext,p=" + p }}
		_, _, err := runScript(t, cred, c)
		wantCode(t, err, CodeInvalidPassword)
	})
	t.Run("wrong password", func(t *testing.T) {
		_, _, err := runScript(t, cred, &scramClient{password: "pen"})
		wantCode(t, err, CodeInvalidPassword)
	})
	t.Run("unknown user", func(t *testing.T) {
		sc, _, err := runScript(t, nil, &scramClient{password: "pencil"})
		wantCode(t, err, CodeInvalidPassword)
		if len(sc.sent) != 2 {
			t.Fatalf("mock exchange sent %d messages", len(sc.sent))
		}
		// Mock salt is stable per user.
		sc2, _, _ := runScript(t, nil, &scramClient{password: "pencil"})
		s1 := strings.Split(string(sc.sent[1].(*pgproto3.AuthenticationSASLContinue).Data), ",")[1]
		s2 := strings.Split(string(sc2.sent[1].(*pgproto3.AuthenticationSASLContinue).Data), ",")[1]
		if s1 != s2 {
			t.Fatalf("mock salt not stable: %s %s", s1, s2)
		}
	})
	t.Run("channel binding p refused", func(t *testing.T) {
		_, _, err := runScript(t, cred, &scramClient{password: "pencil", gs2: "p=tls-server-end-point,,"})
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("PLUS mechanism refused", func(t *testing.T) {
		_, _, err := runScript(t, cred, &scramClient{password: "pencil", mech: "SCRAM-SHA-256-PLUS"})
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("authzid", func(t *testing.T) {
		_, _, err := runScript(t, cred, &scramClient{password: "pencil", gs2: "n,a=bob,"})
		wantCode(t, err, CodeFeatureNotSupported)
	})
	t.Run("bad gs2 flag", func(t *testing.T) {
		_, _, err := runScript(t, cred, &scramClient{password: "pencil", gs2: "x,,"})
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("cbind mismatch", func(t *testing.T) {
		_, _, err := runScript(t, cred, &scramClient{password: "pencil", gs2: "n,,", cbind: "eSws"})
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("nonce mismatch", func(t *testing.T) {
		c := &scramClient{password: "pencil", finalHook: func(w, p string) string {
			return strings.Replace(w, ",r=", ",r=X", 1) + ",p=" + p
		}}
		_, _, err := runScript(t, cred, c)
		wantCode(t, err, CodeInvalidPassword)
	})
	t.Run("garbage after proof", func(t *testing.T) {
		c := &scramClient{password: "pencil", finalHook: func(w, p string) string { return w + ",p=" + p + ",z=1" }}
		_, _, err := runScript(t, cred, c)
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("short proof", func(t *testing.T) {
		c := &scramClient{password: "pencil", finalHook: func(w, p string) string { return w + ",p=AAAA" }}
		_, _, err := runScript(t, cred, c)
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("missing proof", func(t *testing.T) {
		c := &scramClient{password: "pencil", finalHook: func(w, p string) string { return w }}
		_, _, err := runScript(t, cred, c)
		wantCode(t, err, CodeProtocolViolation)
	})
	t.Run("empty final", func(t *testing.T) {
		c := &scramClient{password: "pencil", finalHook: func(w, p string) string { return "" }}
		_, _, err := runScript(t, cred, c)
		wantCode(t, err, CodeProtocolViolation)
	})
}

func TestMalformedPasswordMessage(t *testing.T) {
	cred := mustCred(t, "alice", "pw")
	for _, body := range [][]byte{{}, []byte("pw"), []byte("p\x00w\x00")} {
		sc := &scriptConn{respond: func(pgproto3.BackendMessage) []byte { return body }}
		_, err := Authenticate(sc, MethodMD5, "alice", cred)
		wantCode(t, err, CodeProtocolViolation)
	}
	sc := &scriptConn{respond: func(pgproto3.BackendMessage) []byte { return []byte("SCRAM-SHA-256\x00\x00\x00") }}
	_, err := Authenticate(sc, MethodSCRAMSHA256, "alice", cred)
	wantCode(t, err, CodeProtocolViolation)
}

func TestUnknownMethod(t *testing.T) {
	_, err := Authenticate(&scriptConn{}, "cert", "alice", nil)
	wantCode(t, err, CodeInvalidAuthorizationSpecification)
}

func TestSASLPrep(t *testing.T) {
	if saslPrep("abc def") != "abc def" {
		t.Fatal("ascii changed")
	}
	for in, want := range map[string]string{
		"a\u00a0b\u2168": "a bIX",         // C.1.2 space -> ' ', NFKC
		"a\u00adb":       "ab",            // B.1 mapped to nothing
		"\u00e9\u0007":   "\u00e9\u0007",  // prohibited control: raw
		"\u05d0a\u05d0":  "\u05d0a\u05d0", // RandAL with L: raw
		"\u05d0\u05d1":   "\u05d0\u05d1",
		"I\u2168":        "IIX",
		"\xff\xfe":       "\xff\xfe", // invalid UTF-8: raw
	} {
		if got := saslPrep(in); got != want {
			t.Errorf("saslPrep(%q) = %q, want %q", in, got, want)
		}
	}
}
