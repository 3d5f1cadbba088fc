package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/evloop"
)

// pgDial logs in to the server with pgconn and hijacks the socket.
func pgDial(ctx context.Context, srv config.Server, app AppConfig, database string) (*Conn, error) {
	if app.Password == "" && app.SCRAM != nil {
		if keys, ok := app.SCRAM(); ok {
			return scramDial(ctx, srv, app, database, keys)
		}
	}
	// ParseConfig is mandatory for ConnectConfig; everything that matters is
	// set explicitly afterwards so PG* environment variables and
	// ~/.pgpass cannot change what the pool does.
	connStr := "host=" + quoteConnValue(srv.Host) +
		" port=" + strconv.Itoa(srv.Port) +
		" user=" + quoteConnValue(app.User) +
		" dbname=" + quoteConnValue(database) +
		" sslmode=" + serverSSLMode(srv)
	if srv.CAFile != "" {
		connStr += " sslrootcert=" + quoteConnValue(srv.CAFile)
	}
	cfg, err := pgconn.ParseConfig(connStr)
	if err != nil {
		return nil, err
	}
	cfg.Password = app.Password
	if srv.TLS == "" || srv.TLS == "disable" {
		cfg.TLSConfig = nil
		cfg.Fallbacks = nil
	}
	// The socket is wrapped below TLS, so that an event loop can adopt it;
	// keepalives and tcp_user_timeout bound a partition (hosts.Dialer).
	dialer := hosts.Dialer(srv.TCPUserTimeout)
	var kill *killSwitch
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		kill.close() // an earlier attempt's (pgconn tries every address)
		kill = newKillSwitch(nc)
		return evloop.Wrap(nc), nil
	}
	cfg.RuntimeParams = map[string]string{}
	cfg.ValidateConnect = nil
	cfg.AfterConnect = nil
	if srv.ConnectTimeout > 0 {
		cfg.ConnectTimeout = srv.ConnectTimeout
	}
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		kill.close()
		return nil, err
	}
	// pgconn may have a background reader running after login (it starts
	// one when a write is slow); SyncConn stops it, or it would swallow the
	// server's first reply to lockpool.
	if err := pc.SyncConn(ctx); err != nil {
		_ = pc.Close(context.Background())
		kill.close()
		return nil, err
	}
	hj, err := pc.Hijack()
	if err != nil {
		_ = pc.Close(context.Background())
		kill.close()
		return nil, err
	}
	return &Conn{
		Net:           hj.Conn,
		PID:           hj.PID,
		SecretKey:     hj.SecretKey,
		StartupParams: hj.ParameterStatuses,
		kill:          kill,
	}, nil
}

// serverSSLMode maps server.tls to a libpq sslmode.
func serverSSLMode(srv config.Server) string {
	switch srv.TLS {
	case "prefer", "require", "verify-full":
		return srv.TLS
	}
	return "disable"
}

// quoteConnValue quotes a keyword/value connection string value.
func quoteConnValue(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// serverNetwork returns the network and address to reach srv.
func serverNetwork(srv config.Server) (network, addr string) {
	if strings.HasPrefix(srv.Host, "/") {
		return "unix", srv.Host + "/.s.PGSQL." + strconv.Itoa(srv.Port)
	}
	return "tcp", net.JoinHostPort(srv.Host, strconv.Itoa(srv.Port))
}

const cancelRequestCode = 80877102

// Cancel sends a CancelRequest for c's backend to the server c was dialed
// to, over a new short connection, and waits (bounded by ctx and
// connect_timeout) for the server to close it, like libpq.
func (m *Manager) Cancel(ctx context.Context, c *Conn) error {
	if len(c.SecretKey) == 0 {
		return errors.New("pool: cancel: connection has no cancel key")
	}
	srv := c.srv
	if srv.Host == "" && srv.Port == 0 {
		m.mu.Lock()
		srv = m.server
		m.mu.Unlock()
	}
	timeout := srv.ConnectTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	network, addr := serverNetwork(srv)
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("pool: cancel: %w", err)
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	msg := make([]byte, 12+len(c.SecretKey))
	binary.BigEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.BigEndian.PutUint32(msg[4:8], cancelRequestCode)
	binary.BigEndian.PutUint32(msg[8:12], c.PID)
	copy(msg[12:], c.SecretKey)
	if _, err := nc.Write(msg); err != nil {
		return fmt.Errorf("pool: cancel: %w", err)
	}
	// The server answers nothing and closes the connection once it has
	// processed the request.
	_, _ = io.Copy(io.Discard, nc)
	return nil
}
