package integration

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

// A cancel request sent to instance B for a query running through instance
// A of the same cluster is forwarded to A and cancels the query (57014)
// within 1 s.
func TestClusterCancelForwarded(t *testing.T) {
	t.Parallel()
	const role = "clcancel"
	ls := startClusterInstances(t, 2, role, "pin", "admin_users: "+role)
	a, b := ls[0], ls[1]
	ctx := context.Background()
	// B must know A's address: wait until both registered and see each other.
	eventually(t, 10*time.Second, "both instances in both instances' SHOW CLUSTER", func() bool {
		for _, l := range ls {
			code, body := l.get("/debug/cluster")
			if code != 200 || strings.Count(body, `"live": true`) != 2 || strings.Count(body, `"application": "`+clusterApp+`"`) != 2 {
				return false
			}
		}
		return true
	})
	// SHOW CLUSTER on A's console: both instances, live, A's row marked self.
	admin := a.ConsoleConnect(t, role)
	res, err := testenv.ConsoleQuery(ctx, admin, "SHOW CLUSTER")
	if err != nil {
		t.Fatal(err)
	}
	if want := docColumns(t, "CLUSTER"); !slices.Equal(res.Columns, want) {
		t.Errorf("SHOW CLUSTER columns %v, README documents %v", res.Columns, want)
	}
	selves := 0
	for _, row := range res.Rows {
		if row["live"] != true || row["application"] != clusterApp || row["number"].(int64) < 1 {
			t.Errorf("SHOW CLUSTER row %v, want a live instance with a number and a row for %s", row, clusterApp)
		}
		if row["self"] == true {
			selves++
		}
	}
	if len(res.Rows) != 2 || selves != 1 {
		t.Errorf("SHOW CLUSTER: %d rows, %d marked self; want 2 and 1: %v", len(res.Rows), selves, res.Rows)
	}
	if v := a.metric("lockpool_cluster_instances", nil); v != 2 {
		t.Errorf("lockpool_cluster_instances = %v, want 2", v)
	}

	conn := a.connect(t, role, "appdb")
	pid, secret := conn.PgConn().PID(), conn.PgConn().SecretKey()
	if pid>>23 == 0 {
		t.Fatalf("backend key pid %#x carries no instance number", pid)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "SELECT pg_sleep(30)")
		errc <- err
	}()
	su := superConn(t, "postgres")
	eventually(t, 10*time.Second, "pg_sleep(30) to run", func() bool {
		n, err := countBackends(ctx, su, "usename = '"+role+"' AND state = 'active' AND query LIKE '%pg_sleep(30)%'")
		return err == nil && n == 1
	})
	nc, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	var pkt [16]byte
	binary.BigEndian.PutUint32(pkt[0:], 16)
	binary.BigEndian.PutUint32(pkt[4:], 80877102)
	binary.BigEndian.PutUint32(pkt[8:], pid)
	copy(pkt[12:], secret)
	sent := time.Now()
	if _, err := nc.Write(pkt[:]); err != nil {
		t.Fatal(err)
	}
	_ = nc.Close()
	select {
	case err := <-errc:
		took := time.Since(sent)
		pgErr(t, err, "57014")
		t.Logf("cancel sent to instance B ended the query on instance A after %v", took.Round(time.Millisecond))
		if took > time.Second {
			t.Fatalf("the forwarded cancel took %v, want within 1 s", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the query through A was not cancelled 5 s after a cancel request to B")
	}
	// The connection stays usable.
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 after the cancel: %d, %v", one, err)
	}
}
