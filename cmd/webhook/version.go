package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// version and revision are set by the Makefile with -ldflags "-X main.version=$(VERSION) -X
// main.revision=$(REVISION)": an image is built without .git, so go build stamps no revision.
var version, revision string

// buildInfo tells a dashboard which version each replica runs during an upgrade.
var buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "ip_preallocator_build_info",
	Help: "The version of the running binary, its source revision and the Go version it was built with; always 1.",
}, []string{"version", "revision", "goversion"})

func init() {
	metrics.Registry.MustRegister(buildInfo)
	buildInfo.WithLabelValues(buildVersion(), buildRevision(), runtime.Version()).Set(1)
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

// buildRevision is the revision make stamped, or else the one go build stamped from a checkout.
func buildRevision() string {
	if revision != "" {
		return revision
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	revision, dirty := "unknown", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		revision += "-dirty"
	}
	return revision
}

func addVersionFlag(fs *pflag.FlagSet) *bool {
	return fs.Bool("version", false, "Print the version and exit.")
}

func printVersionAndExit(requested bool) {
	if !requested {
		return
	}
	fmt.Printf("ip-preallocator %s (revision %s, %s %s/%s)\n", buildVersion(), buildRevision(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	os.Exit(0)
}
