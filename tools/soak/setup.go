package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	soakUser     = "soak"
	soakPassword = "soak-secret"
	soakDB       = "soak"
	soakApp      = "soak"

	appBudget   = 8 // applications[].max_connections
	appPinned   = 3 // applications[].max_pinned
	pgbenchScal = 5
)

// lockpoolConfig is the configuration the soak runs lockpool with. The
// placeholders are lockpool's port, the admin port and PostgreSQL's port.
const lockpoolConfig = `# written by tools/soak
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
auth_method: scram-sha-256
instance_id: soak
leak_check_interval: 5s
server:
  host: 127.0.0.1
  port: %d
  max_connections: 20
users:
  - name: %s
    password: %s
applications:
  - name: %s
    user: %s
    database: %s
    pool_mode: transaction
    max_connections: %d
    max_pinned: %d
    advisory_locks: %s
    session_state: pin
    wait_timeout: 5s
leases:
  max_connections: 2
`

// leaseLogDDL is the table lease holders record their holds in.
const leaseLogDDL = `CREATE TABLE soak_lease_log (
  id        bigserial PRIMARY KEY,
  name      text        NOT NULL,
  token     bigint      NOT NULL,
  client    int         NOT NULL,
  entered   timestamptz NOT NULL,  -- written under lease_fence right after lease_acquire returned the token
  last_ok   timestamptz NOT NULL,  -- last write made under lease_fence (or entered)
  exited    timestamptz,           -- written right before lease_release
  released  boolean,               -- what that lease_release returned (true proves the hold lasted to exited)
  killed_at timestamptz,           -- set by the killer just before it closed the holder's socket, if lockpool.leases
                                   -- showed the lease still held by this token at that moment
  lost      boolean     NOT NULL DEFAULT false  -- LP001 from a fence, or lease_release = false
)`

// env is what setup built: the stack (PostgreSQL and the lockpool
// process) and the work directory.
type env struct {
	*testenv.Stack
	work string
}

func setup(ctx context.Context, o *options) (*env, error) {
	t0 := time.Now()
	work, err := os.MkdirTemp("", "lockpool-soak-")
	if err != nil {
		return nil, err
	}
	_ = os.Chmod(work, 0o755)
	e := &env{work: work}
	e.Stack, err = testenv.StartStack(ctx, testenv.StackOptions{
		Dir: work, Binary: o.lockpoolBin,
		User: soakUser, Password: soakPassword, DB: soakDB, PgbenchScale: pgbenchScal,
		Config: func(port, adminPort, pgPort int) string {
			return fmt.Sprintf(lockpoolConfig, port, adminPort, pgPort, soakUser, soakPassword,
				soakApp, soakUser, soakDB, appBudget, appPinned, o.advisory)
		},
		Logf: logf,
	})
	if err != nil {
		return e, err
	}
	// The lease log belongs to the soak role: holders write it through lockpool.
	own, err := pgx.Connect(ctx, e.Cluster.DSN(soakUser, soakPassword, soakDB))
	if err != nil {
		return e, err
	}
	_, err = own.Exec(ctx, leaseLogDDL)
	own.Close(context.Background())
	if err != nil {
		return e, fmt.Errorf("create soak_lease_log: %w", err)
	}
	logf("setup took %v", time.Since(t0).Round(time.Millisecond))
	return e, nil
}

// close stops lockpool and destroys the cluster, if setup got that far.
func (e *env) close() {
	if e.Stack != nil {
		e.Stack.Close()
	}
}
