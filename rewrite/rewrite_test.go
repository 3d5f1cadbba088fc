package rewrite

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

type want struct {
	funcs   []Func
	lease   *LeaseCall
	mention bool
	fence   bool
	state   []StateChange
	sets    []SetCmd
	notify  []NotifyCall
	chans   []string   // src[Pos:End] of each ChannelsCalls span
	whole   *LeaseCall // ChannelsWhole
	views   []string   // src[Pos:End] of each PreparedViews reference, "+alias" appended when Aliased
	acts    []string   // the same for ActivityViews
	signal  *SignalCall
	stmts   int
	count   bool // check stmts
}

type tcase struct {
	name string
	sql  string
	want want
}

func fs(f ...Func) want { return want{funcs: f} }

func st(k StateKind, n string) want { return want{state: []StateChange{{Kind: k, Name: n}}} }

func sets(c ...SetCmd) want { return want{sets: c} }

func lease(fn string, args ...Arg) want { return want{lease: &LeaseCall{Func: fn, Args: args}} }

func sArg(v string) Arg     { return Arg{Kind: ArgString, Text: v} }
func nArg(v string) Arg     { return Arg{Kind: ArgNumber, Text: v} }
func pArg(n int) Arg        { return Arg{Kind: ArgParam, Param: n} }
func none() want            { return want{} }
func mention() want         { return want{mention: true} }
func fence() want           { return want{fence: true} }
func stmts(n int) want      { return want{stmts: n} }
func (w want) n(k int) want { w.stmts, w.count = k, true; return w }

// nt is a NOTIFY or pg_notify with known channel and payload.
func nt(ch, payload string) NotifyCall {
	return NotifyCall{Channel: ch, Payload: payload, Known: true, KnownPayload: true}
}

func notifies(c ...NotifyCall) want { return want{notify: c} }

func chans(text ...string) want { return want{chans: text} }

func views(text ...string) want { return want{views: text} }

func activity(text ...string) want { return want{acts: text} }

// viewTexts is sql[Pos:End] of each reference, "+alias" appended when Aliased.
func viewTexts(sql string, refs []ViewRef) []string {
	var out []string
	for _, v := range refs {
		text := sql[v.Pos:v.End]
		if v.Aliased {
			text += "+alias"
		}
		out = append(out, text)
	}
	return out
}

func (w want) wholeCh(alias string, star bool) want {
	w.whole = &LeaseCall{Func: "pg_listening_channels", Alias: alias, Star: star}
	return w
}

// sig is a whole-statement signal call.
func sig(fn, alias string, args ...Arg) want {
	return want{signal: &SignalCall{Func: fn, Args: args, Alias: alias}}
}

func (w want) star() want { w.signal.Star = true; return w }

func (w want) plus(o want) want {
	w.state = append(w.state, o.state...)
	w.notify = append(w.notify, o.notify...)
	w.chans = append(w.chans, o.chans...)
	return w
}

var (
	long70   = strings.Repeat("a", 35) + strings.Repeat("B", 35)
	long63   = strings.Repeat("a", 35) + strings.Repeat("b", 28)
	longUTF8 = strings.Repeat("x", 62) + "é" // 64 bytes; é straddles byte 63
)

var cases = []tcase{
	// --- advisory functions: positions and spellings
	{"plain", "select pg_advisory_lock(1)", fs(AdvisoryLock).n(1)},
	{"upper", "SELECT PG_ADVISORY_LOCK(1)", fs(AdvisoryLock)},
	{"mixed case", "Select Pg_Try_Advisory_Lock(42)", fs(TryAdvisoryLock)},
	{"all eleven", "select pg_advisory_lock(1), pg_advisory_lock_shared(1), pg_try_advisory_lock(1), pg_try_advisory_lock_shared(1), pg_advisory_xact_lock(1), pg_advisory_xact_lock_shared(1), pg_try_advisory_xact_lock(1), pg_try_advisory_xact_lock_shared(1), pg_advisory_unlock(1), pg_advisory_unlock_shared(1), pg_advisory_unlock_all()",
		fs(AdvisoryLock, AdvisoryLockShared, TryAdvisoryLock, TryAdvisoryLockShared, AdvisoryXactLock, AdvisoryXactLockShared, TryAdvisoryXactLock, TryAdvisoryXactLockShared, AdvisoryUnlock, AdvisoryUnlockShared, AdvisoryUnlockAll)},
	{"from clause", "SELECT * FROM pg_advisory_lock(7)", fs(AdvisoryLock)},
	{"case expr", "select case when $1 then pg_try_advisory_lock($2) else false end", fs(TryAdvisoryLock)},
	{"cte", "with x as (select pg_advisory_xact_lock(hashtext('job'))) select * from x", fs(AdvisoryXactLock)},
	{"subquery", "select 1 where exists (select pg_try_advisory_lock(id) from jobs)", fs(TryAdvisoryLock)},
	{"where clause", "select id from jobs where pg_try_advisory_lock(id) limit 1", fs(TryAdvisoryLock)},
	{"expression key", "select pg_advisory_lock(hashtext($1)::bigint)", fs(AdvisoryLock)},
	{"two keys", "select pg_advisory_lock(1, 2)", fs(AdvisoryLock)},
	{"quoted lower", `select "pg_advisory_lock"(1)`, fs(AdvisoryLock)},
	{"quoted upper is not", `select "PG_ADVISORY_LOCK"(1)`, none()},
	{"pg_catalog", "select pg_catalog.pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"pg_catalog upper", "select PG_CATALOG.PG_ADVISORY_UNLOCK(1)", fs(AdvisoryUnlock)},
	{"pg_catalog quoted", `select "pg_catalog"."pg_advisory_lock"(1)`, fs(AdvisoryLock)},
	{"pg_catalog spaced", "select pg_catalog . pg_advisory_lock (1)", fs(AdvisoryLock)},
	{"catalog.schema.func", "select mydb.pg_catalog.pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"quoted PG_CATALOG is another schema", `select "PG_CATALOG".pg_advisory_lock(1)`, none()},
	{"comment before paren", "select pg_advisory_lock /* why */ (1)", fs(AdvisoryLock)},
	{"line comment before paren", "select pg_advisory_lock -- x\n (1)", fs(AdvisoryLock)},
	{"line comment on name line", "select pg_advisory_lock -- x (\n (1)", fs(AdvisoryLock)},
	{"comment line between", "select pg_advisory_lock\n-- c\n\n(1)", fs(AdvisoryLock)},
	{"multi-line block comment before paren", "select \"pg_advisory_lock\" /* a\n b */\n(1)", fs(AdvisoryLock)},
	{"number glued to name", "select 1pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"param glued to name", "select $1pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"U prefix not unicode", "select U&pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"newline before paren", "select pg_advisory_lock\n\t(1)", fs(AdvisoryLock)},
	{"no paren", "select pg_advisory_lock from t", none()},
	{"no paren end", "select pg_advisory_lock", none()},
	{"longer prefix", "select my_pg_advisory_lock(1)", none()},
	{"longer suffix", "select pg_advisory_lock_foo(1)", none()},
	{"other schema", "select myschema.pg_advisory_lock(1)", none()},
	{"column ref", "select t.pg_advisory_lock from t", none()},
	{"in string", "select 'pg_advisory_lock(1)'", none()},
	{"in string with doubled quote", "select 'it''s pg_advisory_lock(1)'", none()},
	{"E string escaped quote", `select E'\' pg_advisory_lock(1) '`, none()},
	{"E string then call", `select E'\\', pg_advisory_lock(1)`, fs(AdvisoryLock)},
	{"plain backslash string then call", `select '\', pg_advisory_lock(1)`, fs(AdvisoryLock)},
	{"U& string", `select U&'pg_advisory_lock(1)'`, none()},
	{"U& identifier", `select U&"pg_\0061dvisory_lock"(1)`, fs(AdvisoryLock)},
	{"dollar string", "select $$pg_advisory_lock(1)$$", none()},
	{"tagged dollar containing $$", "select $a$ $$ pg_advisory_lock(1) $$ $a$", none()},
	{"param not dollar quote", "select $1, pg_advisory_lock($2), $3", fs(AdvisoryLock)},
	{"ident with dollars", "select a$$b, pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"line comment", "select 1 -- pg_advisory_lock(1)\n", none()},
	{"block comment", "select 1 /* pg_advisory_lock(1) */", none()},
	{"nested comment", "select 1 /* /* */ pg_advisory_lock(1) */", none()},
	{"after nested comment", "select /* a /* b */ c */ pg_advisory_lock(1)", fs(AdvisoryLock)},
	{"quoted ident containing name", `select "pg_advisory_lock(1)" from t`, none()},
	{"multi statement", "select 1; select pg_advisory_unlock(1); select 2", fs(AdvisoryUnlock).n(3)},
	{"duplicates kept", "select pg_advisory_lock(1), pg_advisory_lock(1)", fs(AdvisoryLock, AdvisoryLock)},
	{"xact only", "select pg_advisory_xact_lock(5)", fs(AdvisoryXactLock)},
	{"unterminated string", "select 'pg_advisory_lock(1)", none()},
	{"unterminated comment", "select 1 /* pg_advisory_lock(1)", none()},
	{"unterminated dollar", "select $x$ pg_advisory_lock(1)", none()},
	{"unterminated quoted ident", `select "pg_advisory_lock(1)`, none()},

	// --- DO blocks and function bodies
	{"DO dollar body", "DO $$ BEGIN PERFORM pg_advisory_lock(1); END $$", fs(AdvisoryLock).n(1)},
	{"DO tagged body", "do $body$ begin perform pg_try_advisory_lock(1); end $body$ language plpgsql", fs(TryAdvisoryLock)},
	{"DO quoted body", "DO 'BEGIN PERFORM pg_advisory_lock(1); END'", fs(AdvisoryLock)},
	{"DO quoted body with inner string", "DO 'BEGIN RAISE NOTICE ''pg_advisory_lock(1)''; END'", none()},
	{"DO E body escaped", `DO E'BEGIN PERFORM pg_\x61dvisory_lock(1); END'`, fs(AdvisoryLock)},
	{"DO language first", "DO LANGUAGE plpgsql $$ begin perform pg_advisory_unlock_all(); end $$", fs(AdvisoryUnlockAll)},
	{"DO body EXECUTE string", "DO $$ BEGIN EXECUTE 'select pg_advisory_lock(1)'; END $$", fs(AdvisoryLock)},
	{"DO body comment", "DO $$ BEGIN -- pg_advisory_lock(1)\n NULL; END $$", none()},
	{"DO body temp table", "DO $$ BEGIN CREATE TEMP TABLE t(x int); END $$", st(TempTable, "t")},
	{"create function body", "CREATE FUNCTION f() RETURNS void AS $$ SELECT pg_advisory_lock(1) $$ LANGUAGE sql", none()},
	{"create or replace procedure", "create or replace procedure p() language plpgsql as 'begin perform pg_advisory_lock(1); end'", none()},
	{"begin atomic body", "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT pg_advisory_lock(1); SELECT CASE WHEN true THEN 1 END; END; select 1", want{stmts: 2, count: true}},
	{"create function then call", "CREATE FUNCTION f() RETURNS void AS $$ select 1 $$ LANGUAGE sql; SELECT pg_advisory_lock(1)", fs(AdvisoryLock).n(2)},
	{"upsert do nothing", "insert into t values (1) on conflict do nothing", none()},

	// --- leases
	{"lease acquire", "SELECT lease_acquire('x', 120)", lease("lease_acquire", sArg("x"), nArg("120")).n(1)},
	{"lease acquire qualified params", "SELECT lockpool.lease_acquire($1, $2, $3)", lease("lease_acquire", pArg(1), pArg(2), pArg(3))},
	{"lease renew semicolon", "select lease_renew('x');  -- done\n", lease("lease_renew", sArg("x"))},
	{"lease release upper", "SELECT LEASE_RELEASE('job-1')", lease("lease_release", sArg("job-1"))},
	{"lease alias", "SELECT lease_acquire('x', 10) AS token", want{lease: &LeaseCall{Func: "lease_acquire", Args: []Arg{sArg("x"), nArg("10")}, Alias: "token"}}},
	{"lease bare alias", `SELECT lease_acquire('x', 10) "Token"`, want{lease: &LeaseCall{Func: "lease_acquire", Args: []Arg{sArg("x"), nArg("10")}, Alias: "Token"}}},
	{"lease list star", "SELECT * FROM lease_list()", want{lease: &LeaseCall{Func: "lease_list", Star: true}}},
	{"lease list plain", "select lockpool.lease_list()", lease("lease_list")},
	{"lease casts", "SELECT lease_acquire('x'::text, 1.5::numeric, -2::int)", lease("lease_acquire", Arg{Kind: ArgString, Text: "x", Cast: "text"}, Arg{Kind: ArgNumber, Text: "1.5", Cast: "numeric"}, Arg{Kind: ArgNumber, Text: "-2", Cast: "int"})},
	{"lease param casts", "SELECT lease_acquire($1::text, $2::float8, $3::double precision)", lease("lease_acquire", Arg{Kind: ArgParam, Param: 1, Cast: "text"}, Arg{Kind: ArgParam, Param: 2, Cast: "float8"}, Arg{Kind: ArgParam, Param: 3, Cast: "double precision"})},
	{"lease E string and null", `SELECT lease_acquire(E'a\'b', 10, NULL)`, lease("lease_acquire", sArg("a'b"), nArg("10"), Arg{Kind: ArgNull})},
	{"lease doubled quote", "SELECT lease_renew('it''s')", lease("lease_renew", sArg("it's"))},
	{"lease dollar string", "SELECT lease_renew($$x$$)", lease("lease_renew", sArg("x"))},
	{"lease quoted name", `SELECT "lease_renew"('x')`, lease("lease_renew", sArg("x"))},
	{"lease U& string arg", `SELECT lease_renew(U&'d\0061t\+000061')`, lease("lease_renew", sArg("data"))},
	{"lease in expression", "SELECT lease_acquire('x', 10) + 1", mention()},
	{"lease with from", "SELECT lease_acquire('x', 10) FROM t", mention()},
	{"lease multi statement", "SELECT lease_acquire('x', 10); SELECT 1", mention().n(2)},
	{"lease in where", "select 1 where lease_renew('x')", mention()},
	{"lease other schema", "SELECT other.lease_acquire('x', 10)", none()},
	{"lease column arg", "SELECT lease_acquire(name, 10) FROM jobs", mention()},
	{"lease in string", "SELECT 'lease_acquire(1)'", none()},
	{"lease in DO", "DO $$ BEGIN PERFORM lease_acquire('x', 1); END $$", mention()},
	{"lease fence", "SELECT lease_fence('x', 42); UPDATE t SET v = 1", fence()},
	{"lease fence qualified", "select lockpool.lease_fence($1, $2)", fence()},
	{"lease fence in comment", "select 1 -- lease_fence('x', 1)", none()},

	// --- session state
	{"listen", "LISTEN jobs", st(Listen, "jobs")},
	{"listen quoted", `listen "Jobs"`, st(Listen, "Jobs")},
	{"listen upper folds", "LISTEN Jobs;", st(Listen, "jobs")},
	{"unlisten star", "UNLISTEN *", st(Unlisten, "*")},
	{"unlisten name", "/* c */ unlisten jobs", st(Unlisten, "jobs")},
	{"listen in string", "select 'listen jobs'", none()},
	{"listen not at start", "select 1 as listen", none()},
	{"listen truncated to 63 bytes", "LISTEN " + long70, st(Listen, long63)},
	{"listen quoted truncated", `LISTEN "` + long70 + `"`, st(Listen, long70[:63])},
	{"listen truncated at a character", `LISTEN "` + longUTF8 + `"`, st(Listen, longUTF8[:62])},
	{"listen 63 bytes kept", "LISTEN " + long70[:63], st(Listen, long63)},
	{"listen quoted doubled quote", `LISTEN "a""B"`, st(Listen, `a"B`)},
	{"listen U& identifier", `LISTEN U&"\0041b"`, st(Listen, "Ab")},
	{"listen U& uescape", `LISTEN U&"!0041b!!" UESCAPE '!'`, st(Listen, "Ab!")},
	{"listen U& bad uescape", `LISTEN U&"!0041b" UESCAPE 'a'`, st(Listen, "")},
	{"listen non-ASCII not folded", "LISTEN ÄbC", st(Listen, "Äbc")},
	{"listen unreserved keyword", "listen Name", st(Listen, "name")},
	{"listen reserved keyword", "LISTEN user", st(Listen, "")},
	{"listen quoted reserved keyword", `LISTEN "user"`, st(Listen, "user")},
	{"listen string is no channel", "LISTEN 'jobs'", st(Listen, "")},
	{"listen qualified is no channel", "LISTEN a.b", st(Listen, "")},
	{"listen no channel", "LISTEN;", st(Listen, "")},
	{"listen empty quoted", `LISTEN ""`, st(Listen, "")},
	{"listen unterminated quoted", `LISTEN "jobs`, st(Listen, "")},
	{"listen two names", "LISTEN a b", st(Listen, "")},
	{"unlisten star and more", "UNLISTEN * a", st(Unlisten, "")},
	{"listen star", "LISTEN *", st(Listen, "")},
	{"listen after dollar and comment", "SELECT $$;LISTEN x$$; /* ; */ LISTEN y -- ;\n", st(Listen, "y").n(2)},
	{"listen in DO body", "DO $$BEGIN LISTEN a; END$$", st(Listen, "a")},
	{"listen in comment", "SELECT 1 /* ; LISTEN a */ -- ; LISTEN b", none()},

	// --- NOTIFY and pg_notify
	{"notify", "NOTIFY jobs", notifies(nt("jobs", "")).n(1)},
	{"notify payload", "NOTIFY jobs, 'hello'", notifies(nt("jobs", "hello"))},
	{"notify folds", "Notify Jobs , 'X';", notifies(nt("jobs", "X"))},
	{"notify quoted", `notify "Jobs", 'it''s'`, notifies(nt("Jobs", "it's"))},
	{"notify E payload", `NOTIFY a, E'x\ny\''`, notifies(nt("a", "x\ny'"))},
	{"notify dollar payload", "NOTIFY a, $p$x; NOTIFY b$p$", notifies(nt("a", "x; NOTIFY b")).n(1)},
	{"notify U& payload", `NOTIFY a, U&'!0041' UESCAPE '!'`, notifies(nt("a", "A"))},
	{"notify truncated", "NOTIFY " + long70 + ", ''", notifies(nt(long63, ""))},
	{"notify U& channel", `NOTIFY U&"\0041", 'p'`, notifies(nt("A", "p"))},
	{"notify cast payload rejected", "NOTIFY a, 'x'::text", notifies(NotifyCall{})},
	{"notify param payload rejected", "NOTIFY a, $1", notifies(NotifyCall{})},
	{"notify N payload rejected", "NOTIFY a, N'x'", notifies(NotifyCall{})},
	{"notify continued string", "NOTIFY a, 'x'\n'y'", notifies(NotifyCall{})},
	{"notify unterminated payload", "NOTIFY a, 'x", notifies(NotifyCall{})},
	{"notify reserved channel", "NOTIFY select", notifies(NotifyCall{})},
	{"notify no channel", "NOTIFY", notifies(NotifyCall{})},
	{"notify string channel", "NOTIFY 'a'", notifies(NotifyCall{})},
	{"notify in DO body", "DO $$BEGIN NOTIFY a; PERFORM pg_notify('a', 'b'); END$$", none()},
	{"notify in EXECUTE string", "DO $$BEGIN EXECUTE 'NOTIFY a'; END$$", none()},
	{"notify in string", "SELECT 'NOTIFY a', 'pg_notify(''a'', ''b'')'", none()},
	{"notify in comment", "/* NOTIFY a */ SELECT 1 -- ; NOTIFY b", none()},
	{"notify in dollar string", "SELECT $x$; NOTIFY a; pg_notify('a', 'b')$x$", none()},
	{"notify not at start", "SELECT 1 AS notify", none()},
	{"notify in rule action", "CREATE RULE r AS ON INSERT TO t DO ALSO NOTIFY t", none()},
	{"pg_notify", "SELECT pg_notify('Jobs', 'x')", notifies(nt("Jobs", "x"))},
	{"pg_notify upper", "SELECT PG_NOTIFY('a', 'b')", notifies(nt("a", "b"))},
	{"pg_notify qualified", "select pg_catalog.pg_notify('a', 'b')", notifies(nt("a", "b"))},
	{"pg_notify quoted qualified", `select "pg_catalog"."pg_notify"('a', 'b')`, notifies(nt("a", "b"))},
	{"pg_notify U& name", `select U&"pg_\006Eotify"('a', 'b')`, notifies(nt("a", "b"))},
	{"pg_notify quoted upper is not", `select "PG_NOTIFY"('a', 'b')`, none()},
	{"pg_notify other schema", "select app.pg_notify('a', 'b')", none()},
	{"pg_notify params", "SELECT pg_notify($1, $2)", notifies(NotifyCall{ChannelParam: 1, PayloadParam: 2})},
	{"pg_notify param casts", "SELECT pg_notify($2::text, $1::pg_catalog.varchar)", notifies(NotifyCall{ChannelParam: 2, PayloadParam: 1})},
	{"pg_notify literal casts", "SELECT pg_notify('a'::text, 'b'::character varying::varchar)", notifies(nt("a", "b"))},
	{"pg_notify value-changing casts", "SELECT pg_notify('ab'::varchar(1), $1::char(3))", notifies(NotifyCall{})},
	{"pg_notify N literal", "SELECT pg_notify(N'a ', 'b')", notifies(NotifyCall{Payload: "b", KnownPayload: true})},
	{"pg_notify null payload", "SELECT pg_notify('a', NULL)", notifies(nt("a", ""))},
	{"pg_notify null channel", "SELECT pg_notify(NULL::text, 'x')", notifies(nt("", "x"))},
	{"pg_notify E and dollar", `SELECT pg_notify(E'a\tb', $t$it's$t$)`, notifies(nt("a\tb", "it's"))},
	{"pg_notify concatenation", "SELECT pg_notify('a', 'x' || id) FROM t", notifies(NotifyCall{Channel: "a", Known: true})},
	{"pg_notify columns", "SELECT pg_notify(channel, payload) FROM outbox", notifies(NotifyCall{})},
	{"pg_notify subquery", "SELECT pg_notify('a', (SELECT 'b'))", notifies(NotifyCall{Channel: "a", Known: true})},
	{"pg_notify function argument", "SELECT pg_notify(lower('A'), 'b')", notifies(NotifyCall{Payload: "b", KnownPayload: true})},
	{"pg_notify one argument", "SELECT pg_notify('a')", notifies(NotifyCall{})},
	{"pg_notify three arguments", "SELECT pg_notify('a', 'b', 'c')", notifies(NotifyCall{})},
	{"pg_notify unclosed", "SELECT pg_notify('a', 'b'", notifies(NotifyCall{})},
	{"pg_notify inside other statements", "WITH n AS (SELECT pg_notify('a', '1')) INSERT INTO log SELECT pg_notify('b', '2') FROM n",
		notifies(nt("a", "1"), nt("b", "2"))},
	{"pg_notify comment before paren", "SELECT pg_notify /* x */ ('a', 'b')", notifies(nt("a", "b"))},
	{"pg_notify line comment before paren", "SELECT pg_notify -- x\n('a', 'b')", notifies(nt("a", "b"))},
	{"pg_notify in create function", "CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC SELECT pg_notify('a', 'b'); END", none()},
	{"pg_notify in function string body", "CREATE FUNCTION f() RETURNS void AS $$ SELECT pg_notify('a', 'b') $$ LANGUAGE sql", none()},
	{"listen notify transaction", "BEGIN; LISTEN a; NOTIFY a, 'x'; COMMIT", st(Listen, "a").plus(notifies(nt("a", "x"))).n(4)},
	{"notify and pg_notify in order", "SELECT pg_notify('a', ''); NOTIFY b; SELECT pg_notify('c', 'd')",
		notifies(nt("a", ""), nt("b", ""), nt("c", "d")).n(3)},

	// --- pg_listening_channels
	// --- pg_prepared_statements in a FROM list
	{"prepared view", "SELECT name FROM pg_prepared_statements", views("pg_prepared_statements").n(1)},
	{"prepared view where", "select exists(select 1 from pg_prepared_statements where name = $1)", views("pg_prepared_statements")},
	{"prepared view qualified", "SELECT * FROM pg_catalog.pg_prepared_statements p", views("pg_catalog.pg_prepared_statements+alias")},
	{"prepared view AS", `SELECT * FROM PG_PREPARED_STATEMENTS AS "P"`, views("PG_PREPARED_STATEMENTS+alias")},
	{"prepared view join", "SELECT 1 FROM t JOIN pg_prepared_statements ON true, pg_prepared_statements LEFT JOIN u ON true", views("pg_prepared_statements", "pg_prepared_statements")},
	{"prepared view quoted", `SELECT 1 FROM "pg_prepared_statements"`, views(`"pg_prepared_statements"`)},
	{"prepared view other schema", "SELECT 1 FROM public.pg_prepared_statements", none()},
	{"prepared view column", "SELECT pg_prepared_statements FROM t", none()},
	{"prepared view in string", "SELECT 'FROM pg_prepared_statements'", none()},
	{"prepared view stored", "CREATE VIEW v AS SELECT * FROM pg_prepared_statements", none()},
	// --- pg_stat_activity in a FROM list
	{"activity view", "SELECT pid, (SELECT pg_terminate_backend(pid)) AS killed FROM pg_stat_activity WHERE state = $1", activity("pg_stat_activity")},
	{"activity view qualified", "select count(*) from PG_CATALOG.PG_STAT_ACTIVITY a", activity("PG_CATALOG.PG_STAT_ACTIVITY+alias")},
	{"activity and prepared views", "SELECT 1 FROM pg_stat_activity, pg_prepared_statements", want{views: []string{"pg_prepared_statements"}, acts: []string{"pg_stat_activity"}}},
	{"activity view other schema", "SELECT 1 FROM monitor.pg_stat_activity", none()},
	{"activity view function", "SELECT * FROM pg_stat_activity(1)", none()},
	{"activity view stored", "CREATE VIEW v AS SELECT * FROM pg_stat_activity", none()},
	{"prepared view function", "SELECT * FROM pg_prepared_statements()", none()},
	{"prepared view in DO", "DO $$BEGIN PERFORM 1 FROM pg_prepared_statements; END$$", none()},
	{"channels whole", "SELECT pg_listening_channels()", chans("pg_listening_channels()").wholeCh("", false).n(1)},
	{"channels whole star qualified", "select * from PG_CATALOG.PG_LISTENING_CHANNELS() AS c; -- x",
		chans("PG_CATALOG.PG_LISTENING_CHANNELS()").wholeCh("c", true)},
	{"channels whole bare alias", `SELECT pg_listening_channels() "Ch"`, chans("pg_listening_channels()").wholeCh("Ch", false)},
	{"channels whole quoted", `SELECT "pg_listening_channels"()`, chans(`"pg_listening_channels"()`).wholeCh("", false)},
	{"channels in larger query", "SELECT c FROM pg_listening_channels() c WHERE c LIKE 'a%'", chans("pg_listening_channels()")},
	{"channels cast", "SELECT pg_listening_channels()::text", chans("pg_listening_channels()")},
	{"channels two calls spaced", "SELECT pg_listening_channels(), pg_catalog . pg_listening_channels ( /* ) */ )",
		chans("pg_listening_channels()", "pg_catalog . pg_listening_channels ( /* ) */ )")},
	{"channels three-part name", "SELECT db.pg_catalog.pg_listening_channels()", chans("db.pg_catalog.pg_listening_channels()")},
	{"channels two statements", "SELECT pg_listening_channels(); SELECT 1", chans("pg_listening_channels()").n(2)},
	{"channels second statement", "LISTEN a; SELECT pg_listening_channels()", st(Listen, "a").plus(chans("pg_listening_channels()")).n(2)},
	{"channels with argument", "SELECT pg_listening_channels(1)", none()},
	{"channels other schema", "SELECT x.pg_listening_channels()", none()},
	{"channels quoted upper", `SELECT "PG_LISTENING_CHANNELS"()`, none()},
	{"channels no parens", "SELECT pg_listening_channels FROM t", none()},
	{"channels in string", "SELECT 'pg_listening_channels()'", none()},
	{"channels in comment", "SELECT 1 /* pg_listening_channels() */", none()},
	{"channels in DO body", "DO $$BEGIN PERFORM pg_listening_channels(); END$$", none()},
	{"channels in view", "CREATE VIEW v AS SELECT pg_listening_channels()", none()},
	{"channels in prepare", "PREPARE q AS SELECT pg_listening_channels()", st(Prepare, "q")},
	{"channels in default", "ALTER TABLE t ALTER c SET DEFAULT pg_listening_channels()", none()},

	// --- pg_terminate_backend and pg_cancel_backend as whole statements
	{"terminate literal", "SELECT pg_terminate_backend(4194305)", sig(TerminateBackend, "", nArg("4194305")).n(1)},
	{"terminate param", "select pg_terminate_backend($1)", sig(TerminateBackend, "", pArg(1))},
	{"terminate timeout", "SELECT pg_terminate_backend($1, $2);", sig(TerminateBackend, "", pArg(1), pArg(2)).n(1)},
	{"terminate literal timeout", "SELECT pg_terminate_backend(4194305, 5000)", sig(TerminateBackend, "", nArg("4194305"), nArg("5000"))},
	{"terminate alias", "SELECT pg_terminate_backend($1) AS done", sig(TerminateBackend, "done", pArg(1))},
	{"terminate bare alias", `SELECT pg_terminate_backend($1) "Done"`, sig(TerminateBackend, "Done", pArg(1))},
	{"terminate qualified upper", "SELECT PG_CATALOG.PG_TERMINATE_BACKEND(12)", sig(TerminateBackend, "", nArg("12"))},
	{"terminate quoted", `SELECT "pg_terminate_backend"('12')`, sig(TerminateBackend, "", sArg("12"))},
	{"terminate star", "SELECT * FROM pg_terminate_backend($1) t", sig(TerminateBackend, "t", pArg(1)).star()},
	{"terminate cast", "SELECT pg_terminate_backend($1::int)", sig(TerminateBackend, "", Arg{Kind: ArgParam, Param: 1, Cast: "int"})},
	{"terminate null", "SELECT pg_terminate_backend(NULL)", sig(TerminateBackend, "", Arg{Kind: ArgNull})},
	{"terminate no args", "SELECT pg_terminate_backend()", sig(TerminateBackend, "")},
	{"terminate unicode name", `SELECT U&"pg\005fterminate_backend"(1)`, sig(TerminateBackend, "", nArg("1"))},
	{"cancel literal", "SELECT pg_cancel_backend(4194305)", sig(CancelBackend, "", nArg("4194305"))},
	{"cancel param alias", "select pg_catalog.pg_cancel_backend($1) as ok", sig(CancelBackend, "ok", pArg(1))},
	{"cancel comment before paren", "SELECT pg_cancel_backend /* x */ ($1)", sig(CancelBackend, "", pArg(1))},
	{"terminate from pg_stat_activity", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'x'", activity("pg_stat_activity")},
	{"terminate expression arg", "SELECT pg_terminate_backend(pg_backend_pid())", none()},
	{"terminate two calls", "SELECT pg_terminate_backend(1), pg_cancel_backend(2)", none()},
	{"terminate two statements", "SELECT pg_terminate_backend(1); SELECT 1", none().n(2)},
	{"terminate second statement", "SELECT 1; SELECT pg_terminate_backend(1)", none().n(2)},
	{"terminate other schema", "SELECT x.pg_terminate_backend(1)", none()},
	{"terminate in DO body", "DO $$BEGIN PERFORM pg_terminate_backend(1); END$$", none()},
	{"terminate in string", "SELECT 'pg_terminate_backend(1)'", none()},
	{"terminate where clause", "SELECT pg_terminate_backend(1) WHERE true", none()},
	{"terminate column alias list", "SELECT * FROM pg_terminate_backend(1) AS t(x)", none()},
	{"terminate with lease", "SELECT pg_terminate_backend(1), lease_renew('x')", mention()},
	{"terminate name prefix", "SELECT pg_terminate_backends(1)", none()},
	{"create temp table", "CREATE TEMP TABLE t1 (id int)", st(TempTable, "t1")},
	{"create temporary table if not exists", "create temporary table if not exists T2 as select 1", st(TempTable, "t2")},
	{"create local temp", "CREATE LOCAL TEMPORARY TABLE t3 (x int) ON COMMIT DELETE ROWS", st(TempTable, "t3")},
	{"create temp on commit drop", "CREATE TEMP TABLE t4 (x int) ON COMMIT DROP", none()},
	{"create temp view", "create temp view v as select 1", st(TempTable, "v")},
	{"create temp sequence", "CREATE TEMPORARY SEQUENCE s", st(TempTable, "s")},
	{"create pg_temp table", "CREATE TABLE pg_temp.t5 (x int)", st(TempTable, "t5")},
	{"create pg_temp function", "create function pg_temp.f() returns int as 'select 1' language sql", st(TempTable, "f")},
	{"create table", "CREATE TABLE t (x int)", none()},
	{"select into temp", "SELECT * INTO TEMP tt FROM t", st(TempTable, "tt")},
	{"select into temporary table", "select a into temporary table tt2 from t", st(TempTable, "tt2")},
	{"select into regular", "select * into t9 from t", none()},
	{"insert into temp named table", "INSERT INTO temp VALUES (1)", none()},
	{"drop table", "DROP TABLE IF EXISTS t1", st(DropTable, "t1")},
	{"declare with hold", "DECLARE c1 CURSOR WITH HOLD FOR SELECT 1", st(DeclareHold, "c1")},
	{"declare scroll with hold", "declare C2 no scroll cursor with hold for select * from t", st(DeclareHold, "c2")},
	{"declare without hold", "DECLARE c3 CURSOR WITHOUT HOLD FOR SELECT 1", none()},
	{"declare plain", "DECLARE c4 CURSOR FOR SELECT 'with hold'", none()},
	{"close", "CLOSE c1", st(Close, "c1")},
	{"close all", "close all", st(Close, "*")},
	{"prepare", "PREPARE q1 (int) AS SELECT $1", st(Prepare, "q1")},
	{"prepare transaction", "PREPARE TRANSACTION 'tx1'", none()},
	{"deallocate", "DEALLOCATE q1", st(Deallocate, "q1")},
	{"deallocate prepare all", "deallocate prepare all", st(Deallocate, "*")},
	{"set role", "SET ROLE admin", st(SetRole, "admin")},
	{"set session role quoted", `SET SESSION ROLE "Admin"`, st(SetRole, "Admin")},
	{"set local role ignored", "SET LOCAL ROLE admin", none()},
	{"set role none", "SET ROLE NONE", st(SetRole, "")},
	{"set session authorization", "SET SESSION AUTHORIZATION 'bob'", st(SetRole, "bob")},
	{"reset role", "RESET ROLE", st(SetRole, "")},
	{"reset session authorization", "reset session authorization", st(SetRole, "")},
	{"load", "LOAD 'auto_explain'", st(Load, "auto_explain")},
	{"discard all", "DISCARD ALL", st(Discard, "all")},
	{"discard temporary", "discard temporary", st(Discard, "temp")},

	// --- SET tracking
	{"set to", "SET search_path TO public, \"My Schema\"", sets(SetCmd{Name: "search_path", Value: `public, "My Schema"`})},
	{"set eq", "set statement_timeout = '5s';", sets(SetCmd{Name: "statement_timeout", Value: "'5s'"})},
	{"set session", "SET SESSION work_mem TO '64MB' -- note", sets(SetCmd{Name: "work_mem", Value: "'64MB'"})},
	{"set local", "SET LOCAL lock_timeout = 1000", sets(SetCmd{Name: "lock_timeout", Value: "1000", Local: true})},
	{"set time zone", "SET TIME ZONE 'UTC'", sets(SetCmd{Name: "timezone", Value: "'UTC'"})},
	{"set time zone local", "set time zone local", sets(SetCmd{Name: "timezone", Reset: true})},
	{"set default", "SET DateStyle TO DEFAULT", sets(SetCmd{Name: "datestyle", Reset: true})},
	{"set dotted", "SET app.user_id = '42'", sets(SetCmd{Name: "app.user_id", Value: "'42'"})},
	{"set names", "SET NAMES 'UTF8'", sets(SetCmd{Name: "client_encoding", Value: "'UTF8'"})},
	{"reset", "RESET search_path", sets(SetCmd{Name: "search_path", Reset: true})},
	{"reset all", "RESET ALL", sets(SetCmd{Reset: true, All: true})},
	{"set transaction ignored", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", none()},
	{"set session characteristics ignored", "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", none()},
	{"set in second statement", "select 1; set search_path = x", sets(SetCmd{Name: "search_path", Value: "x"}).n(2)},
	{"set_config", "SELECT set_config('search_path', 'public, \"My Schema\"', false)", sets(SetCmd{Name: "search_path", Value: `'public, "My Schema"'`, Config: true})},
	{"set_config local", "select pg_catalog.set_config('App.X', 'v', true)", sets(SetCmd{Name: "app.x", Value: "'v'", Local: true, Config: true})},
	{"set_config dynamic local", "SELECT set_config('app.user_id', $1, true)", none()},
	{"set_config dynamic session", "SELECT set_config('app.user_id', $1, false)", st(SetConfig, "app.user_id")},
	{"set_config role", "select set_config('role', 'admin', false)", st(SetRole, "admin")},
	{"set_config other schema", "select my.set_config('a', 'b', false)", none()},
	{"set in string", "select 'set search_path = x'", none()},

	// --- statements and noise
	{"empty", "", stmts(0)},
	{"only semicolons", " ; ;; ", stmts(0)},
	{"comment only", "-- nothing\n/* here */", stmts(0)},
	{"semicolon in string", "select ';'; select 2", stmts(2)},
	{"ordinary query", "SELECT id, name FROM users WHERE email = $1 AND deleted_at IS NULL", none()},
	{"cast not hit", "select '1'::int, x::text", none()},
}

func check(t *testing.T, c tcase, f Findings) {
	t.Helper()
	w := c.want
	if !reflect.DeepEqual(f.Funcs, w.funcs) {
		t.Errorf("%s: Funcs = %v, want %v", c.name, f.Funcs, w.funcs)
	}
	adv, sess := len(w.funcs) > 0, false
	for _, fn := range w.funcs {
		sess = sess || fn.SessionAcquire()
	}
	if f.Advisory != adv || f.SessionAcquire != sess {
		t.Errorf("%s: Advisory=%v SessionAcquire=%v, want %v %v", c.name, f.Advisory, f.SessionAcquire, adv, sess)
	}
	if !reflect.DeepEqual(f.Lease, w.lease) {
		t.Errorf("%s: Lease = %+v, want %+v", c.name, f.Lease, w.lease)
	}
	if f.LeaseMention != w.mention || f.LeaseFence != w.fence {
		t.Errorf("%s: LeaseMention=%v LeaseFence=%v, want %v %v", c.name, f.LeaseMention, f.LeaseFence, w.mention, w.fence)
	}
	if !reflect.DeepEqual(unlocatedState(f.State), w.state) {
		t.Errorf("%s: State = %+v, want %+v", c.name, f.State, w.state)
	}
	if !reflect.DeepEqual(unlocated(f.Sets), w.sets) {
		t.Errorf("%s: Sets = %+v, want %+v", c.name, f.Sets, w.sets)
	}
	if !reflect.DeepEqual(f.Notifies, w.notify) {
		t.Errorf("%s: Notifies = %+v, want %+v", c.name, f.Notifies, w.notify)
	}
	var spans []string
	for _, sp := range f.ChannelsCalls {
		spans = append(spans, c.sql[sp.Pos:sp.End])
	}
	if !reflect.DeepEqual(spans, w.chans) {
		t.Errorf("%s: ChannelsCalls = %q, want %q", c.name, spans, w.chans)
	}
	if vs := viewTexts(c.sql, f.PreparedViews); !reflect.DeepEqual(vs, w.views) {
		t.Errorf("%s: PreparedViews = %q, want %q", c.name, vs, w.views)
	}
	if as := viewTexts(c.sql, f.ActivityViews); !reflect.DeepEqual(as, w.acts) {
		t.Errorf("%s: ActivityViews = %q, want %q", c.name, as, w.acts)
	}
	if !reflect.DeepEqual(f.ChannelsWhole, w.whole) {
		t.Errorf("%s: ChannelsWhole = %+v, want %+v", c.name, f.ChannelsWhole, w.whole)
	}
	if !reflect.DeepEqual(f.Signal, w.signal) {
		t.Errorf("%s: Signal = %+v, want %+v", c.name, f.Signal, w.signal)
	}
	if w.count {
		if n := CountStatements(c.sql); n != w.stmts {
			t.Errorf("%s: CountStatements = %d, want %d", c.name, n, w.stmts)
		}
		if f.Hit() && f.Statements != w.stmts {
			t.Errorf("%s: Statements = %d, want %d", c.name, f.Statements, w.stmts)
		}
	}
}

func TestAnalyze(t *testing.T) {
	if len(cases) < 80 {
		t.Fatalf("only %d cases", len(cases))
	}
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.name] {
			t.Errorf("duplicate case name %q", c.name)
		}
		seen[c.name] = true
		check(t, c, Analyze(c.sql))
	}
}

// TestMayHitInvariant: the prefilter is true whenever the full analysis finds
// anything, over every case and some mutations of it.
func TestMayHitInvariant(t *testing.T) {
	for _, c := range cases {
		for _, s := range []string{c.sql, strings.ToUpper(c.sql), "select 1;" + c.sql, "/* x */ " + c.sql} {
			f := analyze(s)
			if f.Hit() && !MayHit(s) {
				t.Errorf("%s: MayHit(%q) = false but Analyze found %+v", c.name, s, f)
			}
			if !f.Hit() && analyze(s).Statements != CountStatements(s) {
				t.Errorf("%s: CountStatements disagrees", c.name)
			}
		}
	}
	if MayHit("SELECT id, name FROM users WHERE email = $1") {
		t.Error("MayHit true on a plain query")
	}
}

// TestChangesSchema checks the statement words that start a new
// statement epoch, and that MayHit is true wherever ChangesSchema is (the
// proxy skips ChangesSchema when MayHit is false).
func TestChangesSchema(t *testing.T) {
	tests := []struct {
		sql  string
		want bool
	}{
		{"ALTER TABLE t ALTER COLUMN c TYPE bigint", true},
		{"select 1; drop table t", true},
		{"BEGIN; CREATE TABLE x (a int)", true},
		{"/* c */ -- d\r\n\tcreate index i on t (a)", true},
		{"SELECT 1;\nImport FOREIGN SCHEMA s FROM SERVER f INTO public", true},
		{"IMPORT FOREIGN SCHEMA s FROM SERVER f INTO public", true},
		{"SELECT created_at FROM t", false},
		{"SELECT 'alter'", false},
		{"UPDATE t SET a = 1", false},
		{"TRUNCATE t", false},
		{"dropped", false},
		{"-- drop table t", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := ChangesSchema(tt.sql); got != tt.want {
			t.Errorf("ChangesSchema(%q) = %v, want %v", tt.sql, got, tt.want)
		}
		if tt.want && !MayHit(tt.sql) {
			t.Errorf("MayHit(%q) = false where ChangesSchema is true", tt.sql)
		}
	}
}

func TestCountStatements(t *testing.T) {
	for _, c := range cases {
		if got, want := CountStatements(c.sql), analyze(c.sql).Statements; got != want {
			t.Errorf("%s: CountStatements = %d, analyze = %d", c.name, got, want)
		}
	}
}

func TestRewriteFence(t *testing.T) {
	for _, c := range []struct{ in, out string }{
		{"select lease_fence('x', 1)", `select "lockpool".lease_fence('x', 1)`},
		{"SELECT LockPool.Lease_Fence($1, $2); UPDATE t SET v = 1", `SELECT "lockpool".lease_fence($1, $2); UPDATE t SET v = 1`},
		{`select "lease_fence"('x', 1)`, `select "lockpool".lease_fence('x', 1)`},
		{"select lockpool . /* c */ lease_fence ('x', 1)", `select "lockpool".lease_fence ('x', 1)`},
		{"select other.lease_fence('x', 1)", "select other.lease_fence('x', 1)"},
		{"select 'lease_fence(1)' -- lease_fence(2)", "select 'lease_fence(1)' -- lease_fence(2)"},
		{"select lease_fence", "select lease_fence"},
		{"create function f() returns void as $$ select lease_fence('a', 1) $$ language sql", "create function f() returns void as $$ select lease_fence('a', 1) $$ language sql"},
		{"DO $$ begin perform lease_fence('a', 1); end $$", `DO $lp$ begin perform "lockpool".lease_fence('a', 1); end $lp$`},
		{"DO'begin perform lease_fence(''a'', 1); end'", `DO $lp$begin perform "lockpool".lease_fence('a', 1); end$lp$`},
		{"select lease_fence(1), lease_fence(2)", `select "lockpool".lease_fence(1), "lockpool".lease_fence(2)`},
	} {
		if got := RewriteFence(c.in, "lockpool"); got != c.out {
			t.Errorf("RewriteFence(%q) = %q, want %q", c.in, got, c.out)
		}
	}
	if got := RewriteFence("select lease_fence(1)", `we"ird`); got != `select "we""ird".lease_fence(1)` {
		t.Errorf("quoting schema: %q", got)
	}
	// The rewritten call is still seen as a fence call.
	if f := Analyze(RewriteFence("select lease_fence('x', 1)", "lockpool")); !f.LeaseFence {
		t.Errorf("rewritten fence not found: %+v", f)
	}
}

func TestSetCmdSQL(t *testing.T) {
	for _, c := range []struct {
		c   SetCmd
		sql string
	}{
		{SetCmd{Name: "search_path", Value: `public, "My Schema"`}, `SET "search_path" TO public, "My Schema"`},
		{SetCmd{Name: "timezone", Value: "'UTC'"}, `SET TIME ZONE 'UTC'`},
		{SetCmd{Name: "app.user_id", Value: "'42'", Local: true}, `SET LOCAL "app"."user_id" TO '42'`},
		{SetCmd{Name: "work_mem", Reset: true}, `RESET "work_mem"`},
		{SetCmd{All: true, Reset: true}, `RESET ALL`},
		{SetCmd{Name: "search_path", Value: "'a, b'", Config: true}, `SELECT pg_catalog.set_config('search_path', 'a, b', false)`},
	} {
		if got := c.c.SQL(); got != c.sql {
			t.Errorf("%+v.SQL() = %q, want %q", c.c, got, c.sql)
		}
	}
}

func TestFuncMethods(t *testing.T) {
	n := 0
	for f := AdvisoryLock; f <= AdvisoryUnlockAll; f++ {
		name := f.String()
		if lookupFunc(name) != f || lookupFuncFold(strings.ToUpper(name)) != f {
			t.Errorf("lookup %s", name)
		}
		k := 0
		for _, b := range []bool{f.SessionAcquire(), f.Xact(), f.Unlock()} {
			if b {
				k++
			}
		}
		if k != 1 {
			t.Errorf("%s: exactly one of SessionAcquire/Xact/Unlock expected", name)
		}
		if f.Try() != strings.Contains(name, "_try_") || f.Shared() != strings.HasSuffix(name, "_shared") {
			t.Errorf("%s: Try/Shared", name)
		}
		if f.SessionAcquire() {
			n++
		}
	}
	if n != 4 {
		t.Errorf("%d session acquires, want 4", n)
	}
	if Func(0).String() != "Func(?)" || StateKind(0).String() != "StateKind(?)" || TempTable.String() != "TEMP TABLE" {
		t.Error("String of invalid values")
	}
}

func TestNoHitAllocs(t *testing.T) {
	q := benchNoHit
	if n := testing.AllocsPerRun(100, func() { _ = Analyze(q) }); n != 0 {
		t.Errorf("Analyze no-hit allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Analyze(benchNoHitCalls) }); n != 0 {
		t.Errorf("Analyze no-hit with calls allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = RewriteFence(q, "lockpool") }); n != 0 {
		t.Errorf("RewriteFence no-hit allocates %v times", n)
	}
}

func FuzzAnalyze(f *testing.F) {
	for _, c := range cases {
		f.Add(c.sql)
	}
	f.Add(benchNoHit)
	f.Add("DO U&'\\0070g_advisory_lock(1)' ")
	f.Add("BEGIN; LISTEN a; NOTIFY a, 'x'; SELECT pg_notify($1, E'\\x41'), pg_catalog.pg_listening_channels(); COMMIT")
	f.Add(`LISTEN U&"!0041" UESCAPE '!'; UNLISTEN *; select * from "pg_listening_channels"() c`)
	f.Add(`SELECT pg_catalog."pg_terminate_backend"($1, '5000') AS "x"; -- pg_cancel_backend(2)`)
	f.Fuzz(func(t *testing.T, s string) {
		full := analyze(s)
		if full.Hit() && !MayHit(s) {
			t.Fatalf("MayHit(%q) = false but Analyze found %+v", s, full)
		}
		if ChangesSchema(s) && !MayHit(s) {
			t.Fatalf("MayHit(%q) = false but ChangesSchema is true", s)
		}
		if got := Analyze(s); !reflect.DeepEqual(got, full) && got.Hit() {
			t.Fatalf("Analyze differs from analyze on %q", s)
		}
		if n := CountStatements(s); n != full.Statements {
			t.Fatalf("CountStatements(%q) = %d, analyze = %d", s, n, full.Statements)
		}
		checkLocations(t, s, full)
		out := RewriteFence(s, "lockpool")
		if !full.LeaseFence && !strings.Contains(strings.ToLower(s), "do") && !strings.Contains(strings.ToLower(s), "execute") && out != s {
			t.Fatalf("RewriteFence changed %q to %q without a fence call", s, out)
		}
	})
}

// checkLocations checks that every position Analyze reports is inside s
// and every statement number at most f.Statements.
func checkLocations(t *testing.T, s string, f Findings) {
	t.Helper()
	in := func(what string, stmt, pos, end int) {
		if stmt < 0 || stmt > f.Statements || pos < 0 || pos > end || end > len(s) {
			t.Fatalf("%q: %s at statement %d, [%d:%d] of %d bytes, %d statements", s, what, stmt, pos, end, len(s), f.Statements)
		}
		if stmt > 0 && pos == end {
			t.Fatalf("%q: %s at statement %d has no text", s, what, stmt)
		}
	}
	for _, c := range f.State {
		if c.Stmt == 0 && (c.Pos != 0 || c.End != 0) || c.Stmt > 0 && c.Kind != Listen && c.Kind != Unlisten {
			t.Fatalf("%q: %+v located wrongly", s, c)
		}
		in(c.Kind.String(), c.Stmt, c.Pos, c.End)
		if (c.Kind == Listen || c.Kind == Unlisten) && (len(c.Name) > maxIdentLen || c.Stmt > 0 && !hasFold(s, c.Pos, strings.ToLower(c.Kind.String()))) {
			t.Fatalf("%q: %+v", s, c)
		}
	}
	for _, c := range f.Sets {
		in("SET", c.Stmt, c.Pos, c.End)
	}
	last := 0
	for _, sp := range f.ChannelsCalls {
		in("pg_listening_channels", 1, sp.Pos, sp.End)
		if sp.Pos < last || s[sp.End-1] != ')' {
			t.Fatalf("%q: channels call [%d:%d] %q", s, sp.Pos, sp.End, s[sp.Pos:sp.End])
		}
		last = sp.End
	}
	if f.ChannelsWhole != nil && (len(f.ChannelsCalls) != 1 || f.Statements != 1 || len(f.ChannelsWhole.Args) != 0) {
		t.Fatalf("%q: ChannelsWhole %+v with %d calls, %d statements", s, f.ChannelsWhole, len(f.ChannelsCalls), f.Statements)
	}
	if f.Signal != nil && f.Statements != 1 {
		t.Fatalf("%q: Signal %+v with %d statements", s, f.Signal, f.Statements)
	}
	for _, n := range f.Notifies {
		if n.Known && n.ChannelParam != 0 || n.KnownPayload && n.PayloadParam != 0 || n.ChannelParam < 0 || n.PayloadParam < 0 {
			t.Fatalf("%q: %+v", s, n)
		}
	}
}

// unlocatedState drops where each statement is (TestStateLocation checks
// that).
func unlocatedState(state []StateChange) []StateChange {
	if state == nil {
		return nil
	}
	out := make([]StateChange, len(state))
	for i, c := range state {
		c.Stmt, c.Pos, c.End = 0, 0, 0
		out[i] = c
	}
	return out
}

// unlocated drops where each statement is (TestSetLocation checks that),
// so the table's cases say only what was found.
func unlocated(sets []SetCmd) []SetCmd {
	if sets == nil {
		return nil
	}
	out := make([]SetCmd, len(sets))
	for i, c := range sets {
		c.Stmt, c.Pos, c.End, c.Tag = 0, 0, 0, ""
		out[i] = c
	}
	return out
}

func TestSetLocation(t *testing.T) {
	tests := []struct {
		sql  string
		want []string // per SetCmd: "stmt:text:tag", "0" when not located
	}{
		{"RESET ALL", []string{"1:RESET ALL:RESET"}},
		{"select 1; reset application_name ;", []string{"2:reset application_name:RESET"}},
		{"BEGIN; SET LOCAL work_mem TO DEFAULT; ; RESET TIME ZONE", []string{"2:SET LOCAL work_mem TO DEFAULT:SET", "3:RESET TIME ZONE:RESET"}},
		{"SET search_path = a, b", []string{"1:SET search_path = a, b:SET"}},
		{"DO $$BEGIN RESET work_mem; END$$; RESET search_path", []string{"0", "2:RESET search_path:RESET"}},
		{"SELECT set_config('a.b', NULL, false)", []string{"0"}},
	}
	for _, tc := range tests {
		f := Analyze(tc.sql)
		var got []string
		for _, c := range f.Sets {
			if c.Stmt == 0 {
				got = append(got, "0")
				continue
			}
			got = append(got, fmt.Sprintf("%d:%s:%s", c.Stmt, tc.sql[c.Pos:c.End], c.Tag))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.sql, got, tc.want)
		}
	}
}

func TestStateLocation(t *testing.T) {
	tests := []struct {
		sql  string
		want []string // per StateChange: "stmt:text:name", "0:name" when not located
	}{
		{"LISTEN a", []string{"1:LISTEN a:a"}},
		{"  LISTEN \"A b\"\n\t", []string{`1:LISTEN "A b":A b`}},
		{"BEGIN; LISTEN a; NOTIFY a, 'x'; COMMIT", []string{"2:LISTEN a:a"}},
		{"select ';' ; /* ; */ unlisten * ; ; listen B -- c;\n;", []string{"2:unlisten *:*", "3:listen B:b"}},
		{"DO $$BEGIN LISTEN a; END$$; LISTEN b", []string{"0:a", "2:LISTEN b:b"}},
		{"LISTEN a b; UNLISTEN $$x$$", []string{"1:LISTEN a b:", "2:UNLISTEN $$x$$:"}},
		{"CREATE TEMP TABLE t (x int); LISTEN c", []string{"0:t", "2:LISTEN c:c"}},
		{`LISTEN U&"!0061" UESCAPE '!'`, []string{`1:LISTEN U&"!0061" UESCAPE '!':a`}},
	}
	for _, tc := range tests {
		f := Analyze(tc.sql)
		var got []string
		for _, c := range f.State {
			if c.Stmt == 0 {
				got = append(got, "0:"+c.Name)
				continue
			}
			got = append(got, fmt.Sprintf("%d:%s:%s", c.Stmt, tc.sql[c.Pos:c.End], c.Name))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.sql, got, tc.want)
		}
	}
}
