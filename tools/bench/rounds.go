package main

import "sort"

// medianResult folds the rounds of one target in one row into the result
// the row reports: each figure is the median over the rounds that did not
// fail (so one round's figures may come from different runs), the
// transaction count their sum, and every round is kept in Rounds. With a
// single round the result is that round's. When every round failed, the
// result is the first failure.
func medianResult(rounds []*Result) *Result {
	if len(rounds) == 1 {
		return rounds[0]
	}
	var good []*Result
	for _, r := range rounds {
		if !r.Failed {
			good = append(good, r)
		}
	}
	if len(good) == 0 {
		r := *rounds[0]
		r.Rounds = rounds
		return &r
	}
	m := &Result{Target: good[0].Target, Rounds: rounds, CPUWindow: "median of rounds"}
	for _, r := range good {
		m.Transactions += r.Transactions
		m.CPUSeconds += r.CPUSeconds
		m.WallSeconds += r.WallSeconds
	}
	m.TPS = median(good, func(r *Result) float64 { return r.TPS })
	m.P50ms = median(good, func(r *Result) float64 { return r.P50ms })
	m.P99ms = median(good, func(r *Result) float64 { return r.P99ms })
	m.CPUPer1000Txn = median(good, func(r *Result) float64 { return r.CPUPer1000Txn })
	m.UserPer1000Txn = median(good, func(r *Result) float64 { return r.UserPer1000Txn })
	m.SwitchesPerTxn = median(good, func(r *Result) float64 { return r.SwitchesPerTxn })
	if m.CPUPer1000Txn < 0 {
		m.CPUSeconds = -1 // direct: no pooler
	}
	return m
}

// median returns the median of f over rs (the mean of the middle two for
// an even count).
func median(rs []*Result, f func(*Result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return medianOf(v)
}

// medianOf returns the median of v (the mean of the middle two for an even
// count), sorting v in place.
func medianOf(v []float64) float64 {
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
