package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// A client's defaults are its startup values: RESET, SET … TO DEFAULT, RESET
// ALL and DISCARD ALL return to them, inside a transaction too, and a
// rolled-back or failed reset changes nothing. Each script runs on a direct
// connection and through lockpool (simple and extended protocol) with the
// same startup parameters, and every statement's command tag or SQLSTATE,
// the settings after it and the ParameterStatus values the client holds
// must agree. After each script a fresh client on the same server
// connection (budget 1) must see a fresh session's values.

// sdStartup are the startup parameters of the scripts' client.
var sdStartup = map[string]string{"application_name": "sd-1", "search_path": "sd_a, public", "DateStyle": "SQL, DMY"}

// sdObserve reads the settings the scripts change, in the client's session.
const sdObserve = "SELECT current_setting('application_name'), current_setting('search_path'), current_setting('DateStyle'), " +
	"current_setting('work_mem'), current_setting('TimeZone'), current_setting('statement_timeout')"

var sdScripts = [][]string{
	{"BEGIN", "SET application_name = 'x'", "RESET application_name", "SET search_path TO DEFAULT", "SET LOCAL DateStyle TO DEFAULT", "COMMIT"},
	{"SET work_mem = '8MB'", "SET TimeZone = 'Asia/Kolkata'", "BEGIN", "RESET ALL", "ROLLBACK"},
	{"SET work_mem = '8MB'", "SET DateStyle = 'ISO, YMD'", "BEGIN", "DISCARD ALL", "ROLLBACK"},
	{"SET application_name = 'y'", "BEGIN", "RESET ALL", "SAVEPOINT s", "SET TimeZone = 'UTC'", "SET application_name = 'w'", "ROLLBACK TO SAVEPOINT s", "COMMIT"},
	{"SET application_name = 'z'", "SET statement_timeout = '77s'", "DISCARD ALL"},
	{"SET TIME ZONE 'Asia/Kolkata'", "RESET TIME ZONE", "SET TIME ZONE 'Asia/Kolkata'", "SET TIME ZONE LOCAL", "SET search_path = pg_catalog", "SET SESSION search_path = DEFAULT"},
	{"BEGIN", "SELECT 1/0", "RESET ALL", "ROLLBACK", "SET application_name = 'v'", "BEGIN", "RESET ALL", "SELECT 1/0", "ROLLBACK"},
	{"SET DateStyle = 'German'", "BEGIN", "SET LOCAL application_name = 'tx'", "RESET DateStyle", "COMMIT", "RESET ALL"},
}

// sdStep is what a client saw for one statement of a script.
type sdStep struct {
	result   string // command tag or SQLSTATE
	settings string // sdObserve's row, or its SQLSTATE
	reported string // application_name and DateStyle as the client was last told
}

func sdRun(ctx context.Context, c *pgx.Conn, script []string, mode pgx.QueryExecMode) []sdStep {
	var steps []sdStep
	for _, q := range script {
		var st sdStep
		tag, err := c.Exec(ctx, q, mode)
		if err != nil {
			st.result = "ERROR " + sqlState(err)
		} else {
			st.result = tag.String()
		}
		var row [6]string
		if err := c.QueryRow(ctx, sdObserve, pgx.QueryExecModeSimpleProtocol).Scan(&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]); err != nil {
			st.settings = "ERROR " + sqlState(err)
		} else {
			st.settings = strings.Join(row[:], " | ")
		}
		st.reported = c.PgConn().ParameterStatus("application_name") + " | " + c.PgConn().ParameterStatus("DateStyle")
		steps = append(steps, st)
	}
	return steps
}

func TestStateResetToStartupValues(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "stdefaults", 1, 0, "20s"
	l := startLockpool(t, 10, "", app)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	directDSN := pgtest.Require(t).DSN("app", appPassword, "appdb")
	withStartup := func(cfg *pgx.ConnConfig) {
		for k, v := range sdStartup {
			cfg.RuntimeParams[k] = v
		}
	}
	connectDirect := func(edit func(*pgx.ConnConfig)) *pgx.Conn {
		cfg, err := pgx.ParseConfig(directDSN)
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(cfg)
		}
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	fresh := func(c *pgx.Conn) string {
		var row [6]string
		if err := c.QueryRow(ctx, sdObserve).Scan(&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]); err != nil {
			t.Fatalf("fresh client: %v", err)
		}
		return strings.Join(row[:], " | ")
	}
	dc := connectDirect(nil)
	wantFresh := fresh(dc)
	_ = dc.Close(ctx)

	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{{"simple", pgx.QueryExecModeSimpleProtocol}, {"extended", pgx.QueryExecModeExec}, {"describe", pgx.QueryExecModeDescribeExec}}
	for i, script := range sdScripts {
		for _, m := range modes {
			name := fmt.Sprintf("script %d %s", i, m.name)
			d := connectDirect(withStartup)
			want := sdRun(ctx, d, script, m.mode)
			_ = d.Close(ctx)
			c := l.connectCfg(t, "app", "appdb", withStartup)
			got := sdRun(ctx, c, script, m.mode)
			_ = c.Close(ctx)
			for j := range want {
				if got[j] != want[j] {
					t.Errorf("%s, after %q (statements %q):\n  direct:   %+v\n  lockpool: %+v", name, script[j], script[:j+1], want[j], got[j])
				}
			}
			// The next client gets the same server connection (budget 1).
			o := l.connect(t, "app", "appdb")
			if f := fresh(o); f != wantFresh {
				t.Errorf("%s: a fresh client then sees %q, want %q", name, f, wantFresh)
			}
			_ = o.Close(ctx)
		}
	}
}
