package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// Row is one pgbench workload run against every target.
type Row struct {
	Script  string             `json:"script"` // select | tpcb
	Mode    string             `json:"mode"`   // simple | extended | prepared
	Clients int                `json:"clients"`
	Results map[string]*Result `json:"results"` // by target name
}

// Result is one pgbench run.
type Result struct {
	Target       string  `json:"target"`
	Failed       bool    `json:"failed"`
	Error        string  `json:"error,omitempty"`
	Transactions int64   `json:"transactions"`
	TPS          float64 `json:"tps"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	// Pooler CPU (utime+stime) during the run; -1 for direct.
	CPUSeconds    float64 `json:"pooler_cpu_seconds"`
	CPUPer1000Txn float64 `json:"pooler_cpu_seconds_per_1000_txn"`
	// UserPer1000Txn is the user-time part of CPUPer1000Txn (the rest is
	// system time); -1 for direct.
	UserPer1000Txn float64 `json:"pooler_user_cpu_seconds_per_1000_txn"`
	WallSeconds    float64 `json:"wall_seconds"`
	CPUWindow      string  `json:"pooler_cpu_window,omitempty"`
	// Context switches of all the pooler's threads per transaction (whole
	// run, logins included: /proc/<pid>/task/*/status); -1 for direct.
	SwitchesPerTxn float64 `json:"pooler_context_switches_per_txn"`
	Profile        string  `json:"pprof,omitempty"`
	// Rounds are the runs this result is the median of (-rounds > 1).
	Rounds []*Result `json:"rounds,omitempty"`
}

func (r *Row) label() string {
	s := "-S"
	if r.Script == "tpcb" {
		s = "tpcb"
	}
	return fmt.Sprintf("%s %s c=%d", s, r.Mode, r.Clients)
}

func runMatrix(o *options, e *env, rep *Report) []*Row {
	var rows []*Row
	total := len(o.scripts) * len(o.modes) * len(o.clients)
	n := 0
	for _, script := range o.scripts {
		for _, mode := range o.modes {
			for _, c := range o.clients {
				n++
				row := &Row{Script: script, Mode: mode, Clients: c, Results: map[string]*Result{}}
				runs := map[string][]*Result{}
				for round := 1; round <= o.rounds; round++ {
					for _, t := range e.roundTargets(round) {
						if t.Name == "direct" && c > o.directMaxClients {
							continue // printed as n/a
						}
						if script == "tpcb" {
							// What pgbench's own pre-run vacuum does, done directly
							// so every target starts from the same table state.
							ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
							_ = e.Cluster.Exec(ctx, benchDB, "VACUUM pgbench_branches, pgbench_tellers; TRUNCATE pgbench_history")
							cancel()
						}
						r := runPgbench(o, e, t, row, round)
						settle(e, o)
						runs[t.Name] = append(runs[t.Name], r)
						at := fmt.Sprintf("[%d/%d]", n, total)
						if o.rounds > 1 {
							at = fmt.Sprintf("[%d/%d round %d]", n, total, round)
						}
						if r.Failed {
							logf("%s %-22s %-9s fails: %s", at, row.label(), t.Name, r.Error)
						} else {
							logf("%s %-22s %-9s %9.0f tps  p50 %6.2f ms  p99 %7.2f ms  cpu %s  switches %s",
								at, row.label(), t.Name, r.TPS, r.P50ms, r.P99ms, cpuStr(r), switchStr(r))
						}
					}
				}
				for name, rs := range runs {
					row.Results[name] = medianResult(rs)
				}
				rows = append(rows, row)
			}
		}
	}
	return rows
}

// settle waits (up to a minute) until the benchmark role's backends are
// back to what the poolers keep open, so 1,000 exiting direct backends do
// not slow down the next target's run.
func settle(e *env, o *options) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, e.Cluster.SuperuserDSN("postgres"))
	if err != nil {
		return
	}
	defer c.Close(context.Background())
	for ctx.Err() == nil {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", benchUser).Scan(&n); err != nil {
			return
		}
		if n <= 2*o.budget+6 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func switchStr(r *Result) string {
	if r.SwitchesPerTxn < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f/txn", r.SwitchesPerTxn)
}

func cpuStr(r *Result) string {
	if r.CPUPer1000Txn < 0 {
		return "-"
	}
	if r.UserPer1000Txn >= 0 {
		return fmt.Sprintf("%.1f µs/txn (user %.1f)", r.CPUPer1000Txn*1000, r.UserPer1000Txn*1000)
	}
	return fmt.Sprintf("%.1f µs/txn", r.CPUPer1000Txn*1000)
}

var (
	reTxns = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	reTPS  = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
)

func runPgbench(o *options, e *env, t *target, row *Row, round int) *Result {
	r := &Result{Target: t.Name, CPUSeconds: -1, CPUPer1000Txn: -1, UserPer1000Txn: -1, SwitchesPerTxn: -1}
	dir, done, err := e.tempDir(o, "pgbench-")
	if err != nil {
		r.Failed, r.Error = true, err.Error()
		return r
	}
	defer done()
	j := 2
	if row.Clients < j {
		j = row.Clients
	}
	args := []string{"-n", "-h", t.Host, "-p", strconv.Itoa(t.Port), "-U", benchUser,
		"-M", row.Mode, "-c", strconv.Itoa(row.Clients), "-j", strconv.Itoa(j),
		"-T", strconv.Itoa(runSeconds(o, t, row.Clients)), "-l", "--log-prefix", filepath.Join(dir, "log")}
	if row.Script == "select" {
		args = append(args, "-S")
	}
	args = append(args, benchDB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.duration)*time.Second+3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "pgbench", args...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+benchPassword)

	var before, userBefore, userAfter, switchesBefore int64
	var samples <-chan []cpuSample
	stop := make(chan struct{})
	if t.Proc != nil {
		u, sys, _ := testenv.ProcCPUTimes(t.Proc.PID())
		before, userBefore = u+sys, u
		switchesBefore, _ = testenv.ProcContextSwitches(t.Proc.PID())
		samples = sampleCPU(t.Proc.PID(), stop)
	}
	var prof chan string
	if t.Name == "lockpool" && o.pprofDir != "" {
		prof = make(chan string, 1)
		go func() { prof <- fetchProfile(o, t, row, round) }()
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r.WallSeconds = time.Since(start).Seconds()
	close(stop)
	var cpu []cpuSample
	if t.Proc != nil {
		u, sys, _ := testenv.ProcCPUTimes(t.Proc.PID())
		r.CPUSeconds = float64(u+sys-before) / testenv.ClockTicks
		userAfter = u
		cpu = <-samples
		if sw, err := testenv.ProcContextSwitches(t.Proc.PID()); err == nil {
			r.SwitchesPerTxn = float64(sw - switchesBefore) // divided below
		}
	}
	if prof != nil {
		r.Profile = <-prof
	}
	text := string(out)
	if m := reTxns.FindStringSubmatch(text); m != nil {
		r.Transactions, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reTPS.FindStringSubmatch(text); m != nil {
		r.TPS, _ = strconv.ParseFloat(m[1], 64)
	}
	if err != nil || strings.Contains(text, "Run was aborted") || r.Transactions == 0 {
		r.Failed = true
		r.Error = firstError(text, err)
		return r
	}
	logs := readLogs(dir)
	r.P50ms, r.P99ms = logs.pct(0.50), logs.pct(0.99)
	if r.SwitchesPerTxn >= 0 && r.Transactions > 0 {
		r.SwitchesPerTxn /= float64(r.Transactions)
	}
	if r.CPUSeconds >= 0 && r.Transactions > 0 {
		// Whole run, logins included, as a fallback.
		r.CPUPer1000Txn = r.CPUSeconds / float64(r.Transactions) * 1000
		r.UserPer1000Txn = float64(userAfter-userBefore) / testenv.ClockTicks / float64(r.Transactions) * 1000
		r.CPUWindow = "whole run"
		if cpu, user, n, ok := steadyCPU(cpu, logs); ok {
			r.CPUPer1000Txn = cpu / float64(n) * 1000
			r.UserPer1000Txn = user / float64(n) * 1000
			r.CPUWindow = fmt.Sprintf("steady state: %.2f s CPU over %d txns", cpu, n)
		}
	}
	if t.Proc != nil && !t.Proc.Alive() {
		r.Failed, r.Error = true, "process died: "+t.Proc.LogTail(3000)
	}
	return r
}

// runSeconds is pgbench's -T for a row against target t. pgbench counts its
// connection phase in -T (it reports tps without it), and 1,000 logins take
// seconds here, so large rows get 6 s more, the same for every pooler.
// Direct PostgreSQL gets 40 s more: each of its logins forks a backend, and
// pgbench's threads log in one client after another, so 1,000 direct logins
// take longer than a pooler's whole run.
func runSeconds(o *options, t *target, clients int) int {
	switch {
	case clients >= 500 && t.Name == "direct":
		return o.duration + 40
	case clients >= 500:
		return o.duration + 6
	}
	return o.duration
}

func firstError(text string, err error) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "error") || strings.Contains(l, "ERROR") || strings.Contains(l, "FATAL") {
			l = strings.TrimSpace(l)
			if len(l) > 200 {
				l = l[:200]
			}
			return l
		}
	}
	tail := strings.TrimSpace(text)
	if i := strings.LastIndex(tail, "\n"); i >= 0 && len(tail)-i < 200 {
		tail = tail[i+1:]
	}
	tail = trunc(tail, 200)
	if err != nil {
		return err.Error() + ": " + tail
	}
	return "no transactions: " + tail
}

// txnLog is what pgbench's per-transaction logs (client_id txn_no
// latency_us script_no epoch epoch_us) say about a run.
type txnLog struct {
	lat []int64 // latency µs, sorted
	end []int64 // completion time, µs since the epoch, sorted
	// steady state: from the moment every pgbench thread finished its
	// first transaction (threads connect all their clients first) to the
	// moment the first thread finished its last one.
	from, to int64
}

func readLogs(dir string) *txnLog {
	files, _ := filepath.Glob(filepath.Join(dir, "log.*"))
	l := &txnLog{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		var first, last int64 = -1, -1
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 {
				continue
			}
			v, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue // "failed" / "skipped"
			}
			sec, err1 := strconv.ParseInt(fields[4], 10, 64)
			us, err2 := strconv.ParseInt(fields[5], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			t := sec*1e6 + us
			l.lat = append(l.lat, v)
			l.end = append(l.end, t)
			if first < 0 || t < first {
				first = t
			}
			if t > last {
				last = t
			}
		}
		fh.Close()
		if first >= 0 {
			if first > l.from {
				l.from = first
			}
			if l.to == 0 || last < l.to {
				l.to = last
			}
		}
	}
	sort.Slice(l.lat, func(i, j int) bool { return l.lat[i] < l.lat[j] })
	sort.Slice(l.end, func(i, j int) bool { return l.end[i] < l.end[j] })
	return l
}

// pct returns the p-quantile of the latencies in ms (-1 when none).
func (l *txnLog) pct(p float64) float64 {
	if len(l.lat) == 0 {
		return -1
	}
	return float64(l.lat[int(p*float64(len(l.lat)-1))]) / 1000
}

// count returns the transactions completed in (a, b] (µs since the epoch).
func (l *txnLog) count(a, b int64) int64 {
	i := sort.Search(len(l.end), func(i int) bool { return l.end[i] > a })
	j := sort.Search(len(l.end), func(i int) bool { return l.end[i] > b })
	return int64(j - i)
}

// cpuSample is the pooler's CPU time at one moment.
type cpuSample struct {
	at    int64 // µs since the epoch
	ticks int64 // user + system
	user  int64
}

// sampleCPU records pid's CPU time every 100 ms until stop is closed.
func sampleCPU(pid int, stop <-chan struct{}) <-chan []cpuSample {
	out := make(chan []cpuSample, 1)
	go func() {
		var s []cpuSample
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			if u, sys, err := testenv.ProcCPUTimes(pid); err == nil {
				s = append(s, cpuSample{at: time.Now().UnixMicro(), ticks: u + sys, user: u})
			}
			select {
			case <-stop:
				if u, sys, err := testenv.ProcCPUTimes(pid); err == nil {
					s = append(s, cpuSample{at: time.Now().UnixMicro(), ticks: u + sys, user: u})
				}
				out <- s
				return
			case <-tk.C:
			}
		}
	}()
	return out
}

// steadyCPU returns the pooler CPU seconds (and the user part of them) and the transactions completed
// between the first sample inside the steady state and the last one, so
// that logins (SCRAM for 1,000 clients costs the pooler too) do not count
// as per-transaction CPU. ok is false when the window is under a second.
func steadyCPU(samples []cpuSample, l *txnLog) (cpu, user float64, txns int64, ok bool) {
	var a, b *cpuSample
	for i := range samples {
		s := &samples[i]
		if s.at >= l.from && a == nil {
			a = s
		}
		if s.at <= l.to {
			b = s
		}
	}
	if a == nil || b == nil || b.at-a.at < 1e6 {
		return 0, 0, 0, false
	}
	n := l.count(a.at, b.at)
	if n == 0 {
		return 0, 0, 0, false
	}
	return float64(b.ticks-a.ticks) / testenv.ClockTicks, float64(b.user-a.user) / testenv.ClockTicks, n, true
}

// fetchProfile takes a CPU profile from lockpool's admin listener for
// (roughly) the length of the run.
func fetchProfile(o *options, t *target, row *Row, round int) string {
	secs := o.duration - 1
	if secs < 1 {
		secs = 1
	}
	_ = os.MkdirAll(o.pprofDir, 0o755)
	name := filepath.Join(o.pprofDir, fmt.Sprintf("lockpool-%s-%s-c%d.pprof", row.Script, row.Mode, row.Clients))
	if o.rounds > 1 {
		name = strings.TrimSuffix(name, ".pprof") + fmt.Sprintf("-round%d.pprof", round)
	}
	// Skip the login phase (the extra seconds large rows get) so the
	// profile shows transactions, not SCRAM.
	time.Sleep(time.Duration(runSeconds(o, t, row.Clients)-o.duration)*time.Second + 700*time.Millisecond)
	return saveProfile(t, secs, name)
}

// saveProfile writes a CPU profile of secs seconds from t's admin listener
// to name and returns name (or the error).
func saveProfile(t *target, secs int, name string) string {
	resp, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", t.AdminURL, secs))
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	f, err := os.Create(name)
	if err != nil {
		return "error: " + err.Error()
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		return "error: " + err.Error()
	}
	return name
}
