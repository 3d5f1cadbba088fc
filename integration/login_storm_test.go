package integration

// A storm of logins on a small budget: the login pipeline (proxy/logingate.go)
// serves every client or refuses it with a clear error within
// client_login_timeout, server connections stay within the budget, and
// lockpool's goroutines and memory come back down afterwards.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// stormMetrics reads the unlabelled series of lockpool's /metrics (the sum
// over labels for labelled ones) from admin.
func stormMetrics(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[name] += v
		}
	}
	return out
}

// stormOutcome is what one client of the storm saw.
type stormOutcome struct {
	served bool          // logged in and SELECT 1 returned 1
	code   string        // the SQLSTATE of the error it got, if any
	msg    string        // that error's message
	other  error         // an error that is no clear error (none expected)
	login  time.Duration // from the dial to the end of the login, or to its refusal
}

// TestLoginStormOnSmallBudget: 2,000 logins on an application of 4 server
// connections, in waves of 500 with a roomy client_login_timeout (every
// client is served), then all at once with a tight one (the pipeline keeps
// up what it can and refuses the rest with 53300 in time).
func TestLoginStormOnSmallBudget(t *testing.T) {
	t.Run("waves", func(t *testing.T) { loginStorm(t, "stormwaves", 2000, 500, 5*time.Second, false) })
	t.Run("at once, tight timeout", func(t *testing.T) { loginStorm(t, "stormtight", 2000, 2000, 700*time.Millisecond, true) })
}

// loginStorm runs total logins of role, wave at a time, against a lockpool
// process with client_login_timeout loginTimeout and an application of 4
// server connections; wantRefused: some clients must have been refused.
func loginStorm(t *testing.T, role string, total, wave int, loginTimeout time.Duration, wantRefused bool) {
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, role)
	const budget = 4
	adminPort := testenv.FreePort(t)
	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	p := testenv.StartLockpoolProcess(t, func(port int) string {
		return testenv.AppsYAML(c, 10,
			fmt.Sprintf("listen: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:%d\nclient_login_timeout: %s", port, adminPort, loginTimeout),
			testenv.App{Name: "storm", User: role, DB: "appdb", Max: budget, Pinned: 1, Advisory: "pin", State: "pin", Wait: "5s"})
	})
	ctx := context.Background()
	// One login first: the server's parameters are cached from then on, as
	// in a running instance.
	first, err := pgx.Connect(ctx, p.DSN(role, "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	first.Close(ctx)
	testenv.Eventually(t, 10*time.Second, "no client left before the storm", func() bool {
		return stormMetrics(t, admin)["lockpool_client_connections"] == 0
	})
	time.Sleep(1500 * time.Millisecond) // the loops let their spare coroutines go after a second idle
	before := stormMetrics(t, admin)
	baseGoroutines, baseRSS := before["go_goroutines"], before["process_resident_memory_bytes"]

	// The server connections of the role, sampled during the storm.
	super := superConn(t, "postgres")
	var maxBackends atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			n, err := countBackends(ctx, super, fmt.Sprintf("usename = '%s' AND backend_type = 'client backend'", role))
			if err == nil && int64(n) > maxBackends.Load() {
				maxBackends.Store(int64(n))
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	cfg, err := pgx.ParseConfig(p.DSN(role, "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnectTimeout = loginTimeout + 10*time.Second // lockpool's answer must come first
	outcomes := make([]stormOutcome, total)
	var peakInProgress, peakWaiting float64
	start := time.Now()
	for w := 0; w < total; w += wave {
		var wg sync.WaitGroup
		for i := w; i < w+wave && i < total; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := &outcomes[i]
				cctx, cancel := context.WithTimeout(ctx, loginTimeout+20*time.Second)
				defer cancel()
				t0 := time.Now()
				conn, err := pgx.ConnectConfig(cctx, cfg)
				o.login = time.Since(t0)
				if err == nil {
					var one int
					err = conn.QueryRow(cctx, "SELECT 1").Scan(&one)
					conn.Close(ctx)
					if err == nil && one == 1 {
						o.served = true
						return
					}
				}
				var pe *pgconn.PgError
				if errors.As(err, &pe) {
					o.code, o.msg = pe.Code, pe.Message
					return
				}
				o.other = err
			}()
		}
		// The pipeline's gauges while the wave logs in.
		waveDone := make(chan struct{})
		go func() { wg.Wait(); close(waveDone) }()
	watch:
		for {
			m := stormMetrics(t, admin)
			peakInProgress = max(peakInProgress, m["lockpool_logins_in_progress"])
			peakWaiting = max(peakWaiting, m["lockpool_logins_waiting"])
			select {
			case <-waveDone:
				break watch
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	took := time.Since(start)
	close(stopSampling)
	<-sampled

	served, codes, others := 0, map[string]int{}, 0
	var slowest time.Duration
	for i, o := range outcomes {
		switch {
		case o.served:
			served++
		case o.code != "":
			codes[o.code]++
			if !strings.HasPrefix(o.msg, "lockpool:") {
				t.Errorf("client %d: error %s %q is not lockpool's", i, o.code, o.msg)
			}
		default:
			others++
			if others <= 5 {
				t.Errorf("client %d: neither served nor refused with a clear error after %v: %v", i, o.login, o.other)
			}
		}
		if o.code != "53300" || o.login < loginTimeout { // a 53300 for the pool comes after the login
			slowest = max(slowest, o.login)
		}
	}
	t.Logf("%d logins in %v: %d served, refused %v, %d other; slowest login or refusal %v; peak in progress %.0f, waiting %.0f; server connections at most %d",
		total, took.Round(time.Millisecond), served, codes, others, slowest.Round(time.Millisecond), peakInProgress, peakWaiting, maxBackends.Load())
	for code := range codes {
		if code != "53300" && code != "57014" {
			t.Errorf("refused with %s (%d clients): want 53300 (no place in time) or 57014 (login timeout)", code, codes[code])
		}
	}
	if served == 0 && !wantRefused {
		t.Error("no client was served") // with a tight timeout on a loaded machine (-race) none may be
	}
	if wantRefused && served == total {
		t.Log("every client was served: the machine logged them in faster than the timeout (no refusal to check)")
	}
	if slack := 2 * time.Second; slowest > loginTimeout+slack {
		t.Errorf("a login or its refusal took %v, more than client_login_timeout %v + %v", slowest, loginTimeout, slack)
	}
	if n := maxBackends.Load(); n > budget {
		t.Errorf("%d server connections of the application at once, budget %d", n, budget)
	}

	// After the storm: no login left, goroutines and memory back down.
	testenv.Eventually(t, 20*time.Second, "the storm's clients gone and the loops' spares let go", func() bool {
		m := stormMetrics(t, admin)
		return m["lockpool_client_connections"] == 0 && m["lockpool_logins_in_progress"] == 0 &&
			m["lockpool_logins_waiting"] == 0 && m["go_goroutines"] <= baseGoroutines+10
	})
	after := stormMetrics(t, admin)
	t.Logf("goroutines %.0f -> %.0f; RSS %.1f -> %.1f MiB; login_seconds count %.0f",
		baseGoroutines, after["go_goroutines"], baseRSS/(1<<20), after["process_resident_memory_bytes"]/(1<<20), after["lockpool_login_seconds_count"])
	if grew := after["process_resident_memory_bytes"] - baseRSS; grew > 64<<20 {
		t.Errorf("RSS grew by %.1f MiB over the storm, want under 64 MiB", grew/(1<<20))
	}
	if got := after["lockpool_login_seconds_count"] - before["lockpool_login_seconds_count"]; int(got) < served {
		t.Errorf("lockpool_login_seconds counted %.0f logins, %d clients were served", got, served)
	}
	// And lockpool still serves.
	last, err := pgx.Connect(ctx, p.DSN(role, "appdb"))
	if err != nil {
		t.Fatalf("after the storm: %v", err)
	}
	var one int
	if err := last.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Errorf("after the storm: %v", err)
	}
	last.Close(ctx)
}
