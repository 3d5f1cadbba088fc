package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/pool"
)

// startupParam is one setting a client asked for at login ("name=value" in
// the startup packet or a switch of its options parameter), spelled as the
// client spelled it: PostgreSQL's error messages quote it that way.
type startupParam struct {
	name, value string
}

// paramAliases are the old parameter names PostgreSQL still accepts for
// another parameter (guc.c map_old_guc_names).
var paramAliases = map[string]string{"sort_mem": "work_mem", "vacuum_mem": "maintenance_work_mem"}

// canonicalParamName is the key a parameter has in the session's values:
// lower case (PostgreSQL compares parameter names case-insensitively), old
// aliases replaced.
func canonicalParamName(name string) string {
	n := lower(name)
	if a, ok := paramAliases[n]; ok {
		return a
	}
	return n
}

// wellKnownParams are standard parameters that clients and drivers send at
// login. When PostgreSQL cannot be asked at login, a login that sets only
// these is accepted and its values are checked when the first statement
// applies them (an invalid value then fails that statement).
var wellKnownParams = map[string]bool{
	"application_name":                    true,
	"client_encoding":                     true,
	"datestyle":                           true,
	"timezone":                            true,
	"search_path":                         true,
	"extra_float_digits":                  true,
	"intervalstyle":                       true,
	"standard_conforming_strings":         true,
	"statement_timeout":                   true,
	"lock_timeout":                        true,
	"idle_in_transaction_session_timeout": true,
	"default_transaction_isolation":       true,
}

// unsupportedStartupParams cannot be set at login through lockpool: they
// change who the session is, and a pooled server connection must not.
var unsupportedStartupParams = map[string]bool{"role": true, "session_authorization": true}

// checkUnsupportedParams refuses the parameters lockpool cannot carry.
func checkUnsupportedParams(seq []startupParam) error {
	for _, p := range seq {
		if n := canonicalParamName(p.name); unsupportedStartupParams[n] {
			return &pgError{Code: "0A000", Message: "lockpool: parameter " + quoteForMsg(n) + " cannot be set at connection start through lockpool",
				Hint: "Remove it from the connection parameters; run SET " + n + " in the session instead (the session is then pinned)."}
		}
	}
	return nil
}

// ---------------------------------------------------------------- options

// optionParams reads the startup "options" parameter as a PostgreSQL backend
// reads it (pg_split_opts, then process_postgres_switches with glibc's
// getopt): it returns the settings the switches stand for, in order, and the
// error PostgreSQL reports for a switch or argument it does not accept. With
// an error, the settings are those PostgreSQL applied before it saw the bad
// switch (getopt moves arguments that are no switches behind all switches):
// a setting among them that the server refuses is reported instead. Switches
// a backend ignores outside the postmaster (-b -C -D -E -j -n -r -T -v) are
// ignored.
func optionParams(opts string) ([]startupParam, error) {
	args := splitOptions(opts)
	var (
		seq      []startupParam
		consumed []string // option arguments processed so far, as getopt permutes them
		nonopts  []string // arguments that are no options, in order
	)
	// badArg is the argument PostgreSQL names for a bad switch: argv[optind-1]
	// after glibc's getopt permuted the options seen so far in front of the
	// non-options (for a bad switch in the middle of a group, that is the
	// argument before the group).
	badArg := func(groupDone bool, current string) error {
		name := current
		if !groupDone {
			switch {
			case len(nonopts) > 0:
				name = nonopts[len(nonopts)-1]
			case len(consumed) > 0:
				name = consumed[len(consumed)-1]
			default:
				name = "postgres"
			}
		}
		return &pgError{Code: "42601", Message: "invalid command-line argument for server process: " + name,
			Hint: `Try "postgres --help" for more information.`}
	}
	set := func(name, value string) { seq = append(seq, startupParam{name, value}) }
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			nonopts = append(nonopts, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			nonopts = append(nonopts, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			flag := a[j]
			takesArg, known := postgresSwitches[flag]
			last := j == len(a)-1
			if !known {
				return seq, badArg(last, a)
			}
			var optarg string
			lastArg := a // the last argument this switch consumed
			if takesArg {
				switch {
				case !last:
					optarg = a[j+1:]
				case i+1 < len(args):
					i++
					optarg = args[i]
					lastArg = optarg
				default:
					return seq, badArg(true, a)
				}
			}
			bad := false
			switch flag {
			case 'B':
				set("shared_buffers", optarg)
			case 'c', '-':
				name, value, ok := strings.Cut(optarg, "=")
				if !ok {
					if flag == '-' {
						return seq, &pgError{Code: "42601", Message: "--" + optarg + " requires a value"}
					}
					return seq, &pgError{Code: "42601", Message: "-c " + optarg + " requires a value"}
				}
				set(strings.ReplaceAll(name, "-", "_"), value)
			case 'd':
				debugSwitch(atoi(optarg), set)
			case 'e':
				set("datestyle", "euro")
			case 'F':
				set("fsync", "false")
			case 'f':
				if n := planSwitchParam(optarg); n != "" {
					set(n, "false")
				} else {
					bad = true
				}
			case 'h':
				set("listen_addresses", optarg)
			case 'i':
				set("listen_addresses", "*")
			case 'k':
				set("unix_socket_directories", optarg)
			case 'l':
				set("ssl", "true")
			case 'N':
				set("max_connections", optarg)
			case 'O':
				set("allow_system_table_mods", "true")
			case 'P':
				set("ignore_system_indexes", "true")
			case 'p':
				set("port", optarg)
			case 'S':
				set("work_mem", optarg)
			case 's':
				set("log_statement_stats", "true")
			case 't':
				if n := statsSwitchParam(optarg); n != "" {
					set(n, "true")
				} else {
					bad = true
				}
			case 'W':
				set("post_auth_delay", optarg)
			}
			if bad {
				return seq, badArg(true, lastArg)
			}
			if takesArg {
				consumed = append(consumed, a)
				if lastArg != a {
					consumed = append(consumed, lastArg)
				}
				break
			}
			if last {
				consumed = append(consumed, a)
			}
		}
	}
	if len(nonopts) > 0 {
		return seq, badArg(true, nonopts[0])
	}
	return seq, nil
}

// postgresSwitches are the switches of process_postgres_switches
// ("B:bc:C:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"), true for those that take
// an argument.
var postgresSwitches = map[byte]bool{
	'B': true, 'b': false, 'c': true, 'C': true, 'D': true, 'd': true, 'E': false, 'e': false, 'F': false,
	'f': true, 'h': true, 'i': false, 'j': false, 'k': true, 'l': false, 'N': true, 'n': false, 'O': false,
	'P': false, 'p': true, 'r': true, 'S': true, 's': false, 'T': false, 't': true, 'v': true, 'W': true, '-': true,
}

// splitOptions splits the options parameter at unescaped white space; a
// backslash makes the next character literal (pg_split_opts).
func splitOptions(opts string) []string {
	var args []string
	var cur []byte
	in, escaped := false, false
	for i := 0; i < len(opts); i++ {
		c := opts[i]
		if !escaped && isSpace(c) {
			if in {
				args = append(args, string(cur))
				cur, in = cur[:0], false
			}
			continue
		}
		in = true
		if !escaped && c == '\\' {
			escaped = true
			continue
		}
		escaped = false
		cur = append(cur, c)
	}
	if in {
		args = append(args, string(cur))
	}
	return args
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// atoi is C's atoi: leading white space, a sign, digits; 0 when none.
func atoi(s string) int {
	i := 0
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	n := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9' && n < 1<<30; i++ {
		n = n*10 + int(s[i]-'0')
	}
	if neg {
		return -n
	}
	return n
}

// debugSwitch is what -d n sets (set_debug_options outside the postmaster).
func debugSwitch(level int, set func(name, value string)) {
	if level > 0 {
		set("log_min_messages", fmt.Sprintf("debug%d", level))
	} else {
		set("log_min_messages", "notice")
	}
	for _, d := range []struct {
		level       int
		name, value string
	}{{2, "log_statement", "all"}, {3, "debug_print_parse", "true"}, {4, "debug_print_plan", "true"}, {5, "debug_print_rewritten", "true"}} {
		if level >= d.level {
			set(d.name, d.value)
		}
	}
}

// planSwitchParam is the parameter -f turns off ("" for an unknown letter).
func planSwitchParam(arg string) string {
	if arg == "" {
		return ""
	}
	return map[byte]string{'s': "enable_seqscan", 'i': "enable_indexscan", 'o': "enable_indexonlyscan", 'b': "enable_bitmapscan",
		't': "enable_tidscan", 'n': "enable_nestloop", 'm': "enable_mergejoin", 'h': "enable_hashjoin"}[arg[0]]
}

// statsSwitchParam is the parameter -t turns on ("" when arg names none).
func statsSwitchParam(arg string) string {
	switch {
	case strings.HasPrefix(arg, "pa"):
		return "log_parser_stats"
	case strings.HasPrefix(arg, "pl"):
		return "log_planner_stats"
	case strings.HasPrefix(arg, "e"):
		return "log_executor_stats"
	}
	return ""
}

// parseBool is PostgreSQL's parse_bool: a case-insensitive prefix of true,
// false, yes, no (at least "on"/"of" for on and off), or 1 and 0.
func parseBool(v string) (val, ok bool) {
	lv := lower(v)
	prefixOf := func(word string, min int) bool {
		return len(lv) >= min && len(lv) <= len(word) && word[:len(lv)] == lv
	}
	switch {
	case lv == "":
		return false, false
	case prefixOf("true", 1), prefixOf("yes", 1), prefixOf("on", 2), lv == "1":
		return true, true
	case prefixOf("false", 1), prefixOf("no", 1), prefixOf("off", 2), lv == "0":
		return false, true
	}
	return false, false
}

// ---------------------------------------------------------------- checking

// maxCheckedStartupSets bounds the cache of checked startup settings.
const maxCheckedStartupSets = 1024

// startupChecks remembers the sets of startup settings PostgreSQL accepted,
// per server user and database, and what it made of each value, so that a
// login with a set seen before needs no server connection. Logins that bring
// the same new set at the same time share one check.
type startupChecks struct {
	mu       sync.Mutex
	sets     map[string]*checkedSettings
	inflight map[string]*startupCheck
}

// checkedSettings is PostgreSQL's answer to one set of settings it accepted.
type checkedSettings struct {
	values  []string // the value set_config returned for each checked setting, in order
	notices []byte   // NoticeResponse messages the check produced (PostgreSQL sends them at login)
}

// startupCheck is one check in progress; its outcome is readable once done
// is closed.
type startupCheck struct {
	done    chan struct{}
	e       *checkedSettings
	verdict *pgError // PostgreSQL refused a setting
	err     error    // no server connection could do the check
}

// begin returns the remembered answer for key, or the check in progress for
// key and whether the caller runs it (and must call finish).
func (c *startupChecks) begin(key string) (e *checkedSettings, ch *startupCheck, owner bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.sets[key]; ok {
		return e, nil, false
	}
	if ch, ok := c.inflight[key]; ok {
		return nil, ch, false
	}
	if c.inflight == nil {
		c.inflight = make(map[string]*startupCheck)
	}
	ch = &startupCheck{done: make(chan struct{})}
	c.inflight[key] = ch
	return nil, ch, true
}

// finish publishes the outcome of the check of key and remembers an
// accepted set (forgetting an arbitrary one when the cache is full).
func (c *startupChecks) finish(key string, ch *startupCheck) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.inflight, key)
	if ch.e != nil {
		if c.sets == nil {
			c.sets = make(map[string]*checkedSettings)
		}
		if len(c.sets) >= maxCheckedStartupSets {
			for k := range c.sets {
				delete(c.sets, k)
				break
			}
		}
		c.sets[key] = ch.e
	}
	close(ch.done)
}

// needsCheck reports whether PostgreSQL has to see a setting to know whether
// it accepts it and how it spells the value. application_name never fails,
// and PostgreSQL keeps a short printable ASCII one as it is: it is the
// setting that most often differs between the clients of one application,
// so leaving it out keeps their sets alike.
func needsCheck(p startupParam) bool {
	if canonicalParamName(p.name) != "application_name" || len(p.value) >= 64 {
		return true
	}
	for i := 0; i < len(p.value); i++ {
		if c := p.value[i]; c < 32 || c > 126 {
			return true
		}
	}
	return false
}

// checkStartupParams has PostgreSQL check the settings a client asked for at
// login, as it would at its own login: the first one it refuses is returned
// as a FATAL with PostgreSQL's SQLSTATE and message. Accepted values take the
// server's spelling (iso -> "ISO, MDY"). It returns NoticeResponse messages
// to send at login.
//
// A set already checked for the application's server user and database needs
// no server. Otherwise the settings are applied on one of the application's
// pooled server connections inside a transaction that is rolled back. When
// no server connection can be had, a set of only well-known parameters is
// accepted unchecked (the first statement applies and so checks it); any
// other set is refused with 08006 (53300 when the pool stayed full).
func (s *Server) checkStartupParams(ctx context.Context, ss *session, seq []startupParam) ([]byte, error) {
	var idx []int
	for i, p := range seq {
		if needsCheck(p) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil, nil
	}
	var key strings.Builder
	key.WriteString(ss.app.cfg.User)
	key.WriteByte(0)
	key.WriteString(ss.database)
	key.WriteByte(0)
	pairs := make([]startupParam, len(idx))
	for j, i := range idx {
		pairs[j] = seq[i]
		key.WriteString(seq[i].name)
		key.WriteByte(0)
		key.WriteString(seq[i].value)
		key.WriteByte(0)
	}
	e, ch, owner := s.startupChecks.begin(key.String())
	if ch != nil {
		var verdict *pgError
		var err error
		if owner {
			ch.e, ch.verdict, ch.err = s.runStartupCheck(ctx, ss.app.cfg.Name, ss.database, pairs)
			s.startupChecks.finish(key.String(), ch)
		} else {
			select {
			case <-ch.done:
			case <-ctx.Done():
			}
		}
		select {
		case <-ch.done:
			e, verdict, err = ch.e, ch.verdict, ch.err
		default:
			err = ctx.Err()
		}
		switch {
		case err != nil:
			if lazilyCheckable(seq) {
				s.log.Debug("startup parameters not checked: no server connection; the first statement applies them", "app", ss.app.cfg.Name, "err", err)
				return nil, nil
			}
			return nil, startupCheckError(err, ss.app.cfg.Name)
		case verdict != nil:
			v := *verdict // shared with the other logins that waited for this check
			return nil, &v
		}
	}
	values := make([]string, len(seq))
	for i, p := range seq {
		values[i] = p.value
	}
	for j, i := range idx {
		values[i] = e.values[j]
	}
	ss.setStartupValues(seq, values)
	return e.notices, nil
}

// lazilyCheckable reports whether every setting is a well-known parameter.
func lazilyCheckable(seq []startupParam) bool {
	for _, p := range seq {
		if !wellKnownParams[canonicalParamName(p.name)] {
			return false
		}
	}
	return true
}

// startupCheckError is what a client gets when its settings needed a check
// and no server connection could be had for it.
func startupCheckError(err error, app string) error {
	var pge *pgconn.PgError
	switch {
	case errors.Is(err, pool.ErrWaitTimeout):
		return &pgError{Code: "53300", Message: fmt.Sprintf("lockpool: no server connection free for application %q to check the connection parameters", app),
			Hint: "Retry in a moment."}
	case errors.As(err, &pge):
		return &pgError{Code: pge.Code, Message: "lockpool: cannot check the connection parameters: " + pge.Message,
			Hint: "The PostgreSQL server refused lockpool's login."}
	}
	return &pgError{Code: "08006", Message: "lockpool: cannot reach PostgreSQL to check the connection parameters",
		Detail: err.Error(),
		Hint:   "Check that PostgreSQL is running and reachable from lockpool. Without it only well-known parameters (application_name, client_encoding, DateStyle, TimeZone, search_path, ...) are accepted at login."}
}

// setStartupValues makes the session's parameters (and what RESET ALL
// returns to) the settings of seq applied in order, so a later setting of a
// parameter wins; values, when not nil, are the server's spelling of each.
func (ss *session) setStartupValues(seq []startupParam, values []string) {
	var eff map[string]string // nil: none
	for i, p := range seq {
		v := p.value
		if values != nil {
			v = values[i]
		}
		if eff == nil {
			eff = make(map[string]string, len(seq))
		}
		eff[canonicalParamName(p.name)] = v
	}
	ss.params.setStartup(eff)
}

// runStartupCheck checks pairs on a pooled server connection of app. A
// connection that fails mid-check is destroyed and the check retried once on
// another (an idle connection may have died unnoticed). It returns the
// server's answer, or the client's FATAL when the server refused a setting,
// or an error when no connection could do the check.
func (s *Server) runStartupCheck(ctx context.Context, app, database string, pairs []startupParam) (*checkedSettings, *pgError, error) {
	var err error
	for attempt := 0; attempt < 2 && ctx.Err() == nil; attempt++ {
		var sc *pool.Conn
		sc, err = s.pool.Acquire(ctx, app, database)
		if err != nil {
			return nil, nil, err
		}
		var e *checkedSettings
		var verdict *pgError
		e, verdict, err = checkOnConn(ctx, sc, pairs)
		if err != nil {
			sc.Broken = true
			s.pool.Destroy(sc)
			continue
		}
		s.pool.Release(sc)
		return e, verdict, nil
	}
	if err == nil {
		err = ctx.Err()
	}
	return nil, nil, err
}

// checkOnConn applies pairs with set_config on sc inside a transaction that
// it rolls back, after RESET ALL so that values that combine with the
// current one (DateStyle) combine with the defaults, not with what the last
// client left on the connection. An error means sc is unusable.
func checkOnConn(ctx context.Context, sc *pool.Conn, pairs []startupParam) (*checkedSettings, *pgError, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	_ = sc.Net.SetDeadline(dl)
	defer sc.Net.SetDeadline(time.Time{})
	var q strings.Builder
	q.WriteString("BEGIN; RESET ALL; SELECT ")
	for i, p := range pairs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("pg_catalog.set_config(" + sqlLiteral(p.name) + ", " + sqlLiteral(p.value) + ", true)")
	}
	q.WriteString("; ROLLBACK")
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return nil, nil, err
	}
	st := stateOf(sc)
	e := &checkedSettings{}
	var verdict *pgError
	var broken error
	var status byte
	read := func(typ byte, body []byte) {
		switch typ {
		case 'E':
			e := pgerr.FromBody(body)
			if sev := e.Severity; sev == "FATAL" || sev == "PANIC" {
				broken = fmt.Errorf("server connection ended: %s", e.Message)
			} else if verdict == nil {
				verdict = e.Fatal()
			}
		case 'N':
			e.notices = wire.AppendFrame(e.notices, 'N', body)
		case 'D':
			dataRowColumns(body, func(i int, v []byte, null bool) {
				if i == len(e.values) && !null {
					e.values = append(e.values, string(v))
				}
			})
		case 'S':
			if k, rest, ok := wire.CString(body); ok {
				v, _, _ := wire.CString(rest)
				st.params[lower(string(k))] = string(v)
			}
		case 'Z':
			if len(body) > 0 {
				status = body[0]
			}
		}
	}
	if err := readUntilReady(sc, read); err != nil {
		return nil, nil, err
	}
	if broken != nil {
		return nil, nil, broken
	}
	if status == 'E' {
		// The error aborted the transaction before the ROLLBACK ran.
		if _, err := sc.Net.Write(wire.AppendQuery(nil, "ROLLBACK")); err != nil {
			return nil, nil, err
		}
		if err := readUntilReady(sc, read); err != nil {
			return nil, nil, err
		}
	}
	if status != 'I' {
		return nil, nil, fmt.Errorf("server connection in transaction state %q after the parameter check", status)
	}
	if verdict != nil {
		return nil, verdict, nil
	}
	if len(e.values) != len(pairs) {
		return nil, nil, fmt.Errorf("parameter check returned %d of %d values", len(e.values), len(pairs))
	}
	return e, nil, nil
}
