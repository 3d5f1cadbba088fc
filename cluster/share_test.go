package cluster

import (
	"math/rand/v2"
	"testing"
)

func TestFairShares(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		budget   int
		minShare int
		members  []member
		turn     int
		want     map[string]int
	}{
		{"one loaded, two idle, min 0", 6, 0, []member{{"a", 9}, {"b", 0}, {"c", 0}}, 0, map[string]int{"a": 6, "b": 0, "c": 0}},
		{"equal load", 6, 0, []member{{"a", 4}, {"b", 4}, {"c", 4}}, 0, map[string]int{"a": 2, "b": 2, "c": 2}},
		{"min share kept when idle", 6, 1, []member{{"a", 9}, {"b", 0}, {"c", 0}}, 0, map[string]int{"a": 4, "b": 1, "c": 1}},
		{"small demand satisfied first", 6, 0, []member{{"a", 1}, {"b", 9}, {"c", 9}}, 0, map[string]int{"a": 1, "b": 3, "c": 2}},
		{"odd unit to the first unmet", 7, 0, []member{{"c", 5}, {"a", 5}, {"b", 5}}, 0, map[string]int{"a": 3, "b": 2, "c": 2}},
		{"odd units move with the turn", 2, 0, []member{{"a", 5}, {"b", 5}, {"c", 5}}, 2, map[string]int{"a": 1, "b": 0, "c": 1}},
		{"min share larger than the budget allows", 2, 1, []member{{"a", 0}, {"b", 0}, {"c", 0}}, 0, map[string]int{"a": 0, "b": 0, "c": 0}},
		{"no demand", 6, 0, []member{{"a", 0}}, 0, map[string]int{"a": 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := fairShares(tc.budget, tc.minShare, tc.members, tc.turn)
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("share of %s = %d, want %d (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

func TestNextSlots(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		budget                  int
		held                    []int
		mine, share, open, want int
	}{
		{"raise by what is free", 6, []int{2, 3, 0}, 0, 4, 0, 1},
		{"raise fully", 6, []int{0, 0, 0}, 0, 6, 0, 6},
		{"lower to the share", 6, []int{6, 0}, 6, 3, 2, 3},
		{"lower no further than open", 6, []int{6, 0}, 6, 1, 4, 4},
		{"claim open connections first", 6, []int{0, 2}, 0, 1, 3, 3},
		{"nothing free", 6, []int{3, 3}, 3, 5, 3, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextSlots(tc.budget, tc.held, tc.mine, tc.share, tc.open); got != tc.want {
				t.Fatalf("nextSlots = %d, want %d", got, tc.want)
			}
		})
	}
}

// The invariant under random moves: instances run the protocol in any
// order (each step one instance, under the application's lock, with a
// random demand and random releases of its connections); open connections
// over all instances never exceed the budget and each instance's open
// count never exceeds its row.
func TestSlotProtocolKeepsBudget(t *testing.T) {
	t.Parallel()
	const budget, instances, steps = 6, 3, 20000
	r := rand.New(rand.NewPCG(1, 2))
	slots := make([]int, instances)
	limit := make([]int, instances)
	open := make([]int, instances)
	demand := make([]int, instances)
	names := []string{"a", "b", "c"}
	for step := 0; step < steps; step++ {
		i := r.IntN(instances)
		switch r.IntN(3) {
		case 0: // clients come and go
			demand[i] = r.IntN(9)
		case 1: // connections open up to the limit, or close
			open[i] = min(max(open[i], r.IntN(limit[i]+1)), max(open[i], limit[i]))
			if r.IntN(2) == 0 {
				open[i] = r.IntN(open[i] + 1)
			}
		default: // a tick of the protocol
			ms := make([]member, instances)
			for j := range ms {
				ms[j] = member{names[j], demand[j]}
			}
			share := fairShares(budget, 0, ms, step/100)[names[i]]
			if share < slots[i] {
				limit[i] = share // lower the limit first
			}
			n := nextSlots(budget, slots, slots[i], share, open[i])
			slots[i] = n
			limit[i] = min(n, max(limit[i], n))
		}
		total, sum := 0, 0
		for j := range open {
			total += open[j]
			sum += slots[j]
			if open[j] > slots[j] {
				t.Fatalf("step %d: instance %d has %d open, row says %d", step, j, open[j], slots[j])
			}
		}
		if total > budget || sum > budget {
			t.Fatalf("step %d: %d open, %d slots held, budget %d", step, total, sum, budget)
		}
	}
}
