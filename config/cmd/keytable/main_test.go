package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockpool/lockpool/config"
)

func TestRun(t *testing.T) {
	stale := "# x\n" + config.KeysBegin + "\n| old |\n" + config.KeysEnd + "\nrest\n"
	fresh := "# x\n" + config.KeysBegin + "\n" + config.KeyTable() + config.KeysEnd + "\nrest\n"
	for _, tc := range []struct {
		name, in string
		check    bool
		want     string // file afterwards
		err      string
	}{
		{name: "writes", in: stale, want: fresh},
		{name: "up to date", in: fresh, want: fresh},
		{name: "check stale", in: stale, check: true, want: stale, err: "out of date"},
		{name: "check fresh", in: fresh, check: true, want: fresh},
		{name: "no markers", in: "# x\n", want: "# x\n", err: "need exactly one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "README.md")
			if err := os.WriteFile(p, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"-readme", p}
			if tc.check {
				args = append(args, "-check")
			}
			err := run(args)
			if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("run = %v, want error %q", err, tc.err)
			}
			got, rerr := os.ReadFile(p)
			if rerr != nil || string(got) != tc.want {
				t.Errorf("file =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
