// Command keytable writes README.md's configuration key table from the key
// declarations in package config, between the <!-- keys:begin --> and
// <!-- keys:end --> lines. Run it with `go generate ./config` (or
// `go run ./config/cmd/keytable -readme README.md` from the repository root);
// with -check it changes nothing and fails when the table is out of date.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/lockpool/lockpool/config"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "keytable:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("keytable", flag.ContinueOnError)
	readme := fs.String("readme", "README.md", "the README to update")
	check := fs.Bool("check", false, "only report whether the table is up to date")
	if err := fs.Parse(args); err != nil {
		return err
	}
	old, err := os.ReadFile(*readme)
	if err != nil {
		return err
	}
	updated, err := config.SpliceKeyTable(old)
	if err != nil {
		return fmt.Errorf("%s: %w", *readme, err)
	}
	if bytes.Equal(old, updated) {
		return nil
	}
	if *check {
		return fmt.Errorf("%s: the key table is out of date (run go generate ./config)", *readme)
	}
	info, err := os.Stat(*readme)
	if err != nil {
		return err
	}
	return os.WriteFile(*readme, updated, info.Mode().Perm())
}
