package integration

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestListenBeforeReadyForQuery: a notification committed before a
// listening client's statement reaches the client before that statement's
// ReadyForQuery, in the simple and the extended protocol, as on
// PostgreSQL (a sending backend signals the listening backends before its
// COMMIT returns, and a listening backend reads the queue before each
// ReadyForQuery outside a transaction block). Drivers rely on it: pgx's
// WaitForNotification returns what a query already read. Each round, the
// sender's NOTIFY has returned before the listener's statement is sent;
// the listener then must have the notification when its statement's
// result is in.
func TestListenBeforeReadyForQuery(t *testing.T) {
	t.Parallel()
	cluster := ensureListenRoleDB(t, listenDiffRole, listenDiffDB)
	l := startListenLockpool(t, listenDiffRole, listenDiffDB)
	targets := []struct{ name, dsn string }{
		{"direct", cluster.DSN(listenDiffRole, appPassword, listenDiffDB)},
		{"lockpool", l.dsn(listenDiffRole, listenDiffDB)},
	}
	const rounds = 100
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := listenCtx(t, time.Minute)
			channel := uniqueName(t, "rfq")
			cfg, err := pgconn.ParseConfig(tg.dsn)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var got []string
			cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
				mu.Lock()
				got = append(got, n.Payload)
				mu.Unlock()
			}
			listener, err := pgconn.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer listener.Close(ctx)
			sender, err := pgconn.Connect(ctx, tg.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer sender.Close(ctx)
			if _, err := listener.Exec(ctx, "LISTEN "+channel).ReadAll(); err != nil {
				t.Fatal(err)
			}
			var seen []string
			for i := range rounds {
				payload := fmt.Sprint(i)
				if _, err := sender.Exec(ctx, fmt.Sprintf("NOTIFY %s, '%s'", channel, payload)).ReadAll(); err != nil {
					t.Fatal(err)
				}
				protocol := "simple"
				if i%2 == 0 {
					if _, err := listener.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
						t.Fatal(err)
					}
				} else {
					protocol = "extended"
					if r := listener.ExecParams(ctx, "SELECT $1::int", [][]byte{[]byte("1")}, nil, nil, nil).Read(); r.Err != nil {
						t.Fatal(r.Err)
					}
				}
				mu.Lock()
				have := slices.Contains(got, payload)
				mu.Unlock()
				if !have {
					seen = append(seen, fmt.Sprintf("round %d (%s): notification %q not there at ReadyForQuery", i, protocol, payload))
				}
			}
			if len(seen) > 0 {
				t.Errorf("%s: %d of %d rounds:\n%v", tg.name, len(seen), rounds, seen)
			}
		})
	}
}
