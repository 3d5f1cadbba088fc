package integration

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/testenv"
)

// endlessRows is a COPY source that never ends: row i is row(i). A COPY
// fed from it returns only when the server's error reaches the client
// while it is still sending, as PostgreSQL sends it.
type endlessRows struct {
	row  func(i int) string
	i    int
	pace time.Duration
	ctx  context.Context
}

func (e *endlessRows) Read(p []byte) (int, error) {
	if err := e.ctx.Err(); err != nil {
		return 0, err
	}
	if e.pace > 0 {
		time.Sleep(e.pace) // pacing: a client producing rows as it goes
	}
	s := e.row(e.i)
	e.i++
	if len(s) > len(p) {
		s = s[:len(p)]
	}
	return copy(p, s), nil
}

// copyOutcome is what a client saw of one COPY case: the error's code,
// the rows it received (COPY TO), the notices, the rows in the table
// afterwards, and the answer to a statement after it.
type copyOutcome struct {
	code    string
	out     string
	notices int
	rows    int64
	after   string
}

// TestCopyFailuresAsDirect runs COPY cases that the server fails (a bad
// row midway, a constraint, a syntax error in the statement, a failing
// query under COPY TO) and one that makes the server send a notice per
// row, directly and through lockpool, and compares what the client saw.
// The failing COPY FROM cases feed an endless source: they return only if
// the error reaches the client while it is still sending data.
func TestCopyFailuresAsDirect(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "")
	ctx := testenv.Context(t, 2*time.Minute)
	su := superConn(t, "appdb")
	table := uniqueName(t, "cpf")
	if _, err := su.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (n int NOT NULL CHECK (n >= 0), t text);
		GRANT ALL ON %[1]s TO PUBLIC;
		CREATE FUNCTION %[1]s_notice() RETURNS trigger LANGUAGE plpgsql AS
		  $$BEGIN IF NEW.t LIKE 'loud%%' THEN RAISE NOTICE 'row %%: %%', NEW.n, repeat('z', 8000); END IF; RETURN NEW; END$$;
		CREATE TRIGGER %[1]s_notice BEFORE INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_notice()`, table)); err != nil {
		t.Fatal(err)
	}
	good := func(i int) string { return fmt.Sprintf("%d\tx\n", i) }
	cases := []struct {
		name     string
		temp     bool // in a temporary table: the session is pinned
		sql      string
		src      func(ctx context.Context) io.Reader
		copyTo   bool
		wantCode string
	}{
		{name: "bad row midway", sql: "COPY %s (n, t) FROM STDIN",
			src: func(ctx context.Context) io.Reader {
				return &endlessRows{ctx: ctx, pace: time.Millisecond, row: func(i int) string {
					if i == 50 {
						return "fifty\tx\n"
					}
					return good(i)
				}}
			}, wantCode: "22P02"},
		{name: "constraint midway", sql: "COPY %s (n, t) FROM STDIN",
			src: func(ctx context.Context) io.Reader {
				return &endlessRows{ctx: ctx, pace: time.Millisecond, row: func(i int) string {
					if i == 30 {
						return "-1\tx\n"
					}
					return good(i)
				}}
			}, wantCode: "23514"},
		{name: "bad row midway, pinned", temp: true, sql: "COPY %s (n, t) FROM STDIN",
			src: func(ctx context.Context) io.Reader {
				return &endlessRows{ctx: ctx, pace: time.Millisecond, row: func(i int) string {
					if i == 20 {
						return "\\N\tx\n"
					}
					return good(i)
				}}
			}, wantCode: "23502"},
		{name: "syntax error in the statement", sql: "COPPY %s FROM STDIN",
			src: func(context.Context) io.Reader {
				return strings.NewReader(strings.Repeat("1\tx\n", 20000))
			}, wantCode: "42601"},
		{name: "syntax error in the statement, pinned", temp: true, sql: "COPPY %s FROM STDIN",
			src: func(context.Context) io.Reader {
				return strings.NewReader(strings.Repeat("1\tx\n", 20000))
			}, wantCode: "42601"},
		{name: "a notice per row", sql: "COPY %s (n, t) FROM STDIN",
			src: func(context.Context) io.Reader {
				var b strings.Builder
				pad := strings.Repeat("x", 10000) // the server reads slower than it is sent to
				for i := 0; i < 2000; i++ {
					fmt.Fprintf(&b, "%d\tloud%s\n", i, pad)
				}
				return strings.NewReader(b.String())
			}},
		{name: "failing query under COPY TO", copyTo: true,
			sql: "COPY (SELECT 10 / (5 - i) FROM generate_series(1, 10) i) TO STDOUT", wantCode: "22012"},
	}
	run := func(t *testing.T, dsn string, tc int) copyOutcome {
		c := cases[tc]
		var o copyOutcome
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) { o.notices++ }
		pc, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close(context.Background())
		target := table
		if c.temp {
			target = "pg_temp.copy_target"
			if _, err := pc.Exec(ctx, "CREATE TEMPORARY TABLE "+target+" (n int NOT NULL, t text)").ReadAll(); err != nil {
				t.Fatal(err)
			}
		} else if _, err := pc.Exec(ctx, "TRUNCATE "+table).ReadAll(); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if c.copyTo {
			var out strings.Builder
			_, err = pc.CopyTo(cctx, &out, c.sql)
			o.out = out.String()
		} else {
			_, err = pc.CopyFrom(cctx, c.src(cctx), fmt.Sprintf(c.sql, target))
		}
		if cctx.Err() != nil {
			t.Fatalf("the COPY returned only when the client gave up: %v", err)
		}
		if pe := pgErrOf(err); pe != nil {
			o.code = pe.Code
		} else if err != nil {
			t.Fatalf("COPY: %v", err)
		}
		res, err := pc.Exec(ctx, "SELECT count(*) FROM "+target).ReadAll()
		if err != nil {
			t.Fatalf("after the COPY: %v", err)
		}
		fmt.Sscan(string(res[0].Rows[0][0]), &o.rows)
		res, err = pc.Exec(ctx, "SELECT 'still here'").ReadAll()
		if err != nil {
			t.Fatalf("after the COPY: %v", err)
		}
		o.after = string(res[0].Rows[0][0])
		return o
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			direct := run(t, directDSN(t, "app", "appdb"), i)
			through := run(t, l.dsn("app", "appdb"), i)
			if direct.code != c.wantCode {
				t.Fatalf("direct: code %q, want %q (the case tests nothing)", direct.code, c.wantCode)
			}
			if through != direct {
				t.Errorf("through lockpool %+v, directly %+v", through, direct)
			}
		})
	}
}
