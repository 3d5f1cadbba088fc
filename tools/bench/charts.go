package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// figure is one chart the report can give: which number of a pgbench
// result it draws and how it names and prints it.
type figure struct {
	file  string // file name in the charts directory
	title string
	axis  string // y-axis label
	unit  string // after a value in a bar's tooltip
	// value is the figure of r, false when r does not have it.
	value func(r *Result) (float64, bool)
	// label prints a value above its bar.
	label func(v float64) string
}

// figures are the charts drawn from a report's pgbench rows, in the order
// they are written: throughput, the poolers' CPU per transaction, p99
// latency.
func figures() []figure {
	return []figure{
		{
			file:  "tps.svg",
			title: "Throughput (higher is better)",
			axis:  "transactions per second",
			unit:  "TPS",
			value: func(r *Result) (float64, bool) { return r.TPS, r.TPS > 0 },
			label: func(v float64) string { return thousands(strconv.FormatFloat(v, 'f', 0, 64)) },
		},
		{
			file:  "cpu.svg",
			title: "Pooler CPU per transaction (lower is better)",
			axis:  "pooler CPU µs per transaction",
			unit:  "µs CPU (user + system) per transaction",
			value: func(r *Result) (float64, bool) { return r.CPUPer1000Txn * 1000, r.CPUPer1000Txn > 0 },
			label: func(v float64) string { return decimals(v, 1) },
		},
		{
			file:  "latency.svg",
			title: "p99 latency (lower is better)",
			axis:  "p99 latency, ms",
			unit:  "ms p99 latency",
			value: func(r *Result) (float64, bool) { return r.P99ms, r.P99ms > 0 },
			label: func(v float64) string { return decimals(v, 2) },
		},
	}
}

// chart is a figure drawn from one report: a panel per pgbench script and
// mode, in each a group of bars per client count, a bar per target.
type chart struct {
	figure
	header  []string // lines under the title: the run's date, machine, software, settings
	targets []string // in legend and bar order
	panels  []*panel
	gaps    bool // some bar is "n/a" or "fails"
}

// panel is one script and mode of a chart.
type panel struct {
	title   string
	clients []int
	bars    [][]bar // by client count, then by target
}

// bar is one target's figure at one client count. A bar without a value
// has a note instead: "fails" (the run failed) or "n/a" (not run, or the
// run did not measure the figure).
type bar struct {
	value float64
	note  string
}

// writeCharts writes the SVG charts of rep into dir (created when missing)
// and returns the paths it wrote, in order. A figure no pgbench result of
// rep has gets no file, so a report without pgbench rows writes none.
func writeCharts(dir string, rep *Report) ([]string, error) {
	var paths []string
	for _, f := range figures() {
		c := newChart(rep, f)
		if c == nil {
			continue
		}
		if len(paths) == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
		}
		path := filepath.Join(dir, f.file)
		if err := os.WriteFile(path, c.svg(), 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// newChart gathers figure f from the pgbench rows of rep, or returns nil
// when no result has it. The targets are those with the figure in some
// row; a panel is left out when none of its results has it.
func newChart(rep *Report, f figure) *chart {
	c := &chart{figure: f, header: chartHeader(rep)}
	for _, r := range rep.Rows {
		for name, res := range r.Results {
			if _, ok := f.value(res); ok && completed(res) && !slices.Contains(c.targets, name) {
				c.targets = append(c.targets, name)
			}
		}
	}
	if len(c.targets) == 0 {
		return nil
	}
	slices.SortFunc(c.targets, func(a, b string) int {
		if ra, rb := targetRank(a), targetRank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	for _, kind := range scriptModes(rep) {
		p := &panel{title: kind.title()}
		for _, r := range rep.Rows {
			if r.Script == kind.script && r.Mode == kind.mode && !slices.Contains(p.clients, r.Clients) {
				p.clients = append(p.clients, r.Clients)
			}
		}
		slices.Sort(p.clients)
		drawn := false
		for _, n := range p.clients {
			row := findRow(rep, kind, n)
			bars := make([]bar, len(c.targets))
			for i, t := range c.targets {
				res := row.Results[t]
				switch v, ok := f.value(orEmpty(res)); {
				case res != nil && res.Failed:
					bars[i].note = "fails"
				case res == nil || !ok:
					bars[i].note = "n/a"
				default:
					bars[i].value = v
					drawn = true
				}
				c.gaps = c.gaps || bars[i].note != ""
			}
			p.bars = append(p.bars, bars)
		}
		if drawn {
			c.panels = append(c.panels, p)
		}
	}
	return c
}

// completed is whether r is a run that did not fail (a failed run's
// figures are partial).
func completed(r *Result) bool { return r != nil && !r.Failed }

// orEmpty is r, or an empty result for a nil r.
func orEmpty(r *Result) *Result {
	if r == nil {
		return &Result{}
	}
	return r
}

// scriptMode is a pgbench script and -M mode: one panel of a chart.
type scriptMode struct{ script, mode string }

// title names the panel of s.
func (s scriptMode) title() string {
	script := "-S (select only)"
	if s.script == "tpcb" {
		script = "TPC-B"
	} else if s.script != "select" {
		script = s.script
	}
	return fmt.Sprintf("pgbench %s, -M %s", script, s.mode)
}

// scriptModes are the scripts and modes of rep's pgbench rows in the order
// they first appear.
func scriptModes(rep *Report) []scriptMode {
	var out []scriptMode
	for _, r := range rep.Rows {
		if k := (scriptMode{r.Script, r.Mode}); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// findRow is the first pgbench row of rep with script, mode and clients.
func findRow(rep *Report, k scriptMode, clients int) *Row {
	for _, r := range rep.Rows {
		if r.Script == k.script && r.Mode == k.mode && r.Clients == clients {
			return r
		}
	}
	return nil
}

// targetRank orders targets: direct PostgreSQL, lockpool, PgBouncer, then
// any other name.
func targetRank(name string) int {
	switch name {
	case "direct":
		return 0
	case "lockpool":
		return 1
	case "pgbouncer":
		return 2
	}
	return 3
}

// targetName is how a chart names target.
func targetName(target string) string {
	switch target {
	case "direct":
		return "PostgreSQL (direct)"
	case "lockpool":
		return "lockpool"
	case "pgbouncer":
		return "PgBouncer"
	}
	return target
}

// targetColor is the fill of target's bars; i is its place in the legend,
// which picks the colour of a target without its own.
func targetColor(target string, i int) string {
	switch target {
	case "direct":
		return "#8a8f98"
	case "lockpool":
		return "#1f6fb4"
	case "pgbouncer":
		return "#e07b24"
	}
	others := []string{"#3a9a5b", "#8e5ab5", "#c2454b", "#3fa7a5"}
	return others[i%len(others)]
}

// chartHeader are the lines under a chart's title: when and where rep ran
// and with what settings, each left out when the report lacks it.
func chartHeader(rep *Report) []string {
	var lines []string
	if rep.Date != "" {
		lines = append(lines, "run "+rep.Date)
	}
	m := rep.Machine
	var host []string
	if m.NProc > 0 {
		host = append(host, fmt.Sprintf("%d CPUs", m.NProc))
	}
	if m.CPUModel != "" {
		host = append(host, m.CPUModel)
	}
	if m.MemTotalKB > 0 {
		host = append(host, fmt.Sprintf("%.0f GB RAM", float64(m.MemTotalKB)/(1<<20)))
	}
	if m.Kernel != "" {
		host = append(host, "Linux "+m.Kernel)
	}
	if len(host) > 0 {
		lines = append(lines, "machine: "+strings.Join(host, ", "))
	}
	var software []string
	for _, s := range []string{m.PostgreSQL, m.PgBouncer, m.Go} {
		if s != "" {
			software = append(software, s)
		}
	}
	if len(software) > 0 {
		lines = append(lines, "software: "+strings.Join(software, "; "))
	}
	if s := rep.Settings; s.DurationSec > 0 {
		line := fmt.Sprintf("pgbench -T %d, scale %d; %d server connections per pooler", s.DurationSec, s.Scale, s.Budget)
		if s.Rounds > 1 {
			line += fmt.Sprintf("; each bar the median of %d rounds", s.Rounds)
		}
		lines = append(lines, line)
	}
	return lines
}

// svg draws c: the title, the header lines and the legend, then the panels
// one under another, each with its own y scale.
func (c *chart) svg() []byte {
	const (
		left     = 84  // y-axis tick labels and label
		right    = 24  // margin
		barW     = 44  // one bar
		barGap   = 4   // between the bars of a group
		groupPad = 40  // between groups
		minPlotW = 600 // room for the header lines
		plotH    = 200
		panelH   = 36 + plotH + 48 // title above, client counts and axis label below
	)
	groups := 0
	for _, p := range c.panels {
		groups = max(groups, len(p.clients))
	}
	barsW := len(c.targets)*barW + (len(c.targets)-1)*barGap
	plotW := max(groups*(barsW+groupPad), minPlotW)
	width := left + plotW + right
	headerH := 40 + 16*len(c.header) + 32
	height := headerH + len(c.panels)*panelH + 8

	var b bytes.Buffer
	b.WriteString("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" fill=\"#222\">\n", width, height, width, height)
	fmt.Fprintf(&b, "<title>%s</title>\n", xmlText(c.title))
	fmt.Fprintf(&b, "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", width, height)
	fmt.Fprintf(&b, "<text x=\"%d\" y=\"28\" font-size=\"18\" font-weight=\"bold\">%s</text>\n", left, xmlText(c.title))
	y := 40
	for _, line := range c.header {
		y += 16
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"12\" fill=\"#555\">%s</text>\n", left, y, xmlText(line))
	}

	// Legend: a swatch and the name of each target, then what the notes mean.
	y += 28
	x := left
	for i, t := range c.targets {
		name := targetName(t)
		fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", x, y-11, targetColor(t, i))
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"13\">%s</text>\n", x+17, y, xmlText(name))
		x += 17 + 8*utf8.RuneCountInString(name) + 20
	}
	if c.gaps {
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"12\" fill=\"#777\">n/a: not run or not measured; fails: the run failed</text>\n", x+10, y)
	}

	for i, p := range c.panels {
		top := headerH + i*panelH + 36 // the plot area's top
		bottom := top + plotH
		fmt.Fprintf(&b, "<g>\n<text x=\"%d\" y=\"%d\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", left, top-14, xmlText(p.title))

		peak := 0.0
		for _, g := range p.bars {
			for _, br := range g {
				peak = max(peak, br.value)
			}
		}
		step := axisStep(peak * 1.12) // headroom for the value labels
		ticks := int(math.Ceil(peak * 1.12 / step))
		yMax := float64(ticks) * step
		places := stepDecimals(step)
		for k := 0; k <= ticks; k++ {
			ty := float64(bottom) - float64(k)*float64(plotH)/float64(ticks)
			color := "#e3e3e3"
			if k == 0 {
				color = "#444"
			}
			fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\"/>\n", left, ty, left+plotW, ty, color)
			fmt.Fprintf(&b, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">%s</text>\n",
				left-6, ty+4, thousands(strconv.FormatFloat(float64(k)*step, 'f', places, 64)))
		}
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444\"/>\n", left, top, left, bottom)
		fmt.Fprintf(&b, "<text transform=\"translate(%d %d) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\" fill=\"#444\">%s</text>\n",
			18, top+plotH/2, xmlText(c.axis))

		groupW := float64(plotW) / float64(len(p.clients))
		for g, n := range p.clients {
			gx := float64(left) + float64(g)*groupW
			x0 := gx + (groupW-float64(barsW))/2
			for k, br := range p.bars[g] {
				bx := x0 + float64(k*(barW+barGap))
				cx := bx + barW/2
				if br.note != "" {
					fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" font-style=\"italic\" text-anchor=\"middle\" fill=\"#777\">%s</text>\n",
						cx, bottom-4, br.note)
					continue
				}
				h := br.value / yMax * plotH
				fmt.Fprintf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>%s</title></rect>\n",
					bx, float64(bottom)-h, barW, h, targetColor(c.targets[k], k),
					xmlText(fmt.Sprintf("%s, %s, %d clients: %s %s", targetName(c.targets[k]), p.title, n, c.label(br.value), c.unit)))
				fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n",
					cx, float64(bottom)-h-4, xmlText(c.label(br.value)))
			}
			fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%d</text>\n", gx+groupW/2, bottom+17, n)
		}
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\" fill=\"#444\">pgbench clients</text>\n</g>\n",
			left+plotW/2, bottom+36)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// axisStep is a round tick step (1, 2, 2.5 or 5 times a power of ten) that
// divides 0..top into at most five intervals; 1 for a top of zero or less.
func axisStep(top float64) float64 {
	if top <= 0 {
		return 1
	}
	raw := top / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// stepDecimals is how many decimal places print the multiples of step.
func stepDecimals(step float64) int {
	d := 0
	for ; d < 6; d++ {
		x := step * math.Pow(10, float64(d))
		if math.Abs(x-math.Round(x)) < 1e-9*math.Max(1, x) {
			break
		}
	}
	return d
}

// decimals prints v with about three significant digits and at most
// places decimal places ("2.61", "98.7", "1,167"), as the text report does.
func decimals(v float64, places int) string {
	switch {
	case v >= 100:
		places = 0
	case v >= 10:
		places = min(places, 1)
	}
	return thousands(strconv.FormatFloat(v, 'f', places, 64))
}

// thousands puts commas between the thousands of the decimal number s
// ("16243.5" → "16,243.5").
func thousands(s string) string {
	whole, frac, hasFrac := strings.Cut(s, ".")
	sign := ""
	if strings.HasPrefix(whole, "-") {
		sign, whole = "-", whole[1:]
	}
	var b strings.Builder
	for i, r := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	out := sign + b.String()
	if hasFrac {
		out += "." + frac
	}
	return out
}

// xmlText is s escaped for XML text and attribute values.
func xmlText(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}
