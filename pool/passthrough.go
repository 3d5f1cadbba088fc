package pool

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/evloop"
)

// SCRAMKeys is the proof material of a SCRAM-SHA-256 secret: with it the
// pool logs in to the server as the user without knowing the password
// (SCRAM pass-through). ClientKey comes from a client's successful login
// against the same verifier the server stores; ServerKey verifies the
// server.
type SCRAMKeys struct {
	ClientKey, ServerKey []byte
}

// scramDial logs in to the server with SCRAM keys instead of a password.
func scramDial(ctx context.Context, srv config.Server, app AppConfig, database string, keys SCRAMKeys) (*Conn, error) {
	if srv.ConnectTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, srv.ConnectTimeout)
		defer cancel()
	}
	network, addr := serverNetwork(srv)
	nc, err := hosts.Dialer(srv.TCPUserTimeout).DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("pool: dial %s: %w", addr, err)
	}
	kill := newKillSwitch(nc)
	// Wrapped below TLS, so that an event loop can adopt the socket.
	nc = evloop.Wrap(nc)
	ok := false
	defer func() {
		if !ok {
			_ = nc.Close()
			kill.close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = nc.SetDeadline(dl)
	}
	if network == "tcp" && srv.TLS != "" && srv.TLS != "disable" {
		if nc, err = startTLS(nc, srv); err != nil {
			return nil, err
		}
	}
	// StartupMessage.
	var buf []byte
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, 3<<16)
	for _, kv := range [][2]string{{"user", app.User}, {"database", database}} {
		buf = append(buf, kv[0]...)
		buf = append(buf, 0)
		buf = append(buf, kv[1]...)
		buf = append(buf, 0)
	}
	buf = append(buf, 0)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)))
	if _, err := nc.Write(buf); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	fe := pgproto3.NewFrontend(br, nc)
	conn := &Conn{Net: nc, StartupParams: map[string]string{}, kill: kill}
	var sc *scramClient
	for {
		msg, err := fe.Receive()
		if err != nil {
			return nil, fmt.Errorf("pool: server login: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.AuthenticationSASL:
			has := false
			for _, mech := range m.AuthMechanisms {
				has = has || mech == "SCRAM-SHA-256"
			}
			if !has {
				return nil, errors.New("pool: server does not offer SCRAM-SHA-256 for pass-through")
			}
			sc = newSCRAMClient(keys)
			fe.Send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: sc.first()})
			if err := fe.Flush(); err != nil {
				return nil, err
			}
		case *pgproto3.AuthenticationSASLContinue:
			if sc == nil {
				return nil, errors.New("pool: unexpected SASLContinue")
			}
			final, err := sc.final(m.Data)
			if err != nil {
				return nil, err
			}
			fe.Send(&pgproto3.SASLResponse{Data: final})
			if err := fe.Flush(); err != nil {
				return nil, err
			}
		case *pgproto3.AuthenticationSASLFinal:
			if sc == nil || !sc.verify(m.Data) {
				return nil, errors.New("pool: the server's SCRAM signature does not match the configured verifier")
			}
		case *pgproto3.AuthenticationOk:
		case *pgproto3.AuthenticationMD5Password, *pgproto3.AuthenticationCleartextPassword:
			return nil, errors.New("pool: the server asks for a password, but only a SCRAM verifier is configured (set password_encryption = scram-sha-256 on the server)")
		case *pgproto3.ParameterStatus:
			conn.StartupParams[m.Name] = m.Value
		case *pgproto3.BackendKeyData:
			conn.PID = m.ProcessID
			conn.SecretKey = append([]byte(nil), m.SecretKey...)
		case *pgproto3.NoticeResponse:
		case *pgproto3.ErrorResponse:
			return nil, pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			_ = nc.SetDeadline(time.Time{})
			if n := br.Buffered(); n > 0 { // the Reader made at registration starts with them
				b, _ := br.Peek(n)
				conn.early = append([]byte(nil), b...)
			}
			ok = true
			return conn, nil
		default:
			return nil, fmt.Errorf("pool: unexpected %T during server login", msg)
		}
	}
}

func startTLS(nc net.Conn, srv config.Server) (net.Conn, error) {
	if _, err := nc.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		return nil, err
	}
	var b [1]byte
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		return nil, err
	}
	if b[0] != 'S' {
		if srv.TLS == "prefer" {
			return nc, nil
		}
		return nil, errors.New("pool: the server refused TLS (server.tls requires it)")
	}
	tc := &tls.Config{ServerName: srv.Host, MinVersion: tls.VersionTLS12}
	switch srv.TLS {
	case "verify-full":
		if srv.CAFile != "" {
			pem, err := os.ReadFile(srv.CAFile)
			if err != nil {
				return nil, fmt.Errorf("pool: ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			tc.RootCAs = pool
		}
	default:
		tc.InsecureSkipVerify = true // prefer/require: encryption without verification, as libpq
	}
	c := tls.Client(nc, tc)
	if err := c.Handshake(); err != nil {
		return nil, fmt.Errorf("pool: tls: %w", err)
	}
	return c, nil
}

// scramClient is the client side of SCRAM-SHA-256 with known keys.
type scramClient struct {
	keys        SCRAMKeys
	nonce       string
	clientFirst string
	authMessage string
}

func newSCRAMClient(keys SCRAMKeys) *scramClient {
	var n [18]byte
	_, _ = rand.Read(n[:])
	return &scramClient{keys: keys, nonce: base64.StdEncoding.EncodeToString(n[:])}
}

func (c *scramClient) first() []byte {
	c.clientFirst = "n=,r=" + c.nonce
	return []byte("n,," + c.clientFirst)
}

func (c *scramClient) final(serverFirst []byte) ([]byte, error) {
	sf := string(serverFirst)
	var r string
	for _, part := range strings.Split(sf, ",") {
		if strings.HasPrefix(part, "r=") {
			r = part[2:]
		}
	}
	if !strings.HasPrefix(r, c.nonce) {
		return nil, errors.New("pool: SCRAM nonce mismatch")
	}
	withoutProof := "c=biws,r=" + r
	c.authMessage = c.clientFirst + "," + sf + "," + withoutProof
	stored := sha256.Sum256(c.keys.ClientKey)
	mac := hmac.New(sha256.New, stored[:])
	mac.Write([]byte(c.authMessage))
	sig := mac.Sum(nil)
	proof := make([]byte, len(sig))
	for i := range sig {
		proof[i] = c.keys.ClientKey[i] ^ sig[i]
	}
	return []byte(withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof)), nil
}

func (c *scramClient) verify(serverFinal []byte) bool {
	s := string(serverFinal)
	if !strings.HasPrefix(s, "v=") {
		return false
	}
	got, err := base64.StdEncoding.DecodeString(s[2:])
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, c.keys.ServerKey)
	mac.Write([]byte(c.authMessage))
	return hmac.Equal(got, mac.Sum(nil))
}
