package integration

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lib/pq"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
	"github.com/lockpool/lockpool/proxy/console"
)

// pg_terminate_backend and pg_cancel_backend of a client's key pid. Every
// case runs the same client code twice: against PostgreSQL directly, where
// the pid a client holds (its BackendKeyData) is its backend's, and through
// lockpool, where it is the key pid lockpool gave it; what each side saw
// (results, notices, errors, what became of the signalled client, its
// transaction and its advisory lock) must be the same.

const (
	sigUser  = "sigapp"   // the signalled clients and, mostly, the callers
	sigOther = "sigother" // another user: refused
	sigAdmin = "sigadmin" // admin_users on lockpool; pg_signal_backend on PostgreSQL
	sigPQ    = "sigpq"    // lib/pq's client (found by its user: lib/pq shows no key pid)
	sigDB    = "appdb"
)

// sigMu keeps the tests that use the sig roles apart: they find clients
// and running statements by user.
var sigMu sync.Mutex

// sigKeys makes advisory lock keys and row ids no other case uses.
var sigKeys atomic.Int64

func init() { sigKeys.Store(7_300_000) }

// sigSide is one way to PostgreSQL: directly, or through lockpool.
type sigSide struct {
	name string
	port int
	// exists reports whether a client with the pid (as the client knows
	// it) is still there.
	exists func(ctx context.Context, pid uint32) bool
	// pidOf is the pid of the only client of user.
	pidOf func(ctx context.Context, user string) uint32
}

func (s sigSide) dsn(user string) string { return testenv.DSN(s.port, user, sigDB) }

// sigSetup makes the roles, the table and a lockpool with an application
// per role (admin_users: sigadmin), and returns the two sides and a
// superuser connection to appdb.
func sigSetup(t *testing.T) ([2]sigSide, *lp, *pgx.Conn) {
	t.Helper()
	c := pgtest.Require(t)
	for _, r := range []string{sigUser, sigOther, sigAdmin, sigPQ} {
		testenv.EnsureRole(t, c, r)
	}
	su := superConn(t, sigDB)
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := su.Exec(ctx, `GRANT pg_signal_backend TO sigadmin;
CREATE TABLE IF NOT EXISTS signal_rows (id bigint PRIMARY KEY);
GRANT ALL ON signal_rows TO PUBLIC`); err != nil {
		t.Fatal(err)
	}
	var apps []appYAML
	for _, r := range []string{sigUser, sigOther, sigAdmin, sigPQ} {
		apps = append(apps, appYAML{name: r, user: r, db: sigDB, max: 3, pinned: 1, advisory: "pin", state: "pin", wait: "10s"})
	}
	l := startLockpool(t, 16, "admin_users: "+sigAdmin, apps...)
	direct := sigSide{name: "direct", port: c.Port,
		exists: func(ctx context.Context, pid uint32) bool {
			n, err := countBackends(ctx, su, fmt.Sprintf("pid = %d", pid))
			return err != nil || n > 0
		},
		pidOf: func(ctx context.Context, user string) uint32 {
			var pid uint32
			if err := su.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND application_name = 'sig_victim'", user).Scan(&pid); err != nil {
				t.Fatalf("the backend of %s: %v", user, err)
			}
			return pid
		}}
	clients := func() []console.ClientRow {
		code, body := l.get("/debug/clients")
		var rows []console.ClientRow
		if code != 200 || json.Unmarshal([]byte(body), &rows) != nil {
			t.Fatalf("GET /debug/clients = %d %s", code, body)
		}
		return rows
	}
	pooled := sigSide{name: "lockpool", port: l.port,
		exists: func(_ context.Context, pid uint32) bool {
			for _, r := range clients() {
				if r.ID == pid {
					return true
				}
			}
			return false
		},
		pidOf: func(_ context.Context, user string) uint32 {
			for _, r := range clients() {
				if r.User == user {
					return r.ID
				}
			}
			t.Fatalf("no client of %s in /debug/clients", user)
			return 0
		}}
	return [2]sigSide{direct, pooled}, l, su
}

// sigConn is a pgx connection of user on side s in exec mode mode; the
// notices it gets are appended to *notices (when not nil).
func sigConn(t *testing.T, s sigSide, user string, mode pgx.QueryExecMode, notices *[]string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(s.dsn(user))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = mode
	if notices != nil {
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			*notices = append(*notices, n.Severity+" "+n.Code+": "+n.Message)
		}
	}
	ctx := testenv.Context(t, 10*time.Second)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("%s: connect as %s: %v", s.name, user, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// errText is what a client saw of err, the same on both sides: a
// server's error by severity, SQLSTATE and message.
func errText(err error) string {
	var pe *pgconn.PgError
	var qe *pq.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &pe):
		return pe.Severity + " " + pe.Code + ": " + pe.Message
	case errors.As(err, &qe):
		return string(qe.Severity) + " " + string(qe.Code) + ": " + qe.Message
	}
	return "connection error"
}

// call runs a signal call and returns its result or its error.
func call(ctx context.Context, conn *pgx.Conn, sql string, args ...any) string {
	var v *bool
	if err := conn.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		return errText(err)
	}
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// sleepingVictim opens sigUser's client on s and starts SELECT pg_sleep(30)
// on it; it returns once PostgreSQL runs the statement (su sees it active),
// with the channel that gets the statement's error.
func sleepingVictim(t *testing.T, ctx context.Context, s sigSide, su *pgx.Conn) (*pgx.Conn, chan error) {
	t.Helper()
	v := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := v.Exec(ctx, "SELECT pg_sleep(30)")
		errc <- err
	}()
	eventually(t, 10*time.Second, "pg_sleep(30) to run", func() bool {
		n, err := countBackends(ctx, su, "usename = '"+sigUser+"' AND state = 'active' AND query LIKE '%pg_sleep(30)%'")
		return err == nil && n == 1
	})
	return v, errc
}

// victimInTx opens user's client on s inside a transaction that inserted
// row key and took advisory lock key.
func victimInTx(t *testing.T, ctx context.Context, s sigSide, user string, key int64) *pgx.Conn {
	t.Helper()
	v := sigConn(t, s, user, pgx.QueryExecModeCacheStatement, nil)
	for _, q := range []string{"BEGIN", fmt.Sprintf("INSERT INTO signal_rows VALUES (%d)", key), fmt.Sprintf("SELECT pg_advisory_lock(%d)", key)} {
		if _, err := v.Exec(ctx, q); err != nil {
			t.Fatalf("%s: victim %s: %v", s.name, q, err)
		}
	}
	return v
}

// afterward is what the victim sees at its next statement.
func afterward(ctx context.Context, v *pgx.Conn) string {
	_, err := v.Exec(ctx, "SELECT 1")
	return fmt.Sprintf("%s; closed %v", errText(err), v.IsClosed())
}

// released waits (lock_timeout 10 s) until advisory lock key is free and
// row key can be inserted: the victim's transaction ended without
// committing. It reports what it found.
func released(ctx context.Context, su *pgx.Conn, key int64) string {
	_, err := su.Exec(ctx, fmt.Sprintf(`SET lock_timeout = '10s';
SELECT pg_advisory_lock(%[1]d); SELECT pg_advisory_unlock(%[1]d);
INSERT INTO signal_rows VALUES (%[1]d); DELETE FROM signal_rows WHERE id = %[1]d;
RESET lock_timeout`, key))
	if err != nil {
		_, _ = su.Exec(ctx, "RESET lock_timeout")
		return "not released: " + errText(err)
	}
	return "released"
}

// sigCase is one case: run gives what side s saw.
type sigCase struct {
	name string
	run  func(t *testing.T, ctx context.Context, s sigSide) map[string]string
}

// sigModes are the ways pgx sends SELECT pg_terminate_backend($1): the
// pid as pgx's uint32 (its default: prepared, described, binary int4), as
// int64 and int32 with the types taken from Go (exec), as text, and
// interpolated into the text (simple protocol).
var sigModes = []struct {
	name string
	mode pgx.QueryExecMode
	arg  func(pid uint32) any
}{
	{"cache uint32", pgx.QueryExecModeCacheStatement, func(p uint32) any { return p }},
	{"describe int64", pgx.QueryExecModeDescribeExec, func(p uint32) any { return int64(p) }},
	{"exec int32", pgx.QueryExecModeExec, func(p uint32) any { return int32(p) }},
	{"exec int64", pgx.QueryExecModeExec, func(p uint32) any { return int64(p) }},
	{"cache text", pgx.QueryExecModeCacheStatement, func(p uint32) any { return fmt.Sprint(p) }},
	{"simple", pgx.QueryExecModeSimpleProtocol, func(p uint32) any { return int64(p) }},
}

func sigCases(su *pgx.Conn) []sigCase {
	var cases []sigCase
	// A client of the same user terminates a client idle in a transaction
	// that holds an advisory lock: true; the victim gets 57P01 and is
	// closed; its transaction rolled back, its lock released.
	for _, m := range sigModes {
		cases = append(cases, sigCase{"terminate same user, " + m.name, func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
			key := sigKeys.Add(1)
			v := victimInTx(t, ctx, s, sigUser, key)
			var notices []string
			c := sigConn(t, s, sigUser, m.mode, &notices)
			res := call(ctx, c, "SELECT pg_terminate_backend($1)", m.arg(v.PgConn().PID()))
			out := map[string]string{"result": res, "notices": strings.Join(notices, "|")}
			if res == "true" {
				out["victim"] = afterward(ctx, v)
				out["released"] = released(ctx, su, key)
			}
			return out
		}})
	}
	// The calls inside a larger statement (pgx's own tests terminate their
	// pool's connections with SELECT pg_terminate_backend(n) FROM
	// unnest($1::int[]) n): the victims end as with a call of their own,
	// the caller sees no notice. (The calls' values differ: lockpool's
	// are false; the count hides them.)
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"cache", pgx.QueryExecModeCacheStatement}, {"simple", pgx.QueryExecModeSimpleProtocol}} {
		cases = append(cases, sigCase{"terminate in a larger statement, " + m.name, func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
			key := sigKeys.Add(1)
			v1 := victimInTx(t, ctx, s, sigUser, key)
			v2 := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil) // idle (one pin slot)
			var notices []string
			c := sigConn(t, s, sigUser, m.mode, &notices)
			var n int64
			err := c.QueryRow(ctx, "SELECT count(*) FROM (SELECT pg_terminate_backend(n) FROM unnest($1::int[]) n) s",
				[]int32{int32(v1.PgConn().PID()), int32(v2.PgConn().PID())}).Scan(&n)
			return map[string]string{"result": fmt.Sprintf("%d %s", n, errText(err)), "notices": strings.Join(notices, "|"),
				"victim 1": afterward(ctx, v1), "victim 2": afterward(ctx, v2),
				"released": released(ctx, su, key)}
		}})
	}
	cases = append(cases, sigCase{"cancel in a larger statement", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		v, errc := sleepingVictim(t, ctx, s, su)
		var notices []string
		c := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, &notices)
		var n int64
		err := c.QueryRow(ctx, "SELECT count(*) FROM (SELECT pg_cancel_backend(n) FROM unnest(ARRAY[$1::int]) n) s", int32(v.PgConn().PID())).Scan(&n)
		return map[string]string{"result": fmt.Sprintf("%d %s", n, errText(err)), "notices": strings.Join(notices, "|"),
			"victim": errText(<-errc), "victim then": afterward(ctx, v)}
	}})
	// Another user is refused (inside a transaction block the block
	// fails, as with any error); the victim goes on.
	for _, fn := range []string{"pg_terminate_backend", "pg_cancel_backend"} {
		cases = append(cases, sigCase{fn + " other user", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
			key := sigKeys.Add(1)
			v := victimInTx(t, ctx, s, sigUser, key)
			c := sigConn(t, s, sigOther, pgx.QueryExecModeCacheStatement, nil)
			out := map[string]string{"result": call(ctx, c, "SELECT "+fn+"($1) AS done", v.PgConn().PID())}
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			out["in block"] = call(ctx, c, "SELECT "+fn+"($1)", v.PgConn().PID())
			out["in block, then"] = call(ctx, c, "SELECT true")
			_, _ = c.Exec(ctx, "ROLLBACK")
			out["victim"] = afterward(ctx, v)
			_, _ = v.Exec(ctx, "ROLLBACK; SELECT pg_advisory_unlock_all()")
			return out
		}})
	}
	// An admin user (PostgreSQL: a member of pg_signal_backend) may
	// terminate anyone's client.
	cases = append(cases, sigCase{"terminate by admin", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		key := sigKeys.Add(1)
		v := victimInTx(t, ctx, s, sigUser, key)
		c := sigConn(t, s, sigAdmin, pgx.QueryExecModeCacheStatement, nil)
		out := map[string]string{"result": call(ctx, c, "SELECT pg_terminate_backend($1) AS done", v.PgConn().PID())}
		out["victim"] = afterward(ctx, v)
		out["released"] = released(ctx, su, key)
		return out
	}})
	// pg_cancel_backend cancels the victim's running statement (57014); the
	// victim stays usable.
	cases = append(cases, sigCase{"cancel running pg_sleep", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		v, errc := sleepingVictim(t, ctx, s, su)
		c := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
		out := map[string]string{"result": call(ctx, c, "SELECT pg_catalog.pg_cancel_backend($1)", v.PgConn().PID())}
		select {
		case err := <-errc:
			out["sleep"] = errText(err)
		case <-ctx.Done():
			t.Fatalf("%s: pg_sleep(30) was not cancelled", s.name)
		}
		out["victim"] = afterward(ctx, v)
		return out
	}})
	// A pid that is no client's and no backend's: PostgreSQL's WARNING and
	// false, in each protocol; a backend's pid: PostgreSQL signals it.
	for _, m := range sigModes {
		cases = append(cases, sigCase{"unknown pid, " + m.name, func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
			var notices []string
			c := sigConn(t, s, sigUser, m.mode, &notices)
			out := map[string]string{}
			for _, pid := range []uint32{1, 0x7f000001} {
				for _, fn := range []string{"pg_terminate_backend", "pg_cancel_backend"} {
					notices = notices[:0]
					k := fmt.Sprintf("%s(%#x)", fn, pid)
					out[k] = call(ctx, c, "SELECT "+fn+"($1)", m.arg(pid)) + " " + strings.Join(notices, "|")
				}
			}
			return out
		}})
	}
	cases = append(cases, sigCase{"backend pid passes through", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		direct := sigSide{port: pgtest.Require(t).Port}
		out := map[string]string{}
		for _, m := range []int{0, len(sigModes) - 1} { // prepared, and simple protocol
			v := sigConn(t, direct, sigUser, pgx.QueryExecModeCacheStatement, nil)
			c := sigConn(t, s, sigUser, sigModes[m].mode, nil)
			out[sigModes[m].name] = call(ctx, c, "SELECT pg_terminate_backend($1)", sigModes[m].arg(v.PgConn().PID()))
			out[sigModes[m].name+" victim"] = afterward(ctx, v)
		}
		return out
	}})
	// With a timeout the call returns once the victim has ended.
	cases = append(cases, sigCase{"terminate with timeout", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		key := sigKeys.Add(1)
		v := victimInTx(t, ctx, s, sigUser, key)
		c := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
		pid := v.PgConn().PID()
		out := map[string]string{
			"negative": call(ctx, c, "SELECT pg_terminate_backend($1, $2)", pid, -1),
			"result":   call(ctx, c, "SELECT pg_terminate_backend($1, $2)", pid, 5000),
		}
		out["gone"] = fmt.Sprint(!s.exists(ctx, pid))
		out["victim"] = afterward(ctx, v)
		out["released"] = released(ctx, su, key)
		out["literal"] = call(ctx, c, fmt.Sprintf("SELECT pg_terminate_backend(%d, 100)", pid))
		return out
	}})
	// On the wire: what Describe shows, declared parameter types, binary
	// formats, NULL, bad input, a prepared statement run later.
	cases = append(cases, sigCase{"protocol details", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		v := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
		pid := []byte(fmt.Sprint(v.PgConn().PID()))
		var notices []string
		pc := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, &notices).PgConn()
		out := map[string]string{}
		sd, err := pc.Prepare(ctx, "sig_stmt", "SELECT pg_catalog.pg_terminate_backend($1, $2) AS t", nil)
		if err == nil {
			out["describe"] = fmt.Sprint(sd.ParamOIDs, len(sd.Fields), string(sd.Fields[0].Name), sd.Fields[0].DataTypeOID, sd.Fields[0].DataTypeSize)
		} else {
			out["describe"] = errText(err)
		}
		exec := func(sql string, params [][]byte, oids []uint32, pf, rf []int16) string {
			notices = notices[:0]
			r := pc.ExecParams(ctx, sql, params, oids, pf, rf).Read()
			return fmt.Sprintf("%q %s %s", r.Rows, errText(r.Err), strings.Join(notices, "|"))
		}
		out["declared bigint"] = exec("SELECT pg_terminate_backend($1)", [][]byte{pid}, []uint32{20}, nil, nil)
		out["declared smallint"] = exec("SELECT pg_cancel_backend($1)", [][]byte{[]byte("1")}, []uint32{21}, nil, nil)
		out["binary"] = exec("SELECT pg_cancel_backend($1)", [][]byte{binary.BigEndian.AppendUint32(nil, 1)}, []uint32{23}, []int16{1}, []int16{1})
		out["bad binary"] = exec("SELECT pg_cancel_backend($1)", [][]byte{{0, 1}}, []uint32{23}, []int16{1}, nil)
		out["null"] = exec("SELECT pg_terminate_backend($1)", [][]byte{nil}, nil, nil, nil)
		out["null timeout"] = exec("SELECT pg_terminate_backend($1, $2)", [][]byte{pid, nil}, nil, nil, nil)
		out["bad text"] = exec("SELECT pg_cancel_backend($1)", [][]byte{[]byte("12x")}, nil, nil, nil)
		out["out of range"] = exec("SELECT pg_cancel_backend($1)", [][]byte{[]byte("5000000000")}, nil, nil, nil)
		_, err = pc.Exec(ctx, "SELECT pg_cancel_backend($1)").ReadAll()
		out["no parameter"] = errText(err)
		notices = notices[:0]
		r := pc.ExecPrepared(ctx, "sig_stmt", [][]byte{pid, []byte("5000")}, nil, []int16{1}).Read()
		out["prepared"] = fmt.Sprintf("%q %s", r.Rows, errText(r.Err))
		out["victim"] = afterward(ctx, v)
		return out
	}})
	// The caller's own pid: terminate ends the caller; cancel fails the
	// call (inside a block, the block).
	cases = append(cases, sigCase{"own pid", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		c := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
		out := map[string]string{"cancel": call(ctx, c, "SELECT pg_cancel_backend($1)", c.PgConn().PID())}
		out["cancel, then"] = call(ctx, c, "SELECT true")
		_, _ = c.Exec(ctx, "BEGIN")
		out["cancel in block"] = call(ctx, c, "SELECT pg_cancel_backend($1)", c.PgConn().PID())
		out["cancel in block, then"] = call(ctx, c, "SELECT true")
		_, _ = c.Exec(ctx, "ROLLBACK")
		out["terminate"] = call(ctx, c, "SELECT pg_terminate_backend($1)", c.PgConn().PID())
		out["closed"] = fmt.Sprint(c.IsClosed())
		return out
	}})
	// psql (simple protocol, the pid a constant) terminates and is refused
	// alike.
	cases = append(cases, sigCase{"psql", func(t *testing.T, ctx context.Context, s sigSide) map[string]string {
		out := map[string]string{}
		for _, caller := range []string{sigOther, sigUser} {
			v := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
			q := fmt.Sprintf("SELECT pg_terminate_backend(%d)", v.PgConn().PID())
			res, err := testenv.PsqlCmd(ctx, s.port, caller, sigDB, "-At", "-c", q).CombinedOutput()
			out[caller] = fmt.Sprintf("%s (%v)", strings.TrimSpace(string(res)), err)
			out[caller+" victim"] = afterward(ctx, v)
		}
		return out
	}})
	return cases
}

func TestSignalKeyPID(t *testing.T) {
	t.Parallel()
	sigMu.Lock()
	defer sigMu.Unlock()
	sides, _, su := sigSetup(t)
	for _, tc := range sigCases(su) {
		t.Run(tc.name, func(t *testing.T) {
			var seen [2]map[string]string
			for i, s := range sides {
				ctx := testenv.Context(t, 30*time.Second)
				seen[i] = tc.run(t, ctx, s)
			}
			if !reflect.DeepEqual(seen[0], seen[1]) {
				t.Errorf("lockpool and PostgreSQL differ:\ndirect:   %v\nlockpool: %v", seen[0], seen[1])
			} else {
				t.Logf("both: %v", seen[0])
			}
		})
	}
}

// Health checks see a terminated client's session as dead, as on
// PostgreSQL: pgx's Ping and CheckConn fail, pgxpool replaces the idle
// connection, lib/pq's Ping fails.
func TestSignalHealthChecks(t *testing.T) {
	t.Parallel()
	sigMu.Lock()
	defer sigMu.Unlock()
	sides, _, _ := sigSetup(t)
	terminate := func(t *testing.T, ctx context.Context, s sigSide, pid uint32) string {
		c := sigConn(t, s, sigAdmin, pgx.QueryExecModeCacheStatement, nil)
		return call(ctx, c, "SELECT pg_terminate_backend($1, 5000)", pid) // returns once the victim has ended
	}
	checks := []struct {
		name string
		run  func(t *testing.T, ctx context.Context, s sigSide) string
	}{
		{"pgx Ping", func(t *testing.T, ctx context.Context, s sigSide) string {
			v := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
			r := terminate(t, ctx, s, v.PgConn().PID())
			return r + "; ping: " + errText(v.Ping(ctx)) + fmt.Sprintf("; closed %v", v.IsClosed())
		}},
		{"pgconn CheckConn", func(t *testing.T, ctx context.Context, s sigSide) string {
			v := sigConn(t, s, sigUser, pgx.QueryExecModeCacheStatement, nil)
			r := terminate(t, ctx, s, v.PgConn().PID())
			//lint:ignore SA1019 deprecated in favour of Ping, which the case above checks; applications still call it as an idle check
			return r + "; check: " + errText(v.PgConn().CheckConn()) + fmt.Sprintf("; closed %v", v.IsClosed())
		}},
		{"pgxpool", func(t *testing.T, ctx context.Context, s sigSide) string {
			cfg, err := pgxpool.ParseConfig(s.dsn(sigUser))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true } // check every idle connection
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			pc, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			first := pc.Conn().PgConn().PID()
			pc.Release()
			r := terminate(t, ctx, s, first)
			pc, err = pool.Acquire(ctx)
			if err != nil {
				return r + "; acquire: " + errText(err)
			}
			defer pc.Release()
			_, err = pc.Exec(ctx, "SELECT 1")
			return r + fmt.Sprintf("; a new connection %v: %s", pc.Conn().PgConn().PID() != first, errText(err))
		}},
		{"lib/pq Ping", func(t *testing.T, ctx context.Context, s sigSide) string {
			db, err := sql.Open("postgres", s.dsn(sigPQ)+" application_name=sig_victim")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			r := terminate(t, ctx, s, s.pidOf(ctx, sigPQ))
			err = conn.PingContext(ctx)
			return r + "; ping: " + errText(err) + fmt.Sprintf(" (%v)", err != nil)
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			var seen [2]string
			for i, s := range sides {
				seen[i] = c.run(t, testenv.Context(t, 30*time.Second), s)
			}
			if seen[0] != seen[1] {
				t.Errorf("lockpool and PostgreSQL differ:\ndirect:   %s\nlockpool: %s", seen[0], seen[1])
			} else {
				t.Logf("both: %s", seen[0])
			}
			if !strings.HasPrefix(seen[1], "true;") {
				t.Errorf("lockpool: %s; want the terminate to return true", seen[1])
			}
		})
	}
}

// Across two instances of a cluster: a client of instance B terminates and
// cancels a client of instance A by its key pid (the call is forwarded to
// A), another user is refused, and a signal request that does not carry
// A's key is refused by A without effect.
func TestSignalAcrossCluster(t *testing.T) {
	t.Parallel()
	const role, other = "clsignal", "clsigother"
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, role)
	testenv.EnsureRole(t, c, other)
	name := uniqueName(t, "cl")
	yaml := testenv.AppsYAML(c, 12, fmt.Sprintf(`
leases:
  schema: %s
cluster:
  name: %s
  database: appdb
  ttl: %s
  heartbeat: 100ms`, role, name, clusterTTL),
		testenv.App{Name: clusterApp, User: role, DB: "appdb", Max: clusterBudget, Pinned: clusterPins,
			Advisory: "pin", State: "pin", Wait: "30s", Extra: "    budget_scope: cluster\n    min_share: 0\n"},
		testenv.App{Name: "other", User: other, DB: "appdb", Max: 2, Pinned: 1, Advisory: "pin", State: "pin", Wait: "10s"})
	a, _ := startYAML(t, yaml)
	b, _ := startYAML(t, yaml)
	eventually(t, 10*time.Second, "both instances in both instances' SHOW CLUSTER", func() bool {
		for _, l := range []*lp{a, b} {
			code, body := l.get("/debug/cluster")
			if code != 200 || strings.Count(body, `"live": true`) != 2 {
				return false
			}
		}
		return true
	})
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 60*time.Second)
	if _, err := su.Exec(ctx, "CREATE TABLE IF NOT EXISTS signal_rows (id bigint PRIMARY KEY); GRANT ALL ON signal_rows TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	onA := sigSide{name: "instance A", port: a.port, exists: func(_ context.Context, pid uint32) bool {
		_, body := a.get("/debug/clients")
		return strings.Contains(body, fmt.Sprintf(`"id": %d,`, pid))
	}}
	onB := sigSide{name: "instance B", port: b.port}

	// Refused: another user; a request without A's key.
	key := sigKeys.Add(1)
	v := victimInTx(t, ctx, onA, role, key)
	pid := v.PgConn().PID()
	if n := pid >> 23; n == 0 {
		t.Fatalf("key pid %#x carries no instance number", pid)
	}
	if got := call(ctx, sigConn(t, onB, other, pgx.QueryExecModeCacheStatement, nil), "SELECT pg_terminate_backend($1)", pid); got != "ERROR 42501: must be a member of the role whose process is being terminated or member of pg_signal_backend" {
		t.Errorf("another user's pg_terminate_backend through B: %s", got)
	}
	for _, mac := range [][]byte{make([]byte, 32), nil} {
		if ans := forgedSignal(t, a.addr, pid, mac); ans != "a" && ans != "" {
			t.Errorf("a signal request with a forged MAC was answered %q", ans)
		}
	}
	if _, err := v.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the victim after the refused requests: %v", err)
	}

	// Terminated from B, with a timeout: it has ended when the call returns.
	caller := sigConn(t, onB, role, pgx.QueryExecModeCacheStatement, nil)
	if got := call(ctx, caller, "SELECT pg_terminate_backend($1, 5000)", pid); got != "true" {
		t.Fatalf("pg_terminate_backend through B of A's client: %s", got)
	}
	if onA.exists(ctx, pid) {
		t.Errorf("client %d still in A's /debug/clients after pg_terminate_backend returned", pid)
	}
	if got := afterward(ctx, v); got != "FATAL 57P01: terminating connection due to administrator command; closed true" {
		t.Errorf("the terminated client saw %s", got)
	}
	if got := released(ctx, su, key); got != "released" {
		t.Errorf("its transaction and lock: %s", got)
	}

	// Cancelled from B: its pg_sleep ends with 57014, and it stays usable.
	v = sigConn(t, onA, role, pgx.QueryExecModeCacheStatement, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := v.Exec(ctx, "SELECT pg_sleep(30)")
		errc <- err
	}()
	eventually(t, 10*time.Second, "pg_sleep(30) to run", func() bool {
		n, err := countBackends(ctx, su, "usename = '"+role+"' AND state = 'active' AND query LIKE '%pg_sleep(30)%'")
		return err == nil && n == 1
	})
	if got := call(ctx, caller, "SELECT pg_cancel_backend($1)", v.PgConn().PID()); got != "true" {
		t.Fatalf("pg_cancel_backend through B of A's client: %s", got)
	}
	select {
	case err := <-errc:
		if got := errText(err); got != "ERROR 57014: canceling statement due to user request" {
			t.Errorf("the cancelled pg_sleep: %s", got)
		}
	case <-ctx.Done():
		t.Fatal("pg_sleep(30) through A was not cancelled")
	}
	if got := call(ctx, v, "SELECT true"); got != "true" {
		t.Errorf("the cancelled client afterwards: %s", got)
	}
	// A key pid of an instance number no instance has: PostgreSQL's answer.
	var notices []string
	n := sigConn(t, onB, role, pgx.QueryExecModeCacheStatement, &notices)
	if got := call(ctx, n, "SELECT pg_terminate_backend($1)", uint32(0x7f000001)); got != "false" || len(notices) != 1 || !strings.Contains(notices[0], "is not a PostgreSQL backend process") {
		t.Errorf("a key pid of no instance: %s %v", got, notices)
	}
}

// forgedSignal sends a signal request for pid to addr and answers the
// challenge with mac (nil: closes instead); it returns the answer byte (""
// when the connection closed).
func forgedSignal(t *testing.T, addr string, pid uint32, mac []byte) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	body := binary.BigEndian.AppendUint32(nil, pid)
	body = append(body, 'T')
	body = binary.BigEndian.AppendUint64(body, 0)
	body = append(body, 1) // claims to be an admin
	body = append(body, "clsignal\x00"...)
	pkt := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	pkt = binary.BigEndian.AppendUint32(pkt, 1234<<16|0x4c50)
	if _, err := c.Write(append(pkt, body...)); err != nil {
		t.Fatal(err)
	}
	challenge := make([]byte, 32)
	if _, err := io.ReadFull(c, challenge); err != nil {
		t.Fatalf("no challenge: %v", err)
	}
	if mac == nil {
		return ""
	}
	if _, err := c.Write(mac); err != nil {
		t.Fatal(err)
	}
	var ans [1]byte
	if _, err := io.ReadFull(c, ans[:]); err != nil {
		return ""
	}
	return string(ans[:])
}
