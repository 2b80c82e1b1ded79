package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/stat"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metal3-community/ip-preallocator/test/stack"
)

// Summary is a distribution's figures, in seconds.
type Summary struct {
	P50, P95, P99, Max, Mean float64
}

// summarize takes a distribution's quantiles with gonum's stat.Quantile, Empirical kind: the
// smallest value at or above the fraction p of the values (nearest rank).
func summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	sorted := slices.Clone(values)
	sort.Float64s(sorted)
	q := func(p float64) float64 { return stat.Quantile(p, stat.Empirical, sorted, nil) }
	return Summary{P50: q(.5), P95: q(.95), P99: q(.99), Max: sorted[len(sorted)-1], Mean: stat.Mean(sorted, nil)}
}

func sum(values []float64) float64 { return floats.Sum(values) }

// Run is one mode of one scenario.
type Run struct {
	Setting, Scenario, Mode string
	// Repeat numbers the runs of one mode of a scenario, from 0.
	Repeat       int
	N, Templates int
	// TimeToReady of each machine, from its Metal3DataClaim's create call to its Metal3Data seen
	// Ready, and BeforeData the part of it until CAPM3's create of the Metal3Data returned, in
	// seconds.
	TimeToReady, BeforeData []float64
	// Total is from the first claim to the last Ready, ArrivalSpan from the first claim to the
	// last Metal3Data created, in seconds.
	Total, ArrivalSpan float64
	// Released is when a backlog's Metal3Data controller was let go, and AfterRelease how long
	// it then took until the last Metal3Data was Ready, in seconds.
	Released     float64 `json:",omitempty"`
	AfterRelease float64 `json:",omitempty"`
	// The template controller's Metal3Data creates: each call as its client saw it (rate limiter
	// included), each request as the API server timed it (admission included), and the time
	// between two creates of one template.
	CreateCall, CreateServer, LoopInterval []float64 `json:"-"`
	// A preallocating admission split at the webhook's claim creates (see recordAdmissions).
	BeforeClaims, ClaimCreates, AfterClaims []float64 `json:"-"`
	// CreatesRefused counts creates the API server refused; ExtraMetal3Data counts Metal3Data
	// created beyond one per claim.
	CreatesRefused, ExtraMetal3Data int
	// Mutating webhook calls of the run and their mean time in seconds, as the API server saw
	// them (transport included), as the webhook's handler did, and the handler's claim creation.
	WebhookCalls                                      int
	WebhookCall, WebhookHandler, WebhookClaimCreation float64
	Reconciles, WorkReconciles                        []int `json:"-"`
	Histories                                         []string
	Requeues                                          int
	FirstReconcileSawWaitingClaim                     int
	// FirstReconcileSawUnansweredClaim counts the Metal3Data whose first CAPM3 reconcile read one
	// of their claims before its IPAM answered it.
	FirstReconcileSawUnansweredClaim int
	ClaimsByCAPM3                    int
	// Claims counts the run's IP claims, of both groups, once every Metal3Data was Ready.
	Claims int
	// HeldBacklog is, in a backlog, how many Metal3Data existed when CAPM3's Metal3Data
	// controller was let go.
	HeldBacklog int `json:",omitempty"`
	// ClaimsByCAPM3Warned counts those the webhook named in a PreallocationIncomplete Event: it
	// left them to CAPM3 (not created in time, or CAPM3 created them first).
	ClaimsByCAPM3Warned int
	// LeftForLimits counts the admissions the webhook left to CAPM3 because CAPM3's client limits
	// are raised (skip reason CAPM3LimitsRaised).
	LeftForLimits int `json:",omitempty"`
	// Requests per Metal3Data by component, then by "verb resource".
	Requests map[string]map[string]float64
	// Load is the machine's mean one-minute load average during the run.
	Load float64
	// CPU is the CPU time in seconds each component used from just before the first claim until
	// the last Metal3Data was Ready, CPUWindow seconds.
	CPU       cpuClock
	CPUWindow float64
	// APIServerCPU is, in profiled runs, the API server's CPU time in ms per Metal3Data by what it
	// went to (see cpuUses), from a profile of the same window.
	APIServerCPU map[string]float64 `json:",omitempty"`
	// Causes counts CAPM3's reconciles per Metal3Data by what woke them (see recordCauses).
	Causes map[string]float64
	// In the leader-loss scenario: whether a leading replica was killed, when (seconds after the
	// first claim), and the time to Ready of the AfterKillN Metal3Data created after the kill.
	LeaderKilled bool    `json:",omitempty"`
	KilledAt     float64 `json:",omitempty"`
	AfterKillN   int     `json:",omitempty"`
	AfterKill    Summary
	readyAt      map[types.NamespacedName]time.Time

	Ready, Before, Call, Server, Loop Summary
	// Admission is the median of each part of a preallocating admission, in seconds.
	Admission struct{ BeforeClaims, ClaimCreates, AfterClaims float64 }
	// BeforeShare is the share of the machines' time to Ready spent before their Metal3Data
	// existed; ArrivalRate is Metal3Data per second from the first claim to the last Metal3Data.
	BeforeShare, ArrivalRate float64
	ReconcilesMean           float64
	ReconcilesMax            int
	WorkReconcileMax         int
	// Floor is the least time CAPM3's requests of this run take at its client rate limit, for
	// the resource type FloorResource that takes longest.
	Floor         float64 `json:",omitempty"`
	FloorResource string  `json:",omitempty"`
}

func (r *Run) finish(capm3 stack.Options) {
	r.Ready, r.Before = summarize(r.TimeToReady), summarize(r.BeforeData)
	r.Call, r.Server, r.Loop = summarize(r.CreateCall), summarize(r.CreateServer), summarize(r.LoopInterval)
	r.Admission.BeforeClaims = summarize(r.BeforeClaims).P50
	r.Admission.ClaimCreates = summarize(r.ClaimCreates).P50
	r.Admission.AfterClaims = summarize(r.AfterClaims).P50
	r.BeforeShare = sum(r.BeforeData) / math.Max(sum(r.TimeToReady), 1e-9)
	r.ArrivalRate = float64(r.N) / math.Max(r.ArrivalSpan, 1e-9)
	total := 0
	for i, n := range r.Reconciles {
		total += n
		r.ReconcilesMax = max(r.ReconcilesMax, n)
		r.WorkReconcileMax = max(r.WorkReconcileMax, r.WorkReconciles[i])
	}
	r.ReconcilesMean = float64(total) / float64(max(1, len(r.Reconciles)))
	if r.Released > 0 {
		r.AfterRelease = r.Total - r.Released
	}
	if r.Scenario != "idle" {
		qps, burst := capm3.QPS, capm3.Burst
		if qps == 0 {
			qps, burst = stack.DefaultQPS, stack.DefaultBurst
		}
		r.Floor, r.FloorResource = floor(r.Requests["capm3"], r.N, qps, burst)
	}
}

// Footprint is the webhook process's memory and cache.
type Footprint struct {
	PeakRSSMiB    float64
	CachedObjects map[string]float64
}

// Ratio is one figure of preallocated over stock: Values has, for each repetition, the figure of
// preallocated's run over stock's run of the same repetition (where stock's is not zero); Mean,
// StdDev, Min and Max are taken over them.
type Ratio struct {
	Name                   string
	Values                 []float64
	Mean, StdDev, Min, Max float64
}

func newRatio(name string, values []float64) Ratio {
	r := Ratio{Name: name, Values: values}
	if len(values) == 0 {
		return r
	}
	r.Mean, r.Min, r.Max = stat.Mean(values, nil), floats.Min(values), floats.Max(values)
	if len(values) > 1 {
		r.StdDev = stat.StdDev(values, nil)
	}
	return r
}

// Comparison is one mode over another for one scenario: preallocated over stock unless Of and
// Over say otherwise.
type Comparison struct {
	Setting, Scenario string
	// Of and Over are the modes compared, when not preallocated and stock.
	Of, Over string `json:",omitempty"`
	// Repetitions is how many pairs of runs the ratios come from.
	Repetitions int
	Ratios      []Ratio
	// The means of three of the ratios.
	ReadyMean, Total, ReconcilesMean float64
	// Noise is the larger, between the two modes, of the range of a figure over the repetitions of
	// one mode relative to its mean: of the mean time to Ready and of the total.
	NoiseReadyMean, NoiseTotal float64 `json:",omitempty"`
}

// Ratio returns the named ratio.
func (q Comparison) Ratio(name string) Ratio {
	for _, r := range q.Ratios {
		if r.Name == name {
			return r
		}
	}
	return Ratio{Name: name}
}

// figure is a number of one run that preallocated and stock are compared on.
type figure struct {
	name string
	of   func(*Run) float64
}

const (
	ratioReadyMean   = "ready mean"
	ratioTotal       = "total"
	ratioReconciles  = "CAPM3 reconciles per Metal3Data"
	ratioLastCreated = "last Metal3Data created"
	ratioAPIServer   = "API server CPU per Metal3Data"
)

var figures = []figure{
	{ratioReadyMean, func(r *Run) float64 { return r.Ready.Mean }},
	{"p50", func(r *Run) float64 { return r.Ready.P50 }},
	{"p95", func(r *Run) float64 { return r.Ready.P95 }},
	{"p99", func(r *Run) float64 { return r.Ready.P99 }},
	{"max", func(r *Run) float64 { return r.Ready.Max }},
	{ratioTotal, func(r *Run) float64 { return r.Total }},
	{ratioLastCreated, func(r *Run) float64 { return r.ArrivalSpan }},
	{ratioReconciles, func(r *Run) float64 { return r.ReconcilesMean }},
	{"CAPM3 requeues per Metal3Data", func(r *Run) float64 { return float64(r.Requeues) / float64(max(1, r.N)) }},
	{"CAPM3 Secret GETs per Metal3Data", func(r *Run) float64 { return r.Requests["capm3"]["get secrets"] }},
	{"CAPM3 requests per Metal3Data", func(r *Run) float64 { return floats.Sum(slices.Collect(maps.Values(r.Requests["capm3"]))) }},
	{"CPU per Metal3Data", func(r *Run) float64 { return floats.Sum(slices.Collect(maps.Values(r.CPU))) / float64(max(1, r.N)) }},
	{ratioAPIServer, func(r *Run) float64 { return r.CPU["kube-apiserver"] / float64(max(1, r.N)) }},
	{"ready p50 of those created after the kill", func(r *Run) float64 { return r.AfterKill.P50 }},
	{"their max", func(r *Run) float64 { return r.AfterKill.Max }},
}

func compare(stock, pre []*Run) Comparison {
	byRepeat := func(runs []*Run) map[int]*Run {
		out := map[int]*Run{}
		for _, r := range runs {
			out[r.Repeat] = r
		}
		return out
	}
	stockRuns, preRuns := byRepeat(stock), byRepeat(pre)
	q := Comparison{Setting: stock[0].Setting, Scenario: stock[0].Scenario}
	for _, repeat := range slices.Sorted(maps.Keys(stockRuns)) {
		if preRuns[repeat] != nil {
			q.Repetitions++
		}
	}
	for _, f := range figures {
		var values []float64
		for _, repeat := range slices.Sorted(maps.Keys(stockRuns)) {
			s, p := stockRuns[repeat], preRuns[repeat]
			if p == nil || f.of(s) == 0 {
				continue
			}
			values = append(values, f.of(p)/f.of(s))
		}
		if len(values) > 0 {
			q.Ratios = append(q.Ratios, newRatio(f.name, values))
		}
	}
	q.ReadyMean, q.Total, q.ReconcilesMean = q.Ratio(ratioReadyMean).Mean, q.Ratio(ratioTotal).Mean, q.Ratio(ratioReconciles).Mean
	readyMean := func(r *Run) float64 { return r.Ready.Mean }
	total := func(r *Run) float64 { return r.Total }
	q.NoiseReadyMean = max(spread(stock, readyMean), spread(pre, readyMean))
	q.NoiseTotal = max(spread(stock, total), spread(pre, total))
	return q
}

// spread is the range of f over the runs relative to its mean; zero for a single run.
func spread(runs []*Run, f func(*Run) float64) float64 {
	if len(runs) < 2 {
		return 0
	}
	values := make([]float64, len(runs))
	for i, r := range runs {
		values[i] = f(r)
	}
	return (floats.Max(values) - floats.Min(values)) / stat.Mean(values, nil)
}

// Report is what make bench writes to bench/results/results.json.
type Report struct {
	Machine           map[string]string
	Started, Finished time.Time
	Load              Load
	Runs              []*Run
	Comparisons       []Comparison
	// WebhookCosts are, where the no-op webhook ran interleaved with the other modes, the no-op
	// over stock (what any webhook served as ours costs) and preallocated over the no-op (what
	// preallocation adds to it).
	WebhookCosts []Comparison `json:",omitempty"`
	// Paired is the speed check's verdict on each scenario (see pairedVerdicts).
	Paired  []Paired
	Webhook *Footprint
	// Fleet is how many Ready machines of a standing fleet the run kept beside its scenarios.
	Fleet int `json:",omitempty"`
	// FleetSettled is how long, after the fleet was written, the IPAMs took to leave it alone;
	// results without it come from before the runs waited for that.
	FleetSettled time.Duration `json:",omitempty"`
	// SlowRate is the slow arrival's Metal3DataClaims per second.
	SlowRate float64 `json:",omitempty"`
	// ScaleRaised is whether a scale run included the raised-limits setting (--scale-raised).
	ScaleRaised bool `json:",omitempty"`
	// Product is the last commit that changed the webhook's code (harness.ProductCommit), and
	// Sizes every size the runs depend on: parts merge only where both are the same.
	Product, Sizes string `json:",omitempty"`
	// Parts are the invocations that ran these results, each with its scenarios.
	Parts []Part `json:",omitempty"`
}

func machine() map[string]string {
	m := map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH}
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if info, err := os.ReadFile("/proc/meminfo"); err == nil {
		m["memory"] = strings.TrimSpace(strings.TrimPrefix(strings.Split(string(info), "\n")[0], "MemTotal:"))
	}
	return m
}

// finish computes every run's figures and the comparisons.
func (r *Report) finish() {
	r.finishRuns()
	r.compareModes()
}

// finishRuns computes the figures of runs just measured; runs read back from results were
// finished before they were saved, without the samples their figures come from.
func (r *Report) finishRuns() {
	for _, s := range settings() {
		for _, run := range r.Runs {
			if run.Setting == s.Name {
				run.finish(s.CAPM3)
			}
		}
	}
}

// compareModes compares the modes of each scenario, anew.
func (r *Report) compareModes() {
	r.Comparisons, r.WebhookCosts = nil, nil
	var order []string
	byKey := map[string]map[string][]*Run{}
	for _, run := range r.Runs {
		key := run.Setting + "/" + run.Scenario
		if byKey[key] == nil {
			byKey[key] = map[string][]*Run{}
			order = append(order, key)
		}
		byKey[key][run.Mode] = append(byKey[key][run.Mode], run)
	}
	for _, key := range order {
		stock, pre, noOp := byKey[key][modeStock], byKey[key][modePreallocated], byKey[key][modeNoOp]
		if len(stock) == 0 || len(pre) == 0 {
			continue
		}
		r.Comparisons = append(r.Comparisons, compare(stock, pre))
		if len(noOp) == 0 {
			continue
		}
		webhook, preallocation := compare(stock, noOp), compare(noOp, pre)
		webhook.Of, webhook.Over = modeNoOp, modeStock
		preallocation.Of, preallocation.Over = modePreallocated, modeNoOp
		r.WebhookCosts = append(r.WebhookCosts, webhook, preallocation)
	}
	r.Paired = pairedVerdicts(r.Comparisons, r.WebhookCosts)
}

func printRun(out io.Writer, r *Run) {
	ready := summarize(r.TimeToReady)
	fmt.Fprintf(out, "  %-15s %-13s %-13s #%d ready p50 %6.2fs p95 %6.2fs max %6.2fs total %6.2fs, last Metal3Data after %6.2fs\n",
		r.Setting, r.Scenario, r.Mode, r.Repeat, ready.P50, ready.P95, ready.Max, r.Total, r.ArrivalSpan)
}

// printReport prints the tables of docs/benchmarks.md, in Markdown.
func printReport(out io.Writer, r *Report) {
	fmt.Fprintln(out, "\n| setting | scenario | mode | run | n | templates | ready p50 (s) | p95 | max | total | Metal3Data exists after, p50 (s) | share of time to Ready before it exists | Metal3Data per second | floor at CAPM3's rate limit (s) | CAPM3 reconciles mean / max | work max | requeues | first reconcile met a waiting claim | first reconcile met an unanswered claim | claims CAPM3 created | load |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, run := range r.Runs {
		floor := "–"
		if run.Floor > 0 {
			floor = fmt.Sprintf("%.1f (%s)", run.Floor, run.FloorResource)
		}
		total := fmt.Sprintf("%.1f", run.Total)
		if run.Released > 0 {
			total += fmt.Sprintf(" (%.1f after release)", run.AfterRelease)
		}
		fmt.Fprintf(out, "| %s | %s | %s | %d | %d | %d | %.2f | %.2f | %.2f | %s | %.2f | %.0f%% | %.1f | %s | %.2f / %d | %d | %d | %d | %d | %d | %.1f |\n",
			run.Setting, run.Scenario, run.Mode, run.Repeat+1, run.N, run.Templates, run.Ready.P50, run.Ready.P95, run.Ready.Max, total,
			run.Before.P50, 100*run.BeforeShare, run.ArrivalRate, floor, run.ReconcilesMean, run.ReconcilesMax, run.WorkReconcileMax,
			run.Requeues, run.FirstReconcileSawWaitingClaim, run.FirstReconcileSawUnansweredClaim, run.ClaimsByCAPM3, run.Load)
	}
	printLoop(out, r)
	printLeaderLoss(out, r)
	printComparisons(out, r)
	printSpeedCheck(out, r.Paired)
	printCPU(out, r)
	printAPIServerCPU(out, r)
	printCauses(out, r)
	printRequests(out, r)
	fmt.Fprintf(out, "\nLoad average (1 min) during the benchmark: min %.1f, mean %.1f, max %.1f (%d samples)\n", r.Load.Min, r.Load.Mean, r.Load.Max, r.Load.Samples)
	if f := r.Webhook; f != nil {
		fmt.Fprintf(out, "Webhook process: peak RSS %.0f MiB; cached objects %v\n", f.PeakRSSMiB, f.CachedObjects)
	}
}

// printLoop prints what each run's Metal3Data creates cost CAPM3's template controller.
func printLoop(out io.Writer, r *Report) {
	fmt.Fprintln(out, "\n| setting | scenario | mode | run | create call p50 (ms) | p99 | at the API server p50 (ms) | p99 | webhook calls | webhook call mean, API server's view (ms) | webhook handler mean (ms) | of which creating claims (ms) | admission until the first claim create p50 (ms) | claim creates p50 (ms) | after them p50 (ms) | between two creates of a template p50 (ms) | creates refused | extra Metal3Data |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, run := range r.Runs {
		a := run.Admission
		fmt.Fprintf(out, "| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d | %d |\n",
			run.Setting, run.Scenario, run.Mode, run.Repeat+1, 1000*run.Call.P50, 1000*run.Call.P99, 1000*run.Server.P50, 1000*run.Server.P99,
			run.WebhookCalls, 1000*run.WebhookCall, 1000*run.WebhookHandler, 1000*run.WebhookClaimCreation,
			1000*a.BeforeClaims, 1000*a.ClaimCreates, 1000*a.AfterClaims,
			1000*run.Loop.P50, run.CreatesRefused, run.ExtraMetal3Data)
	}
}

// printCPU prints, for each scenario and mode, the CPU each component used per Metal3Data
// (means over the repetitions) and how busy it kept the machine's cores.
func printCPU(out io.Writer, r *Report) {
	fmt.Fprintf(out, "\nCPU per Metal3Data (ms) from the first claim to the last Ready, by process, means over the repetitions; busy: all of it over %d cores' time.\n", runtime.NumCPU())
	fmt.Fprintf(out, "\n| setting | scenario | mode | %s | all | busy |\n", strings.Join(cpuComponents, " | "))
	fmt.Fprintf(out, "|---|---|---|%s---:|---:|\n", strings.Repeat("---:|", len(cpuComponents)))
	var order []string
	byKey := map[string][]*Run{}
	for _, run := range r.Runs {
		key := run.Setting + " | " + run.Scenario + " | " + run.Mode
		if byKey[key] == nil {
			order = append(order, key)
		}
		byKey[key] = append(byKey[key], run)
	}
	for _, key := range order {
		runs := byKey[key]
		cells := make([]string, len(cpuComponents))
		var all, busy float64
		for i, c := range cpuComponents {
			var ms float64
			for _, run := range runs {
				ms += 1000 * run.CPU[c] / float64(max(1, run.N)) / float64(len(runs))
			}
			cells[i], all = fmt.Sprintf("%.1f", ms), all+ms
		}
		for _, run := range runs {
			busy += floats.Sum(slices.Collect(maps.Values(run.CPU))) / (math.Max(run.CPUWindow, 1e-9) * float64(runtime.NumCPU())) / float64(len(runs))
		}
		fmt.Fprintf(out, "| %s | %s | %.1f | %.0f%% |\n", key, strings.Join(cells, " | "), all, 100*busy)
	}
}

func printComparisons(out io.Writer, r *Report) {
	fmt.Fprintln(out, "\nEach repetition's preallocated run over its stock run: mean ±standard deviation over the repetitions (these and p95 and max in the results' JSON). Noise: the larger, between the modes, of the range of one mode's runs over their mean.")
	printRatios(out, r.Comparisons, false)
	if len(r.WebhookCosts) > 0 {
		fmt.Fprintln(out, "\nWhat any webhook costs, and what preallocation adds: the no-op webhook's runs over stock's of the same repetition, and preallocated's over the no-op's.")
		printRatios(out, r.WebhookCosts, true)
	}
}

// jsonOnlyRatios are left out of the tables: a run's slowest machines are Ready at its end, so
// they repeat p99 and the total.
var jsonOnlyRatios = []string{"p95", "max"}

// printRatios prints a table of comparisons, naming the modes compared when withModes.
func printRatios(out io.Writer, comparisons []Comparison, withModes bool) {
	var names []string
	for _, f := range figures {
		if slices.Contains(jsonOnlyRatios, f.name) {
			continue
		}
		for _, q := range comparisons {
			if len(q.Ratio(f.name).Values) > 0 {
				names = append(names, f.name)
				break
			}
		}
	}
	modes, modesRule := "", ""
	if withModes {
		modes, modesRule = "modes | ", "---|"
	}
	fmt.Fprintf(out, "\n| setting | scenario | %srepetitions | %s | noise: mean time to Ready | noise: total |\n", modes, strings.Join(names, " | "))
	fmt.Fprintf(out, "|---|---|%s---:|%s---:|---:|\n", modesRule, strings.Repeat("---:|", len(names)))
	noise := func(v float64) string {
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf("±%.0f%%", 100*v)
	}
	for _, q := range comparisons {
		cells := make([]string, len(names))
		for i, name := range names {
			ratio := q.Ratio(name)
			switch len(ratio.Values) {
			case 0:
				cells[i] = "–"
			case 1:
				cells[i] = fmt.Sprintf("%.2f", ratio.Mean)
			default:
				cells[i] = fmt.Sprintf("%.2f ±%.2f", ratio.Mean, ratio.StdDev)
			}
		}
		pair := ""
		if withModes {
			pair = q.Of + " / " + q.Over + " | "
		}
		fmt.Fprintf(out, "| %s | %s | %s%d | %s | %s | %s |\n", q.Setting, q.Scenario, pair, q.Repetitions, strings.Join(cells, " | "),
			noise(q.NoiseReadyMean), noise(q.NoiseTotal))
	}
}

// printCauses prints, for each scenario, CAPM3's reconciles per Metal3Data by what woke them,
// in each mode (means over the repetitions).
func printCauses(out io.Writer, r *Report) {
	fmt.Fprintf(out, "\nWhat woke CAPM3's Metal3Data reconciles. %s\n", causeMethod)
	var order []string
	byKey := map[string]map[string][]*Run{}
	for _, run := range r.Runs {
		key := run.Setting + " / " + run.Scenario
		if byKey[key] == nil {
			byKey[key] = map[string][]*Run{}
			order = append(order, key)
		}
		byKey[key][run.Mode] = append(byKey[key][run.Mode], run)
	}
	for _, key := range order {
		var ms []string
		for _, m := range []string{modeStock, modePreallocated, modeNoOp} {
			if len(byKey[key][m]) > 0 {
				ms = append(ms, m)
			}
		}
		mean := map[string]map[string]float64{}
		weight := map[string]float64{}
		for _, m := range ms {
			mean[m] = map[string]float64{}
			for _, run := range byKey[key][m] {
				for cause, v := range run.Causes {
					mean[m][cause] += v / float64(len(byKey[key][m]))
					weight[cause] += v / float64(len(byKey[key][m]))
				}
			}
		}
		causes := slices.SortedFunc(maps.Keys(weight), func(a, b string) int {
			if weight[a] != weight[b] {
				return cmp.Compare(weight[b], weight[a])
			}
			return strings.Compare(a, b)
		})
		fmt.Fprintf(out, "\n**%s**\n\n| woken by | %s |\n|---|%s\n", key, strings.Join(ms, " | "), strings.Repeat("---:|", len(ms)))
		totals := make([]float64, len(ms))
		for _, cause := range causes {
			cells := make([]string, len(ms))
			for i, m := range ms {
				cells[i] = fmt.Sprintf("%.2f", mean[m][cause])
				totals[i] += mean[m][cause]
			}
			fmt.Fprintf(out, "| %s | %s |\n", cause, strings.Join(cells, " | "))
		}
		cells := make([]string, len(ms))
		for i := range ms {
			cells[i] = fmt.Sprintf("%.2f", totals[i])
		}
		fmt.Fprintf(out, "| **all reconciles** | %s |\n", strings.Join(cells, " | "))
	}
}

// printLeaderLoss prints, for each leader-loss run, when the leader was killed and how the
// Metal3Data created after the kill fared.
func printLeaderLoss(out io.Writer, r *Report) {
	header := false
	for _, run := range r.Runs {
		if run.Scenario != "leader-loss" {
			continue
		}
		if !header {
			fmt.Fprintln(out, "\nLeader loss: two webhook replicas under leader election, the leader killed (SIGKILL) once half of the Metal3Data exist and started again 0.5 s later, in both modes (in stock the webhook is not called).")
			fmt.Fprintln(out, "\n| setting | scenario | mode | run | n | leader killed | killed after (s) | created after the kill | their ready p50 (s) | p95 | max | all: ready p50 (s) | max | total |")
			fmt.Fprintln(out, "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
			header = true
		}
		killed := "no leader found"
		if run.LeaderKilled {
			killed = "yes"
		}
		fmt.Fprintf(out, "| %s | %s | %s | %d | %d | %s | %.2f | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f |\n", run.Setting, run.Scenario, run.Mode,
			run.Repeat+1, run.N, killed, run.KilledAt, run.AfterKillN, run.AfterKill.P50, run.AfterKill.P95, run.AfterKill.Max,
			run.Ready.P50, run.Ready.Max, run.Total)
	}
}

// printRequests prints the API requests per Metal3Data of the first runs of the default-limits
// burst, by component.
func printRequests(out io.Writer, r *Report) {
	for _, run := range r.Runs {
		if run.Setting != "default-limits" || run.Scenario != "burst" || run.Repeat != 0 {
			continue
		}
		fmt.Fprintf(out, "\n**%s / %s / %s**\n\n| component | requests per Metal3Data |\n|---|---|\n", run.Setting, run.Scenario, run.Mode)
		for _, who := range slices.Sorted(maps.Keys(run.Requests)) {
			var parts []string
			for _, req := range slices.Sorted(maps.Keys(run.Requests[who])) {
				parts = append(parts, fmt.Sprintf("%s %.2f", req, run.Requests[who][req]))
			}
			fmt.Fprintf(out, "| %s | %s |\n", who, strings.Join(parts, ", "))
		}
	}
}
