package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/testenv"
)

// LoginResult is the login-storm row: pgbench -C (a new connection, and so
// a SCRAM-SHA-256 login, for every transaction) against each pooler, both
// checking the same verifier (the role's pg_authid secret: PgBouncer's
// auth_file and lockpool's users hold it), in alternating rounds.
type LoginResult struct {
	Clients int    `json:"clients"`
	Seconds int    `json:"pgbench_T"`
	Command string `json:"command"` // pgbench's arguments, host and port left out
	// Rounds by target, in round order.
	Rounds map[string][]*LoginRun `json:"rounds"`
	// Medians by target over the rounds that did not fail.
	CPUPerLoginUs map[string]float64 `json:"cpu_us_per_login"`
	LoginsPerSec  map[string]float64 `json:"logins_per_second"`
	// CPURatio and RateRatio are the medians of the rounds' lockpool /
	// PgBouncer ratios (the two ran back to back in each round).
	CPURatio  float64 `json:"cpu_ratio_median"`
	RateRatio float64 `json:"rate_ratio_median"`
}

// LoginRun is one pgbench -C run against one pooler.
type LoginRun struct {
	Target string `json:"target"`
	Round  int    `json:"round"`
	Failed bool   `json:"failed"`
	Error  string `json:"error,omitempty"`
	Logins int64  `json:"logins"` // transactions, one login each
	// LoginsPerSec is logins over the run's wall time (pgbench's tps
	// including reconnection times).
	LoginsPerSec float64 `json:"logins_per_second"`
	// CPUSeconds is the pooler's CPU time over the whole run: the time its
	// threads ran, summed from /proc/<pid>/task/*/schedstat (nanoseconds,
	// what perf stat's task-clock counts; Clock "schedstat"), or user +
	// system time from /proc/<pid>/stat where that is missing (clock ticks,
	// sampled 100 times a second; Clock "ticks"). CPUPerLoginUs is that per
	// login, UserPerLoginUs its user-time part (utime's share of utime +
	// stime).
	CPUSeconds     float64 `json:"pooler_cpu_seconds"`
	Clock          string  `json:"cpu_clock"`
	CPUPerLoginUs  float64 `json:"cpu_us_per_login"`
	UserPerLoginUs float64 `json:"user_cpu_us_per_login"`
	// ConnectMs is pgbench's average connection time.
	ConnectMs float64 `json:"average_connection_ms"`
	P99ms     float64 `json:"p99_ms"` // transaction latency, login included
	// Profile is the lockpool CPU profile of the run (-pprof).
	Profile string `json:"pprof,omitempty"`
}

var (
	reTPSConnect = regexp.MustCompile(`tps = ([0-9.]+) \(including reconnection times\)`)
	reConnTime   = regexp.MustCompile(`average connection time = ([0-9.]+) ms`)
)

// loginArgs is the login-storm pgbench command for c clients and d seconds
// (without host, port and user).
func loginArgs(c, d int) []string {
	return []string{"-n", "-C", "-S", "-M", "simple", "-c", strconv.Itoa(c), "-j", "2", "-T", strconv.Itoa(d)}
}

// loginTest runs the login-storm row: o.rounds rounds, each pooler once per
// round, lockpool first in odd rounds and PgBouncer first in even ones.
func loginTest(o *options, e *env) *LoginResult {
	res := &LoginResult{Clients: o.loginClients, Seconds: o.duration, Rounds: map[string][]*LoginRun{},
		CPUPerLoginUs: map[string]float64{}, LoginsPerSec: map[string]float64{},
		Command: "pgbench " + strings.Join(loginArgs(o.loginClients, o.duration), " ")}
	for round := 1; round <= o.rounds; round++ {
		ps := e.poolers()
		if round%2 == 0 && len(ps) == 2 {
			ps[0], ps[1] = ps[1], ps[0]
		}
		for _, t := range ps {
			r := loginRun(o, e, t, round)
			res.Rounds[t.Name] = append(res.Rounds[t.Name], r)
			settle(e, o)
			if r.Failed {
				logf("[login storm round %d] %-9s fails: %s", round, t.Name, r.Error)
				continue
			}
			logf("[login storm round %d] %-9s %7.0f logins/s  cpu %6.1f µs/login (user %.1f)  connect %.2f ms  p99 %.2f ms",
				round, t.Name, r.LoginsPerSec, r.CPUPerLoginUs, r.UserPerLoginUs, r.ConnectMs, r.P99ms)
		}
	}
	var cpuQ, rateQ []float64
	for name, rs := range res.Rounds {
		var cpu, rate []float64
		for _, r := range rs {
			if !r.Failed {
				cpu = append(cpu, r.CPUPerLoginUs)
				rate = append(rate, r.LoginsPerSec)
			}
		}
		if len(cpu) > 0 {
			res.CPUPerLoginUs[name] = medianOf(cpu)
			res.LoginsPerSec[name] = medianOf(rate)
		}
	}
	lp, pb := res.Rounds["lockpool"], res.Rounds["pgbouncer"]
	for i := 0; i < len(lp) && i < len(pb); i++ {
		if !lp[i].Failed && !pb[i].Failed && pb[i].CPUPerLoginUs > 0 && pb[i].LoginsPerSec > 0 {
			cpuQ = append(cpuQ, lp[i].CPUPerLoginUs/pb[i].CPUPerLoginUs)
			rateQ = append(rateQ, lp[i].LoginsPerSec/pb[i].LoginsPerSec)
		}
	}
	if len(cpuQ) > 0 {
		res.CPURatio, res.RateRatio = medianOf(cpuQ), medianOf(rateQ)
	}
	return res
}

// loginRun runs the login-storm pgbench once against t and reads t's CPU
// time before and after it.
func loginRun(o *options, e *env, t *target, round int) *LoginRun {
	r := &LoginRun{Target: t.Name, Round: round}
	dir, done, err := e.tempDir(o, "login-")
	if err != nil {
		r.Failed, r.Error = true, err.Error()
		return r
	}
	defer done()
	args := append([]string{"-h", t.Host, "-p", strconv.Itoa(t.Port), "-U", benchUser},
		loginArgs(o.loginClients, o.duration)...)
	args = append(args, "-l", "--log-prefix", filepath.Join(dir, "log"), benchDB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.duration)*time.Second+3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "pgbench", args...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+benchPassword)
	pid := t.Proc.PID()
	u0, s0, _ := testenv.ProcCPUTimes(pid)
	n0, nerr := taskNanos(pid)
	var prof chan string
	if t.Name == "lockpool" && o.pprofDir != "" {
		prof = make(chan string, 1)
		go func() { prof <- fetchLoginProfile(o, t, round) }()
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	wall := time.Since(start).Seconds()
	u1, s1, _ := testenv.ProcCPUTimes(pid)
	n1, nerr1 := taskNanos(pid)
	if prof != nil {
		r.Profile = <-prof
	}
	text := string(out)
	if m := reTxns.FindStringSubmatch(text); m != nil {
		r.Logins, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reTPSConnect.FindStringSubmatch(text); m != nil {
		r.LoginsPerSec, _ = strconv.ParseFloat(m[1], 64)
	} else if wall > 0 {
		r.LoginsPerSec = float64(r.Logins) / wall
	}
	if m := reConnTime.FindStringSubmatch(text); m != nil {
		r.ConnectMs, _ = strconv.ParseFloat(m[1], 64)
	}
	if err != nil || strings.Contains(text, "Run was aborted") || r.Logins == 0 {
		r.Failed, r.Error = true, firstError(text, err)
		return r
	}
	if !t.Proc.Alive() {
		r.Failed, r.Error = true, "process died: "+t.Proc.LogTail(3000)
		return r
	}
	ticks := float64(u1+s1-u0-s0) / testenv.ClockTicks
	r.CPUSeconds, r.Clock = ticks, "ticks"
	if nerr == nil && nerr1 == nil {
		r.CPUSeconds, r.Clock = float64(n1-n0)/1e9, "schedstat"
	}
	r.CPUPerLoginUs = r.CPUSeconds / float64(r.Logins) * 1e6
	// The user part: the share utime has of utime+stime (tick-sampled).
	if u1+s1-u0-s0 > 0 {
		r.UserPerLoginUs = r.CPUPerLoginUs * float64(u1-u0) / float64(u1+s1-u0-s0)
	}
	r.P99ms = readLogs(dir).pct(0.99)
	return r
}

// taskNanos is the CPU time the threads of pid ran so far, in nanoseconds:
// the first field of each /proc/<pid>/task/<tid>/schedstat (a thread that
// ended meanwhile is missing from the sum; Go and PgBouncer keep theirs).
func taskNanos(pid int) (int64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: empty schedstat", e.Name())
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// printLogin prints the login-storm row of rep.
func printLogin(w interface{ Write([]byte) (int, error) }, x *LoginResult) {
	fmt.Fprintf(w, "\nlogin storm (%s; a SCRAM-SHA-256 login per transaction, both poolers checking the same verifier), medians of %d rounds:\n",
		x.Command, len(x.Rounds["lockpool"]))
	for _, name := range []string{"lockpool", "pgbouncer"} {
		rs, ok := x.Rounds[name]
		if !ok {
			continue
		}
		var parts []string
		for _, r := range rs {
			if r.Failed {
				parts = append(parts, "fails")
			} else {
				parts = append(parts, fmt.Sprintf("%.0f/s %.0f µs", r.LoginsPerSec, r.CPUPerLoginUs))
			}
		}
		fmt.Fprintf(w, "  %-9s %7.0f logins/s, cpu %6.1f µs/login (rounds: %s)\n", name, x.LoginsPerSec[name], x.CPUPerLoginUs[name], strings.Join(parts, "; "))
	}
	if x.CPURatio > 0 {
		fmt.Fprintf(w, "  lockpool/PgBouncer, median of the rounds' ratios: cpu per login %.2f, login rate %.2f\n", x.CPURatio, x.RateRatio)
	}
}

// fetchLoginProfile takes a CPU profile from lockpool's admin listener over
// a login-storm run (its first and last half second left out).
func fetchLoginProfile(o *options, t *target, round int) string {
	_ = os.MkdirAll(o.pprofDir, 0o755)
	name := filepath.Join(o.pprofDir, fmt.Sprintf("lockpool-login-c%d-round%d.pprof", o.loginClients, round))
	time.Sleep(500 * time.Millisecond) // pgbench's start
	return saveProfile(t, max(1, o.duration-1), name)
}
