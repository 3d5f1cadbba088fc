package cluster

import "sort"

// member is one live instance's claim on an application's budget, as the
// fair split sees it.
type member struct {
	instance string
	demand   int
}

// fairShares splits budget over the live members: each first gets
// minShare (as far as the budget goes), then the rest is filled level by
// level up to each member's demand (max-min fairness); units a level
// cannot split evenly go to members with unmet demand in instance order,
// starting at index turn (mod the member count) so that, with turn moving
// over time, no member goes without them for long (a budget of 2 pins
// over 3 busy instances). Every instance computes the same split from the
// same rows and turn. The shares never add up to more than budget.
func fairShares(budget, minShare int, members []member, turn int) map[string]int {
	ms := append([]member(nil), members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].instance < ms[j].instance })
	out := make(map[string]int, len(ms))
	if len(ms) == 0 || budget <= 0 {
		for _, m := range ms {
			out[m.instance] = 0
		}
		return out
	}
	floor := min(minShare, budget/len(ms))
	total := func(level int) int {
		sum := 0
		for _, m := range ms {
			sum += max(floor, min(m.demand, level))
		}
		return sum
	}
	level := 0
	for level < budget && total(level+1) <= budget {
		level++
	}
	left := budget
	for _, m := range ms {
		out[m.instance] = max(floor, min(m.demand, level))
		left -= out[m.instance]
	}
	for k := range ms {
		if left == 0 {
			break
		}
		m := ms[(k+turn)%len(ms)]
		if m.demand > out[m.instance] {
			out[m.instance]++
			left--
		}
	}
	return out
}

// nextSlots is the slot count an instance writes to its row, given the
// budget, the slots of every row of the application (its own included),
// its own row's slots, its fair share and the connections it has open now
// (after lowering its limit to the share). Up: by no more than is free, so
// the sum stays within the budget; down: to the share but never below what
// is still open, so the row always covers the open connections.
func nextSlots(budget int, held []int, mine, share, open int) int {
	want := max(share, open)
	if want > mine {
		sum := 0
		for _, h := range held {
			sum += h
		}
		return mine + max(0, min(want-mine, budget-sum))
	}
	return want
}
