// Command keytable writes the configuration reference, docs/configuration.md,
// from the key declarations in package config ([config.Reference]). Run it
// with `go generate ./config`, or `go run ./config/cmd/keytable` from the
// repository's root; with -check it changes nothing and fails when the page
// is out of date.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
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
	fset := flag.NewFlagSet("keytable", flag.ContinueOnError)
	out := fset.String("out", config.ReferencePath, "the page to write")
	check := fset.Bool("check", false, "only report whether the page is up to date")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fset.Arg(0))
	}
	want := []byte(config.Reference())
	old, err := os.ReadFile(*out)
	if err != nil && !(errors.Is(err, fs.ErrNotExist) && !*check) {
		return err
	}
	if err == nil && bytes.Equal(old, want) {
		return nil
	}
	if *check {
		return fmt.Errorf("%s is out of date (run go generate ./config)", *out)
	}
	return os.WriteFile(*out, want, 0o644)
}
