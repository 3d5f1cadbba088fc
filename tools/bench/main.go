// Command bench is lockpool's side-by-side benchmark harness.
//
// It starts its own PostgreSQL (internal/pgtest), a built lockpool binary and
// PgBouncer (when installed), all with the same server-connection budget, and
// runs pgbench against direct PostgreSQL, lockpool and PgBouncer in turn
// (direct → lockpool → PgBouncer for every row, so drift hits all three
// alike). It also measures pooler CPU per transaction (/proc/<pid>/stat),
// p50/p99 latency (pgbench -l logs), resident memory per idle client with
// 2,000 and with 10,000 idle authenticated clients (each count on freshly
// started poolers), lease_acquire+lease_release pairs per
// second from 50 sessions, a mixed run with 20 % of the sessions pinned
// by advisory locks, and the login storm (login.go: pgbench -C, a SCRAM
// login per transaction, both poolers checking the same verifier; CPU per
// login from the threads' schedstat run time). It prints one table with the ratios lockpool/PgBouncer
// and lockpool/direct and writes everything as JSON.
//
// Run it with scripts/bench.sh (installs PgBouncer when missing), or:
//
//	go run ./tools/bench -out bench-results/$(date +%F).json
//
// Quick smoke run: -T 2 -clients 10,100 -idle 1000.
//
// -report FILE prints an earlier run's report again; -charts DIR (with
// -report, or at the end of a run) also draws its pgbench figures as SVG
// charts in DIR: tps.svg, cpu.svg and latency.svg, each when the report
// has its figure.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options from the command line.
type options struct {
	out              string
	duration         int // pgbench -T seconds
	rounds           int // runs of each row per target, alternating; the row reports medians
	clients          []int
	scripts          []string // select, tpcb
	modes            []string // simple, extended, prepared
	budget           int      // server connections per pooler
	maxPinned        int
	eventLoops       int
	scale            int
	idle             []int // idle clients for the memory test, one test per number on fresh processes
	leaseSess        int
	mixedSess        int
	lockSess         int
	directMax        int // PostgreSQL max_connections for direct runs
	noPgb            bool
	splitClients     int // -latency-split
	schedClients     int // -sched-latency
	directMaxClients int
	loginClients     int // -login-clients: the login-storm row's pgbench -C clients
	pprofDir         string
	keep             bool
	lockpoolBy       string // path to a lockpool binary; "" builds one
	reprint          string // -report: print this JSON report, run nothing
	charts           string // -charts: write the report's SVG charts into this directory
}

// Report is what the JSON file holds.
type Report struct {
	Date     string         `json:"date"`
	Command  string         `json:"command"`
	Machine  Machine        `json:"machine"`
	Settings Settings       `json:"settings"`
	Rows     []*Row         `json:"pgbench"`
	Idle     []*IdleResult  `json:"idle_clients"`
	Lease    *LeaseResult   `json:"lease_throughput,omitempty"`
	Locks    *LockResult    `json:"advisory_lock_throughput,omitempty"`
	Mixed    *MixedResult   `json:"mixed_pinned,omitempty"`
	Split    []*SplitResult `json:"latency_split,omitempty"`
	Sched    []*SchedResult `json:"sched_latency,omitempty"`
	Login    *LoginResult   `json:"login_storm,omitempty"`
	Notes    []string       `json:"notes"`
	Elapsed  float64        `json:"elapsed_seconds"`
}

// Machine describes where the run happened.
type Machine struct {
	NProc      int    `json:"nproc"`
	CPUModel   string `json:"cpu_model"`
	Kernel     string `json:"kernel"`
	MemTotalKB int64  `json:"mem_total_kb"`
	LoadAvg    string `json:"loadavg_at_start"`
	PostgreSQL string `json:"postgresql"`
	PgBouncer  string `json:"pgbouncer"`
	Go         string `json:"lockpool_go"`
}

// Settings are the knobs of the run.
type Settings struct {
	DurationSec     int      `json:"pgbench_T"`
	Rounds          int      `json:"rounds"`
	Threads         int      `json:"pgbench_j"`
	Clients         []int    `json:"clients"`
	Scale           int      `json:"scale"`
	Budget          int      `json:"server_connection_budget"`
	MaxPinned       int      `json:"lockpool_max_pinned"`
	DirectMaxConn   int      `json:"postgres_max_connections"`
	LockpoolConfig  string   `json:"lockpool_config"`
	PgBouncerConfig string   `json:"pgbouncer_config,omitempty"`
	Scripts         []string `json:"scripts"`
	Modes           []string `json:"modes"`
}

func main() {
	os.Exit(run())
}

func parseFlags() (*options, error) {
	o := &options{}
	var clients, scripts, modes, idle string
	flag.StringVar(&o.out, "out", "", "write the JSON report here (default bench-results/<date>.json)")
	flag.IntVar(&o.duration, "T", 7, "pgbench -T seconds per run")
	flag.IntVar(&o.rounds, "rounds", 1, "runs of each pgbench row per target, the targets alternating (direct → lockpool → PgBouncer, then again); the row reports each figure's median")
	flag.StringVar(&clients, "clients", "1,10,50,100,1000", "pgbench client counts (0 = no pgbench rows)")
	flag.StringVar(&scripts, "scripts", "select,tpcb", "pgbench scripts: select (-S), tpcb (default script)")
	flag.StringVar(&modes, "modes", "simple,extended,prepared", "pgbench -M modes")
	flag.IntVar(&o.budget, "budget", 10, "server connections for each pooler (lockpool application max_connections, PgBouncer default_pool_size)")
	flag.IntVar(&o.maxPinned, "max-pinned", 2, "lockpool max_pinned")
	flag.IntVar(&o.eventLoops, "event-loops", 0, "lockpool event_loops (0: its default)")
	flag.IntVar(&o.scale, "scale", 10, "pgbench -i -s")
	flag.StringVar(&idle, "idle", "2000,10000", "idle authenticated clients for the memory test, one test per number, each on freshly started poolers (0 = skip)")
	flag.IntVar(&o.leaseSess, "lease-sessions", 50, "sessions for the lease throughput test (0 = skip)")
	flag.IntVar(&o.lockSess, "lock-sessions", 50, "sessions for the advisory lock throughput test under advisory_locks: hold (0 = skip)")
	flag.IntVar(&o.loginClients, "login-clients", 50, "clients of the login-storm row: pgbench -C -S -M simple -j 2 (a SCRAM-SHA-256 login per transaction) against each pooler, -rounds times, alternating (0 = skip)")
	flag.IntVar(&o.mixedSess, "mixed-sessions", 10, "sessions in the mixed run, 20 % of them pinned (0 = skip)")
	flag.IntVar(&o.directMax, "pg-max-connections", 1100, "PostgreSQL max_connections (direct runs at 1000 clients need > 1000)")
	flag.IntVar(&o.directMaxClients, "direct-max-clients", 1000, "skip direct PostgreSQL for rows with more clients (n/a)")
	flag.IntVar(&o.splitClients, "latency-split", 10, "clients of one pgbench -S simple run per pooler under tcpdump (when installed) that splits each transaction's latency into the pooler's way in, the server and the pooler's way out (0 = skip)")
	flag.IntVar(&o.schedClients, "sched-latency", 10, "clients of one pgbench -S simple run per pooler under perf sched (when perf is installed) that gives each task's wait from wake-up to running: the pooler's threads, PostgreSQL's, pgbench's (0 = skip)")
	flag.BoolVar(&o.noPgb, "no-pgbouncer", false, "skip PgBouncer even when installed")
	flag.StringVar(&o.pprofDir, "pprof", "", "save a lockpool CPU profile of every lockpool pgbench and login-storm run into this directory")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (configs, logs, pgbench logs)")
	flag.StringVar(&o.reprint, "report", "", "print the report of this JSON file (an earlier run's -out) and exit: nothing is run")
	flag.StringVar(&o.charts, "charts", "", "also write SVG charts of the report (tps.svg, cpu.svg, latency.svg, each only when the report has its figure) into this directory: with -report, of that file's report; otherwise at the end of the run")
	flag.StringVar(&o.lockpoolBy, "lockpool", "", "use this lockpool binary instead of building ./cmd/lockpool")
	flag.Parse()
	var err error
	if clients != "0" {
		if o.clients, err = intList(clients); err != nil {
			return nil, fmt.Errorf("-clients: %w", err)
		}
	}
	if idle != "0" {
		if o.idle, err = intList(idle); err != nil {
			return nil, fmt.Errorf("-idle: %w", err)
		}
	}
	if o.rounds < 1 {
		return nil, fmt.Errorf("-rounds: %d is below 1", o.rounds)
	}
	o.scripts = strList(scripts)
	o.modes = strList(modes)
	for _, s := range o.scripts {
		if s != "select" && s != "tpcb" {
			return nil, fmt.Errorf("-scripts: unknown %q", s)
		}
	}
	for _, m := range o.modes {
		if m != "simple" && m != "extended" && m != "prepared" {
			return nil, fmt.Errorf("-modes: unknown %q", m)
		}
	}
	if o.maxPinned >= o.budget {
		return nil, fmt.Errorf("-max-pinned must be < -budget")
	}
	if o.out == "" {
		o.out = filepath.Join("bench-results", time.Now().Format("2006-01-02T150405")+".json")
	}
	return o, nil
}

func run() int {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if o.reprint != "" {
		return reprint(o.reprint, o.charts)
	}
	t0 := time.Now()
	raiseNoFile()
	rep := &Report{
		Date:    t0.Format(time.RFC3339),
		Command: strings.Join(os.Args, " "),
		Machine: machine(),
	}
	logf("machine: %d CPUs, %s, load %s", rep.Machine.NProc, rep.Machine.CPUModel, rep.Machine.LoadAvg)

	work, err := os.MkdirTemp("", "lockpool-bench-")
	if err != nil {
		return fail(err)
	}
	if !o.keep {
		defer os.RemoveAll(work)
	} else {
		logf("work directory: %s", work)
	}
	_ = os.Chmod(work, 0o755)

	env, err := setup(o, work, rep)
	if env != nil {
		defer env.close()
	}
	if err != nil {
		return fail(err)
	}

	// Idle clients first, on fresh processes: after the pgbench rows a Go
	// heap already grown by 1,000 busy clients would hide the cost.
	for i, n := range o.idle {
		for _, p := range env.poolers() {
			if i > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := p.restart(ctx)
				cancel()
				if err != nil {
					return fail(err)
				}
			}
			rep.Idle = append(rep.Idle, idleTest(p, env, n))
		}
	}
	rep.Rows = runMatrix(o, env, rep)
	if o.loginClients > 0 {
		rep.Login = loginTest(o, env)
	}
	if o.mixedSess > 0 {
		rep.Mixed = mixedTest(o, env)
	}
	if o.leaseSess > 0 {
		rep.Lease = leaseTest(o, env)
	}
	if o.lockSess > 0 {
		rep.Locks = locksTest(o, env)
	}
	if o.splitClients > 0 {
		if _, err := exec.LookPath("tcpdump"); err != nil {
			rep.Notes = append(rep.Notes, "latency split: tcpdump not installed (scripts/bench.sh installs it with apt-get)")
		} else {
			for _, p := range env.poolers() {
				logf("latency split: %s, %d clients under tcpdump", p.Name, o.splitClients)
				rep.Split = append(rep.Split, splitTest(o, env, p, o.splitClients))
			}
		}
	}
	if o.schedClients > 0 {
		if _, err := exec.LookPath("perf"); err != nil {
			rep.Notes = append(rep.Notes, "scheduler latency: perf not installed (apt-get install linux-perf)")
		} else {
			for _, p := range env.poolers() {
				logf("scheduler latency: %s, %d clients under perf sched", p.Name, o.schedClients)
				rep.Sched = append(rep.Sched, schedTest(o, env, p, o.schedClients))
			}
		}
	}
	rep.Elapsed = time.Since(t0).Seconds()

	printReport(os.Stdout, rep)
	if err := writeJSON(o.out, rep); err != nil {
		return fail(err)
	}
	fmt.Printf("\nJSON: %s  (elapsed %s)\n", o.out, time.Since(t0).Round(time.Second))
	if o.charts != "" {
		if err := printCharts(o.charts, rep); err != nil {
			return fail(err)
		}
	}
	return 0
}

func writeJSON(path string, rep *Report) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// reprint prints the report of the JSON file path (written by an earlier
// run), in this version's format, and writes its charts into chartsDir
// unless that is "".
func reprint(path, chartsDir string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return fail(err)
	}
	rep := &Report{}
	if err := json.Unmarshal(b, rep); err != nil {
		return fail(fmt.Errorf("%s: %w", path, err))
	}
	printReport(os.Stdout, rep)
	if chartsDir != "" {
		if err := printCharts(chartsDir, rep); err != nil {
			return fail(err)
		}
	}
	return 0
}

// printCharts writes the charts of rep into dir and says which files it
// wrote.
func printCharts(dir string, rep *Report) error {
	paths, err := writeCharts(dir, rep)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	if len(paths) == 0 {
		fmt.Println("charts: none (the report has no pgbench figures)")
		return nil
	}
	fmt.Printf("charts: %s\n", strings.Join(paths, " "))
	return nil
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "bench: FAIL:", err)
	return 1
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// raiseNoFile sets RLIMIT_NOFILE as high as allowed. Setting it explicitly
// (rather than relying on the Go runtime's own raise) makes child processes
// (lockpool, PgBouncer, pgbench) inherit it too.
func raiseNoFile() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	want := uint64(1 << 17)
	if lim.Max < want {
		// Root may raise the hard limit; others get what they have.
		try := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &try) == nil {
			logf("RLIMIT_NOFILE raised to %d", want)
			return
		}
	}
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	logf("RLIMIT_NOFILE = %d", lim.Cur)
}

func machine() Machine {
	m := Machine{}
	if b, err := exec.Command("nproc").Output(); err == nil {
		m.NProc, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				f := strings.Fields(l)
				if len(f) >= 2 {
					m.MemTotalKB, _ = strconv.ParseInt(f[1], 10, 64)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if b, err := exec.Command("pgbench", "--version").Output(); err == nil {
		m.PostgreSQL = strings.TrimSpace(string(b))
	}
	if b, err := exec.Command("pgbouncer", "--version").Output(); err == nil {
		m.PgBouncer = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	}
	if b, err := exec.Command("go", "version").Output(); err == nil {
		m.Go = strings.TrimSpace(string(b))
	}
	return m
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func strList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
