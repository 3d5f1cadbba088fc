package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
	"github.com/lockpool/lockpool/proxy/console"
)

// TestSessionStateDifferential runs twelve clients' seeded random scripts of
// session-state statements (SET in all its forms, set_config, RESET, SET
// ROLE, SQL PREPARE, temporary tables, WITH HOLD cursors, DISCARD,
// transactions and savepoints, failing statements), each step in the
// simple or the extended protocol (a few steps are several statements in
// one Query or one pipeline), once directly against PostgreSQL (the
// oracle, run twice: the two runs must agree) and once through lockpool with
// all twelve clients at once on a budget of 3 with 2 pin slots. After every
// statement each client reads its own session (settings, current and
// session user, SQL-prepared statements, cursors, temporary tables); every
// statement's outcome, that observation and the ParameterStatus values the
// client holds must be the same as on the direct connection. Afterwards
// fresh clients through lockpool, on every server connection, must see what
// a fresh direct session sees.
//
// The scripts never branch on results, so both runs send the same
// statements. Each client has its own startup parameters (as connection
// parameters or -c switches in options), so a reset must return to that
// client's startup value. A transaction ends within sessionMaxTxSteps
// statements, and state that pins a session is released once it is
// sessionMaxHeldSteps statements old (a transaction open then is ended
// first), so every wait for a connection or a pin slot can end well within
// wait_timeout.
//
// LOCKPOOL_STATEDIFF_SEEDS (a comma list of seeds, or random:N for N random
// ones) and LOCKPOOL_STATEDIFF_STEPS (statements per client; 150 with
// LOCKPOOL_LONG) choose longer runs; scripts/state-diff.sh runs many.
// LOCKPOOL_STATEDIFF_TRACE (client numbers, or "all") logs those clients'
// statements with both sides' records, for a replay.

const (
	sessionClients      = 12
	sessionCISeed       = 20261205
	sessionCISteps      = 40
	sessionLongSteps    = 150
	sessionMaxTxSteps   = 7 // BEGIN and up to 6 more, then COMMIT or ROLLBACK
	sessionMaxHeldSteps = 6
	sessionRole         = "statediff"
	sessionDB           = "appdb"
	sessionBudget       = 3
	sessionPinned       = 2
	sessionWait         = "10s"
	sessionShownInFull  = 20
	sessionRecentSteps  = 6
)

// sessionMemberRoles are the roles sessionRole is a member of, for SET ROLE.
var sessionMemberRoles = []string{"statediff_a", "statediff_b"}

// sessionObserve reads a client's session state; it runs in the client's
// own session after every statement, in the simple protocol, and is the
// same on both sides. The custom setting reads NULL as the empty string:
// PostgreSQL cannot remove a custom setting once defined, so on a server
// connection where another client defined it lockpool's README documents an
// empty string where a direct session has NULL.
const sessionObserve = `SELECT current_setting('search_path'), current_setting('statement_timeout'),
 current_setting('TimeZone'), current_setting('DateStyle'), current_setting('application_name'),
 current_setting('work_mem'), coalesce(current_setting('sd.flag', true), ''),
 current_user, session_user,
 coalesce((SELECT string_agg(name, ',' ORDER BY name) FROM pg_prepared_statements WHERE from_sql), ''),
 coalesce((SELECT string_agg(name, ',' ORDER BY name) FROM pg_cursors), ''),
 coalesce((SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class
   WHERE relnamespace = pg_my_temp_schema() AND relkind IN ('r', 'p')), '')`

// sessionObserved names sessionObserve's columns.
var sessionObserved = []string{"search_path", "statement_timeout", "TimeZone", "DateStyle",
	"application_name", "work_mem", "sd.flag", "current_user", "session_user",
	"prepared", "cursors", "temp_tables"}

// sessionReported are the ParameterStatus values recorded after each
// statement.
var sessionReported = []string{"application_name", "DateStyle", "TimeZone"}

// sessionStep is one statement of a script and the protocol it is sent in,
// or several statements ("; " between them) sent as one Query or as one
// extended-protocol pipeline (one Sync).
type sessionStep struct {
	sql   string
	mode  pgx.QueryExecMode
	batch sessionBatch
}

// sessionBatch says how a step with several statements is sent.
type sessionBatch int

const (
	singleStatement sessionBatch = iota
	multiStatementQuery
	pipelineOfStatements
)

func (s sessionStep) String() string {
	m := map[pgx.QueryExecMode]string{pgx.QueryExecModeSimpleProtocol: "simple",
		pgx.QueryExecModeExec: "extended", pgx.QueryExecModeDescribeExec: "describe"}[s.mode]
	switch s.batch {
	case multiStatementQuery:
		m = "one query"
	case pipelineOfStatements:
		m = "pipeline"
	}
	return "[" + m + "] " + s.sql
}

// sessionClient is one client: its startup parameters and its script.
type sessionClient struct {
	params  map[string]string // connection parameters (application_name, …)
	options string            // -c switches, "" for none
	script  []sessionStep
}

func (c sessionClient) startup() string {
	keys := make([]string, 0, len(c.params))
	for k := range c.params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q ", k, c.params[k])
	}
	if c.options != "" {
		fmt.Fprintf(&b, "options=%q", c.options)
	}
	return strings.TrimSpace(b.String())
}

// sessionRecord is what a client saw for one statement.
type sessionRecord struct {
	outcome  string   // command tag and rows, or ERROR SQLSTATE; then notices
	observed []string // sessionObserve's row, or one "ERROR SQLSTATE"
	reported string   // sessionReported as the client was last told
	txStatus string   // the transaction status of the last ReadyForQuery: I, T or E
	// When the statement was sent (since the run began) and how long it
	// took; not compared, shown to tell waits and their overlaps apart.
	at, took time.Duration
}

// sessionHeld is a kind of state that pins a session through lockpool.
type sessionHeld int

const (
	heldRole sessionHeld = iota
	heldTemp
	heldCursor
	heldPrepared
	heldKinds
)

// sessionScriptGen writes one client's script. It keeps a model of the
// client's transaction (exact: it does not depend on results) and of the
// pinning state that may exist (conservative: only a release that cannot
// fail, outside a transaction, forgets it), and uses it only to keep the
// script sane: transactions end, pins are released. It also guesses which
// temporary tables, cursors, SQL-prepared statements and savepoints exist,
// so that most statements using one name one that does.
type sessionScriptGen struct {
	rng        *rand.Rand
	client     int
	inTx       bool
	txSteps    int
	held       [heldKinds]bool
	heldSteps  int // statements since the oldest state in held appeared; -1: none
	seq        int
	batch      sessionBatch // how the step being written is sent, when it has several statements
	objects    map[string]bool
	savepoints []string
	// localDefault: this transaction ran SET LOCAL … TO DEFAULT. A RESET
	// ALL after it is not generated: on PostgreSQL RESET ALL skips a
	// setting whose value is its startup value at the moment, so COMMIT
	// then restores the value from before the SET LOCAL, which lockpool
	// does not reproduce (a documented difference, see README).
	localDefault bool
}

func newSessionScript(seed int64, client, steps int) []sessionStep {
	g := &sessionScriptGen{rng: rand.New(rand.NewSource(seed*1000 + int64(client))), client: client, heldSteps: -1, objects: map[string]bool{}}
	var out []sessionStep
	add := func(sql string) {
		out = append(out, sessionStep{sql: sql, mode: g.mode(), batch: g.batch})
		g.batch = singleStatement
		g.account()
	}
	for len(out) < steps {
		add(g.next())
	}
	// The end: no transaction, nothing that pins.
	if g.inTx {
		add(g.endTx())
	}
	for k := sessionHeld(0); k < heldKinds; k++ {
		if g.held[k] {
			add(g.release(k))
		}
	}
	return out
}

func (g *sessionScriptGen) mode() pgx.QueryExecMode {
	switch n := g.rng.Intn(10); {
	case g.batch == multiStatementQuery:
		return pgx.QueryExecModeSimpleProtocol
	case g.batch == pipelineOfStatements:
		return pgx.QueryExecModeExec
	case n < 4:
		return pgx.QueryExecModeSimpleProtocol
	case n < 7:
		return pgx.QueryExecModeExec
	default:
		return pgx.QueryExecModeDescribeExec
	}
}

// account counts a statement against the transaction's and the pins'
// bounds.
func (g *sessionScriptGen) account() {
	if g.inTx {
		g.txSteps++
	}
	anyHeld := false
	for _, h := range g.held {
		anyHeld = anyHeld || h
	}
	if anyHeld {
		g.heldSteps++
	} else {
		g.heldSteps = -1
	}
}

func (g *sessionScriptGen) hold(k sessionHeld) {
	g.held[k] = true
	if g.heldSteps < 0 {
		g.heldSteps = 0
	}
}

// forget drops k from the model when the statement releasing it runs
// outside a transaction (inside one it may fail or be rolled back).
func (g *sessionScriptGen) forget(k sessionHeld) {
	if !g.inTx {
		g.held[k] = false
	}
}

// name picks one of names, mostly one the model believes exists.
func (g *sessionScriptGen) name(names ...string) string {
	var known []string
	for _, n := range names {
		if g.objects[n] {
			known = append(known, n)
		}
	}
	if len(known) > 0 && g.rng.Intn(4) != 0 {
		return known[g.rng.Intn(len(known))]
	}
	return names[g.rng.Intn(len(names))]
}

func (g *sessionScriptGen) forgetObjects(names ...string) {
	for _, n := range names {
		delete(g.objects, n)
	}
}

var (
	sessionTempTables = []string{"tmp_one", "tmp_two"}
	sessionCursors    = []string{"cur_hold", "cur_scroll", "cur_tx"}
	sessionStatements = []string{"stmt_one", "stmt_two"}
)

func (g *sessionScriptGen) next() string {
	switch {
	case g.inTx && (g.txSteps >= sessionMaxTxSteps || g.heldSteps >= sessionMaxHeldSteps):
		return g.endTx()
	case !g.inTx && g.heldSteps >= sessionMaxHeldSteps:
		for k := sessionHeld(0); k < heldKinds; k++ {
			if g.held[k] {
				return g.release(k)
			}
		}
	}
	type choice struct {
		w int
		f func() string
	}
	inTx := func(yes, no int) int {
		if g.inTx {
			return yes
		}
		return no
	}
	cs := []choice{
		{40, g.setting},
		{12, g.transaction},
		{inTx(8, 1), g.savepoint},
		{7, g.role},
		{8, g.prepared},
		{8, g.temp},
		{8, g.cursor},
		{4, g.discard},
		{inTx(4, 1), func() string { return "SELECT 1/0" }},
		{4, g.read},
		{5, g.several},
	}
	total := 0
	for _, c := range cs {
		total += c.w
	}
	n := g.rng.Intn(total)
	for _, c := range cs {
		if n < c.w {
			return c.f()
		}
		n -= c.w
	}
	panic("unreachable")
}

func (g *sessionScriptGen) oneOf(s ...string) string { return s[g.rng.Intn(len(s))] }

func (g *sessionScriptGen) endTx() string {
	g.inTx, g.savepoints, g.localDefault = false, nil, false
	g.forgetObjects("cur_tx")
	return g.oneOf("COMMIT", "ROLLBACK", "END", "ABORT", "COMMIT", "ROLLBACK")
}

func (g *sessionScriptGen) release(k sessionHeld) string {
	if g.rng.Intn(5) == 0 {
		return g.discardAll()
	}
	g.forget(k)
	switch k {
	case heldRole:
		return g.oneOf("RESET ROLE", "SET ROLE NONE", "SET SESSION ROLE NONE", "SELECT set_config('role', 'none', false)")
	case heldTemp:
		g.forgetObjects(sessionTempTables...)
		return g.oneOf("DISCARD TEMP", "DISCARD TEMPORARY")
	case heldCursor:
		g.forgetObjects(sessionCursors...)
		return "CLOSE ALL"
	default:
		g.forgetObjects(sessionStatements...)
		return g.oneOf("DEALLOCATE ALL", "DEALLOCATE PREPARE ALL")
	}
}

// discardAll is DISCARD ALL: it releases everything outside a transaction
// and fails (25001) inside one.
func (g *sessionScriptGen) discardAll() string {
	if !g.inTx {
		g.held = [heldKinds]bool{}
		g.objects = map[string]bool{}
	}
	return "DISCARD ALL"
}

// sessionSettings are the settings the scripts change; the custom one is
// last.
var sessionSettings = []string{"search_path", "statement_timeout", "TimeZone", "DateStyle", "application_name", "work_mem", "sd.flag"}

// value is a value for setting name as SET writes it and as set_config
// takes it. Timeouts are long enough never to fire.
func (g *sessionScriptGen) value(name string) (sql, plain string) {
	g.seq++
	var vs [][2]string
	switch name {
	case "search_path":
		vs = [][2]string{{"sd_a, public", "sd_a, public"}, {"public", "public"}, {"'sd_b', pg_catalog", "sd_b, pg_catalog"}, {`"$user", public`, `"$user", public`}}
	case "statement_timeout":
		vs = [][2]string{{"'45s'", "45s"}, {"50000", "50000"}, {"'2min'", "2min"}, {"0", "0"}}
	case "TimeZone":
		vs = [][2]string{{"'UTC'", "UTC"}, {"'Asia/Kolkata'", "Asia/Kolkata"}, {"'Pacific/Chatham'", "Pacific/Chatham"}, {"'America/St_Johns'", "America/St_Johns"}}
	case "DateStyle":
		vs = [][2]string{{"'ISO, DMY'", "ISO, DMY"}, {"'SQL, MDY'", "SQL, MDY"}, {"German", "German"}, {"'Postgres, YMD'", "Postgres, YMD"}}
	case "application_name":
		v := fmt.Sprintf("sd-%d-%d", g.client, g.seq)
		vs = [][2]string{{"'" + v + "'", v}}
	case "work_mem":
		vs = [][2]string{{"'8MB'", "8MB"}, {"'12MB'", "12MB"}, {"4096", "4096"}, {"'64kB'", "64kB"}}
	default:
		v := fmt.Sprintf("v%d", g.seq)
		vs = [][2]string{{"'on'", "on"}, {"'" + v + "'", v}}
	}
	v := vs[g.rng.Intn(len(vs))]
	return v[0], v[1]
}

func (g *sessionScriptGen) setting() string {
	name := sessionSettings[g.rng.Intn(len(sessionSettings))]
	sql, plain := g.value(name)
	if name == "TimeZone" && g.rng.Intn(3) == 0 {
		return g.oneOf("SET TIME ZONE "+sql, "SET TIME ZONE LOCAL", "SET TIME ZONE DEFAULT", "RESET TIME ZONE", "SET LOCAL TIME ZONE "+sql, "SET SESSION TIME ZONE "+sql)
	}
	switch n := g.rng.Intn(100); {
	case n < 25:
		return fmt.Sprintf("SET %s %s %s", name, g.oneOf("=", "TO"), sql)
	case n < 32:
		return fmt.Sprintf("SET SESSION %s = %s", name, sql)
	case n < 45:
		return fmt.Sprintf("SET LOCAL %s TO %s", name, sql)
	case n < 56:
		return "RESET " + name
	case n < 63:
		return fmt.Sprintf("SET %s TO DEFAULT", name)
	case n < 69:
		return fmt.Sprintf("SET %s = DEFAULT", name)
	case n < 72:
		g.localDefault = g.localDefault || g.inTx
		return fmt.Sprintf("SET LOCAL %s TO DEFAULT", name)
	case n < 78:
		if g.localDefault {
			return "RESET " + name
		}
		return "RESET ALL"
	case n < 89:
		return fmt.Sprintf("SELECT set_config('%s', '%s', false)", name, plain)
	default:
		return fmt.Sprintf("SELECT set_config('%s', '%s', true)", name, plain)
	}
}

func (g *sessionScriptGen) begin() string {
	g.inTx, g.txSteps, g.savepoints = true, 0, nil
	return g.oneOf("BEGIN", "BEGIN", "START TRANSACTION", "BEGIN ISOLATION LEVEL REPEATABLE READ")
}

func (g *sessionScriptGen) transaction() string {
	if g.inTx {
		if g.rng.Intn(8) == 0 {
			return "BEGIN" // a warning; still the same transaction
		}
		return g.endTx()
	}
	if g.rng.Intn(8) == 0 {
		return g.oneOf("COMMIT", "ROLLBACK") // a warning outside a transaction
	}
	return g.begin()
}

func (g *sessionScriptGen) savepoint() string {
	if len(g.savepoints) == 0 || g.rng.Intn(3) == 0 {
		sp := g.oneOf("sp_a", "sp_b")
		g.savepoints = append(g.savepoints, sp)
		return "SAVEPOINT " + sp
	}
	sp := g.savepoints[g.rng.Intn(len(g.savepoints))]
	if g.rng.Intn(4) == 0 {
		sp = g.oneOf("sp_a", "sp_b")
	}
	return g.oneOf("ROLLBACK TO SAVEPOINT "+sp, "ROLLBACK TO "+sp, "RELEASE SAVEPOINT "+sp, "RELEASE "+sp)
}

func (g *sessionScriptGen) role() string {
	r := sessionMemberRoles[g.rng.Intn(len(sessionMemberRoles))]
	switch n := g.rng.Intn(100); {
	case n < 30:
		g.hold(heldRole)
		return g.oneOf("SET ROLE "+r, "SET SESSION ROLE "+r, "SET ROLE '"+r+"'")
	case n < 40:
		g.hold(heldRole)
		return fmt.Sprintf("SELECT set_config('role', '%s', false)", r)
	case n < 52:
		return "SET LOCAL ROLE " + r
	case n < 58:
		return fmt.Sprintf("SELECT set_config('role', '%s', true)", r)
	default:
		g.forget(heldRole)
		return g.oneOf("RESET ROLE", "SET ROLE NONE", "SET ROLE TO DEFAULT", "SELECT set_config('role', 'none', false)")
	}
}

func (g *sessionScriptGen) prepared() string {
	switch n := g.rng.Intn(100); {
	case n < 30:
		g.hold(heldPrepared)
		name := g.oneOf(sessionStatements...)
		g.objects[name] = true
		if name == "stmt_one" {
			return "PREPARE stmt_one AS SELECT 1 AS one"
		}
		return "PREPARE stmt_two(int) AS SELECT $1 * 2 AS twice"
	case n < 65:
		if g.name(sessionStatements...) == "stmt_one" {
			return "EXECUTE stmt_one"
		}
		return "EXECUTE stmt_two(21)"
	case n < 85:
		name := g.name(sessionStatements...)
		g.forgetObjects(name)
		return g.oneOf("DEALLOCATE ", "DEALLOCATE PREPARE ") + name
	default:
		g.forget(heldPrepared)
		g.forgetObjects(sessionStatements...)
		return "DEALLOCATE ALL"
	}
}

func (g *sessionScriptGen) temp() string {
	switch n := g.rng.Intn(100); {
	case n < 25:
		g.hold(heldTemp)
		name := g.oneOf(sessionTempTables...)
		g.objects[name] = true
		if name == "tmp_one" {
			return "CREATE TEMP TABLE tmp_one (a int)"
		}
		return "CREATE TEMPORARY TABLE tmp_two AS SELECT 2 AS b"
	case n < 32:
		return "CREATE TEMP TABLE tmp_commit_drop (a int) ON COMMIT DROP"
	case n < 60:
		if g.name(sessionTempTables...) == "tmp_one" {
			return g.oneOf("INSERT INTO tmp_one VALUES (1)", "SELECT count(*) FROM tmp_one")
		}
		return g.oneOf("SELECT b FROM tmp_two", "SELECT count(*) FROM pg_temp.tmp_two")
	case n < 85:
		name := g.name(sessionTempTables...)
		g.forgetObjects(name)
		return g.oneOf("DROP TABLE ", "DROP TABLE IF EXISTS ") + name
	default:
		g.forget(heldTemp)
		g.forgetObjects(sessionTempTables...)
		return "DISCARD TEMP"
	}
}

func (g *sessionScriptGen) cursor() string {
	switch n := g.rng.Intn(100); {
	case n < 25:
		g.hold(heldCursor)
		name := g.oneOf("cur_hold", "cur_scroll")
		g.objects[name] = true
		if name == "cur_hold" {
			return "DECLARE cur_hold CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 5) g"
		}
		return "DECLARE cur_scroll SCROLL CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 5) g"
	case n < 35:
		if g.inTx {
			g.objects["cur_tx"] = true
		}
		return "DECLARE cur_tx CURSOR FOR SELECT g FROM generate_series(1, 3) g"
	case n < 65:
		name := g.name(sessionCursors...)
		return g.oneOf("FETCH 1 FROM ", "FETCH NEXT FROM ", "MOVE 1 IN ", "FETCH 2 FROM ") + name
	case n < 85:
		name := g.name(sessionCursors...)
		g.forgetObjects(name)
		return "CLOSE " + name
	default:
		g.forget(heldCursor)
		g.forgetObjects(sessionCursors...)
		return "CLOSE ALL"
	}
}

func (g *sessionScriptGen) discard() string {
	switch n := g.rng.Intn(100); {
	case n < 40:
		return g.discardAll()
	case n < 70:
		return "DISCARD PLANS"
	case n < 90:
		g.forget(heldTemp)
		g.forgetObjects(sessionTempTables...)
		return "DISCARD TEMP"
	default:
		return "DISCARD SEQUENCES"
	}
}

// read reads a setting back in the statement's own protocol. Not the
// custom one: where a direct session has it undefined (NULL, or 42704 from
// SHOW) lockpool may have it defined as an empty string, a difference its
// README documents (PostgreSQL cannot remove a custom setting).
func (g *sessionScriptGen) read() string {
	name := sessionSettings[g.rng.Intn(len(sessionSettings)-1)]
	return g.oneOf("SHOW "+name, fmt.Sprintf("SELECT current_setting('%s', true)", name), "SELECT current_user, session_user", "SELECT 1")
}

// several is a step of several statements, sent as one Query or as one
// pipeline: outside a transaction block they run in one implicit
// transaction, which a failing statement rolls back as a whole.
func (g *sessionScriptGen) several() string {
	g.batch = multiStatementQuery
	if g.rng.Intn(5) < 2 {
		g.batch = pipelineOfStatements
	}
	name := sessionSettings[g.rng.Intn(len(sessionSettings))]
	sql, _ := g.value(name)
	set := fmt.Sprintf("SET %s = %s", name, sql)
	switch n := g.rng.Intn(100); {
	case n < 20:
		return set + "; SELECT 1/0"
	case n < 30:
		return fmt.Sprintf("SET LOCAL %s = %s; SHOW %s", name, sql, name)
	case n < 40 && !g.localDefault:
		return "RESET ALL; SELECT current_setting('TimeZone'), current_setting('DateStyle')"
	case n < 50:
		return set + "; RESET " + name
	case n < 60:
		if g.inTx && g.localDefault {
			return set + "; SAVEPOINT sp_m; RESET " + name + "; ROLLBACK TO SAVEPOINT sp_m"
		}
		if g.inTx {
			return set + "; SAVEPOINT sp_m; RESET ALL; ROLLBACK TO SAVEPOINT sp_m"
		}
		return "BEGIN; " + set + "; " + g.oneOf("COMMIT", "ROLLBACK")
	case n < 68:
		g.hold(heldRole)
		r := sessionMemberRoles[g.rng.Intn(len(sessionMemberRoles))]
		return "SET ROLE " + r + "; SELECT current_user"
	case n < 76:
		g.hold(heldTemp)
		g.objects["tmp_one"] = true
		return "CREATE TEMP TABLE tmp_one (a int); " + g.oneOf("INSERT INTO tmp_one VALUES (7)", "SELECT 1/0")
	case n < 84:
		g.hold(heldCursor)
		g.objects["cur_hold"] = true
		return "DECLARE cur_hold CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 5) g; FETCH 2 FROM cur_hold"
	case n < 92:
		return set + "; DISCARD ALL" // 25001: the implicit transaction is a block
	default:
		// Not the custom setting: reading it undefined is 42704 (see read).
		name = sessionSettings[g.rng.Intn(len(sessionSettings)-1)]
		return fmt.Sprintf("SELECT set_config('%s', current_setting('%s'), false); SET %s TO DEFAULT", name, name, name)
	}
}

// newSessionClients makes the twelve clients of seed: startup parameters
// and scripts of steps statements (and the few that end them).
func newSessionClients(seed int64, steps int) []sessionClient {
	rng := rand.New(rand.NewSource(seed))
	// Startup values: [connection parameter, value in options].
	startup := map[string][][2]string{
		"DateStyle":         {{"SQL, DMY", `SQL,\ DMY`}, {"German", "German"}, {"ISO, YMD", "ISO,YMD"}},
		"TimeZone":          {{"Asia/Kathmandu", "Asia/Kathmandu"}, {"Australia/Eucla", "Australia/Eucla"}},
		"search_path":       {{"sd_start, public", `sd_start,\ public`}, {"pg_catalog, public", "pg_catalog,public"}},
		"statement_timeout": {{"41s", "41s"}, {"3min", "3min"}},
		"work_mem":          {{"6MB", "6MB"}},
		"sd.flag":           {{"from-startup", "from-startup"}},
	}
	names := []string{"DateStyle", "TimeZone", "search_path", "statement_timeout", "work_mem", "sd.flag"}
	clients := make([]sessionClient, sessionClients)
	for i := range clients {
		c := sessionClient{params: map[string]string{"application_name": fmt.Sprintf("sd-%d", i)}}
		var opts []string
		for _, n := range names {
			if rng.Intn(100) >= 40 {
				continue
			}
			vs := startup[n]
			v := vs[rng.Intn(len(vs))]
			if rng.Intn(2) == 0 {
				c.params[n] = v[0]
			} else {
				opts = append(opts, "-c "+n+"="+v[1])
			}
		}
		c.options = strings.Join(opts, " ")
		c.script = newSessionScript(seed, i, steps)
		clients[i] = c
	}
	return clients
}

// sessionConn is a client connection that records the notices of the
// statement running.
type sessionConn struct {
	conn    *pgx.Conn
	notices []string
}

func connectSession(ctx context.Context, dsn string, c sessionClient) (*sessionConn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	for k, v := range c.params {
		cfg.RuntimeParams[k] = v
	}
	if c.options != "" {
		cfg.RuntimeParams["options"] = c.options
	}
	sc := &sessionConn{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		sc.notices = append(sc.notices, n.SeverityUnlocalized+" "+n.Code)
	}
	sc.conn, err = pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return sc, nil
}

// sessionError is how an error is recorded: the SQLSTATE, marked when
// lockpool made it, or the error's text when it is not PostgreSQL's.
func sessionError(err error) string {
	if pe := testenv.PgError(err); pe != nil {
		s := "ERROR " + pe.Code
		if strings.HasPrefix(pe.Message, "lockpool:") {
			s += " (" + pe.Message + ")"
		}
		return s
	}
	return "ERROR " + err.Error()
}

// query runs sql in mode and returns its command tag and rows, or its
// error.
func (sc *sessionConn) query(ctx context.Context, sql string, mode pgx.QueryExecMode) (string, [][]string) {
	rows, err := sc.conn.Query(ctx, sql, mode)
	if err != nil {
		return sessionError(err), nil
	}
	var out [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			rows.Close()
			return sessionError(err), nil
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			if v == nil {
				row[i] = "NULL"
			} else {
				row[i] = fmt.Sprint(v)
			}
		}
		out = append(out, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return sessionError(err), nil
	}
	return rows.CommandTag().String(), out
}

func (sc *sessionConn) observe(ctx context.Context) []string {
	tag, rows := sc.query(ctx, sessionObserve, pgx.QueryExecModeSimpleProtocol)
	if len(rows) != 1 {
		return []string{tag}
	}
	return rows[0]
}

// batch sends a step's statements as one Query or as one pipeline and
// returns every statement's command tag and rows, or its error.
func (sc *sessionConn) batch(ctx context.Context, st sessionStep) string {
	var mrr *pgconn.MultiResultReader
	if st.batch == multiStatementQuery {
		mrr = sc.conn.PgConn().Exec(ctx, st.sql)
	} else {
		b := &pgconn.Batch{}
		for _, q := range strings.Split(st.sql, "; ") {
			b.ExecParams(q, nil, nil, nil, nil)
		}
		mrr = sc.conn.PgConn().ExecBatch(ctx, b)
	}
	results, err := mrr.ReadAll()
	var parts []string
	failed := false
	for _, r := range results {
		if r.Err != nil {
			parts = append(parts, sessionError(r.Err))
			failed = true
			continue
		}
		p := r.CommandTag.String()
		if len(r.Rows) > 0 {
			rows := make([][]string, len(r.Rows))
			for i, row := range r.Rows {
				for _, v := range row {
					if v == nil {
						rows[i] = append(rows[i], "NULL")
					} else {
						rows[i] = append(rows[i], string(v))
					}
				}
			}
			p += fmt.Sprintf(" %v", rows)
		}
		parts = append(parts, p)
	}
	if err != nil && !failed {
		parts = append(parts, sessionError(err))
	}
	return strings.Join(parts, "; ")
}

func (sc *sessionConn) step(ctx context.Context, st sessionStep) sessionRecord {
	sc.notices = sc.notices[:0]
	var outcome string
	if st.batch != singleStatement {
		outcome = sc.batch(ctx, st)
	} else {
		tag, rows := sc.query(ctx, st.sql, st.mode)
		outcome = tag
		if len(rows) > 0 {
			outcome += fmt.Sprintf(" %v", rows)
		}
	}
	if len(sc.notices) > 0 {
		outcome += " notices " + strings.Join(sc.notices, ",")
	}
	rec := sessionRecord{outcome: outcome}
	rec.observed = sc.observe(ctx)
	var rep []string
	for _, p := range sessionReported {
		rep = append(rep, p+"="+sc.conn.PgConn().ParameterStatus(p))
	}
	rec.reported = strings.Join(rep, " ")
	rec.txStatus = string(sc.conn.PgConn().TxStatus())
	return rec
}

// sessionStall is what runSessionClients tells its caller when no
// statement has finished for sessionStallAfter: the statement each client
// is at (-1: done) and the backend key (lockpool's client id) of each.
type sessionStall struct {
	at      time.Duration
	current []int
	keys    []uint32
}

// sessionStallAfter is how long without a finished statement counts as a
// stall worth a snapshot (a diagnostic only: nothing waits for it).
const sessionStallAfter = 3 * time.Second

// runSessionClients connects every client to dsn, then runs all scripts at
// once, each client in its own goroutine, and returns each client's
// records. onStall, if not nil, is called once per stall.
func runSessionClients(ctx context.Context, t *testing.T, dsn string, clients []sessionClient, seed int64, onStall func(sessionStall)) [][]sessionRecord {
	t.Helper()
	conns := make([]*sessionConn, len(clients))
	keys := make([]uint32, len(clients))
	out := make([][]sessionRecord, len(clients))
	for i, c := range clients {
		sc, err := connectSession(ctx, dsn, c)
		if err != nil {
			t.Errorf("client %d (%s): connect: %v", i, c.startup(), err)
			continue
		}
		conns[i], keys[i] = sc, sc.conn.PgConn().PID()
	}
	var wg sync.WaitGroup
	var finished atomic.Int64
	current := make([]atomic.Int64, len(clients))
	began := time.Now()
	for i, c := range clients {
		current[i].Store(-1)
		if conns[i] == nil {
			continue
		}
		wg.Add(1)
		go func(i int, c sessionClient, sc *sessionConn) {
			defer wg.Done()
			defer current[i].Store(-1)
			defer sc.conn.Close(context.Background())
			rng := rand.New(rand.NewSource(seed + int64(i)))
			recs := make([]sessionRecord, 0, len(c.script))
			for j, st := range c.script {
				if sc.conn.IsClosed() {
					recs = append(recs, sessionRecord{outcome: "not run: connection closed"})
					continue
				}
				current[i].Store(int64(j))
				at := time.Since(began)
				rec := sc.step(ctx, st)
				rec.at, rec.took = at, time.Since(began)-at
				recs = append(recs, rec)
				finished.Add(1)
				if rng.Intn(3) == 0 {
					runtime.Gosched()
				}
			}
			out[i] = recs
		}(i, c, conns[i])
	}
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if onStall == nil {
			return
		}
		tick := time.NewTicker(sessionStallAfter / 4)
		defer tick.Stop()
		last, since, reported := finished.Load(), time.Now(), false
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if n := finished.Load(); n != last {
				last, since, reported = n, time.Now(), false
				continue
			}
			if !reported && time.Since(since) >= sessionStallAfter {
				reported = true
				st := sessionStall{at: time.Since(began), keys: keys, current: make([]int, len(clients))}
				for i := range current {
					st.current[i] = int(current[i].Load())
				}
				onStall(st)
			}
		}
	}()
	wg.Wait()
	close(done)
	<-watched
	return out
}

// logSessionStall logs what every client was doing in a stall through l:
// its statement, lockpool's view of it (/debug/clients: state, pinned,
// server connection) and its state before that statement on the direct
// run (transaction status, what pins).
func logSessionStall(t *testing.T, l *lp, clients []sessionClient, direct [][]sessionRecord, st sessionStall) {
	rows := map[uint32]console.ClientRow{}
	if code, body := l.get("/debug/clients"); code == 200 {
		var rs []console.ClientRow
		if err := json.Unmarshal([]byte(body), &rs); err == nil {
			for _, r := range rs {
				rows[r.ID] = r
			}
		}
	}
	var s strings.Builder
	fmt.Fprintf(&s, "no statement finished for %v at +%v; the clients:\n", sessionStallAfter, st.at.Round(time.Millisecond))
	for i, j := range st.current {
		if j < 0 {
			fmt.Fprintf(&s, "  client %d: done\n", i)
			continue
		}
		r, ok := rows[st.keys[i]]
		view := "not listed"
		if ok {
			backend := "none"
			if r.BackendPID != nil {
				backend = strconv.Itoa(int(*r.BackendPID))
			}
			view = fmt.Sprintf("state %s, pinned %v %s, server connection %s", r.State, r.Pinned, r.PinReason, backend)
		}
		before := "at its start"
		if j > 0 && j-1 < len(direct[i]) {
			p := direct[i][j-1]
			before = "tx " + p.txStatus + " | " + formatObserved(p.observed)
		}
		fmt.Fprintf(&s, "  client %d at step %d %v\n    lockpool: %s\n    direct before it: %s\n", i, j, clients[i].script[j], view, before)
	}
	t.Log(s.String())
}

// sessionDivergence is one statement whose records differ.
type sessionDivergence struct {
	client, step int
	fields       []string
	want, got    sessionRecord
}

func sessionDiffer(want, got sessionRecord) []string {
	var fields []string
	if want.outcome != got.outcome {
		fields = append(fields, "outcome")
	}
	if len(want.observed) != len(got.observed) {
		fields = append(fields, "observation")
	} else {
		for i := range want.observed {
			if want.observed[i] != got.observed[i] {
				fields = append(fields, sessionObserved[i])
			}
		}
	}
	if want.reported != got.reported {
		fields = append(fields, "reported")
	}
	if want.txStatus != got.txStatus {
		fields = append(fields, "transaction status")
	}
	return fields
}

func compareSessionRuns(want, got [][]sessionRecord) []sessionDivergence {
	var ds []sessionDivergence
	for c := range want {
		for s := range want[c] {
			g := sessionRecord{outcome: "not run"}
			if s < len(got[c]) {
				g = got[c][s]
			}
			if f := sessionDiffer(want[c][s], g); len(f) > 0 {
				ds = append(ds, sessionDivergence{client: c, step: s, fields: f, want: want[c][s], got: g})
			}
		}
	}
	return ds
}

func formatObserved(o []string) string {
	if len(o) != len(sessionObserved) {
		return strings.Join(o, " ")
	}
	parts := make([]string, len(o))
	for i, v := range o {
		parts[i] = sessionObserved[i] + "=" + strconv.Quote(v)
	}
	return strings.Join(parts, " ")
}

func (d sessionDivergence) format(clients []sessionClient, a, b string) string {
	c := clients[d.client]
	var s strings.Builder
	fmt.Fprintf(&s, "client %d (%s), step %d: %v\n", d.client, c.startup(), d.step, c.script[d.step])
	fmt.Fprintf(&s, "    differs in: %s\n", strings.Join(d.fields, ", "))
	if len(d.want.observed) == len(sessionObserved) && len(d.got.observed) == len(sessionObserved) {
		for i := range d.want.observed {
			if d.want.observed[i] != d.got.observed[i] {
				fmt.Fprintf(&s, "    %s: %s %q, %s %q\n", sessionObserved[i], a, d.want.observed[i], b, d.got.observed[i])
			}
		}
	}
	fmt.Fprintf(&s, "    %-9s outcome %s | %s | %s | tx %s\n", a+":", d.want.outcome, formatObserved(d.want.observed), d.want.reported, d.want.txStatus)
	fmt.Fprintf(&s, "    %-9s outcome %s | %s | %s | tx %s (sent at +%v, took %v)\n", b+":", d.got.outcome, formatObserved(d.got.observed), d.got.reported,
		d.got.txStatus, d.got.at.Round(time.Millisecond), d.got.took.Round(time.Millisecond))
	from := d.step - sessionRecentSteps
	if from < 0 {
		from = 0
	}
	s.WriteString("    statements before:")
	if from == d.step {
		s.WriteString(" none")
	}
	for j := from; j < d.step; j++ {
		fmt.Fprintf(&s, "\n      %d %v", j, c.script[j])
	}
	return s.String()
}

// summarizeSessionDivergences is a readable report: counts by field and by
// client, each client's first divergence (later ones often follow from it),
// then more up to sessionShownInFull.
func summarizeSessionDivergences(ds []sessionDivergence, clients []sessionClient, a, b string) string {
	byField := map[string]int{}
	byClient := map[int]int{}
	for _, d := range ds {
		for _, f := range d.fields {
			byField[f]++
		}
		byClient[d.client]++
	}
	var s strings.Builder
	fmt.Fprintf(&s, "%d divergent statements (%s vs %s) in %d of %d clients\n", len(ds), a, b, len(byClient), len(clients))
	fields := make([]string, 0, len(byField))
	for f := range byField {
		fields = append(fields, f)
	}
	sort.Slice(fields, func(i, j int) bool { return byField[fields[i]] > byField[fields[j]] })
	s.WriteString("  by field:")
	for _, f := range fields {
		fmt.Fprintf(&s, " %s=%d", f, byField[f])
	}
	s.WriteString("\n")
	shown := map[int]bool{}
	firstOf := map[int]bool{}
	for i, d := range ds {
		if !firstOf[d.client] {
			firstOf[d.client] = true
			shown[i] = true
		}
	}
	for i := range ds {
		if len(shown) >= sessionShownInFull {
			break
		}
		shown[i] = true
	}
	n := 0
	s.WriteString("first divergence of each client, then further ones:\n")
	for i, d := range ds {
		if shown[i] && n < sessionShownInFull+len(clients) {
			s.WriteString("  " + d.format(clients, a, b) + "\n")
			n++
		}
	}
	if len(ds) > n {
		fmt.Fprintf(&s, "  … and %d more\n", len(ds)-n)
	}
	return s.String()
}

// sessionSeeds is LOCKPOOL_STATEDIFF_SEEDS: a comma list of seeds, or
// random:N; the CI seed when unset.
func sessionSeeds(t *testing.T) []int64 {
	v := strings.TrimSpace(os.Getenv("LOCKPOOL_STATEDIFF_SEEDS"))
	if v == "" {
		return []int64{sessionCISeed}
	}
	if n, ok := strings.CutPrefix(v, "random:"); ok {
		k, err := strconv.Atoi(n)
		if err != nil || k < 1 {
			t.Fatalf("LOCKPOOL_STATEDIFF_SEEDS=%q: want random:N with N ≥ 1", v)
		}
		rng := rand.New(rand.NewSource(time.Now().UnixNano()))
		seeds := make([]int64, k)
		for i := range seeds {
			seeds[i] = rng.Int63n(1 << 40)
		}
		return seeds
	}
	var seeds []int64
	for _, f := range strings.Split(v, ",") {
		s, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("LOCKPOOL_STATEDIFF_SEEDS=%q: %v", v, err)
		}
		seeds = append(seeds, s)
	}
	return seeds
}

// sessionSteps is LOCKPOOL_STATEDIFF_STEPS, else sessionLongSteps with
// LOCKPOOL_LONG, else sessionCISteps.
func sessionSteps(t *testing.T) int {
	if v := os.Getenv("LOCKPOOL_STATEDIFF_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("LOCKPOOL_STATEDIFF_STEPS=%q: want a positive number", v)
		}
		return n
	}
	if testenv.Long() {
		return sessionLongSteps
	}
	return sessionCISteps
}

// ensureSessionRoles makes sessionRole and the roles it may SET ROLE to.
func ensureSessionRoles(t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	testenv.EnsureRole(t, c, sessionRole)
	var b strings.Builder
	b.WriteString("DO $$BEGIN\n")
	for _, r := range sessionMemberRoles {
		fmt.Fprintf(&b, "  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN CREATE ROLE %s NOLOGIN; END IF;\n", r, r)
	}
	b.WriteString("END$$;\n")
	fmt.Fprintf(&b, "GRANT %s TO %s", strings.Join(sessionMemberRoles, ", "), sessionRole)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Exec(ctx, "postgres", b.String()); err != nil {
		t.Fatal(err)
	}
}

func TestSessionStateDifferential(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Require(t)
	ensureSessionRoles(t, cluster)
	steps := sessionSteps(t)
	seeds := sessionSeeds(t)
	t.Logf("seeds %v, %d statements per client (replay one with LOCKPOOL_STATEDIFF_SEEDS=<seed> LOCKPOOL_STATEDIFF_STEPS=%d)", seeds, steps, steps)
	directDSN := cluster.DSN(sessionRole, appPassword, sessionDB)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			testSessionStateSeed(t, directDSN, seed, steps)
		})
	}
}

func testSessionStateSeed(t *testing.T, directDSN string, seed int64, steps int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+time.Duration(steps)*2*time.Second)
	defer cancel()
	clients := newSessionClients(seed, steps)

	start := time.Now()
	direct := runSessionClients(ctx, t, directDSN, clients, seed, nil)
	again := runSessionClients(ctx, t, directDSN, clients, seed, nil)
	if t.Failed() {
		t.FailNow()
	}
	if ds := compareSessionRuns(direct, again); len(ds) > 0 {
		t.Errorf("seed %d: the oracle disagrees with itself (a test problem, not lockpool's):\n%s", seed,
			summarizeSessionDivergences(ds, clients, "direct", "direct 2"))
	}
	directTime := time.Since(start)

	app := defaultApp()
	app.name, app.user, app.db = "statediff", sessionRole, sessionDB
	app.max, app.pinned, app.advisory, app.state, app.wait, app.mode = sessionBudget, sessionPinned, "pin", "pin", sessionWait, "transaction"
	l := startLockpool(t, 10, "", app)
	start = time.Now()
	pooled := runSessionClients(ctx, t, l.DSN(sessionRole, sessionDB), clients, seed, func(st sessionStall) {
		logSessionStall(t, l, clients, direct, st)
	})
	pooledTime := time.Since(start)

	var waits []string
	for c, recs := range pooled {
		for s, r := range recs {
			if strings.HasPrefix(r.outcome, "ERROR 53300") || (len(r.observed) == 1 && strings.HasPrefix(r.observed[0], "ERROR 53300")) {
				waits = append(waits, fmt.Sprintf("client %d step %d %v", c, s, clients[c].script[s]))
			}
		}
	}
	t.Logf("seed %d: %d clients × %d statements: direct (twice) %v, through lockpool %v; waits that ended in 53300: %d",
		seed, len(clients), steps, directTime.Round(time.Millisecond), pooledTime.Round(time.Millisecond), len(waits))
	for _, w := range waits {
		t.Logf("  53300 at %s", w)
	}

	t.Logf("seed %d: the oracle's statements: %s", seed, sessionCoverage(direct))
	app1 := map[string]string{"app": app.name}
	t.Logf("seed %d: lockpool: %v pins, pin slot requests %v immediate / %v waited / %v timed out, %v requests for a server connection (%v timed out)",
		seed, l.metric("lockpool_pins_total", app1),
		l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "immediate"}),
		l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "waited"}),
		l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "timeout"}),
		l.metric("lockpool_pool_wait_seconds", app1), l.metric("lockpool_pool_wait_timeouts_total", app1))

	if v := os.Getenv("LOCKPOOL_STATEDIFF_TRACE"); v != "" {
		traceSessionClients(t, v, clients, direct, pooled)
	}

	ds := compareSessionRuns(direct, pooled)
	fresh := checkFreshSessions(ctx, t, l, directDSN)
	if len(ds) > 0 || len(fresh) > 0 {
		var s strings.Builder
		fmt.Fprintf(&s, "seed %d (replay: LOCKPOOL_STATEDIFF_SEEDS=%d LOCKPOOL_STATEDIFF_STEPS=%d): lockpool differs from a direct connection\n", seed, seed, steps)
		if len(ds) > 0 {
			s.WriteString(summarizeSessionDivergences(ds, clients, "direct", "lockpool"))
		}
		if len(waits) > 0 {
			fmt.Fprintf(&s, "(%d waits ended in 53300; the statements after one differ as a consequence)\n", len(waits))
		}
		for _, f := range fresh {
			s.WriteString(f + "\n")
		}
		t.Error(s.String())
	}
}

// checkFreshSessions compares what fresh clients through lockpool see
// (only application_name given) with a fresh direct session: first as
// many clients as the budget, each in a transaction so that each is on
// its own server connection, then the same clients outside a transaction
// and two more. It returns the differences.
func checkFreshSessions(ctx context.Context, t *testing.T, l *lp, directDSN string) []string {
	t.Helper()
	fresh := sessionClient{params: map[string]string{"application_name": "sd-fresh"}}
	d, err := connectSession(ctx, directDSN, fresh)
	if err != nil {
		t.Fatalf("fresh direct client: %v", err)
	}
	want := d.observe(ctx)
	_ = d.conn.Close(ctx)

	var out []string
	check := func(what string, got []string) {
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			var diff []string
			if len(got) == len(want) && len(want) == len(sessionObserved) {
				for i := range want {
					if want[i] != got[i] {
						diff = append(diff, fmt.Sprintf("%s: direct %q, lockpool %q", sessionObserved[i], want[i], got[i]))
					}
				}
			} else {
				diff = append(diff, fmt.Sprintf("direct %s, lockpool %s", formatObserved(want), formatObserved(got)))
			}
			out = append(out, fmt.Sprintf("a fresh client through lockpool (%s) does not see a fresh session's values: %s", what, strings.Join(diff, "; ")))
		}
	}
	var held []*sessionConn
	defer func() {
		for _, c := range held {
			_ = c.conn.Close(context.Background())
		}
	}()
	pids := map[string]bool{}
	for i := 0; i < sessionBudget; i++ {
		c, err := connectSession(ctx, l.DSN(sessionRole, sessionDB), fresh)
		if err != nil {
			out = append(out, fmt.Sprintf("fresh client %d: connect: %v", i, err))
			continue
		}
		held = append(held, c)
		if tag, _ := c.query(ctx, "BEGIN", pgx.QueryExecModeSimpleProtocol); tag != "BEGIN" {
			out = append(out, fmt.Sprintf("fresh client %d: BEGIN: %s", i, tag))
			continue
		}
		check(fmt.Sprintf("client %d in a transaction", i), c.observe(ctx))
		if _, rows := c.query(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol); len(rows) == 1 {
			pids[rows[0][0]] = true
		}
	}
	t.Logf("fresh clients in transactions were on %d server connections (budget %d)", len(pids), sessionBudget)
	for i, c := range held {
		if tag, _ := c.query(ctx, "COMMIT", pgx.QueryExecModeSimpleProtocol); tag != "COMMIT" {
			out = append(out, fmt.Sprintf("fresh client %d: COMMIT: %s", i, tag))
		}
	}
	for i, c := range held {
		check(fmt.Sprintf("client %d outside a transaction", i), c.observe(ctx))
	}
	for i := 0; i < 2; i++ {
		c, err := connectSession(ctx, l.DSN(sessionRole, sessionDB), fresh)
		if err != nil {
			out = append(out, fmt.Sprintf("extra fresh client %d: connect: %v", i, err))
			continue
		}
		held = append(held, c)
		check(fmt.Sprintf("extra client %d", i), c.observe(ctx))
	}
	return out
}

// sessionCoverage says what state the oracle's run went through: how many
// statements failed, ran in a failed transaction, or left a temporary
// table, a cursor, an SQL-prepared statement or another role in place.
func sessionCoverage(runs [][]sessionRecord) string {
	col := map[string]int{}
	for i, n := range sessionObserved {
		col[n] = i
	}
	var total, failed, aborted, temp, cursor, prepared, role int
	for _, recs := range runs {
		for _, r := range recs {
			total++
			if strings.Contains(r.outcome, "ERROR") {
				failed++
			}
			if len(r.observed) != len(sessionObserved) {
				if strings.HasPrefix(r.observed[0], "ERROR 25P02") {
					aborted++
				}
				continue
			}
			if r.observed[col["temp_tables"]] != "" {
				temp++
			}
			if r.observed[col["cursors"]] != "" {
				cursor++
			}
			if r.observed[col["prepared"]] != "" {
				prepared++
			}
			if r.observed[col["current_user"]] != r.observed[col["session_user"]] {
				role++
			}
		}
	}
	return fmt.Sprintf("%d in all, %d failed, %d left the transaction failed; after them a temporary table existed %d times, a cursor %d, an SQL-prepared statement %d, another role was current %d",
		total, failed, aborted, temp, cursor, prepared, role)
}

// traceSessionClients logs every statement and both records of the clients
// listed in spec (LOCKPOOL_STATEDIFF_TRACE: a comma list of client numbers,
// or "all"), for replaying a seed.
func traceSessionClients(t *testing.T, spec string, clients []sessionClient, direct, pooled [][]sessionRecord) {
	want := map[int]bool{}
	for _, f := range strings.Split(spec, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			want[n] = true
		}
	}
	for i, c := range clients {
		if spec != "all" && !want[i] {
			continue
		}
		var s strings.Builder
		fmt.Fprintf(&s, "client %d (%s):\n", i, c.startup())
		for j, st := range c.script {
			fmt.Fprintf(&s, "  %d %v\n", j, st)
			for _, side := range []struct {
				name string
				recs []sessionRecord
			}{{"direct", direct[i]}, {"lockpool", pooled[i]}} {
				if j < len(side.recs) {
					r := side.recs[j]
					fmt.Fprintf(&s, "      %-9s %s | %s | %s | tx %s (+%v, %v)\n", side.name+":", r.outcome, formatObserved(r.observed), r.reported,
						r.txStatus, r.at.Round(time.Millisecond), r.took.Round(time.Millisecond))
				}
			}
		}
		t.Log(s.String())
	}
}
