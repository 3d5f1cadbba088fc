package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SplitResult splits the latency of one pgbench -S simple run through a
// pooler into the three stretches a packet capture on the loopback
// interface sees: the pooler's way in (the client's Query on the wire to
// the same Query on the wire to PostgreSQL), the server (that Query to the
// server's first reply bytes) and the pooler's way out (those bytes to the
// first reply bytes to the client). Figures are in microseconds.
type SplitResult struct {
	Target  string  `json:"target"`
	Clients int     `json:"clients"`
	TPS     float64 `json:"tps"`
	Matched int     `json:"transactions_matched"` // client queries followed through both hops
	Error   string  `json:"error,omitempty"`
	Total   Pcts    `json:"total_us"`
	In      Pcts    `json:"pooler_in_us"`
	Server  Pcts    `json:"server_us"`
	Out     Pcts    `json:"pooler_out_us"`
	// Tail is the mean of each stretch over the transactions whose total
	// lies between its p99 and its p99.9: where the tail's time goes.
	TailIn     float64 `json:"tail_pooler_in_us"`
	TailServer float64 `json:"tail_server_us"`
	TailOut    float64 `json:"tail_pooler_out_us"`
}

// Pcts are a stretch's median and 99th percentile.
type Pcts struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// splitTest runs one pgbench -S -M simple run with clients clients through
// t while tcpdump captures the loopback traffic of t's and PostgreSQL's
// ports, and splits each transaction's latency (SplitResult).
func splitTest(o *options, e *env, t *target, clients int) *SplitResult {
	r := &SplitResult{Target: t.Name, Clients: clients}
	dir, done, err := e.tempDir(o, "split-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer done()
	pcap := filepath.Join(dir, "lo.pcap")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.duration)*time.Second+2*time.Minute)
	defer cancel()
	// SIGINT stops tcpdump after it has written what it buffered.
	dump := exec.CommandContext(ctx, "tcpdump", "-i", "lo", "-n", "-s", "256", "-B", "65536", "-w", pcap,
		fmt.Sprintf("tcp port %d or tcp port %d", t.Port, e.Cluster.Port))
	stderr, err := dump.StderrPipe()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	if err := dump.Start(); err != nil {
		r.Error = err.Error()
		return r
	}
	// tcpdump says "listening on" once the capture runs; anything else it
	// said before it ended is why it did not start.
	listening := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var seen []string
		for sc.Scan() {
			seen = append(seen, sc.Text())
			if strings.Contains(sc.Text(), "listening on") {
				listening <- nil
				_, _ = io.Copy(io.Discard, stderr)
				return
			}
		}
		listening <- fmt.Errorf("tcpdump ended before it captured: %s", strings.Join(seen, "; "))
	}()
	stopDump := func() {
		_ = dump.Process.Signal(os.Interrupt)
		_ = dump.Wait()
	}
	select {
	case err := <-listening:
		if err != nil {
			stopDump()
			r.Error = err.Error()
			return r
		}
	case <-ctx.Done():
		stopDump()
		r.Error = "tcpdump did not start"
		return r
	}
	row := &Row{Script: "select", Mode: "simple", Clients: clients}
	res := runPgbench(o, e, t, row, 0)
	stopDump()
	if res.Failed {
		r.Error = "pgbench: " + res.Error
		return r
	}
	r.TPS = res.TPS
	f, err := os.Open(pcap)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer f.Close()
	txns, err := splitCapture(bufio.NewReaderSize(f, 1<<20), uint16(t.Port), uint16(e.Cluster.Port))
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.fill(txns)
	return r
}

// splitTxn is one transaction's three stretches, in microseconds.
type splitTxn struct{ total, in, server, out float64 }

func (r *SplitResult) fill(txns []splitTxn) {
	r.Matched = len(txns)
	if len(txns) == 0 {
		r.Error = "no transaction followed through both hops"
		return
	}
	// The median and p99 as the pgbench rows take them (medianOf,
	// txnLog.pct).
	pcts := func(get func(splitTxn) float64) Pcts {
		v := make([]float64, len(txns))
		for i, x := range txns {
			v[i] = get(x)
		}
		p50 := medianOf(v) // sorts v
		return Pcts{P50: p50, P99: v[int(0.99*float64(len(v)-1))]}
	}
	r.Total = pcts(func(x splitTxn) float64 { return x.total })
	r.In = pcts(func(x splitTxn) float64 { return x.in })
	r.Server = pcts(func(x splitTxn) float64 { return x.server })
	r.Out = pcts(func(x splitTxn) float64 { return x.out })
	byTotal := slices.Clone(txns)
	slices.SortFunc(byTotal, func(a, b splitTxn) int { return cmp.Compare(a.total, b.total) })
	tail := byTotal[len(byTotal)*99/100 : len(byTotal)*999/1000]
	if len(tail) == 0 {
		return
	}
	for _, x := range tail {
		r.TailIn += x.in
		r.TailServer += x.server
		r.TailOut += x.out
	}
	n := float64(len(tail))
	r.TailIn, r.TailServer, r.TailOut = r.TailIn/n, r.TailServer/n, r.TailOut/n
}

// splitCapture reads a pcap file of loopback traffic and follows every
// simple-protocol Query a client sent to the pooler (port pooler): to the
// first Query with the same text the pooler sent PostgreSQL (port server)
// at or after it, to the server connection's next bytes back, to the
// client connection's next bytes back. pgbench -S queries name a random
// account, so a text seldom repeats within the moment one takes; a query
// that cannot be followed is left out.
func splitCapture(rd io.Reader, pooler, server uint16) ([]splitTxn, error) {
	type query struct {
		at   time.Duration
		port uint16
		text string
	}
	var fromClients []query
	toServer := map[string][]query{}              // by text
	serverReplies := map[uint16][]time.Duration{} // by the pooler's port of the server connection
	clientReplies := map[uint16][]time.Duration{} // by the client's port
	err := readPcap(rd, func(at time.Duration, src, dst uint16, payload []byte) {
		text, isQuery := queryText(payload)
		switch {
		case dst == pooler && isQuery:
			fromClients = append(fromClients, query{at, src, text})
		case src == pooler:
			clientReplies[dst] = append(clientReplies[dst], at)
		case dst == server && isQuery:
			toServer[text] = append(toServer[text], query{at, src, text})
		case src == server:
			serverReplies[dst] = append(serverReplies[dst], at)
		}
	})
	if err != nil {
		return nil, err
	}
	// after is the first time in ts (ascending) after t.
	after := func(ts []time.Duration, t time.Duration) (time.Duration, bool) {
		i, _ := slices.BinarySearch(ts, t+1)
		if i == len(ts) {
			return 0, false
		}
		return ts[i], true
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	var out []splitTxn
	for _, q := range fromClients {
		var sent *query
		for i := range toServer[q.text] {
			if s := &toServer[q.text][i]; s.at >= q.at {
				sent = s
				break
			}
		}
		if sent == nil {
			continue
		}
		replied, ok1 := after(serverReplies[sent.port], sent.at)
		relayed, ok2 := after(clientReplies[q.port], q.at)
		if !ok1 || !ok2 || relayed < replied {
			continue
		}
		out = append(out, splitTxn{total: us(relayed - q.at), in: us(sent.at - q.at), server: us(replied - sent.at), out: us(relayed - replied)})
	}
	return out, nil
}

// queryText is the text of a simple-protocol Query at the start of a TCP
// payload.
func queryText(p []byte) (string, bool) {
	if len(p) < 6 || p[0] != 'Q' {
		return "", false
	}
	body := p[5:]
	if i := slices.Index(body, 0); i >= 0 {
		body = body[:i]
	}
	return string(body), true
}

// readPcap calls fn for every IPv4 TCP segment with a payload in a pcap
// file (microsecond or nanosecond timestamps, Ethernet or Linux cooked
// captures), with its time since the first packet and its ports.
func readPcap(rd io.Reader, fn func(at time.Duration, src, dst uint16, payload []byte)) error {
	var gh [24]byte
	if _, err := io.ReadFull(rd, gh[:]); err != nil {
		return fmt.Errorf("pcap header: %w", err)
	}
	var order binary.ByteOrder = binary.LittleEndian
	nano := false
	switch binary.LittleEndian.Uint32(gh[:4]) {
	case 0xa1b2c3d4:
	case 0xa1b23c4d:
		nano = true
	case 0xd4c3b2a1:
		order = binary.BigEndian
	case 0x4d3cb2a1:
		order, nano = binary.BigEndian, true
	default:
		return errors.New("not a pcap file")
	}
	link := order.Uint32(gh[20:24])
	var l2 int
	switch link {
	case 1: // Ethernet
		l2 = 14
	case 113: // Linux cooked
		l2 = 16
	default:
		return fmt.Errorf("pcap link type %d not supported", link)
	}
	var first time.Duration
	started := false
	var ph [16]byte
	buf := make([]byte, 0, 65536)
	for {
		if _, err := io.ReadFull(rd, ph[:]); err != nil {
			return nil // the end, or a capture cut short: it ends where it ends
		}
		sec, frac, incl := order.Uint32(ph[0:4]), order.Uint32(ph[4:8]), int(order.Uint32(ph[8:12]))
		buf = slices.Grow(buf[:0], incl)[:incl]
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil
		}
		at := time.Duration(sec) * time.Second
		if nano {
			at += time.Duration(frac)
		} else {
			at += time.Duration(frac) * time.Microsecond
		}
		if !started {
			first, started = at, true
		}
		p := buf
		if len(p) < l2+20 || binary.BigEndian.Uint16(p[l2-2:l2]) != 0x0800 {
			continue
		}
		ip := p[l2:]
		ihl := int(ip[0]&15) * 4
		total := int(binary.BigEndian.Uint16(ip[2:4]))
		if ip[9] != 6 || len(ip) < ihl+20 {
			continue
		}
		tcp := ip[ihl:]
		off := int(tcp[12]>>4) * 4
		n := total - ihl - off
		if n <= 0 || len(tcp) < off {
			continue
		}
		payload := tcp[off:]
		if len(payload) > n {
			payload = payload[:n]
		}
		fn(at-first, binary.BigEndian.Uint16(tcp[0:2]), binary.BigEndian.Uint16(tcp[2:4]), payload)
	}
}

// splitLine formats a SplitResult for the report.
func splitLine(r *SplitResult) string {
	if r.Error != "" {
		return fmt.Sprintf("%s: %s", r.Target, r.Error)
	}
	return fmt.Sprintf("%-9s %s tps, %d followed: total p50 %s p99 %s | %s in p50 %s p99 %s | server p50 %s p99 %s | %s out p50 %s p99 %s | p99–p99.9 mean: in %s, server %s, out %s µs",
		r.Target, strconv.FormatFloat(r.TPS, 'f', 0, 64), r.Matched, f0(r.Total.P50), f0(r.Total.P99), r.Target, f0(r.In.P50), f0(r.In.P99),
		f0(r.Server.P50), f0(r.Server.P99), r.Target, f0(r.Out.P50), f0(r.Out.P99), f0(r.TailIn), f0(r.TailServer), f0(r.TailOut))
}

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
