package integration

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Two clients with different startup TimeZone,
// DateStyle, application_name and search_path sharing one server connection
// each see only their own values over 1,000 interleaved transactions.
func TestSessionParamsSharedServerConn(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.user, app.max, app.pinned = "params", "params", 1, 0
	l := startLockpool(t, 10, "", app)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	super := superConn(t, "appdb")
	schemaA, schemaB := uniqueName(t, "sa"), uniqueName(t, "sb")
	if _, err := super.Exec(ctx, fmt.Sprintf(`
CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.whoami (v text); INSERT INTO %[1]s.whoami VALUES ('A');
CREATE SCHEMA %[2]s; CREATE TABLE %[2]s.whoami (v text); INSERT INTO %[2]s.whoami VALUES ('B');
GRANT USAGE ON SCHEMA %[1]s, %[2]s TO params; GRANT SELECT ON %[1]s.whoami, %[2]s.whoami TO params`, schemaA, schemaB)); err != nil {
		t.Fatal(err)
	}

	type client struct {
		name                       string
		tz, datestyle, appname, sp string
		nowRe                      *regexp.Regexp
		whoami                     string
		c                          *pgx.Conn
	}
	clients := []*client{
		{name: "A", tz: "UTC", datestyle: "ISO, MDY", appname: "alpha-client", sp: schemaA,
			nowRe: regexp.MustCompile(`^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?\+00$`), whoami: "A"},
		{name: "B", tz: "Asia/Tokyo", datestyle: "SQL, DMY", appname: "beta-client", sp: schemaB,
			nowRe: regexp.MustCompile(`^\d{2}/\d{2}/\d{4} \d{2}:\d{2}:\d{2}(\.\d+)? JST$`), whoami: "B"},
	}
	for _, cl := range clients {
		cl.c = l.connectCfg(t, "params", "appdb", func(cfg *pgx.ConnConfig) {
			cfg.RuntimeParams["TimeZone"] = cl.tz
			cfg.RuntimeParams["DateStyle"] = cl.datestyle
			cfg.RuntimeParams["application_name"] = cl.appname
			cfg.RuntimeParams["search_path"] = cl.sp
		})
		// What the client was told at startup.
		for k, want := range map[string]string{"TimeZone": cl.tz, "DateStyle": cl.datestyle, "application_name": cl.appname} {
			if got := cl.c.PgConn().ParameterStatus(k); got != want {
				t.Errorf("client %s: ParameterStatus %s = %q at startup, want %q", cl.name, k, got, want)
			}
		}
	}

	var pids [2]uint32
	shows := []struct {
		name string
		want func(*client) string
	}{
		{"TimeZone", func(c *client) string { return c.tz }},
		{"DateStyle", func(c *client) string { return c.datestyle }},
		{"application_name", func(c *client) string { return c.appname }},
		{"search_path", func(c *client) string { return c.sp }},
	}
	for i := 0; i < 1000; i++ {
		for k, cl := range clients {
			tx, err := cl.c.Begin(ctx)
			if err != nil {
				t.Fatalf("tx %d client %s: begin: %v", i, cl.name, err)
			}
			var tz, ds, an, sp, now, who string
			var pid uint32
			if err := tx.QueryRow(ctx, `SELECT current_setting('TimeZone'), current_setting('DateStyle'),
  current_setting('application_name'), current_setting('search_path'), now()::text, whoami.v, pg_backend_pid()
  FROM whoami`).Scan(&tz, &ds, &an, &sp, &now, &who, &pid); err != nil {
				t.Fatalf("tx %d client %s: %v", i, cl.name, err)
			}
			if tz != cl.tz || ds != cl.datestyle || an != cl.appname || sp != cl.sp || who != cl.whoami {
				t.Fatalf("tx %d client %s sees TimeZone=%q DateStyle=%q application_name=%q search_path=%q whoami=%q; want %q %q %q %q %q",
					i, cl.name, tz, ds, an, sp, who, cl.tz, cl.datestyle, cl.appname, cl.sp, cl.whoami)
			}
			if !cl.nowRe.MatchString(now) {
				t.Fatalf("tx %d client %s: now()::text = %q does not match %s", i, cl.name, now, cl.nowRe)
			}
			// SHOW (a different one each time), in the same transaction.
			s := shows[(i+k)%len(shows)]
			var v string
			if err := tx.QueryRow(ctx, "SHOW "+s.name).Scan(&v); err != nil || v != s.want(cl) {
				t.Fatalf("tx %d client %s: SHOW %s = %q (%v), want %q", i, cl.name, s.name, v, err, s.want(cl))
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("tx %d client %s: commit: %v", i, cl.name, err)
			}
			if i == 0 {
				pids[k] = pid
			} else if pid != pids[k] {
				t.Fatalf("tx %d client %s: server pid %d, was %d: not one shared server connection", i, cl.name, pid, pids[k])
			}
		}
	}
	if pids[0] != pids[1] {
		t.Fatalf("clients ran on server pids %d and %d: the test needs them to share one", pids[0], pids[1])
	}
	// pg_stat_activity shows the last client's application_name for the
	// shared backend.
	var an string
	if err := super.QueryRow(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = $1", pids[0]).Scan(&an); err != nil || an != "beta-client" {
		t.Errorf("pg_stat_activity application_name of the shared backend = %q (%v), want beta-client", an, err)
	}
	// A SET inside one client's session stays with that client.
	if _, err := clients[0].c.Exec(ctx, "SET TimeZone = 'Europe/Berlin'"); err != nil {
		t.Fatal(err)
	}
	var tzA, tzB string
	for i := 0; i < 5; i++ {
		if err := clients[1].c.QueryRow(ctx, "SHOW TimeZone").Scan(&tzB); err != nil || tzB != "Asia/Tokyo" {
			t.Fatalf("client B after A's SET: %q, %v", tzB, err)
		}
		if err := clients[0].c.QueryRow(ctx, "SHOW TimeZone").Scan(&tzA); err != nil || tzA != "Europe/Berlin" {
			t.Fatalf("client A after its SET and B's queries: %q, %v", tzA, err)
		}
	}
	// The empty string is a value like any other: lc_monetary has a
	// non-empty default, which '' overrides for B alone.
	var def string
	if err := super.QueryRow(ctx, "SHOW lc_monetary").Scan(&def); err != nil || def == "" {
		t.Fatalf("the server's lc_monetary: %q, %v (the check needs a non-empty default)", def, err)
	}
	if _, err := clients[1].c.Exec(ctx, "SET lc_monetary = ''"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		var lmA, lmB string
		if err := clients[0].c.QueryRow(ctx, "SHOW lc_monetary").Scan(&lmA); err != nil || lmA != def {
			t.Fatalf("client A after B's SET lc_monetary = '': %q, %v; want %q", lmA, err, def)
		}
		if err := clients[1].c.QueryRow(ctx, "SHOW lc_monetary").Scan(&lmB); err != nil || lmB != "" {
			t.Fatalf("client B after its SET lc_monetary = '' and A's queries: %q, %v; want \"\"", lmB, err)
		}
	}
}
