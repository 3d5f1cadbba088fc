package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"

	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/proxy/console"
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
	return StartPairWith(t, PairOptions{Sync: sync})
}

// PairOptions configure [StartPairWith].
type PairOptions struct {
	// Sync makes the standby synchronous.
	Sync bool
	// NetNS starts the primary in a network namespace of its own
	// ([pgtest.RequireNetNS]: the test skips where namespaces are not
	// available), so that [pgtest.Cluster.Partition] can cut it off; the
	// standby runs in the root namespace, as lockpool does, and reaches
	// the primary through the namespaces' hub.
	NetNS bool
}

// StartPairWith is [StartPair] with options.
func StartPairWith(t *testing.T, o PairOptions) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var p *pgtest.Cluster
	if o.NetNS {
		p = pgtest.RequireNetNS(t) // destroyed when t ends
	} else {
		pgtest.Require(t)
		var err error
		if p, err = pgtest.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Destroy() })
	}
	if err := p.CreateRole(ctx, "app", Password); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateDatabase(ctx, "appdb", "app"); err != nil {
		t.Fatal(err)
	}
	s, err := p.StartStandby(ctx, pgtest.StandbyOptions{Sync: o.Sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Destroy() })
	return &Pair{Primary: p, Standby: s, sync: o.Sync}
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
		list = append(list, "'"+Addr(c)+"'")
	}
	old := fmt.Sprintf("server:\n  host: %s\n  port: %d\n", hosts[0].Host, hosts[0].Port)
	repl := "server:\n  hosts: [" + strings.Join(list, ", ") + "]\n"
	if serverExtra != "" {
		repl += strings.TrimRight(serverExtra, "\n") + "\n"
	}
	return strings.Replace(y, old, repl, 1)
}

// Hosts is lockpool's /debug/hosts (SHOW HOSTS as JSON).
func (l *Lockpool) Hosts() []console.HostRow {
	l.t.Helper()
	code, body := l.Get("/debug/hosts")
	if code != http.StatusOK {
		l.t.Fatalf("/debug/hosts: %d %s", code, body)
	}
	var rows []console.HostRow
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		l.t.Fatalf("/debug/hosts: %v\n%s", err, body)
	}
	return rows
}

// HostRow is the row of c in hosts (as [Lockpool.Hosts] returns them), or
// a row with only Host set when there is none.
func HostRow(hosts []console.HostRow, c *pgtest.Cluster) console.HostRow {
	addr := Addr(c)
	for _, h := range hosts {
		if h.Host == addr {
			return h
		}
	}
	return console.HostRow{Host: addr}
}

// Addr is c's host:port as lockpool's server.hosts, logs, metrics and SHOW
// HOSTS name it.
func Addr(c *pgtest.Cluster) string { return fmt.Sprintf("%s:%d", c.Host, c.Port) }

// Crash is a crash failover: the primary is stopped with -m immediate, the
// standby promoted, and the old primary rejoined as the new one's standby
// (rewound; synchronous again if the pair was started so), so that the
// pair can fail over again. It returns when each step happened: Stopped
// after the old primary is gone, Promoted once the new one is out of
// recovery, Rejoined once the old one streams from it.
func (p *Pair) Crash(ctx context.Context) (pgtest.SwitchoverTimes, error) {
	var ts pgtest.SwitchoverTimes
	old, next := p.Primary, p.Standby
	ts.Stopping = time.Now()
	if err := old.StopImmediate(); err != nil {
		return ts, err
	}
	ts.Stopped = time.Now()
	ts.Promoting = time.Now()
	if err := next.Promote(ctx); err != nil {
		return ts, err
	}
	ts.Promoted = time.Now()
	p.Primary, p.Standby = next, old
	if err := old.Demote(ctx, next); err != nil {
		return ts, err
	}
	ts.Rejoined = time.Now()
	if p.sync {
		if err := next.AddSyncStandby(ctx, old); err != nil {
			return ts, err
		}
	}
	return ts, nil
}

// SoakEnv names the environment variable that turns the failover oracle
// tests into a soak: its value is how long they run (a Go duration such as
// 10m), with a failover every [SoakFailoverEvery]. scripts/failover-soak.sh
// sets it.
const SoakEnv = "LOCKPOOL_FAILOVER_SOAK"

// SoakFailoverEvery is how far apart a soak's failovers are.
const SoakFailoverEvery = 30 * time.Second

// FailoverPlan is how long a failover oracle test runs and how often the
// primary changes: a short run in the test suite, a soak when [SoakEnv]
// is set.
type FailoverPlan struct {
	// Failovers is how many primary changes the test makes.
	Failovers int
	// Every is the time from one failover's start to the next one's.
	Every time.Duration
	// Soak says the plan came from [SoakEnv].
	Soak bool
}

// PlanFailovers returns the plan of a failover oracle test: n failovers
// every `every` in the test suite, or, with [SoakEnv] set, as many as fit
// in its duration every [SoakFailoverEvery]. A malformed value fails t.
func PlanFailovers(t testing.TB, n int, every time.Duration) FailoverPlan {
	t.Helper()
	v := os.Getenv(SoakEnv)
	if v == "" {
		return FailoverPlan{Failovers: n, Every: every}
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < SoakFailoverEvery {
		t.Fatalf("%s=%q: want a duration of at least %v", SoakEnv, v, SoakFailoverEvery)
	}
	return FailoverPlan{Failovers: int(d / SoakFailoverEvery), Every: SoakFailoverEvery, Soak: true}
}
