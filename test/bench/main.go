// Command bench measures what preallocation buys against stock CAPM3 on the path Metal3Data take
// in a cluster: Metal3DataClaims are created (as CAPM3's Metal3Machine controller does), CAPM3's
// own Metal3DataTemplate controller creates the Metal3Data one after another, ip-preallocator's
// mutating webhook admits them (preallocated) or does not run (stock), and CAPM3's Metal3Data
// controller and the IPAMs make them Ready. CAPM3 v1.13.2's two controllers and the Metal3 IPAM
// v1.13.2 run in-process, set up as their main.go sets them up, the Cluster API in-cluster IPAM
// provider as a process, all against a local API server. See docs/benchmarks.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

type config struct {
	idle, burst, backlog int
	// raisedBurst is the size of the bursts with CAPM3's limits raised.
	raisedBurst int
	// slow is the size of the slow arrival, whose claims are created slowRate per second; 0
	// leaves it out.
	slow     int
	slowRate float64
	// scale runs the scale scenarios (scaleSettings) instead of settings, and saves to
	// scaleResults; scaleRaised adds their raised-limits setting.
	scale, scaleRaised bool
	// leaderLoss is the size of the leader-loss burst; 0 leaves the scenario out.
	leaderLoss int
	// templates is how many Metal3DataTemplates the spread burst's claims are divided among.
	templates int
	// repeats is how often each mode of a scenario runs, alternating which mode goes first from
	// one repetition to the next (A B, B A, A B, ...); the spread between the runs of one mode is
	// the noise reported next to each ratio.
	repeats int
	// pause is how long CAPM3's Metal3Data controller stays held after the first claim of a
	// backlog, in both modes.
	pause                 time.Duration
	timeout               time.Duration
	results, scaleResults string
	only                  string
	// scenarios, if set, are the only setting/scenario names run.
	scenarios []string
	// webhookArgs are extra flags for the webhook process, to measure what a setting changes.
	webhookArgs string
	// page is the Markdown page written from the results, relative to the repository; empty: none.
	page string
	// pageOnly writes the page, and the results and plots in their current format, from the
	// results already in the results directories, and runs nothing.
	pageOnly bool
	// profiled are the setting/scenario names whose runs profile the API server's CPU.
	profiled []string
	// fleet is the size of the standing fleet written before the scenarios run; 0: none.
	fleet int
	// merge keeps the saved results of the scenarios this run leaves out, where they measured the
	// same product code at the same sizes (withEarlierParts): a run in parts.
	merge bool
}

// Default sizes: the speed check's six pairs of every mode take about 40 minutes on 2 cores. With
// CAPM3's limits raised no client limit paces a burst, the host's CPU does: a burst of 30 took
// 3 s, and its runs swung by ±30% with the host's load, more than the 5% the speed check must
// tell apart; 150 machines take about 20 s. bigArgs is the larger run of earlier versions (200
// machines per burst), one BENCH_ARGS away; with three repetitions it takes about an hour.
const (
	defaultIdle        = 10
	defaultBurst       = 30
	defaultRaisedBurst = 150
	defaultBacklog     = 20
	defaultLeaderLoss  = 30
	defaultRepeats     = minPairs
	defaultPause       = 10 * time.Second
	bigArgs            = "--idle=20 --burst=200 --raised-burst=200 --backlog=200 --backlog-pause=60s --leader-loss=100"
)

func main() {
	var c config
	flag.IntVar(&c.idle, "idle", defaultIdle, "Metal3DataClaims created one after another in the idle scenario.")
	flag.IntVar(&c.burst, "burst", defaultBurst, "Metal3DataClaims created at once in the burst scenarios at CAPM3's default limits.")
	flag.IntVar(&c.raisedBurst, "raised-burst", defaultRaisedBurst, "Metal3DataClaims created at once in the burst scenarios with CAPM3's limits raised.")
	flag.IntVar(&c.templates, "templates", 10, "Metal3DataTemplates the claims of the burst-spread scenario are divided among.")
	flag.IntVar(&c.backlog, "backlog", defaultBacklog, "Metal3DataClaims created while CAPM3's Metal3Data controller is held, in the backlog scenario.")
	flag.IntVar(&c.leaderLoss, "leader-loss", defaultLeaderLoss, "Metal3DataClaims created at once in the leader-loss scenario (two webhook replicas, the leader killed halfway); 0 leaves it out.")
	flag.IntVar(&c.repeats, "repeats", defaultRepeats, "Runs of each mode per scenario, alternating which mode goes first (A B, B A, A B, ...); the speed check needs 6 pairs.")
	flag.DurationVar(&c.pause, "backlog-pause", defaultPause, "How long CAPM3's Metal3Data controller stays held after the first claim of the backlog scenario, in both modes.")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Minute, "How long one run may take to get every Metal3Data Ready.")
	flag.Func("scenarios", "Run only these setting/scenario names, separated by commas (e.g. default-limits/backlog,raised-limits/burst-spread).", func(v string) error {
		c.scenarios = strings.Split(v, ",")
		return nil
	})
	flag.BoolVar(&c.merge, "merge", false, "Keep the saved results of the scenarios this run leaves out, if they measured the same product code at the same sizes: a run split into parts by --scenarios.")
	flag.StringVar(&c.only, "only", "", "Run only the scenarios whose setting/scenario name contains this.")
	flag.StringVar(&c.results, "results", "bench/results", "Directory for the JSON results and the plot, relative to the repository.")
	flag.StringVar(&c.scaleResults, "scale-results", "bench/results/scale", "Directory for the JSON results and the plot of --scale, relative to the repository; the page has a section from each.")
	flag.BoolVar(&c.scale, "scale", false, "Run the scale scenarios (a burst over 10 templates and a backlog, at CAPM3's default limits) instead of the default ones; make bench-scale sets their sizes.")
	flag.BoolVar(&c.scaleRaised, "scale-raised", false, "With --scale, also run the burst over 10 templates with CAPM3's limits raised, beside the no-op webhook, and the slow arrival if --slow is set.")
	flag.IntVar(&c.slow, "slow", 0, "Metal3DataClaims created --slow-rate per second in the slow-arrival scenario (--scale-raised only); 0 leaves it out.")
	flag.Float64Var(&c.slowRate, "slow-rate", 10, "Metal3DataClaims per second in the slow-arrival scenario.")
	flag.StringVar(&c.page, "page", "docs/benchmarks.md", "Page written from the results, relative to the repository; empty for none.")
	flag.BoolVar(&c.pageOnly, "page-only", false, "Only write the page, and the results and plots in their current format, from the results already saved.")
	flag.IntVar(&c.fleet, "fleet", 0, "Ready machines of a standing fleet, over 10 namespaces, written directly before the scenarios run (as a restore from backup would), which CAPM3, the IPAM and the webhook then hold in their caches.")
	// The raised-limits burst is where the webhook steps aside; the default-limits backlog, where
	// its claim writes cost the API server most over stock's.
	c.profiled = []string{"raised-limits/burst", "default-limits/backlog"}
	flag.Func("profile", "Profile the API server's CPU during the runs of these setting/scenario names, separated by commas (default raised-limits/burst,default-limits/backlog); each profile goes to the logs directory, what it went to into the results.", func(v string) error {
		c.profiled = strings.Split(v, ",")
		return nil
	})
	flag.StringVar(&c.webhookArgs, "webhook-args", "", "Extra flags for the single webhook process (not the leader-loss replicas), separated by spaces, e.g. --handover-ipam-wait=0.")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./bench [flags]\n\nThe default sizes take about 40 minutes on 2 cores; the larger run (about two hours):\n  make bench BENCH_ARGS=%q\n\n", bigArgs)
		flag.PrintDefaults()
	}
	klog.InitFlags(nil)
	flag.Parse()

	if err := runUntilSignal(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// runUntilSignal runs the benchmark, cancelled by an interrupt or SIGTERM.
func runUntilSignal(c config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err := run(ctx, c, os.Stdout)
	return err
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
	Kind string // idle, burst, backlog or slow
	// Spread divides the claims among config.templates templates instead of one.
	Spread bool
	// IPAM overrides the setting's IPAM options.
	IPAM *stack.Options
	// NoOp adds a run with the webhook registered but admitting every Metal3Data unchanged, to
	// tell what any webhook costs CAPM3's template loop from what preallocation costs.
	NoOp bool
	// LeaderLoss runs the webhook as two replicas under leader election behind a load balancer
	// and kills the leader (SIGKILL) once half of the burst's Metal3Data exist, in both modes;
	// it is restarted half a second later.
	LeaderLoss bool
}

var raised = stack.Options{QPS: 1000, Burst: 2000}

// settings are the two client rate limit configurations. Idle machines do not meet a rate limit,
// so idle runs only at the defaults. At the defaults the template controllers of every template
// share one rate limiter per resource type, so a burst spread over templates arrives as a burst of
// one does; with raised limits each template's loop is paced by the latency of its creates,
// admission included, and templates loop in parallel: the spread burst runs there, and beside each
// of its bursts the no-op webhook, which tells what any admission costs. The backlog scenario measures CAPM3's
// Metal3Data queue, not the IPAM's throughput (the bursts do), so its IPAM runs with the raised
// limit: at 20/s the IPAM alone needs minutes for the claims of 200 machines. So does the
// fast-IPAM burst, where the IPAM keeps up and CAPM3's own limits decide. With CAPM3's limits
// raised (declared in its Deployment, where the webhook reads them) the webhook leaves every
// admission to CAPM3: its raised-limits runs measure what that costs beside stock and the no-op
// webhook, and the leader-loss burst, which needs preallocated claims to take over, runs at the
// defaults.
func settings() []setting {
	return []setting{
		{
			Name: "default-limits",
			Scenarios: []scenario{
				{Name: "idle", Kind: "idle"},
				{Name: "burst", Kind: "burst"},
				{Name: "burst-fast-ipam", Kind: "burst", IPAM: &raised},
				{Name: "backlog", Kind: "backlog", IPAM: &raised},
				{Name: "leader-loss", Kind: "burst", LeaderLoss: true},
			},
		},
		{
			Name:  "raised-limits",
			CAPM3: raised,
			IPAM:  raised,
			Scenarios: []scenario{
				{Name: "burst-spread", Kind: "burst", Spread: true, NoOp: true},
				{Name: "burst", Kind: "burst", NoOp: true},
			},
		},
	}
}

// limitsRaised tells whether the webhook leaves every admission of the setting to CAPM3: CAPM3's
// client limits are raised there (declareLimits).
func (s setting) limitsRaised() bool { return s.CAPM3.QPS > stack.DefaultQPS }

// slot is one run of a scenario: a mode and its repetition.
type slot struct {
	mode   string
	repeat int
}

// modes returns the order in which a scenario's runs go: stock and preallocated alternate which
// goes first from one scenario to the next and from one repetition to the next (A B, B A, A B,
// ...), so that a drift in the machine's load does not favour one mode. With the no-op webhook
// the three modes rotate (A B C, B C A, C A B, ...), so that each goes first, second and last.
func modes(index, repeats int, noOp bool) []slot {
	first, second := modeStock, modePreallocated
	if index%2 == 1 {
		first, second = second, first
	}
	var out []slot
	for r := range max(1, repeats) {
		if noOp {
			order := []string{first, second, modeNoOp}
			for i := range order {
				out = append(out, slot{order[(r+i)%len(order)], r})
			}
			continue
		}
		if r%2 == 0 {
			out = append(out, slot{first, r}, slot{second, r})
		} else {
			out = append(out, slot{second, r}, slot{first, r})
		}
	}
	return out
}

func run(ctx context.Context, c config, out io.Writer) (*Report, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return nil, err
	}
	if c.pageOnly {
		return rewritePage(root, c)
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
	// One webhook replica, without leader election: on this shared machine its lease renewals
	// sometimes missed their deadline, and a replica that loses the lease exits, taking the
	// admission server with it. Its controllers run as on a leader. The harness starts it with
	// leader election (the leader-loss scenario's replicas keep it), so it is restarted without.
	cp, err := harness.Start(ctx, harness.Options{Webhook: true, AuditLog: true, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	cp.StopWebhook()
	singleWebhook = append(singleWebhook, strings.Fields(c.webhookArgs)...)
	if err := cp.StartWebhook(ctx, singleWebhook...); err != nil {
		return nil, err
	}
	if err := writeFleet(ctx, cp, c.fleet, out); err != nil {
		return nil, err
	}
	if err := cp.StartInClusterIPAM(ctx); err != nil {
		return nil, err
	}
	var settled time.Duration
	if c.fleet > 0 {
		if settled, err = settleFleet(ctx, cp, out); err != nil {
			return nil, err
		}
	}
	ready, err := stack.WatchReadiness(ctx, cp.Config)
	if err != nil {
		return nil, err
	}
	b := &bench{cp: cp, ready: ready, cfg: c, out: out, load: startLoadSampler(ctx), serving: modePreallocated}
	defer b.stopReplicas()

	report := &Report{Machine: machine(), Started: time.Now().UTC(), Fleet: c.fleet, FleetSettled: settled, Sizes: c.sizes()}
	report.Product, _ = harness.ProductCommit(root)
	if c.slow > 0 {
		report.SlowRate = c.slowRate
	}
	report.ScaleRaised = c.scale && c.scaleRaised
	if err := b.runScenarios(ctx, report); err != nil {
		return report, err
	}
	report.Finished = time.Now().UTC()
	report.Load = b.load.summary()
	report.Parts = []Part{{Started: report.Started, Finished: report.Finished, Scenarios: ranScenarios(report), FleetSettled: settled, Load: report.Load}}
	report.finishRuns()
	if c.merge && c.resultsDir() != "" {
		fmt.Fprintln(out, withEarlierParts(report, root, c))
	}
	report.compareModes()
	printReport(out, report)
	if err := save(report, root, c.resultsDir(), out); err != nil {
		return report, err
	}
	if c.resultsDir() == "" || c.page == "" {
		return report, nil
	}
	_, err = rewritePage(root, c)
	return report, err
}

// writeFleet writes the standing fleet with the webhook out of the Metal3Data path, as a restore
// would; the templates go through its validation.
func writeFleet(ctx context.Context, cp *harness.ControlPlane, machines int, out io.Writer) error {
	if machines == 0 {
		return nil
	}
	start := time.Now()
	templates, err := harness.FleetNamespaces(ctx, cp.Client, fleetNamespaces)
	if err != nil {
		return err
	}
	if err := cp.UnregisterMutatingWebhooks(ctx); err != nil {
		return err
	}
	if err := harness.WriteFleet(ctx, cp.Client, templates, 0, machines); err != nil {
		return err
	}
	fmt.Fprintf(out, "Standing fleet: %d Ready machines over %d namespaces, written in %s\n", machines, fleetNamespaces, time.Since(start).Round(time.Second))
	return cp.RegisterMutatingWebhooks(ctx)
}

// runScenarios runs every selected scenario in every mode, then the leader-loss scenario, which
// replaces the webhook process by two replicas. The single process is restarted around the no-op
// runs (serveAs); its footprint is read whenever a preallocating one stops (readFootprint).
func (b *bench) runScenarios(ctx context.Context, report *Report) error {
	var later []func() error
	for _, s := range b.cfg.settings() {
		for i, sc := range s.Scenarios {
			if !b.selected(s, sc) {
				continue
			}
			runs := func() error {
				for _, at := range modes(i, b.cfg.repeats, sc.NoOp) {
					if err := b.serveAs(ctx, at.mode); err != nil {
						return err
					}
					if err := b.runAndRecord(ctx, report, s, sc, at.mode, at.repeat); err != nil {
						return err
					}
				}
				return nil
			}
			if sc.LeaderLoss {
				later = append(later, runs)
			} else if err := runs(); err != nil {
				return err
			}
		}
	}
	if b.serving == modePreallocated {
		if err := b.readFootprint(); err != nil {
			return err
		}
	}
	report.Webhook = b.footprint
	if len(later) > 0 {
		if err := b.startReplicas(ctx); err != nil {
			return err
		}
		for _, r := range later {
			if err := r(); err != nil {
				return err
			}
		}
		b.stopReplicas()
	}
	return nil
}

// selected tells whether a scenario runs: --only, and a leader-loss size above zero.
func (b *bench) selected(s setting, sc scenario) bool {
	name := s.Name + "/" + sc.Name
	if sc.LeaderLoss && b.cfg.leaderLoss <= 0 || sc.Kind == "slow" && b.cfg.slow <= 0 || len(b.cfg.scenarios) > 0 && !slices.Contains(b.cfg.scenarios, name) {
		return false
	}
	return strings.Contains(name, b.cfg.only)
}

func (b *bench) runAndRecord(ctx context.Context, report *Report, s setting, sc scenario, mode string, repeat int) error {
	r, err := b.runOne(ctx, s, sc, mode, repeat)
	if err != nil {
		return fmt.Errorf("%s/%s/%s: %w", s.Name, sc.Name, mode, err)
	}
	report.Runs = append(report.Runs, r)
	printRun(b.out, r)
	return b.dropRun(ctx, runNamespace(s, sc, mode, repeat))
}

// save writes results.json and the plot.
func save(report *Report, root, results string, out io.Writer) error {
	if results == "" {
		return nil
	}
	dir := results
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := encodeReport(report)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), data, 0o644); err != nil {
		return err
	}
	if err := plotCDF(report, filepath.Join(dir, "time-to-ready.png")); err != nil {
		return err
	}
	fmt.Fprintf(out, "Results in %s\n", dir)
	return nil
}
