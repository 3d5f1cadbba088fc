package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// Pair is a primary and its streaming standby, started for one test: role
// app (with [Password]) owns database appdb on both. Primary and Standby
// name the clusters' roles now; Switch swaps them.
type Pair struct {
	Primary, Standby *pgtest.Cluster
	sync             bool // the standby is synchronous, also after Switch
}

// StartPair starts a fresh primary (not the shared cluster: failover tests
// stop it) and a standby made from it, synchronous when sync is set (so a
// commit acknowledged by the primary is on the standby too). Both are
// destroyed when the test ends.
func StartPair(t *testing.T, sync bool) *Pair {
	t.Helper()
	pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy() })
	if err := p.CreateRole(ctx, "app", Password); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateDatabase(ctx, "appdb", "app"); err != nil {
		t.Fatal(err)
	}
	s, err := p.StartStandby(ctx, pgtest.StandbyOptions{Sync: sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Destroy() })
	return &Pair{Primary: p, Standby: s, sync: sync}
}

// Switch is a switchover: the primary is stopped cleanly, the standby
// promoted, and the old primary restarted as its standby (synchronous
// again if the pair was started so). It returns when each step happened
// ([pgtest.SwitchoverTimes]).
func (p *Pair) Switch(ctx context.Context) (pgtest.SwitchoverTimes, error) {
	ts, err := p.Primary.SwitchoverTimed(ctx, p.Standby)
	if err != nil {
		return ts, err
	}
	p.Primary, p.Standby = p.Standby, p.Primary
	if p.sync {
		if err := p.Primary.AddSyncStandby(ctx, p.Standby); err != nil {
			return ts, err
		}
	}
	return ts, nil
}

// Exec runs sql as the superuser on the current primary's database db.
func (p *Pair) Exec(ctx context.Context, db, sql string, args ...any) error {
	return p.Primary.Exec(ctx, db, sql, args...)
}

// Connect opens a superuser connection to c's database db.
func Connect(ctx context.Context, c *pgtest.Cluster, db string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, c.SuperuserDSN(db))
}

// HostsYAML is [AppsYAML] with server.hosts listing the clusters (host and
// port removed) and more server: lines serverExtra (indented two spaces).
func HostsYAML(hosts []*pgtest.Cluster, serverMax int, top, serverExtra string, apps ...App) string {
	y := AppsYAML(hosts[0], serverMax, top, apps...)
	var list []string
	for _, c := range hosts {
		list = append(list, fmt.Sprintf("'%s:%d'", c.Host, c.Port))
	}
	old := fmt.Sprintf("server:\n  host: %s\n  port: %d\n", hosts[0].Host, hosts[0].Port)
	repl := "server:\n  hosts: [" + strings.Join(list, ", ") + "]\n"
	if serverExtra != "" {
		repl += strings.TrimRight(serverExtra, "\n") + "\n"
	}
	return strings.Replace(y, old, repl, 1)
}
