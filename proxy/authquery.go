package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/auth"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
)

// authLookup finds verifiers of users not listed under users through
// auth_query, and keeps them for cache_ttl (a miss too, so unknown names
// cannot make lockpool hammer PostgreSQL).
type authLookup struct {
	mu    sync.Mutex
	conn  *pgconn.PgConn
	cache map[string]authEntry
}

type authEntry struct {
	cred    *auth.Credential // nil: no such user
	expires time.Time
}

// lookup returns the credential of user from auth_query, or nil when the
// user does not exist or has no SCRAM verifier.
func (a *authLookup) lookup(ctx context.Context, cfg *config.Config, mon *hosts.Monitor, user string) (*auth.Credential, error) {
	aq := cfg.AuthQuery
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.cache[user]; ok && time.Now().Before(e.expires) {
		return e.cred, nil
	}
	if a.conn == nil || a.conn.IsClosed() {
		pc, err := pgconn.ParseConfig(serverTLSConnString(cfg))
		if err != nil {
			return nil, err
		}
		pc.Host = cfg.Server.Host
		pc.Port = uint16(cfg.Server.Port)
		pc.User = aq.User
		pc.Password = aq.Password
		pc.Database = aq.Database
		pc.ConnectTimeout = cfg.Server.ConnectTimeout
		pc.RuntimeParams = map[string]string{"application_name": "lockpool-auth"}
		routeOwn(pc, mon, cfg.Server)
		c, err := pgconn.ConnectConfig(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("auth_query login: %w", err)
		}
		a.conn = c
	}
	res := a.conn.ExecParams(ctx, aq.Query, [][]byte{[]byte(user)}, nil, nil, nil).Read()
	if res.Err != nil {
		var pge *pgconn.PgError
		if !errors.As(res.Err, &pge) {
			_ = a.conn.Close(context.Background())
			a.conn = nil
		}
		return nil, fmt.Errorf("auth_query: %w", res.Err)
	}
	var cred *auth.Credential
	if len(res.Rows) > 0 && len(res.Rows[0]) >= 2 && res.Rows[0][1] != nil {
		c, err := auth.NewCredential(user, string(res.Rows[0][1]))
		if err == nil {
			if _, plain := c.Plaintext(); !plain {
				cred = c
			}
		}
	}
	if a.cache == nil {
		a.cache = make(map[string]authEntry)
	}
	a.cache[user] = authEntry{cred: cred, expires: time.Now().Add(aq.CacheTTL)}
	return cred, nil
}

// reset closes the lookup connection and forgets every cached answer: the
// auth_query section changed.
func (a *authLookup) reset() {
	a.close()
	a.mu.Lock()
	a.cache = nil
	a.mu.Unlock()
}

func (a *authLookup) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close(context.Background())
		a.conn = nil
	}
}
