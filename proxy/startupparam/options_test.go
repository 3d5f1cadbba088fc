package startupparam

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// TestParseOptions: the options parameter is read as a PostgreSQL 15
// backend reads it. The expected errors are what PostgreSQL 15.18 answered
// to the same options (the integration tests compare more cases live).
func TestParseOptions(t *testing.T) {
	type sp = Param
	for _, tc := range []struct {
		opts string
		want []Param
		err  string // message of the error, "" for none
	}{
		{"", nil, ""},
		{"-c a=b", []sp{{"a", "b"}}, ""},
		{"-cfoo=bar", []sp{{"foo", "bar"}}, ""},
		{"-c a=b --c-d=e -e -S 1MB", []sp{{"a", "b"}, {"c_d", "e"}, {"datestyle", "euro"}, {"work_mem", "1MB"}}, ""},
		{`-c search_path=a\ b\\c`, []sp{{"search_path", `a b\c`}}, ""},
		{"-c\tsearch_path=x  ", []sp{{"search_path", "x"}}, ""},
		{"-c DateStyle-x=foo", []sp{{"DateStyle_x", "foo"}}, ""},
		{"-c search_path=", []sp{{"search_path", ""}}, ""},
		{"-d 2", []sp{{"log_min_messages", "debug2"}, {"log_statement", "all"}}, ""},
		{"-d0", []sp{{"log_min_messages", "notice"}}, ""},
		{"-f s -t pa -tpl -te", []sp{{"enable_seqscan", "false"}, {"log_parser_stats", "true"}, {"log_planner_stats", "true"}, {"log_executor_stats", "true"}}, ""},
		{"-se", []sp{{"log_statement_stats", "true"}, {"datestyle", "euro"}}, ""},
		{"-B 100 -P", []sp{{"shared_buffers", "100"}, {"ignore_system_indexes", "true"}}, ""},
		{"-C x -n -T -D /x -r y -v 9 -b -E -j", nil, ""},
		{"-- ", nil, ""},
		// Errors, with the settings PostgreSQL applied before it saw them.
		{"-x", nil, "invalid command-line argument for server process: -x"},
		{"foo", nil, "invalid command-line argument for server process: foo"},
		{"foo -c zzz=1", []sp{{"zzz", "1"}}, "invalid command-line argument for server process: foo"},
		{"-c zzz=1 foo", []sp{{"zzz", "1"}}, "invalid command-line argument for server process: foo"},
		{"-sx", []sp{{"log_statement_stats", "true"}}, "invalid command-line argument for server process: -sx"},
		{"-xs", nil, "invalid command-line argument for server process: postgres"},
		{"-f z", nil, "invalid command-line argument for server process: z"},
		{"-c", nil, "invalid command-line argument for server process: -c"},
		{"-c foo", nil, "-c foo requires a value"},
		{"--foo", nil, "--foo requires a value"},
		{"-- foo", nil, "invalid command-line argument for server process: foo"},
	} {
		t.Run(tc.opts, func(t *testing.T) {
			got, err := ParseOptions(tc.opts)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("settings %q, want %q", got, tc.want)
			}
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.err != "":
				var pe *pgerr.Error
				if !errors.As(err, &pe) || pe.Code != "42601" || pe.Message != tc.err {
					t.Errorf("error %v, want 42601 %q", err, tc.err)
				}
			}
		})
	}
}

func TestParseBool(t *testing.T) {
	for _, tc := range []struct {
		in      string
		val, ok bool
	}{
		{"true", true, true}, {"T", true, true}, {"tru", true, true}, {"truex", false, false},
		{"yes", true, true}, {"Y", true, true}, {"on", true, true}, {"ON", true, true}, {"1", true, true},
		{"false", false, true}, {"f", false, true}, {"no", false, true}, {"of", false, true}, {"off", false, true}, {"0", false, true},
		{"o", false, false}, {"offf", false, false}, {"01", false, false}, {"", false, false}, {"database", false, false},
	} {
		if val, ok := ParseBool(tc.in); val != tc.val || ok != tc.ok {
			t.Errorf("ParseBool(%q) = %v, %v; want %v, %v", tc.in, val, ok, tc.val, tc.ok)
		}
	}
}

// startupMsgs is what a client got before the close, summarised: single-byte

// FuzzParseOptions: the options parser never panics, its only error is
// 42601, a name given with -c or --name=value never keeps a dash, and the
// split into arguments is white space unless escaped: ASCII options without
// a backslash split as strings.Fields splits them, and arguments written
// back with every byte escaped split into themselves again.
func FuzzParseOptions(f *testing.F) {
	for _, s := range []string{"", "-c a=b --c-d=e -e -S 1MB", `-c search_path=a\ b\\c`, "-d 2 -f s -t pa -tpl -te", "-sx", "-xs", "foo -c zzz=1", "-c", "--foo", "-- foo", "-\\"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, opts string) {
		seq, err := ParseOptions(opts)
		if err != nil {
			var pe *pgerr.Error
			if !errors.As(err, &pe) || pe.Code != "42601" {
				t.Fatalf("ParseOptions(%q): error %v, want a 42601", opts, err)
			}
		}
		for _, p := range seq {
			if strings.Contains(p.Name, "-") {
				t.Fatalf("ParseOptions(%q): setting name %q keeps a dash", opts, p.Name)
			}
		}
		args := splitOptions(opts)
		ascii := !strings.ContainsFunc(opts, func(r rune) bool { return r >= 0x80 })
		if ascii && !strings.Contains(opts, `\`) && !slices.Equal(args, strings.Fields(opts)) {
			t.Fatalf("splitOptions(%q) = %q, strings.Fields %q", opts, args, strings.Fields(opts))
		}
		var b strings.Builder
		for _, a := range args {
			if a == "" {
				return // a lone trailing backslash: an empty argument, which no escaping writes
			}
			b.WriteByte(' ')
			for i := 0; i < len(a); i++ {
				b.WriteByte('\\')
				b.WriteByte(a[i])
			}
		}
		if again := splitOptions(b.String()); !slices.Equal(again, args) {
			t.Fatalf("splitOptions(%q) = %q; escaped and split again: %q", opts, args, again)
		}
	})
}

func TestParamNames(t *testing.T) {
	for _, tc := range []struct {
		name, canonical string
		lazy            bool // LazilyCheckable alone
	}{
		{"DateStyle", "datestyle", true},
		{"application_name", "application_name", true},
		{"sort_mem", "work_mem", false},
		{"VACUUM_MEM", "maintenance_work_mem", false},
		{"myapp.X", "myapp.x", false},
	} {
		if got := CanonicalName(tc.name); got != tc.canonical {
			t.Errorf("CanonicalName(%q) = %q, want %q", tc.name, got, tc.canonical)
		}
		if got := LazilyCheckable([]Param{{"TimeZone", "UTC"}, {tc.name, "x"}}); got != tc.lazy {
			t.Errorf("LazilyCheckable with %q = %v, want %v", tc.name, got, tc.lazy)
		}
	}
	if !LazilyCheckable(nil) {
		t.Error("LazilyCheckable(nil) = false")
	}
	for _, tc := range []struct {
		p    Param
		want bool
	}{
		{Param{"application_name", "web-1"}, false},
		{Param{"Application_Name", "web 1"}, false},
		{Param{"application_name", ""}, false},
		{Param{"application_name", strings.Repeat("a", 63)}, false},
		{Param{"application_name", strings.Repeat("a", 64)}, true},
		{Param{"application_name", "caf\u00e9"}, true},
		{Param{"application_name", "a\tb"}, true},
		{Param{"DateStyle", "iso"}, true},
	} {
		if got := NeedsCheck(tc.p); got != tc.want {
			t.Errorf("NeedsCheck(%q) = %v, want %v", tc.p, got, tc.want)
		}
	}
	for _, tc := range []struct {
		seq  []Param
		name string // the parameter refused, "" for none
	}{
		{nil, ""},
		{[]Param{{"search_path", "a"}, {"rolename", "x"}}, ""},
		{[]Param{{"search_path", "a"}, {"Role", "x"}, {"session_authorization", "y"}}, "role"},
		{[]Param{{"SESSION_AUTHORIZATION", "y"}}, "session_authorization"},
	} {
		err := CheckUnsupported(tc.seq)
		var pe *pgerr.Error
		switch {
		case tc.name == "" && err != nil:
			t.Errorf("CheckUnsupported(%q): %v, want nil", tc.seq, err)
		case tc.name != "" && (!errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Message, `"`+tc.name+`"`)):
			t.Errorf("CheckUnsupported(%q): %v, want 0A000 naming %q", tc.seq, err, tc.name)
		}
	}
}
