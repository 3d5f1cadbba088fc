package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestListenSenderPIDWithoutEarlierListeners: a notification carries the
// pid its sender's driver was given, also when nobody listened in the
// database while the sender's transaction sent it and the first LISTEN
// came before its COMMIT: another client's LISTEN, or the sender's own
// LISTEN later in the same transaction. Each case runs directly and
// through a lockpool of its own (whose listener connection has never
// listened), in the simple and the extended protocol.
func TestListenSenderPIDWithoutEarlierListeners(t *testing.T) {
	t.Parallel()
	cluster := ensureListenRoleDB(t, listenDiffRole, listenDiffDB)
	if listenMode(t) != "shared" {
		t.Skip("listen: shared only")
	}
	notify := map[string]func(ctx context.Context, c *pgx.Conn, channel string) error{
		"simple": func(ctx context.Context, c *pgx.Conn, channel string) error {
			_, err := c.Exec(ctx, "NOTIFY "+channel+", 'sent'", pgx.QueryExecModeSimpleProtocol)
			return err
		},
		"extended": func(ctx context.Context, c *pgx.Conn, channel string) error {
			_, err := c.Exec(ctx, "SELECT pg_notify($1, $2)", pgx.QueryExecModeExec, channel, "sent")
			return err
		},
	}
	cases := []struct {
		name string
		run  func(t *testing.T, ctx context.Context, dsn string, send func(context.Context, *pgx.Conn, string) error)
	}{
		{"another client listens before the commit", func(t *testing.T, ctx context.Context, dsn string, send func(context.Context, *pgx.Conn, string) error) {
			channel := uniqueName(t, "first")
			sender, listener := mustConnect(ctx, t, dsn), mustConnect(ctx, t, dsn)
			execListen(ctx, t, sender, "BEGIN")
			if err := send(ctx, sender, channel); err != nil {
				t.Fatal(err)
			}
			execListen(ctx, t, listener, "LISTEN "+channel)
			execListen(ctx, t, sender, "COMMIT")
			checkNotification(ctx, t, listener, channel, sender.PgConn().PID())
		}},
		{"the sender listens later in its transaction", func(t *testing.T, ctx context.Context, dsn string, send func(context.Context, *pgx.Conn, string) error) {
			channel := uniqueName(t, "own")
			sender := mustConnect(ctx, t, dsn)
			execListen(ctx, t, sender, "BEGIN")
			if err := send(ctx, sender, channel); err != nil {
				t.Fatal(err)
			}
			execListen(ctx, t, sender, "LISTEN "+channel)
			execListen(ctx, t, sender, "COMMIT")
			checkNotification(ctx, t, sender, channel, sender.PgConn().PID())
		}},
	}
	for _, c := range cases {
		for protocol, send := range notify {
			t.Run(c.name+"/"+protocol, func(t *testing.T) {
				t.Parallel()
				ctx := listenCtx(t, time.Minute)
				t.Run("direct", func(t *testing.T) {
					c.run(t, ctx, cluster.DSN(listenDiffRole, appPassword, listenDiffDB), send)
				})
				t.Run("lockpool", func(t *testing.T) {
					l := startListenLockpool(t, listenDiffRole, listenDiffDB)
					c.run(t, ctx, l.dsn(listenDiffRole, listenDiffDB), send)
				})
			})
		}
	}
}

// checkNotification waits (up to 5 s) for one notification on c and fails
// t unless it is on channel and carries pid.
func checkNotification(ctx context.Context, t *testing.T, c *pgx.Conn, channel string, pid uint32) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := c.WaitForNotification(wctx)
	if err != nil {
		t.Fatalf("no notification on %s within 5 s: %v", channel, err)
	}
	if n.Channel != channel || n.Payload != "sent" || n.PID != pid {
		t.Fatalf("got channel %s payload %q pid %d; want channel %s payload \"sent\" pid %d (the sender's PID())",
			n.Channel, n.Payload, n.PID, channel, pid)
	}
}

// execListen runs sql on c in the simple protocol and fails t on an error.
func execListen(ctx context.Context, t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	if _, err := c.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
