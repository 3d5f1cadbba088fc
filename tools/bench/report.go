package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

func printReport(w io.Writer, rep *Report) {
	m := rep.Machine
	fmt.Fprintf(w, "\nlockpool benchmark — %s\n", rep.Date)
	fmt.Fprintf(w, "machine: %d CPUs (nproc), %s, %d MB RAM, Linux %s, load at start %s\n",
		m.NProc, m.CPUModel, m.MemTotalKB/1024, m.Kernel, m.LoadAvg)
	fmt.Fprintf(w, "software: %s; %s; %s\n", m.PostgreSQL, orNA(m.PgBouncer), m.Go)
	fmt.Fprintf(w, "command: %s\n", rep.Command)
	s := rep.Settings
	fmt.Fprintf(w, "settings: pgbench -T %d -j 2 (≤ clients), scale %d; server-connection budget %d for lockpool (max_pinned %d) and PgBouncer (default_pool_size); PostgreSQL max_connections %d for direct\n",
		s.DurationSec, s.Scale, s.Budget, s.MaxPinned, s.DirectMaxConn)
	if s.Rounds > 1 {
		fmt.Fprintf(w, "rounds: %d per row, the targets alternating; each figure is the median of its rounds\n", s.Rounds)
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "workload\tdirect\tlockpool\tpgbouncer\tlp/pgb\tlp/direct\tp50 ms d/lp/pgb\tp99 ms d/lp/pgb\tcpu (user) µs/txn lp/pgb\tcpu lp/pgb\tswitches/txn lp/pgb\tnote\t")
	ext := map[string]*Result{}
	for _, r := range rep.Rows {
		if r.Mode == "extended" {
			ext[fmt.Sprintf("%s/%d", r.Script, r.Clients)] = r.Results["lockpool"]
		}
	}
	for _, r := range rep.Rows {
		d, lp, pb := r.Results["direct"], r.Results["lockpool"], r.Results["pgbouncer"]
		note := ""
		if r.Mode == "prepared" {
			if e := ext[fmt.Sprintf("%s/%d", r.Script, r.Clients)]; ok(e) && ok(lp) {
				note = fmt.Sprintf("lp prepared/extended %.2f", lp.TPS/e.TPS)
			}
		}
		for _, x := range []*Result{d, lp, pb} {
			if x != nil && x.Failed && x.Target != "pgbouncer" {
				note = strings.TrimSpace(note + " " + x.Target + ": " + trunc(x.Error, 60))
			}
		}
		fmt.Fprintf(tw, "%s tps\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.label(), tps(d), tps(lp), tps(pb), ratio(lp, pb, func(x *Result) float64 { return x.TPS }),
			ratio(lp, d, func(x *Result) float64 { return x.TPS }),
			triple(d, lp, pb, func(x *Result) float64 { return x.P50ms }),
			triple(d, lp, pb, func(x *Result) float64 { return x.P99ms }),
			cpuPair(lp, pb), cpuRatio(lp, pb), switchPair(lp, pb), note)
	}
	for _, n := range idleCounts(rep) {
		lp, pb := idleOf(rep, "lockpool", n), idleOf(rep, "pgbouncer", n)
		r := "n/a"
		if lp != nil && pb != nil && pb.KBPerClient > 0 {
			r = fmt.Sprintf("%.2f", lp.KBPerClient/pb.KBPerClient)
		}
		fmt.Fprintf(tw, "idle %d clients: kB RSS/client\tn/a\t%s\t%s\t%s\tn/a\t\t\t\t\t%s\t\n", n,
			idleKB(lp), idleKB(pb), r, "connected lp "+idleConn(lp)+", pgb "+idleConn(pb)+
				"; each of the second half: lp "+marginalKB(lp)+", pgb "+marginalKB(pb)+" kB")
	}
	if l := rep.Lease; l != nil {
		note := fmt.Sprintf("%d errors, lockpool cpu %.1f µs/pair", l.Errors, l.CPUPer1000*1000)
		if l.FirstError != "" {
			note += "; " + trunc(l.FirstError, 60)
		}
		fmt.Fprintf(tw, "lease acquire+release pairs/s, %d sessions\tn/a\t%.0f\tn/a\tn/a\tn/a\t\t\t\t\t%s\t\n", l.Sessions, l.PairsPerSec, note)
	}
	if l := rep.Locks; l != nil {
		note := fmt.Sprintf("budget %d, %d errors, %d unlocks false, pinned at most %g, fallbacks %g, lockpool cpu %.1f µs/pair",
			l.Budget, l.Errors, l.FalseUnlock, l.MaxPinned, l.Fallbacks, l.CPUPer1000*1000)
		if l.FirstError != "" {
			note += "; " + trunc(l.FirstError, 60)
		}
		fmt.Fprintf(tw, "advisory lock+unlock pairs/s (hold), %d sessions\tn/a\t%.0f\tn/a\tn/a\tn/a\t\t\t\t\t%s\t\n", l.Sessions, l.PairsPerSec, note)
	}
	if x := rep.Mixed; x != nil {
		if x.Error != "" {
			fmt.Fprintf(tw, "mixed %d%% pinned\tn/a\tfails\tn/a\tn/a\tn/a\t\t\t\t\t%s\t\n", 20, trunc(x.Error, 80))
		} else {
			fmt.Fprintf(tw, "mixed: %d unpinned tps, %d pinned vs 0\tn/a\t%.0f vs %.0f\tn/a\tn/a\tn/a\t\t\t\t\tpinned/no-pins %.3f (pinned seen %g)\t\n",
				x.Sessions-x.Pinned, x.Pinned, x.WithPinsTPS, x.NoPinsTPS, x.Ratio, x.PinnedSeen)
		}
	}
	tw.Flush()
	if rep.Login != nil {
		printLogin(w, rep.Login)
	}
	if len(rep.Split) > 0 {
		fmt.Fprintf(w, "\nlatency split, µs (tcpdump on lo; pgbench -S simple, %d clients; in: client's Query to the server's copy, server: to its first reply bytes, out: to the client's):\n", rep.Split[0].Clients)
		for _, x := range rep.Split {
			fmt.Fprintf(w, "  %s\n", splitLine(x))
		}
	}
	if len(rep.Sched) > 0 {
		fmt.Fprintf(w, "\nscheduler latency (perf sched latency over %.0f s of a pgbench -S simple run, %d clients; delay: wake-up or preemption to running, averaged over the command's tasks):\n", rep.Sched[0].Window, rep.Sched[0].Clients)
		for _, x := range rep.Sched {
			fmt.Fprintf(w, "  %s\n", schedLine(x))
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	printTargets(w, rep)
}

// idleCounts are the client counts of the run's idle tests, in order.
func idleCounts(rep *Report) []int {
	var ns []int
	for _, x := range rep.Idle {
		if !slices.Contains(ns, x.Clients) {
			ns = append(ns, x.Clients)
		}
	}
	return ns
}

// idleOf is target's idle test with n clients, or nil.
func idleOf(rep *Report, target string, n int) *IdleResult {
	for _, x := range rep.Idle {
		if x.Target == target && x.Clients == n {
			return x
		}
	}
	return nil
}

// printTargets checks lockpool's performance targets against this run:
// CPU per transaction at most PgBouncer's at 10, 50 and 100 clients (-S,
// simple and extended), throughput at least PgBouncer's at 10 clients and
// more, p99 at most PgBouncer's + 10 %, context switches per transaction at
// most PgBouncer's + 0.2 at 50 clients, -M prepared at least 0.95 × lockpool's
// own extended, at most 4 kB per idle client, unpinned sessions at least
// 0.9 × their throughput without pins, and at least 1,000 advisory lock +
// unlock pairs per second under hold with nothing pinned and no errors; in
// the login storm, CPU per login at most PgBouncer's and a login rate at
// least 0.95 × its (medians of the rounds' ratios).
func printTargets(w io.Writer, rep *Report) {
	fmt.Fprintln(w, "\ntargets:")
	for _, r := range rep.Rows {
		lp, pb := r.Results["lockpool"], r.Results["pgbouncer"]
		if !ok(lp) || !ok(pb) || r.Mode == "prepared" {
			continue
		}
		if r.Clients >= 10 {
			q := lp.TPS / pb.TPS
			fmt.Fprintf(w, "  tps lp/pgb ≥ 1.0: %s: %.2f %s%s\n", r.label(), q, mark(q >= 1.0),
				byRound(lp, pb, func(x *Result) float64 { return x.TPS }))
			fmt.Fprintf(w, "  p99 ≤ pgb + 10 %%: %s: %.2f vs %.2f ms %s%s\n", r.label(), lp.P99ms, pb.P99ms, mark(lp.P99ms <= 1.1*pb.P99ms),
				byRound(lp, pb, func(x *Result) float64 { return x.P99ms }))
		}
		if r.Script == "select" && (r.Clients == 10 || r.Clients == 50 || r.Clients == 100) && pb.CPUPer1000Txn > 0 {
			q := lp.CPUPer1000Txn / pb.CPUPer1000Txn
			fmt.Fprintf(w, "  cpu/txn lp/pgb ≤ 1.0: %s: %.2f %s\n", r.label(), q, mark(q <= 1.0))
		}
		if r.Clients == 50 && lp.SwitchesPerTxn >= 0 && pb.SwitchesPerTxn >= 0 {
			fmt.Fprintf(w, "  switches/txn ≤ pgb + 0.2: %s: %.2f vs %.2f %s\n", r.label(), lp.SwitchesPerTxn, pb.SwitchesPerTxn, mark(lp.SwitchesPerTxn <= pb.SwitchesPerTxn+0.2))
		}
	}
	for _, n := range idleCounts(rep) {
		if lp := idleOf(rep, "lockpool", n); lp != nil {
			fmt.Fprintf(w, "  ≤ 4 kB per idle client, all connect: %d clients: %.2f kB (each of the second half %.2f kB), %d/%d connected %s\n", n, lp.KBPerClient, lp.MarginalKB, lp.Connected, lp.Clients,
				mark(lp.KBPerClient <= 4 && lp.AllConnected))
		}
	}
	ext := map[string]*Result{}
	for _, r := range rep.Rows {
		if r.Mode == "extended" {
			ext[fmt.Sprintf("%s/%d", r.Script, r.Clients)] = r.Results["lockpool"]
		}
	}
	for _, r := range rep.Rows {
		if r.Mode != "prepared" {
			continue
		}
		lp, e := r.Results["lockpool"], ext[fmt.Sprintf("%s/%d", r.Script, r.Clients)]
		if ok(lp) && ok(e) {
			q := lp.TPS / e.TPS
			fmt.Fprintf(w, "  lp prepared ≥ 0.95 × extended: %s: %.2f %s\n", r.label(), q, mark(q >= 0.95))
		} else if lp != nil && lp.Failed {
			fmt.Fprintf(w, "  lp prepared ≥ 0.95 × extended: %s: lockpool fails: %s MISS\n", r.label(), lp.Error)
		}
	}
	if x := rep.Login; x != nil && x.CPURatio > 0 {
		fmt.Fprintf(w, "  login storm: cpu per login lp/pgb ≤ 1.0: %.2f %s; login rate lp/pgb ≥ 0.95: %.2f %s\n",
			x.CPURatio, mark(x.CPURatio <= 1.0), x.RateRatio, mark(x.RateRatio >= 0.95))
	}
	if x := rep.Mixed; x != nil && x.Error == "" {
		fmt.Fprintf(w, "  unpinned ≥ 0.9 × no-pins: %.3f %s\n", x.Ratio, mark(x.Ratio >= 0.9))
	}
	if l := rep.Locks; l != nil {
		fmt.Fprintf(w, "  hold: ≥ 1,000 lock+unlock pairs/s from %d sessions, 0 pinned, 0 errors: %.0f/s, pinned at most %g, %d errors %s\n",
			l.Sessions, l.PairsPerSec, l.MaxPinned, l.Errors, mark(l.PairsPerSec >= 1000 && l.MaxPinned == 0 && l.Errors == 0 && l.FalseUnlock == 0))
	}
}

// roundRatios are f(lp)/f(pb) of each round both targets completed, in
// round order. The two runs of a pair ran back to back (the targets
// alternate within a round), so their spread shows how far the machine's
// drift moves a ratio of medians. Nil with fewer than two rounds.
func roundRatios(lp, pb *Result, f func(*Result) float64) []float64 {
	if len(lp.Rounds) < 2 || len(lp.Rounds) != len(pb.Rounds) {
		return nil
	}
	var q []float64
	for i, a := range lp.Rounds {
		if b := pb.Rounds[i]; ok(a) && ok(b) && f(b) > 0 {
			q = append(q, f(a)/f(b))
		}
	}
	return q
}

// byRound formats roundRatios for a target line: "" without rounds.
func byRound(lp, pb *Result, f func(*Result) float64) string {
	q := roundRatios(lp, pb, f)
	if len(q) < 2 {
		return ""
	}
	parts := make([]string, len(q))
	for i, x := range q {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf(" (lp/pgb by round: %s; their median %.2f)", strings.Join(parts, " "), medianOf(q))
}

func mark(b bool) string {
	if b {
		return "ok"
	}
	return "MISS"
}

func ok(r *Result) bool { return r != nil && !r.Failed && r.TPS > 0 }

func tps(r *Result) string {
	switch {
	case r == nil:
		return "n/a"
	case r.Failed:
		return "fails"
	}
	return fmt.Sprintf("%.0f", r.TPS)
}

func ratio(a, b *Result, f func(*Result) float64) string {
	if !ok(a) || !ok(b) || f(b) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", f(a)/f(b))
}

func triple(d, lp, pb *Result, f func(*Result) float64) string {
	v := func(r *Result) string {
		if !ok(r) || f(r) < 0 {
			return "-"
		}
		x := f(r)
		if x >= 100 {
			return fmt.Sprintf("%.0f", x)
		}
		return fmt.Sprintf("%.2f", x)
	}
	return v(d) + " / " + v(lp) + " / " + v(pb)
}

func cpuPair(lp, pb *Result) string {
	v := func(r *Result) string {
		if !ok(r) || r.CPUPer1000Txn < 0 {
			return "-"
		}
		if r.UserPer1000Txn < 0 {
			return fmt.Sprintf("%.1f", r.CPUPer1000Txn*1000)
		}
		return fmt.Sprintf("%.1f (%.1f)", r.CPUPer1000Txn*1000, r.UserPer1000Txn*1000)
	}
	return v(lp) + " / " + v(pb)
}

func switchPair(lp, pb *Result) string {
	v := func(r *Result) string {
		if !ok(r) || r.SwitchesPerTxn < 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", r.SwitchesPerTxn)
	}
	return v(lp) + " / " + v(pb)
}

func cpuRatio(lp, pb *Result) string {
	if !ok(lp) || !ok(pb) || pb.CPUPer1000Txn <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", lp.CPUPer1000Txn/pb.CPUPer1000Txn)
}

func idleKB(x *IdleResult) string {
	if x == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", x.KBPerClient)
}

func marginalKB(x *IdleResult) string {
	if x == nil || x.MarginalKB == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", x.MarginalKB)
}

func idleConn(x *IdleResult) string {
	if x == nil {
		return "n/a"
	}
	return fmt.Sprintf("%d/%d", x.Connected, x.Clients)
}

func orNA(s string) string {
	if s == "" {
		return "PgBouncer n/a"
	}
	return s
}

func trunc(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
