package integration

import (
	"context"
	"os"
	"testing"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// testRoles are the roles TestMain makes on the shared cluster: the
// applications' users, and one role for each test that counts its backends
// in pg_stat_activity (bench, hup, dier, params, pooler, psqlr, lkrand,
// lkhold, and clbudget, clkill, clpin, clcancel, clstall, clclosed for the
// cluster budget tests).
var testRoles = []string{"app", "app2", "jobs", "rejecter", "other",
	"bench", "hup", "dier", "params", "pooler", "psqlr", "lkrand", "lkhold",
	"clbudget", "clkill", "clpin", "clcancel", "clstall", "clclosed"}

func TestMain(m *testing.M) {
	code := pgtest.RunMain(m, func(c *pgtest.Cluster) error {
		ctx := context.Background()
		for _, u := range testRoles {
			if err := c.CreateRole(ctx, u, testenv.Password); err != nil {
				return err
			}
		}
		if err := c.CreateDatabase(ctx, "appdb", "app"); err != nil {
			return err
		}
		if err := c.CreateDatabase(ctx, "benchdb", "bench"); err != nil {
			return err
		}
		return c.Exec(ctx, "appdb", "GRANT ALL ON SCHEMA public TO PUBLIC; GRANT CREATE ON DATABASE appdb TO PUBLIC")
	})
	testenv.RemoveLockpoolBinary()
	os.Exit(code)
}
