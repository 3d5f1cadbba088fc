package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// AdminUser is the admin console user [ConsoleYAML] configures, with
// password [Password]. It needs no PostgreSQL role: the console never
// reaches PostgreSQL as that user.
const AdminUser = "lpadmin"

// ConsoleYAML is [AppsYAML] with [AdminUser] added to users and listed in
// admin_users.
func ConsoleYAML(c *pgtest.Cluster, serverMax int, top string, apps ...App) string {
	return WithConsole(AppsYAML(c, serverMax, top, apps...))
}

// WithConsole adds [AdminUser] to the users of a configuration [AppsYAML]
// (or [HostsYAML]) wrote, and lists it in admin_users, which top must not
// set.
func WithConsole(yaml string) string {
	y := "admin_users: " + AdminUser + "\n" + yaml
	return strings.Replace(y, "\nusers:\n", fmt.Sprintf("\nusers:\n  - name: %s\n    password: %s\n", AdminUser, Password), 1)
}

// StartConsole runs lockpool in-process with the configuration
// [ConsoleYAML] writes.
func StartConsole(t *testing.T, serverMax int, top string, apps ...App) *Lockpool {
	t.Helper()
	yaml := ConsoleYAML(pgtest.Require(t), serverMax, top, apps...)
	cfg, err := config.Parse([]byte(yaml), "test.yaml", nil)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return StartConfig(t, cfg)
}

// ConsoleConnect opens a pgx connection to the admin console (database
// lockpool) as user, in the simple query protocol; closed when t ends.
func (l *Lockpool) ConsoleConnect(t testing.TB, user string) *pgx.Conn {
	t.Helper()
	return l.ConnectConfig(t, user, "lockpool", func(c *pgx.ConnConfig) {
		c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	})
}

// ConsoleResult is an admin console command's answer: its column names in
// order and its rows by column name.
type ConsoleResult[V any] struct {
	Columns []string
	Rows    []map[string]V
}

// Find returns the first row whose column col is want.
func (r ConsoleResult[V]) Find(col string, want V) (map[string]V, bool) {
	for _, row := range r.Rows {
		if any(row[col]) == any(want) {
			return row, true
		}
	}
	return nil, false
}

// ConsoleQuery runs cmd on an admin console connection; the values are as
// pgx decodes them (int64, float64, bool, string, time.Time, nil for NULL).
func ConsoleQuery(ctx context.Context, c *pgx.Conn, cmd string) (ConsoleResult[any], error) {
	var res ConsoleResult[any]
	rows, err := c.Query(ctx, cmd)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	for _, f := range rows.FieldDescriptions() {
		res.Columns = append(res.Columns, f.Name)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return res, err
		}
		row := make(map[string]any, len(vals))
		for i, v := range vals {
			row[res.Columns[i]] = v
		}
		res.Rows = append(res.Rows, row)
	}
	return res, rows.Err()
}

// PsqlConsole runs cmd with psql -c on the admin console as user and
// returns the printed table (unaligned, NULL as ""). err includes psql's
// output.
func (l *Lockpool) PsqlConsole(ctx context.Context, user, cmd string) (ConsoleResult[string], error) {
	var res ConsoleResult[string]
	const sep = "\x1f"
	out, err := l.PsqlCmd(ctx, user, "lockpool", "-A", "-F", sep, "-P", "footer=off", "-c", cmd).CombinedOutput()
	if err != nil {
		return res, fmt.Errorf("psql -c %q: %w\n%s", cmd, err, out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		return res, nil
	}
	res.Columns = strings.Split(lines[0], sep)
	for _, line := range lines[1:] {
		vals := strings.Split(line, sep)
		if len(vals) != len(res.Columns) {
			return res, fmt.Errorf("psql -c %q: row %q has %d fields, header %d", cmd, line, len(vals), len(res.Columns))
		}
		row := make(map[string]string, len(vals))
		for i, v := range vals {
			row[res.Columns[i]] = v
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}
