package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockpool/lockpool/config"
)

func TestRun(t *testing.T) {
	fresh := config.Reference()
	const stale = "# Configuration reference\n| old |\n"
	for _, tc := range []struct {
		name  string
		in    *string // nil: no file
		check bool
		want  *string // file afterwards; nil: none
		err   string
	}{
		{name: "writes", in: ptr(stale), want: &fresh},
		{name: "creates", want: &fresh},
		{name: "up to date", in: &fresh, want: &fresh},
		{name: "check stale", in: ptr(stale), check: true, want: ptr(stale), err: "out of date"},
		{name: "check missing", check: true, err: "no such file"},
		{name: "check fresh", in: &fresh, check: true, want: &fresh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "configuration.md")
			if tc.in != nil {
				if err := os.WriteFile(p, []byte(*tc.in), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"-out", p}
			if tc.check {
				args = append(args, "-check")
			}
			err := run(args)
			if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("run = %v, want error %q", err, tc.err)
			}
			got, rerr := os.ReadFile(p)
			switch {
			case tc.want == nil && rerr == nil:
				t.Errorf("file written:\n%s", got)
			case tc.want != nil && (rerr != nil || string(got) != *tc.want):
				t.Errorf("file = %q (%v), want %q", got, rerr, *tc.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }
