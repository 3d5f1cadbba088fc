package pool

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgtest"
)

const (
	pgRole     = "pool_app"
	pgPassword = "s3cret 'pw'"
	pgDB       = "pooldb"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.RunMain(m, func(c *pgtest.Cluster) error {
		ctx := context.Background()
		if err := c.CreateRole(ctx, pgRole, pgPassword); err != nil {
			return err
		}
		return c.CreateDatabase(ctx, pgDB, pgRole)
	}))
}

// query runs sql with the simple protocol on c and returns the first column
// of each row, or the server's error; c must be idle in no transaction
// after it.
func query(t *testing.T, c *Conn, sql string) ([]string, error) {
	t.Helper()
	rows, status, qerr := exchange(t, c, sql)
	if status != 'I' {
		t.Fatalf("transaction status %c", status)
	}
	return rows, qerr
}

// exchange runs sql with the simple protocol on c and returns the first
// column of each row, the transaction status after it and the server's
// error.
func exchange(t *testing.T, c *Conn, sql string) ([]string, byte, error) {
	t.Helper()
	fe := pgproto3.NewFrontend(c.Reader, c.Net)
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var rows []string
	var qerr error
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch msg := msg.(type) {
		case *pgproto3.DataRow:
			rows = append(rows, string(msg.Values[0]))
		case *pgproto3.ErrorResponse:
			qerr = pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.ReadyForQuery:
			return rows, msg.TxStatus, qerr
		}
	}
}

// backendRunning polls pg_stat_activity until backend pid is active
// running sql, for up to d; false if it never was.
func backendRunning(ctx context.Context, pc *pgtest.Cluster, pid uint32, sql string, d time.Duration) (bool, error) {
	su, err := pgconn.Connect(ctx, pc.SuperuserDSN("postgres"))
	if err != nil {
		return false, err
	}
	defer su.Close(context.Background())
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		res := su.ExecParams(ctx, "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query = $2",
			[][]byte{[]byte(strconv.FormatUint(uint64(pid), 10)), []byte(sql)}, nil, nil, nil).Read()
		if res.Err != nil {
			return false, res.Err
		}
		if len(res.Rows) > 0 {
			return true, nil
		}
	}
	return false, nil
}

func TestRealServer(t *testing.T) {
	pc := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clk := newFakeClock()
	server := config.Server{Host: pc.Host, Port: pc.Port, MaxConnections: 5, IdleTimeout: time.Hour, MaxLifetime: time.Hour, ConnectTimeout: 5 * time.Second}
	apps := []AppConfig{
		{Name: "app", User: pgRole, Password: pgPassword, MaxConnections: 2, MaxPinned: 1, WaitTimeout: 5 * time.Second},
		{Name: "badpw", User: pgRole, Password: "wrong", MaxConnections: 1, WaitTimeout: time.Second},
	}
	m, err := New(Options{Server: server, Apps: apps, now: clk.Now, janitorInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	c, err := m.Acquire(ctx, "app", pgDB)
	if err != nil {
		t.Fatal(err)
	}
	if c.PID == 0 || len(c.SecretKey) == 0 || c.StartupParams["server_version"] == "" || c.StartupParams["client_encoding"] != "UTF8" {
		t.Fatalf("login data missing: pid=%d key=%v params=%v", c.PID, c.SecretKey, c.StartupParams)
	}
	rows, err := query(t, c, "select current_user || '/' || current_database() || '/' || pg_backend_pid()")
	if err != nil {
		t.Fatal(err)
	}
	if want := pgRole + "/" + pgDB + "/"; len(rows) != 1 || rows[0][:len(want)] != want {
		t.Fatalf("rows = %v", rows)
	}

	t.Run("cancel", func(t *testing.T) {
		// The cancel goes once pg_stat_activity shows the query running.
		done := make(chan error, 1)
		go func() {
			running, err := backendRunning(ctx, pc, c.PID, "select pg_sleep(30)::text", 10*time.Second)
			if cerr := m.Cancel(ctx, c); err == nil {
				err = cerr
			}
			if err == nil && !running {
				err = errors.New("timed out after 10s waiting for pg_stat_activity to show the query running")
			}
			done <- err
		}()
		_, qerr := query(t, c, "select pg_sleep(30)::text")
		var pgErr *pgconn.PgError
		if !errors.As(qerr, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("query error = %v, want 57014", qerr)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})

	m.Release(c)
	c2, err := m.Acquire(ctx, "app", pgDB)
	if err != nil || c2 != c {
		t.Fatalf("idle conn not reused: %v", err)
	}
	m.Release(c2)

	p, err := m.ServerParams(ctx, "app", pgDB)
	if err != nil || p["server_version"] != c.StartupParams["server_version"] {
		t.Fatalf("ServerParams = %v, %v", p, err)
	}

	t.Run("dial errors keep SQLSTATE", func(t *testing.T) {
		for _, tc := range []struct{ app, db, code string }{
			{"app", "no_such_db", "3D000"},
			{"badpw", pgDB, "28P01"},
		} {
			_, err := m.Acquire(ctx, tc.app, tc.db)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
				t.Errorf("Acquire(%s, %s) = %v, want SQLSTATE %s", tc.app, tc.db, err, tc.code)
			}
		}
		if s := m.Stats("badpw"); s.Open != 0 {
			t.Errorf("failed dial left a slot: %+v", s)
		}
		if s := m.Stats("app"); s.Open != 1 || s.Idle != 1 {
			t.Errorf("Stats(app) = %+v", s)
		}
	})

	t.Run("unix socket", func(t *testing.T) {
		us := server
		us.Host = pc.SocketDir
		m2, err := New(Options{Server: us, Apps: apps[:1]})
		if err != nil {
			t.Fatal(err)
		}
		defer m2.Close()
		uc, err := m2.Acquire(ctx, "app", pgDB)
		if err != nil {
			t.Fatal(err)
		}
		if rows, err := query(t, uc, "select 1::text"); err != nil || len(rows) != 1 {
			t.Fatalf("rows %v, %v", rows, err)
		}
		m2.Release(uc)
	})

	t.Run("restart discards dead idle conns", func(t *testing.T) {
		if err := pc.Restart(); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Second)
		c3, err := m.Acquire(ctx, "app", pgDB)
		if err != nil {
			t.Fatal(err)
		}
		if c3 == c || c3.PID == c.PID {
			t.Fatal("conn killed by the restart was handed out")
		}
		if rows, err := query(t, c3, "select 1::text"); err != nil || len(rows) != 1 {
			t.Fatalf("rows %v, %v", rows, err)
		}
		m.Release(c3)
		if s := m.Stats("app"); s.Open != 1 || s.Idle != 1 {
			t.Errorf("Stats(app) = %+v", s)
		}
	})
}
