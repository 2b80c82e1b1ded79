// Command bench measures what preallocation buys against stock CAPM3: the real CAPM3 v1.13.2
// Metal3Data controller, the real Metal3 IPAM v1.13.2 (both in-process, set up as their main.go
// sets them up) and the Cluster API in-cluster IPAM provider (a process) run against a local API
// server, with ip-preallocator's mutating webhook registered (preallocated) or not (stock), in the
// same invocation. See docs/benchmarks.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

type config struct {
	idle, burst, backlog int
	// pause bounds how long CAPM3 stays stopped while the IPAMs fulfil a preallocated backlog.
	pause   time.Duration
	timeout time.Duration
	results string
	only    string
}

func main() {
	var c config
	flag.IntVar(&c.idle, "idle", 20, "Metal3Data created one after another in the idle scenario.")
	flag.IntVar(&c.burst, "burst", 200, "Metal3Data created at once in the burst scenarios.")
	flag.IntVar(&c.backlog, "backlog", 200, "Metal3Data created while CAPM3 is stopped in the backlog scenario.")
	flag.DurationVar(&c.pause, "backlog-pause", time.Minute, "At most how long CAPM3 stays stopped while the IPAMs fulfil a preallocated backlog; stock waits as long.")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Minute, "How long one run may take to get every Metal3Data Ready.")
	flag.StringVar(&c.only, "only", "", "Run only the scenarios whose setting/scenario name contains this.")
	flag.StringVar(&c.results, "results", "bench/results", "Directory for the JSON results and the plot, relative to the repository.")
	klog.InitFlags(nil)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// setting is one configuration of the controllers' client rate limits.
type setting struct {
	Name      string
	CAPM3     stack.Options
	IPAM      stack.Options
	Scenarios []scenario
}

type scenario struct {
	Name string
	// IPAM overrides the setting's IPAM options.
	IPAM *stack.Options
	Kind string // idle, burst or backlog
}

var raised = stack.Options{QPS: 1000, Burst: 2000}

// settings are the two client rate limit configurations. Idle Metal3Data do not meet a rate
// limit, so idle runs only at the defaults. The backlog scenario measures CAPM3's queue, not the
// IPAM's throughput (the burst scenarios do), so its IPAM runs with the raised limit: at 20/s the
// IPAM alone needs minutes for the claims of 200 machines.
func settings() []setting {
	return []setting{
		{
			Name: "default-limits",
			Scenarios: []scenario{
				{Name: "idle", Kind: "idle"},
				{Name: "burst", Kind: "burst"},
				{Name: "burst-fast-ipam", Kind: "burst", IPAM: &raised},
				{Name: "backlog", Kind: "backlog", IPAM: &raised},
			},
		},
		{
			Name:  "raised-limits",
			CAPM3: raised,
			IPAM:  raised,
			Scenarios: []scenario{
				{Name: "burst", Kind: "burst"},
				{Name: "backlog", Kind: "backlog"},
			},
		},
	}
}

func run(ctx context.Context, c config, out io.Writer) (*Report, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ip-preallocator-bench-")
	if err != nil {
		return nil, err
	}
	logs, err := harness.LogControllersTo(filepath.Join(dir, "controllers.log"))
	if err != nil {
		return nil, err
	}
	defer logs.Close()

	fmt.Fprintf(out, "Logs in %s\n", dir)
	cp, err := harness.Start(ctx, harness.Options{Webhook: true, AuditLog: true, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	if err := cp.StartInClusterIPAM(ctx); err != nil {
		return nil, err
	}
	ready, err := stack.WatchReadiness(ctx, cp.Config)
	if err != nil {
		return nil, err
	}
	b := &bench{cp: cp, ready: ready, cfg: c, out: out}

	report := &Report{Machine: machine(), Started: time.Now().UTC()}
	for _, s := range settings() {
		for i, sc := range s.Scenarios {
			if !strings.Contains(s.Name+"/"+sc.Name, c.only) {
				continue
			}
			modes := []string{modeStock, modePreallocated}
			if i%2 == 1 || sc.Kind == "backlog" {
				modes = []string{modePreallocated, modeStock}
			}
			for _, mode := range modes {
				r, err := b.runOne(ctx, s, sc, mode)
				if err != nil {
					return report, fmt.Errorf("%s/%s/%s: %w", s.Name, sc.Name, mode, err)
				}
				report.Runs = append(report.Runs, r)
				printRun(out, r)
			}
		}
	}
	noop, err := b.admissionLatency(ctx)
	if err != nil {
		return report, err
	}
	report.Admission = noop
	if report.Webhook, err = b.webhookFootprint(); err != nil {
		return report, err
	}
	report.ratios()
	report.Finished = time.Now().UTC()
	printReport(out, report)

	if c.results == "" {
		return report, nil
	}
	resultsDir := c.results
	if !filepath.IsAbs(resultsDir) {
		resultsDir = filepath.Join(root, resultsDir)
	}
	if err := os.MkdirAll(resultsDir, 0o755); err != nil {
		return report, err
	}
	data, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return report, err
	}
	if err := os.WriteFile(filepath.Join(resultsDir, "results.json"), data, 0o644); err != nil {
		return report, err
	}
	if err := plotCDF(report, filepath.Join(resultsDir, "time-to-ready.png")); err != nil {
		return report, err
	}
	fmt.Fprintf(out, "Results in %s\n", resultsDir)
	return report, nil
}
