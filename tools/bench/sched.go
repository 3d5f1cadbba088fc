package main

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SchedResult is what the kernel's scheduler did during one pgbench -S
// simple run through a pooler: `perf sched latency` over a window in the
// middle of the run, for the pooler's threads, PostgreSQL's processes and
// pgbench's. A task's delay is the time from its wake-up (or preemption)
// to running again; with a CPU-bound machine it is the latency a pooler
// adds that is not its own work.
type SchedResult struct {
	Target  string      `json:"target"`
	Clients int         `json:"clients"`
	TPS     float64     `json:"tps"`
	Window  float64     `json:"window_seconds"`
	Error   string      `json:"error,omitempty"`
	Pooler  *SchedTask  `json:"pooler,omitempty"`
	Others  []SchedTask `json:"others,omitempty"` // postgres, pgbench
}

// SchedTask is one line of `perf sched latency`: the tasks of one command
// name, merged.
type SchedTask struct {
	Comm       string  `json:"comm"`
	Tasks      int     `json:"tasks"`
	RuntimeMS  float64 `json:"runtime_ms"`
	Switches   int     `json:"switches"`
	AvgDelayUS float64 `json:"avg_delay_us"`
	MaxDelayMS float64 `json:"max_delay_ms"`
}

// schedTest runs one pgbench -S -M simple run with clients clients through
// t and records the scheduler's events system-wide (perf sched record)
// from 1 s into the run for up to 3 s.
func schedTest(o *options, e *env, t *target, clients int) *SchedResult {
	r := &SchedResult{Target: t.Name, Clients: clients}
	dir, done, err := e.tempDir(o, "sched-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer done()
	r.Window = math.Min(3, float64(o.duration)-2)
	if r.Window < 1 {
		r.Error = "the run is too short for a window (-T below 3)"
		return r
	}
	data := filepath.Join(dir, "sched.data")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.duration)*time.Second+2*time.Minute)
	defer cancel()
	recorded := make(chan error, 1)
	go func() {
		// The window starts a second into the run: after pgbench's
		// connections are made (the harness's runs are warm).
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			recorded <- ctx.Err()
			return
		}
		out, err := exec.CommandContext(ctx, "perf", "sched", "record", "-o", data, "--",
			"sleep", strconv.FormatFloat(r.Window, 'f', 1, 64)).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("perf sched record: %v: %s", err, trunc(strings.TrimSpace(string(out)), 200))
		}
		recorded <- err
	}()
	row := &Row{Script: "select", Mode: "simple", Clients: clients}
	res := runPgbench(o, e, t, row, 0)
	if err := <-recorded; err != nil {
		r.Error = err.Error()
		return r
	}
	if res.Failed {
		r.Error = "pgbench: " + res.Error
		return r
	}
	r.TPS = res.TPS
	out, err := exec.CommandContext(ctx, "perf", "sched", "latency", "-i", data).Output()
	if err != nil {
		r.Error = "perf sched latency: " + err.Error()
		return r
	}
	tasks := parseSchedLatency(string(out))
	pooler := schedComm(filepath.Base(t.Proc.Cmd.Path))
	for i := range tasks {
		switch tasks[i].Comm {
		case pooler:
			r.Pooler = &tasks[i]
		case "postgres", "pgbench":
			r.Others = append(r.Others, tasks[i])
		}
	}
	if r.Pooler == nil {
		r.Error = fmt.Sprintf("perf sched latency has no line for %q", pooler)
	}
	return r
}

// schedComm is the command name the kernel keeps for a program: at most 15
// bytes of its file name.
func schedComm(name string) string {
	if len(name) > 15 {
		return name[:15]
	}
	return name
}

// parseSchedLatency reads the table `perf sched latency` prints:
//
//	Task                  |   Runtime ms  | Switches | Avg delay ms    | Max delay ms    | …
//	postgres:(12)         |   3709.454 ms |     1631 | avg:   0.854 ms | max: 628.497 ms | …
//	pgbouncer:17346       |   1100.250 ms |    14662 | avg:   0.076 ms | max:   5.065 ms | …
//
// A name followed by ":(n)" merges n tasks; ":pid" is one. Lines that are
// not of that shape (the header, rules, TOTAL) are skipped.
func parseSchedLatency(s string) []SchedTask {
	var tasks []SchedTask
	for _, line := range strings.Split(s, "\n") {
		f := strings.Split(line, "|")
		if len(f) < 5 {
			continue
		}
		name := strings.TrimSpace(f[0])
		i := strings.LastIndexByte(name, ':')
		if i <= 0 {
			continue
		}
		t := SchedTask{Comm: name[:i], Tasks: 1}
		if n := name[i+1:]; strings.HasPrefix(n, "(") && strings.HasSuffix(n, ")") {
			var err error
			if t.Tasks, err = strconv.Atoi(n[1 : len(n)-1]); err != nil {
				continue
			}
		}
		var err1, err2, err3, err4 error
		t.RuntimeMS, err1 = msField(f[1], "")
		t.Switches, err2 = strconv.Atoi(strings.TrimSpace(f[2]))
		avg, err3 := msField(f[3], "avg:")
		t.MaxDelayMS, err4 = msField(f[4], "max:")
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue
		}
		t.AvgDelayUS = avg * 1000
		tasks = append(tasks, t)
	}
	return tasks
}

// msField reads "  avg:   0.854 ms " (label "avg:") as 0.854.
func msField(f, label string) (float64, error) {
	f = strings.TrimSpace(f)
	f = strings.TrimSpace(strings.TrimPrefix(f, label))
	f = strings.TrimSpace(strings.TrimSuffix(f, "ms"))
	return strconv.ParseFloat(f, 64)
}

// schedLine is a SchedResult's line in the report.
func schedLine(x *SchedResult) string {
	if x.Error != "" {
		return fmt.Sprintf("%-9s fails: %s", x.Target, trunc(x.Error, 160))
	}
	p := x.Pooler
	line := fmt.Sprintf("%-9s %6.0f tps | %s: avg delay %4.0f µs, max %6.2f ms, %.2f switches/txn, threads %d",
		x.Target, x.TPS, x.Target, p.AvgDelayUS, p.MaxDelayMS, float64(p.Switches)/(x.TPS*x.Window), p.Tasks)
	for _, o := range x.Others {
		line += fmt.Sprintf(" | %s: avg delay %4.0f µs, max %6.2f ms", o.Comm, o.AvgDelayUS, o.MaxDelayMS)
	}
	return line
}
