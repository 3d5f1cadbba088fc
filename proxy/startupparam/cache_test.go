package startupparam

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// TestCache: the first Begin of a key owns its check and later ones wait
// for it; Finish hands every waiter the outcome; only an accepted set is
// remembered, and the cache stays within maxCachedSets.
func TestCache(t *testing.T) {
	var c Cache
	_, ch, owner := c.Begin("a")
	if ch == nil || !owner {
		t.Fatalf("first Begin: check %v, owner %v; want a check to own", ch, owner)
	}
	_, ch2, owner2 := c.Begin("a")
	if ch2 != ch || owner2 {
		t.Fatalf("second Begin: check %p, owner %v; want the first's %p, not owner", ch2, owner2, ch)
	}
	select {
	case <-ch.Done():
		t.Fatal("Done before Finish")
	default:
	}
	want := &Checked{Values: []string{"ISO, MDY"}}
	c.Finish("a", ch, want, nil, nil)
	<-ch2.Done()
	if got, verdict, err := ch2.Result(); got != want || verdict != nil || err != nil {
		t.Fatalf("Result %v, %v, %v; want the accepted set", got, verdict, err)
	}
	if got, ch, _ := c.Begin("a"); got != want || ch != nil {
		t.Fatalf("Begin after an accepted check: %v, %v; want the remembered set", got, ch)
	}

	// Refusals and failures are not remembered.
	for _, outcome := range []struct {
		verdict *pgerr.Error
		err     error
	}{{&pgerr.Error{Code: "22023"}, nil}, {nil, errors.New("no server")}} {
		_, ch, owner := c.Begin("b")
		if !owner {
			t.Fatal("Begin of b: not owner")
		}
		c.Finish("b", ch, nil, outcome.verdict, outcome.err)
		if _, verdict, err := ch.Result(); verdict != outcome.verdict || err != outcome.err {
			t.Fatalf("Result %v, %v; want %v, %v", verdict, err, outcome.verdict, outcome.err)
		}
		if got, ch, owner := c.Begin("b"); got != nil || !owner {
			t.Fatalf("Begin after a refusal or failure: %v, owner %v; want a new check", got, owner)
		} else {
			c.Finish("b", ch, nil, nil, errors.New("again"))
		}
	}

	for i := 0; i < 2*maxCachedSets; i++ {
		key := fmt.Sprint("k", i)
		_, ch, _ := c.Begin(key)
		c.Finish(key, ch, &Checked{}, nil, nil)
	}
	if n := len(c.sets); n > maxCachedSets {
		t.Fatalf("%d sets remembered, want at most %d", n, maxCachedSets)
	}
	if n := len(c.inflight); n != 0 {
		t.Fatalf("%d checks in flight after all finished", n)
	}
}
