package main

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfo is what -version prints and lockpool_build_info labels.
type buildInfo struct {
	Version   string // -ldflags "-X main.version=v1.2.3", else the module version, else "devel"
	Revision  string // -ldflags "-X main.revision=…", else vcs.revision from the build, else "unknown"
	GoVersion string // the Go toolchain that built the binary
}

// Set at link time: go build -ldflags "-X main.version=v1.2.3 -X main.revision=abc123".
var (
	version  string
	revision string
)

// readBuildInfo combines the link-time values with debug.ReadBuildInfo.
func readBuildInfo() buildInfo {
	bi := buildInfo{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if bi.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			bi.Version = info.Main.Version
		}
		var vcsRev string
		var dirty bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				vcsRev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if bi.Revision == "" && vcsRev != "" {
			bi.Revision = vcsRev
			if dirty {
				bi.Revision += "-dirty"
			}
		}
	}
	if bi.Version == "" {
		bi.Version = "devel"
	}
	if bi.Revision == "" {
		bi.Revision = "unknown"
	}
	return bi
}

// String is the line -version prints.
func (b buildInfo) String() string {
	return "lockpool " + b.Version + " (revision " + b.Revision + ", " + b.GoVersion + ")"
}

// collector returns lockpool_build_info{version,goversion,revision} = 1.
func (b buildInfo) collector() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockpool_build_info",
		Help: "Always 1; the labels say which lockpool build runs (version, Go version, VCS revision).",
	}, []string{"version", "goversion", "revision"})
	g.WithLabelValues(b.Version, b.GoVersion, b.Revision).Set(1)
	return g
}
