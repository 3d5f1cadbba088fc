package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// chartReport is a small report: -S simple at 1 and 100 clients (direct
// only at 1), tpcb prepared at 10 with PgBouncer failing. noCPU and noP99
// leave those figures out, as an older JSON or direct-only run would.
func chartReport(noCPU, noP99 bool) *Report {
	res := func(target string, tps, p99, cpuMs float64) *Result {
		r := &Result{Target: target, TPS: tps, P99ms: p99, CPUPer1000Txn: cpuMs, SwitchesPerTxn: -1}
		if noCPU || target == "direct" {
			r.CPUPer1000Txn = -1
		}
		if noP99 {
			r.P99ms = 0 // absent from the JSON
		}
		return r
	}
	failed := &Result{Target: "pgbouncer", Failed: true, Error: `prepared statement "P_0" already exists`, P99ms: -1, CPUPer1000Txn: -1}
	return &Report{
		Date:     "2026-12-04T23:21:07Z",
		Machine:  Machine{NProc: 2, CPUModel: "AMD EPYC <test> & co", Kernel: "6.18.0", MemTotalKB: 24 << 20, PgBouncer: "PgBouncer 1.18.0"},
		Settings: Settings{DurationSec: 8, Rounds: 5, Scale: 10, Budget: 10},
		Rows: []*Row{
			{Script: "select", Mode: "simple", Clients: 100, Results: map[string]*Result{
				"lockpool": res("lockpool", 13942.4, 19.9, 0.0243), "pgbouncer": res("pgbouncer", 12125, 22.1, 0.0349)}},
			{Script: "select", Mode: "simple", Clients: 1, Results: map[string]*Result{
				"direct": res("direct", 16243, 0.15, -1), "lockpool": res("lockpool", 9866, 0.19, 0.0381), "pgbouncer": res("pgbouncer", 10555, 0.16, 0.0327)}},
			{Script: "tpcb", Mode: "prepared", Clients: 10, Results: map[string]*Result{
				"direct": res("direct", 3460, 14.8, -1), "lockpool": res("lockpool", 2262, 1167, 0.160), "pgbouncer": failed}},
		},
	}
}

func TestWriteCharts(t *testing.T) {
	all := []string{"PostgreSQL (direct)", "lockpool", "PgBouncer"}
	poolers := []string{"lockpool", "PgBouncer"}
	header := []string{"2026-12-04T23:21:07Z", "2 CPUs, AMD EPYC &lt;test&gt; &amp; co", "pgbench TPC-B, -M prepared", "fails"}
	tests := []struct {
		name string
		rep  *Report
		// want are the files written, each with strings it must contain:
		// the targets' names, a value label and the header.
		want map[string][]string
	}{
		{"every figure", chartReport(false, false), map[string][]string{
			"tps.svg":     append(slices.Concat(all, header), "16,243", "13,942", "transactions per second"),
			"cpu.svg":     append(slices.Concat(poolers, header), "38.1", "24.3", "160"),
			"latency.svg": append(slices.Concat(all, header), "0.19", "19.9", "1,167"),
		}},
		{"no pooler CPU", chartReport(true, false), map[string][]string{
			"tps.svg":     append(slices.Concat(all, header), "9,866"),
			"latency.svg": append(slices.Concat(all, header), "22.1"),
		}},
		{"no p99", chartReport(false, true), map[string][]string{
			"tps.svg": append(slices.Concat(all, header), "12,125"),
			"cpu.svg": append(slices.Concat(poolers, header), "34.9"),
		}},
		{"no pgbench rows", &Report{Date: "2026-12-04T23:21:07Z"}, map[string][]string{}},
		{"only failed runs", &Report{Rows: []*Row{{Script: "select", Mode: "simple", Clients: 1, Results: map[string]*Result{
			"lockpool": {Target: "lockpool", Failed: true, TPS: 5, P99ms: 1, CPUPer1000Txn: 0.03}}}}}, map[string][]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			first, second := t.TempDir(), t.TempDir()
			paths, err := writeCharts(first, tc.rep)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := writeCharts(second, tc.rep); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range paths {
				names = append(names, filepath.Base(p))
			}
			entries, err := os.ReadDir(first)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != len(tc.want) || len(names) != len(tc.want) {
				t.Fatalf("wrote %v (%d files in the directory), want %d files", names, len(entries), len(tc.want))
			}
			for file, contains := range tc.want {
				b, err := os.ReadFile(filepath.Join(first, file))
				if err != nil {
					t.Fatalf("%s: %v (wrote %v)", file, err, names)
				}
				if err := wellFormed(b); err != nil {
					t.Fatalf("%s is not well-formed XML: %v", file, err)
				}
				for _, s := range contains {
					if !bytes.Contains(b, []byte(s)) {
						t.Errorf("%s lacks %q", file, s)
					}
				}
				again, err := os.ReadFile(filepath.Join(second, file))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(b, again) {
					t.Errorf("%s differs between two renderings of the same report", file)
				}
			}
		})
	}
}

// wellFormed reads b to the end with an XML decoder and checks that its
// root element is an svg.
func wellFormed(b []byte) error {
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		return errors.New("root element is " + root + ", not svg")
	}
	return nil
}

func TestAxisStep(t *testing.T) {
	for _, tc := range []struct {
		top, step float64
		places    int
	}{
		{18200, 5000, 0},
		{4.1, 1, 0},
		{0.21, 0.05, 2},
		{1300, 500, 0},
		{120, 25, 0},
		{0, 1, 0},
	} {
		step := axisStep(tc.top)
		if !near(step, tc.step) || stepDecimals(step) != tc.places {
			t.Errorf("axisStep(%v) = %v with %d decimals, want %v with %d", tc.top, step, stepDecimals(step), tc.step, tc.places)
		}
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[string]string{"0": "0", "999": "999", "1000": "1,000", "16243": "16,243", "1234567.25": "1,234,567.25", "-12000": "-12,000"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%q) = %q, want %q", in, got, want)
		}
	}
	if got := strings.Join([]string{decimals(0.1549, 2), decimals(19.94, 2), decimals(1167.4, 2)}, " "); got != "0.15 19.9 1,167" {
		t.Errorf("decimals: %s", got)
	}
}
