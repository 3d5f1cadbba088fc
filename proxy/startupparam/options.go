package startupparam

import (
	"fmt"
	"strings"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// ParseOptions reads the startup "options" parameter as a PostgreSQL
// backend reads it (pg_split_opts, then process_postgres_switches with
// glibc's getopt): it returns the settings the switches stand for, in
// order, and the error PostgreSQL reports for a switch or argument it does
// not accept. With an error, the settings are those PostgreSQL applied
// before it saw the bad switch (getopt moves arguments that are no switches
// behind all switches): a setting among them that the server refuses is
// reported instead. Switches a backend ignores outside the postmaster (-b
// -C -D -E -j -n -r -T -v) are ignored.
func ParseOptions(opts string) ([]Param, error) {
	args := splitOptions(opts)
	var (
		seq      []Param
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
		return &pgerr.Error{Code: "42601", Message: "invalid command-line argument for server process: " + name,
			Hint: `Try "postgres --help" for more information.`}
	}
	set := func(name, value string) { seq = append(seq, Param{name, value}) }
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
			takesArg, known := postgresSwitch(flag)
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
						return seq, &pgerr.Error{Code: "42601", Message: "--" + optarg + " requires a value"}
					}
					return seq, &pgerr.Error{Code: "42601", Message: "-c " + optarg + " requires a value"}
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

// postgresOpts is the getopt option string of process_postgres_switches: a
// letter followed by ':' takes an argument.
const postgresOpts = "B:bc:C:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"

// postgresSwitch reports whether c is a switch of postgresOpts and whether
// it takes an argument.
func postgresSwitch(c byte) (takesArg, known bool) {
	i := strings.IndexByte(postgresOpts, c)
	if i < 0 || c == ':' {
		return false, false
	}
	return i+1 < len(postgresOpts) && postgresOpts[i+1] == ':', true
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
