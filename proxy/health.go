package proxy

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
)

// healthProbe keeps lockpool's own connection for /health/ready and the
// leak sweep: never an application's pool.
type healthProbe struct {
	mu   sync.Mutex
	conn *pgconn.PgConn
}

// adminConn returns the probe connection, dialing it when needed. The
// caller holds h.mu.
func (h *healthProbe) adminConn(ctx context.Context, s *Server) (*pgconn.PgConn, error) {
	if h.conn != nil && !h.conn.IsClosed() {
		return h.conn, nil
	}
	cfg := s.rc.Load().cfg
	if len(cfg.Applications) == 0 {
		return nil, context.Canceled
	}
	user, pw, db := ownLogin(cfg)
	pc, err := pgconn.ParseConfig(serverTLSConnString(cfg))
	if err != nil {
		return nil, err
	}
	pc.Host = cfg.Server.Host
	pc.Port = uint16(cfg.Server.Port)
	ownAuth(pc, user, pw, s.scramKeys)
	pc.Database = db
	pc.ConnectTimeout = time.Second
	pc.RuntimeParams = map[string]string{"application_name": "lockpool-admin"}
	routeOwn(pc, s.hosts, cfg.Server)
	c, err := pgconn.ConnectConfig(ctx, pc)
	if ctx.Err() == nil {
		s.pool.ServerReached("lockpool", err)
	}
	if err != nil {
		return nil, err
	}
	h.conn = c
	return c, nil
}

func (h *healthProbe) check(ctx context.Context, s *Server) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, err := h.adminConn(ctx, s)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, "SELECT 1").ReadAll()
	if err != nil {
		_ = c.Close(context.Background())
		h.conn = nil
	}
	return err
}

// query runs sql on the admin connection and returns its text rows.
func (h *healthProbe) query(ctx context.Context, s *Server, sql string) ([][]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, err := h.adminConn(ctx, s)
	if err != nil {
		return nil, err
	}
	res := c.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		if c.IsClosed() {
			h.conn = nil
		}
		return nil, res.Err
	}
	out := make([][]string, 0, len(res.Rows))
	for _, r := range res.Rows {
		row := make([]string, len(r))
		for i, v := range r {
			row[i] = string(v)
		}
		out = append(out, row)
	}
	return out, nil
}

func (h *healthProbe) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		_ = h.conn.Close(context.Background())
		h.conn = nil
	}
}

// serverTLSConnString is the sslmode part of a connection string for
// lockpool's own connections (health probe, leases), from server.tls.
func serverTLSConnString(cfg *config.Config) string {
	mode := cfg.Server.TLS
	switch mode {
	case "prefer", "require", "verify-full":
	default:
		mode = "disable"
	}
	cs := "sslmode=" + mode
	if cfg.Server.CAFile != "" {
		cs += " sslrootcert='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(cfg.Server.CAFile) + "'"
	}
	return cs
}
