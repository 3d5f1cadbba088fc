// Command clustersoak is the cluster budget soak (scripts/cluster-soak.sh):
// it starts its own PostgreSQL and three lockpool processes of one cluster
// sharing an application budget of 6 (max_pinned 2, min_share 0, ttl 2s),
// keeps clients running transactions through all three, kills instances
// at random (kill -9, sometimes SIGTERM) and restarts them on the same
// port, and samples pg_stat_activity every 20 ms: the application's
// backends (lockpool's own connections, application_name lockpool…, left
// out) must never exceed the budget. It prints a summary and exits 1 on
// any sample above the budget.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	user      = "clsoak"
	password  = "clsoak-secret"
	database  = "clsoak"
	budget    = 6
	instances = 3
	clients   = 4 // per instance
)

// configYAML is one instance's configuration: its port, its admin port,
// PostgreSQL's port and its instance id.
const configYAML = `# written by tools/clustersoak
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
auth_method: scram-sha-256
instance_id: %s
leak_check_interval: 0s
shutdown_timeout: 2s
server:
  host: 127.0.0.1
  port: %d
  max_connections: 20
users:
  - name: ` + user + `
    password: ` + password + `
applications:
  - name: soak
    user: ` + user + `
    database: ` + database + `
    max_connections: 6
    max_pinned: 2
    budget_scope: cluster
    min_share: 0
    wait_timeout: 10s
cluster:
  name: soak
  database: ` + database + `
  ttl: 2s
  heartbeat: 200ms
`

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// instance is one lockpool process slot: restarted on the same ports.
type instance struct {
	n, port, admin int
	conf           string
	mu             sync.Mutex
	proc           *testenv.Process
	starts         int
}

func main() { os.Exit(run()) }

func run() int {
	minutes := flag.Float64("minutes", 10, "how long the run lasts")
	killMin := flag.Duration("kill-min", 3*time.Second, "shortest pause between two kills")
	killMax := flag.Duration("kill-max", 10*time.Second, "longest pause between two kills")
	seed := flag.Uint64("seed", 0, "random seed (0: from the clock)")
	keep := flag.Bool("keep", false, "keep the work directory (configs, logs)")
	flag.Parse()
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	r := rand.New(rand.NewPCG(*seed, 1))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	work, err := os.MkdirTemp("", "lockpool-clustersoak-")
	if err != nil {
		logf("%v", err)
		return 2
	}
	_ = os.Chmod(work, 0o755)
	if !*keep {
		defer os.RemoveAll(work)
	}
	var first instance
	stack, err := testenv.StartStack(ctx, testenv.StackOptions{
		Dir: work, User: user, Password: password, DB: database,
		Config: func(port, admin, pg int) string {
			first = instance{n: 0, port: port, admin: admin, conf: fmt.Sprintf(configYAML, port, admin, "soak-0", pg)}
			return first.conf
		},
		Logf: logf,
	})
	if stack != nil {
		defer stack.Close()
	}
	if err != nil {
		logf("setup: %v", err)
		return 2
	}
	bin := filepath.Join(work, "lockpool")
	insts := []*instance{&first}
	first.proc, first.starts = stack.Lockpool, 1
	for i := 1; i < instances; i++ {
		port, err1 := testenv.UnusedPort()
		admin, err2 := testenv.UnusedPort()
		if err1 != nil || err2 != nil {
			logf("ports: %v %v", err1, err2)
			return 2
		}
		in := &instance{n: i, port: port, admin: admin, conf: fmt.Sprintf(configYAML, port, admin, fmt.Sprintf("soak-%d", i), stack.Cluster.Port)}
		if err := in.start(ctx, work, bin); err != nil {
			logf("instance %d: %v", i, err)
			return 2
		}
		insts = append(insts, in)
	}
	defer func() {
		for _, in := range insts {
			in.mu.Lock()
			if in.proc != nil && in.proc.Alive() {
				_ = in.proc.Stop(5 * time.Second)
			}
			in.mu.Unlock()
		}
	}()
	logf("three instances up; running %.1f minutes (seed %d)", *minutes, *seed)

	runCtx, cancel := context.WithTimeout(ctx, time.Duration(*minutes*float64(time.Minute)))
	defer cancel()
	var commits, failures atomic.Int64
	var wg sync.WaitGroup
	for _, in := range insts {
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				load(runCtx, in, &commits, &failures)
			}()
		}
	}

	// The sampler.
	su, err := pgx.Connect(ctx, stack.Cluster.SuperuserDSN("postgres"))
	if err != nil {
		logf("sampler: %v", err)
		return 2
	}
	defer su.Close(context.Background())
	var samples, over, maxSeen int
	var sampleErrs int
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for runCtx.Err() == nil {
			<-tk.C
			var n int
			err := su.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE usename = $1 AND backend_type = 'client backend' AND application_name NOT LIKE 'lockpool%'`, user).Scan(&n)
			if err != nil {
				sampleErrs++
				continue
			}
			samples++
			maxSeen = max(maxSeen, n)
			if n > budget {
				over++
				logf("VIOLATION: %d backends of the application, budget %d", n, budget)
			}
		}
	}()

	// The killer.
	kills, terms := 0, 0
	for runCtx.Err() == nil {
		pause := *killMin + time.Duration(r.Int64N(int64(*killMax-*killMin)+1))
		select {
		case <-runCtx.Done():
		case <-time.After(pause):
		}
		if runCtx.Err() != nil {
			break
		}
		in := insts[r.IntN(len(insts))]
		in.mu.Lock()
		if r.IntN(4) == 0 {
			terms++
			logf("SIGTERM instance %d (pid %d)", in.n, in.proc.PID())
			_ = in.proc.Stop(5 * time.Second)
		} else {
			kills++
			logf("kill -9 instance %d (pid %d)", in.n, in.proc.PID())
			in.proc.Kill()
		}
		in.mu.Unlock()
		down := time.Duration(200+r.IntN(3000)) * time.Millisecond
		select {
		case <-runCtx.Done():
		case <-time.After(down):
		}
		if err := in.start(ctx, work, bin); err != nil {
			logf("restarting instance %d: %v", in.n, err)
			return 2
		}
	}
	wg.Wait()
	<-sampleDone
	result := "PASS"
	if over > 0 || samples == 0 {
		result = "FAIL"
	}
	fmt.Printf("cluster soak %s: %.1f min, %d samples every 20 ms (%d sampling errors), at most %d backends of budget %d, %d samples above it; "+
		"%d kill -9, %d SIGTERM, %d restarts; %d transactions committed, %d failed (clients of stopped instances)\n",
		result, *minutes, samples, sampleErrs, maxSeen, budget, over, kills, terms, kills+terms, commits.Load(), failures.Load())
	if result != "PASS" {
		return 1
	}
	return 0
}

// start (re)starts the instance's process and waits until it serves.
func (in *instance) start(ctx context.Context, work, bin string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.starts++
	conf := filepath.Join(work, fmt.Sprintf("lockpool-%d.yaml", in.n))
	if err := os.WriteFile(conf, []byte(in.conf), 0o600); err != nil {
		return err
	}
	p, err := testenv.StartLogged(work, fmt.Sprintf("lockpool-%d-%d", in.n, in.starts), nil, bin, "-config", conf)
	if err != nil {
		return err
	}
	in.proc = p
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return testenv.WaitReady(wctx, p, in.dsn())
}

func (in *instance) dsn() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable connect_timeout=5", in.port, user, password, database)
}

// load runs short transactions through in until ctx ends, reconnecting
// after a failure (its instance was stopped).
func load(ctx context.Context, in *instance, commits, failures *atomic.Int64) {
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, in.dsn())
		if err != nil {
			failures.Add(1)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ctx.Err() == nil {
			if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.005)"); err != nil {
				if ctx.Err() == nil {
					failures.Add(1)
				}
				break
			}
			commits.Add(1)
		}
		conn.Close(context.Background())
	}
}
