package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---- pgbench ----

type pgbenchStats struct {
	mu        sync.Mutex
	runs      int
	failed    int   // runs that exited non-zero (aborted clients, errors)
	txns      int64 // transactions actually processed
	failedTx  int64
	lastTPS   float64 // from the latest -P progress line
	errLines  []string
	errCounts map[string]int
}

var (
	reProcessed = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	reFailedTx  = regexp.MustCompile(`number of failed transactions: (\d+)`)
	reProgress  = regexp.MustCompile(`^progress: [\d.]+ s, ([\d.]+) tps`)
	reSQLState  = regexp.MustCompile(`(ERROR|FATAL):\s+(.*)$`)
)

// runPgbench keeps `pgbench -S -c 8 -j 2` running through lockpool until
// the soak ends, restarting it whenever it exits.
func (s *soak) runPgbench(end time.Time) {
	for !s.stopping() {
		left := time.Until(end)
		if left < 2*time.Second {
			return
		}
		t := 60
		if left < 60*time.Second {
			t = int(left / time.Second)
		}
		if !s.pgbenchOnce(t) {
			time.Sleep(time.Second)
		}
	}
}

// pgbenchOnce runs pgbench once and reports whether it exited 0.
func (s *soak) pgbenchOnce(seconds int) bool {
	ctx, cancel := context.WithTimeout(s.abortCtx, time.Duration(seconds+30)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "pgbench", "-S", "-n", "-c", "8", "-j", "2", "-P", "5",
		"-T", strconv.Itoa(seconds), "-h", "127.0.0.1", "-p", strconv.Itoa(s.e.Port), "-U", soakUser, soakDB)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+soakPassword)
	var out strings.Builder
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		s.unexpectedf("pgbench: %v", err)
		return false
	}
	if err := cmd.Start(); err != nil {
		s.unexpectedf("pgbench: %v", err)
		return false
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if m := reProgress.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			s.pgb.mu.Lock()
			s.pgb.lastTPS = v
			s.pgb.mu.Unlock()
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		s.pgb.mu.Lock()
		if m := reSQLState.FindStringSubmatch(line); m != nil {
			s.pgb.errCounts[m[1]+": "+m[2]]++
		}
		if len(s.pgb.errLines) < 10 {
			s.pgb.errLines = append(s.pgb.errLines, line)
		}
		s.pgb.mu.Unlock()
	}
	err = cmd.Wait()
	s.pgb.mu.Lock()
	defer s.pgb.mu.Unlock()
	s.pgb.runs++
	if m := reProcessed.FindStringSubmatch(out.String()); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		s.pgb.txns += n
	}
	if m := reFailedTx.FindStringSubmatch(out.String()); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		s.pgb.failedTx += n
	}
	if err != nil {
		s.pgb.failed++
		logf("pgbench exited: %v (restarting)", err)
		return false
	}
	return true
}

// ---- plain transaction clients ----

// txnClient runs short explicit transactions with its own application_name
// (a session setting that must follow it and no one else); the killer cuts
// some of them mid-transaction.
type txnClient struct {
	base
	rng *rand.Rand
}

func newTxnClient(s *soak, id int, seed int64) *txnClient {
	c := &txnClient{rng: rand.New(rand.NewSource(seed))}
	c.base = base{s: s, kind: "txn", id: id}
	c.afterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, fmt.Sprintf("SET application_name = 'soak-txn-%d'", id), pgx.QueryExecModeSimpleProtocol)
		return err
	}
	return c
}

func (c *txnClient) failed(op string, err error) {
	if _, ok := c.killed(); ok {
		c.s.count("txn: transactions cut by a kill")
		c.drop()
		return
	}
	if sqlState(err) == "53300" {
		c.s.count("txn: 53300 (no connection within wait_timeout)")
		return
	}
	c.s.unexpectedf("%s: %s: %v", c.name(), op, err)
	c.drop()
}

func (c *txnClient) once() {
	conn := c.c()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	tx, err := conn.Begin(ctx)
	if err != nil {
		c.failed("BEGIN", err)
		return
	}
	c.holding.Store(true) // inside a transaction: a kill now cuts it
	defer c.holding.Store(false)
	var bal int64
	var app string
	aid := 1 + c.rng.Intn(pgbenchScal*100000)
	if err := tx.QueryRow(ctx, "SELECT abalance, current_setting('application_name') FROM pgbench_accounts WHERE aid = $1", aid).Scan(&bal, &app); err != nil {
		_ = tx.Rollback(ctx)
		c.failed("SELECT", err)
		return
	}
	if want := fmt.Sprintf("soak-txn-%d", c.id); app != want {
		c.s.violatef("state", "%s: application_name is %q inside its transaction, the session set %q", c.name(), app, want)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.05)"); err != nil {
		_ = tx.Rollback(ctx)
		c.failed("pg_sleep", err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		c.failed("COMMIT", err)
		return
	}
	c.s.count("txn: transactions committed")
}

func (c *txnClient) run() {
	for c.ensure() {
		c.once()
		time.Sleep(time.Duration(20+c.rng.Intn(100)) * time.Millisecond)
	}
	c.drop()
}

// ---- the killer ----

// runKiller closes the socket of a random client every few seconds, half the
// time one that holds a lock or lease or is inside a transaction.
func (s *soak) runKiller(rng *rand.Rand, all []killable) {
	for {
		d := s.o.killMin + time.Duration(rng.Int63n(int64(s.o.killMax-s.o.killMin)+1))
		select {
		case <-s.stopCh:
			return
		case <-time.After(d):
		}
		var live, holders []killable
		for _, k := range all {
			if k.connected() {
				live = append(live, k)
				if k.isHolding() {
					holders = append(holders, k)
				}
			}
		}
		pick := live
		if len(holders) > 0 && rng.Intn(2) == 0 {
			pick = holders
		}
		if len(pick) == 0 {
			continue
		}
		k := pick[rng.Intn(len(pick))]
		holding := k.isHolding()
		if k.kill() {
			s.kills.Add(1)
			if holding {
				s.count("kill: " + k.kindName() + " client (holding)")
			} else {
				s.count("kill: " + k.kindName() + " client")
			}
		}
	}
}

// markKilled records, through the killer's superuser connection, that a
// lease holder's socket is about to close.
func (s *soak) markKilled(row int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Only while lockpool's lease table shows the lease still held by this
	// hold's token is the kill time a proven end of the hold.
	if _, err := s.killerSU.Exec(ctx, `UPDATE soak_lease_log s SET killed_at = clock_timestamp()
FROM lockpool.leases l
WHERE s.id = $1 AND s.exited IS NULL AND l.name = s.name AND l.token = s.token AND l.expires_at > clock_timestamp()`, row); err != nil {
		s.unexpectedf("killer: mark lease hold %d killed: %v", row, err)
	}
}
