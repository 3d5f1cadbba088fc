package main

import (
	"strings"
	"testing"
)

func TestMedianResult(t *testing.T) {
	run := func(tps, p99, cpu, sw float64, n int64) *Result {
		return &Result{Target: "lockpool", TPS: tps, P99ms: p99, CPUPer1000Txn: cpu, UserPer1000Txn: cpu / 4, SwitchesPerTxn: sw, Transactions: n, CPUSeconds: 1}
	}
	failed := &Result{Target: "lockpool", Failed: true, Error: "boom", CPUSeconds: -1, CPUPer1000Txn: -1, UserPer1000Txn: -1, SwitchesPerTxn: -1}
	tests := []struct {
		name              string
		rounds            []*Result
		tps, p99, cpu, sw float64
		txns              int64
		failedWant        bool
		roundsKept        int
	}{
		{"one round is itself", []*Result{run(10, 1, 0.04, 0.5, 100)}, 10, 1, 0.04, 0.5, 100, false, 0},
		{"odd: each figure's own median", []*Result{run(30, 9, 0.03, 0.4, 300), run(10, 1, 0.05, 0.6, 100), run(20, 5, 0.04, 0.9, 200)}, 20, 5, 0.04, 0.6, 600, false, 3},
		{"even: mean of the middle two", []*Result{run(10, 2, 0.04, 0.5, 100), run(20, 4, 0.06, 0.7, 200)}, 15, 3, 0.05, 0.6, 300, false, 2},
		{"failed rounds are left out", []*Result{failed, run(10, 2, 0.04, 0.5, 100), run(30, 6, 0.02, 0.3, 300)}, 20, 4, 0.03, 0.4, 400, false, 3},
		{"all failed is a failure", []*Result{failed, failed}, 0, 0, -1, -1, 0, true, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := medianResult(tc.rounds)
			if m.Failed != tc.failedWant || m.TPS != tc.tps || m.P99ms != tc.p99 || !near(m.CPUPer1000Txn, tc.cpu) || !near(m.SwitchesPerTxn, tc.sw) || m.Transactions != tc.txns {
				t.Fatalf("got failed=%v tps=%v p99=%v cpu=%v sw=%v txns=%v; want %v %v %v %v %v %v",
					m.Failed, m.TPS, m.P99ms, m.CPUPer1000Txn, m.SwitchesPerTxn, m.Transactions, tc.failedWant, tc.tps, tc.p99, tc.cpu, tc.sw, tc.txns)
			}
			wantUser := tc.cpu / 4 // each round's user time is a quarter of its CPU
			if tc.failedWant {
				wantUser = -1
			}
			if !near(m.UserPer1000Txn, wantUser) {
				t.Fatalf("user %v, want %v", m.UserPer1000Txn, wantUser)
			}
			if len(m.Rounds) != tc.roundsKept {
				t.Fatalf("kept %d rounds, want %d", len(m.Rounds), tc.roundsKept)
			}
		})
	}
}

func near(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 }

func TestRoundTargets(t *testing.T) {
	e := &env{direct: &target{Name: "direct"}, lockpool: &target{Name: "lockpool"}, pgbouncer: &target{Name: "pgbouncer"}}
	noPgb := &env{direct: e.direct, lockpool: e.lockpool}
	for _, tc := range []struct {
		e     *env
		round int
		want  string
	}{
		{e, 1, "direct lockpool pgbouncer"},
		{e, 2, "direct pgbouncer lockpool"},
		{e, 3, "direct lockpool pgbouncer"},
		{noPgb, 2, "direct lockpool"},
	} {
		var names []string
		for _, x := range tc.e.roundTargets(tc.round) {
			names = append(names, x.Name)
		}
		if got := strings.Join(names, " "); got != tc.want {
			t.Errorf("round %d: %s, want %s", tc.round, got, tc.want)
		}
	}
}

func TestRoundRatios(t *testing.T) {
	res := func(tps ...float64) *Result {
		r := &Result{Target: "x"}
		for _, v := range tps {
			if v < 0 {
				r.Rounds = append(r.Rounds, &Result{Failed: true})
				continue
			}
			r.Rounds = append(r.Rounds, &Result{TPS: v})
		}
		return r
	}
	tps := func(x *Result) float64 { return x.TPS }
	for _, tc := range []struct {
		name   string
		lp, pb *Result
		want   string
	}{
		{"each round its own pair", res(10, 30, 22), res(20, 20, 20), " (lp/pgb by round: 0.50 1.50 1.10; their median 1.10)"},
		{"even count: mean of the middle two", res(10, 30), res(20, 20), " (lp/pgb by round: 0.50 1.50; their median 1.00)"},
		{"a failed round on either side drops the pair", res(10, -1, 40), res(20, 20, -1), ""},
		{"failed rounds leave the others paired", res(10, -1, 40, 20), res(20, 20, 20, 40), " (lp/pgb by round: 0.50 2.00 0.50; their median 0.50)"},
		{"one round: nothing to show", res(10), res(20), ""},
		{"rounds that do not line up are not paired", res(10, 20), res(20, 20, 20), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := byRound(tc.lp, tc.pb, tps); got != tc.want {
				t.Fatalf("byRound = %q, want %q", got, tc.want)
			}
		})
	}
}
