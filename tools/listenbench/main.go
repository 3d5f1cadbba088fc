// Command listenbench measures LISTEN/NOTIFY fan-out through lockpool under
// applications[].listen: shared: it opens -clients connections through
// lockpool (-dsn), each runs LISTEN bench and waits in WaitForNotification,
// while one sender sends SELECT pg_notify('bench', '<seq>:<unix nanos>') at
// -rate per second for -duration. It counts every notification each client
// receives (by seq) and the delivery latency (receive time − the send time in
// the payload), then prints sent, expected and received deliveries, missing
// and duplicate ones, p50/p99/max latency, the number of 'lockpool listener'
// backends in pg_stat_activity (-direct-dsn) and lockpool's memory per
// listening client (RSS from /proc/<-pid>/status, or
// process_resident_memory_bytes from -admin's /metrics), before the clients
// connected and after they all listened.
//
//	go run ./tools/listenbench -dsn postgres://app:pw@127.0.0.1:6432/appdb \
//	    -direct-dsn postgres://postgres@127.0.0.1:5432/appdb -pid $(pidof lockpool)
//
// scripts/listen-bench.sh starts PostgreSQL and lockpool and runs it.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const channel = "bench"

type options struct {
	clients     int
	rate        float64
	duration    time.Duration
	dsn         string
	directDSN   string
	admin       string
	pid         int
	concurrency int
	senders     int
	drain       time.Duration
}

// client is one listening connection and what it received.
type client struct {
	conn *pgx.Conn
	seen []uint32 // per seq: deliveries received (index = seq)
	lat  []int64  // latency of each delivery, ns
	bad  int      // payloads that did not parse
	err  error    // what ended its wait, other than the end of the run
}

func main() {
	var o options
	flag.IntVar(&o.clients, "clients", 1000, "listening connections through lockpool")
	flag.Float64Var(&o.rate, "rate", 200, "NOTIFY per second")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "how long the sender sends")
	flag.StringVar(&o.dsn, "dsn", "", "connection string through lockpool (required)")
	flag.StringVar(&o.directDSN, "direct-dsn", "", "superuser connection string directly to PostgreSQL, to count 'lockpool listener' backends (optional)")
	flag.StringVar(&o.admin, "admin", "", "lockpool admin URL, e.g. http://127.0.0.1:9930, for /metrics (optional)")
	flag.IntVar(&o.pid, "pid", 0, "lockpool's process id, for its RSS from /proc/<pid>/status (optional)")
	flag.IntVar(&o.concurrency, "connect-concurrency", 32, "client connections opened at once")
	flag.IntVar(&o.senders, "senders", 4, "sending connections (each sends every senders-th NOTIFY on the common schedule)")
	flag.DurationVar(&o.drain, "drain", 10*time.Second, "after the last NOTIFY, how long to wait for outstanding deliveries")
	flag.Parse()
	if o.dsn == "" || o.clients < 1 || o.rate <= 0 || o.duration <= 0 || o.concurrency < 1 || o.senders < 1 {
		fmt.Fprintln(os.Stderr, "listenbench: -dsn is required; -clients, -rate, -duration, -connect-concurrency and -senders must be positive")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "listenbench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	rssBefore, rssSrc := rss(ctx, o)
	if rssSrc != "" {
		logf("lockpool RSS before clients: %.1f MiB (%s)", float64(rssBefore)/(1<<20), rssSrc)
	}

	// Room for every seq the sender can send, plus slack for timer slop.
	maxSeq := int(o.rate*o.duration.Seconds()) + 16
	clients := make([]*client, o.clients)
	t0 := time.Now()
	if err := connectAll(ctx, o, clients, maxSeq); err != nil {
		for _, c := range clients {
			if c != nil && c.conn != nil {
				_ = c.conn.Close(context.Background())
			}
		}
		return err
	}
	connectTook := time.Since(t0).Round(time.Millisecond)
	logf("%d clients connected and listening in %v", o.clients, connectTook)
	defer func() {
		for _, c := range clients {
			_ = c.conn.Close(context.Background())
		}
	}()

	// Let lockpool settle (its listener LISTENs, buffers get allocated) before
	// the memory sample.
	time.Sleep(time.Second)
	rssAfter, _ := rss(ctx, o)
	listeners := -1
	if o.directDSN != "" {
		n, err := countListeners(ctx, o.directDSN)
		if err != nil {
			logf("counting listener backends: %v", err)
		} else {
			listeners = n
		}
	}

	// Receivers.
	var received atomic.Int64
	waitCtx, stopWait := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func(c *client) {
			defer wg.Done()
			for {
				n, err := c.conn.WaitForNotification(waitCtx)
				if err != nil {
					if waitCtx.Err() == nil {
						c.err = err
					}
					return
				}
				now := time.Now().UnixNano()
				seq, sent, ok := parsePayload(n.Payload)
				if !ok || n.Channel != channel || seq >= len(c.seen) {
					c.bad++
					continue
				}
				c.seen[seq]++
				c.lat = append(c.lat, now-sent)
				received.Add(1)
			}
		}(c)
	}

	// Senders: seq goes to sender seq % senders, each on the common
	// schedule, so one slow round trip does not hold the others back.
	senders := make([]*pgx.Conn, o.senders)
	for i := range senders {
		c, err := pgx.Connect(ctx, o.dsn)
		if err != nil {
			stopWait()
			wg.Wait()
			return fmt.Errorf("sender connect: %w", err)
		}
		defer c.Close(context.Background())
		senders[i] = c
	}
	interval := time.Duration(float64(time.Second) / o.rate)
	start := time.Now()
	var (
		sendMu                  sync.Mutex
		sent, sendErrs, lateMax = 0, 0, time.Duration(0)
		swg                     sync.WaitGroup
	)
	for i, sender := range senders {
		swg.Add(1)
		go func(i int, sender *pgx.Conn) {
			defer swg.Done()
			for seq := i; seq < maxSeq; seq += len(senders) {
				due := start.Add(time.Duration(seq) * interval)
				if due.Sub(start) >= o.duration {
					return
				}
				late := time.Duration(0)
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				} else {
					late = -d
				}
				payload := strconv.Itoa(seq) + ":" + strconv.FormatInt(time.Now().UnixNano(), 10)
				_, err := sender.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload)
				sendMu.Lock()
				if late > lateMax {
					lateMax = late
				}
				if err != nil {
					sendErrs++
					logf("notify %d: %v", seq, err)
				} else {
					sent++
				}
				stop := sendErrs > 20
				sendMu.Unlock()
				if stop {
					return
				}
			}
		}(i, sender)
	}
	swg.Wait()
	sendTook := time.Since(start)
	logf("sent %d notifications in %v (sender at most %v behind schedule)", sent, sendTook.Round(time.Millisecond), lateMax.Round(time.Millisecond))

	// Drain: wait until every delivery arrived or -drain passed.
	expected := int64(sent) * int64(o.clients)
	deadline := time.Now().Add(o.drain)
	for received.Load() < expected && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	drainTook := o.drain - time.Until(deadline)
	if drainTook > o.drain {
		drainTook = o.drain
	}
	if listeners < 0 && o.directDSN != "" {
		if n, err := countListeners(ctx, o.directDSN); err == nil {
			listeners = n
		}
	}
	listenersEnd := -1
	if o.directDSN != "" {
		if n, err := countListeners(ctx, o.directDSN); err == nil {
			listenersEnd = n
		}
	}
	rssEnd, _ := rss(ctx, o)
	var metrics []string
	if o.admin != "" {
		var err error
		metrics, err = listenMetrics(ctx, o.admin)
		if err != nil {
			logf("metrics: %v", err)
		}
	}
	stopWait()
	wg.Wait()

	// Tally.
	var unique, dups, bad int64
	var clientErrs int
	var firstErr error
	minRecv, maxRecv := int64(-1), int64(0)
	all := make([]int64, 0, received.Load())
	for _, c := range clients {
		var got int64
		for seq := 0; seq < sent && seq < len(c.seen); seq++ {
			if c.seen[seq] > 0 {
				unique++
				got++
				dups += int64(c.seen[seq] - 1)
			}
		}
		// Deliveries of seqs past sent (there should be none) count as bad.
		for seq := sent; seq < len(c.seen); seq++ {
			bad += int64(c.seen[seq])
		}
		bad += int64(c.bad)
		if minRecv < 0 || got < minRecv {
			minRecv = got
		}
		if got > maxRecv {
			maxRecv = got
		}
		if c.err != nil {
			clientErrs++
			if firstErr == nil {
				firstErr = c.err
			}
		}
		all = append(all, c.lat...)
	}
	slices.Sort(all)

	fmt.Println("=== listenbench")
	fmt.Printf("clients:                    %d (connected in %v, %d at once)\n", o.clients, connectTook, o.concurrency)
	fmt.Printf("rate / duration:            %.0f/s for %v (send loop took %v, at most %v behind schedule)\n", o.rate, o.duration, sendTook.Round(time.Millisecond), lateMax.Round(time.Millisecond))
	fmt.Printf("notifications sent:         %d (send errors %d; achieved %.1f/s of %.0f/s asked)\n", sent, sendErrs, float64(sent)/sendTook.Seconds(), o.rate)
	fmt.Printf("deliveries expected:        %d (sent × clients)\n", expected)
	fmt.Printf("deliveries received:        %d (distinct %d, duplicates %d, bad %d)\n", int64(len(all)), unique, dups, bad)
	fmt.Printf("missing:                    %d\n", expected-unique)
	fmt.Printf("per client received:        min %d, max %d\n", minRecv, maxRecv)
	fmt.Printf("drain after last NOTIFY:    %v\n", drainTook.Round(time.Millisecond))
	fmt.Printf("delivery throughput:        %.0f/s (received / (send loop + drain))\n", float64(len(all))/(sendTook+drainTook).Seconds())
	if len(all) > 0 {
		fmt.Printf("latency p50 / p99 / max:    %v / %v / %v\n", pct(all, 0.50), pct(all, 0.99), time.Duration(all[len(all)-1]).Round(time.Microsecond))
	} else {
		fmt.Printf("latency p50 / p99 / max:    n/a\n")
	}
	if clientErrs > 0 {
		fmt.Printf("client errors:              %d (first: %v)\n", clientErrs, firstErr)
	} else {
		fmt.Printf("client errors:              0\n")
	}
	if o.directDSN != "" {
		fmt.Printf("'lockpool listener' backends: %d while listening, %d at the end\n", listeners, listenersEnd)
	} else {
		fmt.Printf("'lockpool listener' backends: n/a (no -direct-dsn)\n")
	}
	if rssSrc != "" && rssBefore > 0 && rssAfter > 0 {
		per := float64(rssAfter-rssBefore) / float64(o.clients)
		fmt.Printf("lockpool RSS:               %.1f MiB before clients, %.1f MiB with %d listening, %.1f MiB at the end (%s)\n",
			float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), o.clients, float64(rssEnd)/(1<<20), rssSrc)
		fmt.Printf("lockpool memory per client: %.1f KiB ((RSS listening − RSS before) / clients); %.1f KiB with the end-of-run RSS\n",
			per/1024, float64(rssEnd-rssBefore)/float64(o.clients)/1024)
	} else {
		fmt.Printf("lockpool memory per client: n/a (no -pid or -admin)\n")
	}
	for _, m := range metrics {
		fmt.Printf("metric: %s\n", m)
	}
	if expected-unique != 0 || clientErrs > 0 {
		return errors.New("deliveries missing or clients failed")
	}
	return nil
}

// connectAll opens the clients, o.concurrency at a time, and runs LISTEN on
// each.
func connectAll(ctx context.Context, o options, clients []*client, maxSeq int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, o.concurrency)
	var mu sync.Mutex
	var firstErr error
	var done atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		sem <- struct{}{}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
			defer ccancel()
			conn, err := pgx.Connect(cctx, o.dsn)
			if err == nil {
				if _, err = conn.Exec(cctx, "LISTEN "+channel); err != nil {
					_ = conn.Close(context.Background())
					conn = nil
				}
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("client %d: %w", i, err)
				}
				mu.Unlock()
				cancel()
				return
			}
			clients[i] = &client{conn: conn, seen: make([]uint32, maxSeq)}
			if n := done.Add(1); n%200 == 0 {
				logf("%d clients listening", n)
			}
		}(i)
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func parsePayload(p string) (seq int, sent int64, ok bool) {
	a, b, found := strings.Cut(p, ":")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.Atoi(a)
	t, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || s < 0 {
		return 0, 0, false
	}
	return s, t, true
}

func pct(sorted []int64, q float64) time.Duration {
	i := int(q * float64(len(sorted)-1))
	return time.Duration(sorted[i]).Round(time.Microsecond)
}

func countListeners(ctx context.Context, dsn string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	var n int
	err = c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockpool listener'").Scan(&n)
	return n, err
}

// rss is lockpool's resident set in bytes: VmRSS from /proc/<pid>/status
// with -pid, else process_resident_memory_bytes from -admin's /metrics.
func rss(ctx context.Context, o options) (int64, string) {
	if o.pid > 0 {
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", o.pid))
		if err != nil {
			logf("rss: %v", err)
			return 0, ""
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err == nil {
					return kb * 1024, fmt.Sprintf("VmRSS of pid %d", o.pid)
				}
			}
		}
		return 0, ""
	}
	if o.admin != "" {
		lines, err := fetchMetrics(ctx, o.admin)
		if err != nil {
			return 0, ""
		}
		for _, l := range lines {
			if v, ok := strings.CutPrefix(l, "process_resident_memory_bytes "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err == nil {
					return int64(f), "process_resident_memory_bytes from /metrics"
				}
			}
		}
	}
	return 0, ""
}

func fetchMetrics(ctx context.Context, admin string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(admin, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return strings.Split(string(b), "\n"), nil
}

// listenMetrics are lockpool's LISTEN/NOTIFY series from /metrics.
func listenMetrics(ctx context.Context, admin string) ([]string, error) {
	lines, err := fetchMetrics(ctx, admin)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "lockpool_listen_") || strings.HasPrefix(l, "lockpool_notifications_") {
			out = append(out, l)
		}
	}
	return out, nil
}
