package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// DocumentedMetric is one row of the metric table in docs/metrics.md.
type DocumentedMetric struct {
	Name   string   // lockpool_pool_wait_seconds
	Labels []string // as docs/metrics.md writes them, e.g. app, reason
	Kind   string   // counter, gauge or histogram
	// Values are the values docs/metrics.md lists (in backquotes) for the one label
	// besides app, when the metric has exactly the labels app and one more.
	Values []string
}

var (
	metricRow    = regexp.MustCompile("(?m)^\\| `(lockpool_[a-z_]+)(?:\\{([a-z_,]+)\\})?` \\| (counter|gauge|histogram) \\| (.*) \\|$")
	quotedValues = regexp.MustCompile("`([a-z_]+)`")
)

// DocumentedMetrics reads the metric table of the module's docs/metrics.md.
func DocumentedMetrics() ([]DocumentedMetric, error) {
	data, err := os.ReadFile(filepath.Join(ModuleRoot(), "docs", "metrics.md"))
	if err != nil {
		return nil, err
	}
	var out []DocumentedMetric
	for _, m := range metricRow.FindAllStringSubmatch(string(data), -1) {
		d := DocumentedMetric{Name: m[1], Kind: m[3]}
		if m[2] != "" {
			d.Labels = strings.Split(m[2], ",")
		}
		if len(d.Labels) == 2 && d.Labels[0] == "app" {
			for _, v := range quotedValues.FindAllStringSubmatch(m[4], -1) {
				if v[1] != d.Labels[1] {
					d.Values = append(d.Values, v[1])
				}
			}
		}
		out = append(out, d)
	}
	if len(out) < 10 {
		return nil, fmt.Errorf("docs/metrics.md: found %d rows in the metric table", len(out))
	}
	return out, nil
}
