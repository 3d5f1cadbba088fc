package integration

import (
	"context"
	"testing"
)

func TestBasicQueries(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "")
	ctx := context.Background()
	c := l.connect(t, "app", "appdb")
	var n int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("SELECT 1 = %d, %v", n, err)
	}
	for i := 0; i < 50; i++ {
		var s string
		if err := c.QueryRow(ctx, "SELECT $1::text || 'x'", "a").Scan(&s); err != nil || s != "ax" {
			t.Fatalf("param query = %q, %v", s, err)
		}
	}
	if _, err := c.Exec(ctx, "SELECT 1; SELECT 2"); err != nil {
		t.Fatal(err)
	}
}
