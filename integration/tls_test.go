package integration

// TLS on both sides.
//   - client side: psql sslmode=verify-full against lockpool's certificate
//     works; pgx sslmode=require works; a plaintext client is refused with a
//     lockpool: message when tls.required is set; a failed handshake closes
//     that client only.
//   - server side: lockpool → PostgreSQL with server.tls verify-full and
//     ca_file works (pg_stat_ssl says so) and refuses a wrong CA. This uses
//     a second cluster of its own with ssl = on, so the shared one is left
//     alone.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// tlsCA is a throwaway certificate authority.
type tlsCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newTLSCA(t testing.TB, name string) *tlsCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &tlsCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a server certificate for localhost and 127.0.0.1.
func (ca *tlsCA) leaf(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + 1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func writeFiles(t testing.TB, dir string, files map[string][]byte) map[string]string {
	t.Helper()
	paths := map[string]string{}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		paths[name] = p
	}
	return paths
}

func TestTLSClientSide(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	const role = "tlsclient"
	testenv.EnsureRole(t, c, role)
	ca := newTLSCA(t, "lockpool test CA")
	crt, key := ca.leaf(t)
	f := writeFiles(t, t.TempDir(), map[string][]byte{"ca.pem": ca.certPEM, "server.crt": crt, "server.key": key})
	top := fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n  required: true", f["server.crt"], f["server.key"])
	l, _ := startYAML(t, testenv.UserYAML(c, top, 10, "", role, appPassword,
		"    database: appdb\n    max_connections: 4\n    max_pinned: 1\n    wait_timeout: 5s"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// pgx, sslmode=require.
	other, err := pgx.Connect(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=appdb sslmode=require", l.port, role, appPassword))
	if err != nil {
		t.Fatalf("pgx sslmode=require: %v", err)
	}
	defer other.Close(ctx)
	var one int
	if err := other.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("pgx over TLS: %v", err)
	}
	// pgx, sslmode=verify-full against the CA, by host name.
	vf, err := pgx.Connect(ctx, fmt.Sprintf("host=localhost port=%d user=%s password=%s dbname=appdb sslmode=verify-full sslrootcert=%s", l.port, role, appPassword, f["ca.pem"]))
	if err != nil {
		t.Errorf("pgx sslmode=verify-full: %v", err)
	} else {
		vf.Close(ctx)
	}

	// psql, sslmode=verify-full.
	if _, err := os.Stat("/usr/bin/psql"); err == nil {
		cmd := exec.CommandContext(ctx, "/usr/bin/psql", "-X", "-At", "-v", "ON_ERROR_STOP=1",
			fmt.Sprintf("host=localhost port=%d user=%s dbname=appdb sslmode=verify-full sslrootcert=%s", l.port, role, f["ca.pem"]),
			"-c", "SELECT 'tls-ok'")
		cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PSQLRC=/dev/null", "PGCONNECT_TIMEOUT=10")
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "tls-ok" {
			t.Errorf("psql sslmode=verify-full: %v\n%s", err, out)
		}
		// A CA that did not sign lockpool's certificate is refused by psql.
		wrong := newTLSCA(t, "some other CA")
		wf := writeFiles(t, t.TempDir(), map[string][]byte{"wrong.pem": wrong.certPEM})
		cmd = exec.CommandContext(ctx, "/usr/bin/psql", "-X", "-At",
			fmt.Sprintf("host=localhost port=%d user=%s dbname=appdb sslmode=verify-full sslrootcert=%s", l.port, role, wf["wrong.pem"]),
			"-c", "SELECT 1")
		cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PSQLRC=/dev/null", "PGCONNECT_TIMEOUT=10")
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("psql verify-full with the wrong CA connected:\n%s", out)
		}
	} else {
		t.Logf("psql not installed: psql part skipped")
	}

	// Plaintext with tls.required: refused clearly.
	_, err = pgx.Connect(ctx, l.dsn(role, "appdb"))
	pe := pgErr(t, err, "28000")
	if !strings.HasPrefix(pe.Message, "lockpool:") || !strings.Contains(pe.Message, "TLS") {
		t.Errorf("plaintext refusal: %q", pe.Message)
	}

	// A failed handshake closes that client only.
	raw, err := net.DialTimeout("tcp", l.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := raw.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		t.Fatal(err)
	}
	ans := make([]byte, 1)
	if _, err := io.ReadFull(raw, ans); err != nil || ans[0] != 'S' {
		t.Fatalf("SSLRequest answer %q, %v", ans, err)
	}
	_, _ = raw.Write([]byte("this is not a TLS ClientHello at all, just bytes\r\n\r\n"))
	if _, err := io.Copy(io.Discard, raw); err != nil {
		t.Errorf("lockpool did not close the client with the bad handshake: %v", err)
	}
	raw.Close()
	if err := other.QueryRow(ctx, "SELECT 2").Scan(&one); err != nil || one != 2 {
		t.Errorf("the other TLS client after a failed handshake: %v", err)
	}
}

// startSSLCluster starts a cluster of its own with ssl = on and a
// certificate for 127.0.0.1 signed by ca.
func startSSLCluster(t *testing.T, ca *tlsCA) *pgtest.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatalf("second cluster: %v", err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	crt, key := ca.leaf(t)
	st, err := os.Stat(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	for name, b := range map[string][]byte{"server.crt": crt, "server.key": key} {
		p := filepath.Join(c.Dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, int(sys.Uid), int(sys.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Exec(ctx, "postgres", "ALTER SYSTEM SET ssl = on"); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateRole(ctx, "tlsserver", appPassword); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTLSServerSide(t *testing.T) {
	t.Parallel()
	pgtest.Require(t)
	ca := newTLSCA(t, "postgres test CA")
	c := startSSLCluster(t, ca)
	wrong := newTLSCA(t, "not the postgres CA")
	f := writeFiles(t, t.TempDir(), map[string][]byte{"ca.pem": ca.certPEM, "wrong.pem": wrong.certPEM})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	app := "    database: postgres\n    max_connections: 2\n    max_pinned: 1\n    wait_timeout: 5s"

	for _, mode := range []string{"verify-full", "require"} {
		srvTLS := fmt.Sprintf("  tls: %s\n  ca_file: %s", mode, f["ca.pem"])
		l, _ := startYAML(t, testenv.UserYAML(c, "", 5, srvTLS, "tlsserver", appPassword, app))
		conn, err := pgx.Connect(ctx, l.dsn("tlsserver", "postgres"))
		if err != nil {
			t.Fatalf("server.tls %s: %v", mode, err)
		}
		var ssl bool
		if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil {
			t.Fatalf("server.tls %s: %v", mode, err)
		}
		if !ssl {
			t.Errorf("server.tls %s: lockpool's server connection does not use TLS", mode)
		}
		conn.Close(ctx)
	}

	// verify-full with a CA that did not sign the server's certificate:
	// lockpool cannot log in, and the client is told so.
	srvTLS := fmt.Sprintf("  tls: verify-full\n  ca_file: %s", f["wrong.pem"])
	l, logs := startYAML(t, testenv.UserYAML(c, "", 5, srvTLS, "tlsserver", appPassword, app))
	_, err := pgx.Connect(ctx, l.dsn("tlsserver", "postgres"))
	if err == nil {
		t.Fatal("server.tls verify-full with the wrong CA: client connected")
	}
	st := sqlState(err)
	if st == "" || !strings.Contains(err.Error(), "lockpool:") {
		t.Errorf("wrong CA: want a lockpool: error with a SQLSTATE, got %v", err)
	}
	t.Logf("wrong CA: %v; log: %s", err, firstLine(logs.String(), "x509"))
	_ = strconv.Itoa
}

// firstLine returns the first line of s containing sub.
func firstLine(s, sub string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			return line
		}
	}
	return ""
}
