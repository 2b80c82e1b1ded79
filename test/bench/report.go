package main

import (
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

	"github.com/metal3-community/ip-preallocator/test/stack"
)

// Summary is a distribution's figures, in seconds.
type Summary struct {
	P50, P95, P99, Max, Mean float64
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func summarize(values []float64) Summary {
	sorted := slices.Clone(values)
	sort.Float64s(sorted)
	s := Summary{P50: percentile(sorted, .5), P95: percentile(sorted, .95), P99: percentile(sorted, .99)}
	if len(sorted) > 0 {
		s.Max, s.Mean = sorted[len(sorted)-1], sum(sorted)/float64(len(sorted))
	}
	return s
}

func sum(values []float64) float64 {
	var s float64
	for _, v := range values {
		s += v
	}
	return s
}

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
	ClaimsByCAPM3                                     int
	// Requests per Metal3Data by component, then by "verb resource".
	Requests map[string]map[string]float64
	// Load is the machine's mean one-minute load average during the run.
	Load float64

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

// Comparison is preallocated over stock for one scenario, from the means of their runs.
type Comparison struct {
	Setting, Scenario                              string
	ReadyMean, ReadyP50, ReadyP95, ReadyMax, Total float64
	ArrivalSpan, ReconcilesMean                    float64
	// Noise is, with repeated runs, the largest spread between two runs of one mode, relative to
	// their mean, of the mean time to Ready and of the total.
	NoiseReadyMean, NoiseTotal float64 `json:",omitempty"`
}

// Report is what make bench writes to bench/results/results.json.
type Report struct {
	Machine           map[string]string
	Started, Finished time.Time
	Load              Load
	Runs              []*Run
	Comparisons       []Comparison
	Webhook           *Footprint
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
	for _, s := range settings() {
		for _, run := range r.Runs {
			if run.Setting == s.Name {
				run.finish(s.CAPM3)
			}
		}
	}
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
		stock, pre := byKey[key][modeStock], byKey[key][modePreallocated]
		if len(stock) == 0 || len(pre) == 0 {
			continue
		}
		r.Comparisons = append(r.Comparisons, compare(stock, pre))
	}
}

func compare(stock, pre []*Run) Comparison {
	ratio := func(f func(*Run) float64) float64 { return meanOf(pre, f) / meanOf(stock, f) }
	readyMean := func(r *Run) float64 { return r.Ready.Mean }
	total := func(r *Run) float64 { return r.Total }
	return Comparison{
		Setting: stock[0].Setting, Scenario: stock[0].Scenario,
		ReadyMean:      ratio(readyMean),
		ReadyP50:       ratio(func(r *Run) float64 { return r.Ready.P50 }),
		ReadyP95:       ratio(func(r *Run) float64 { return r.Ready.P95 }),
		ReadyMax:       ratio(func(r *Run) float64 { return r.Ready.Max }),
		Total:          ratio(total),
		ArrivalSpan:    ratio(func(r *Run) float64 { return r.ArrivalSpan }),
		ReconcilesMean: ratio(func(r *Run) float64 { return r.ReconcilesMean }),
		NoiseReadyMean: max(spread(stock, readyMean), spread(pre, readyMean)),
		NoiseTotal:     max(spread(stock, total), spread(pre, total)),
	}
}

func meanOf(runs []*Run, f func(*Run) float64) float64 {
	var s float64
	for _, r := range runs {
		s += f(r)
	}
	return s / float64(len(runs))
}

// spread is the range of f over the runs relative to its mean; zero for a single run.
func spread(runs []*Run, f func(*Run) float64) float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		lo, hi = math.Min(lo, f(r)), math.Max(hi, f(r))
	}
	if len(runs) < 2 {
		return 0
	}
	return (hi - lo) / meanOf(runs, f)
}

func printRun(out io.Writer, r *Run) {
	ready := summarize(r.TimeToReady)
	fmt.Fprintf(out, "  %-15s %-13s %-13s #%d ready p50 %6.2fs p95 %6.2fs max %6.2fs total %6.2fs, last Metal3Data after %6.2fs\n",
		r.Setting, r.Scenario, r.Mode, r.Repeat, ready.P50, ready.P95, ready.Max, r.Total, r.ArrivalSpan)
}

// printReport prints the tables of docs/benchmarks.md, in Markdown.
func printReport(out io.Writer, r *Report) {
	fmt.Fprintln(out, "\n| setting | scenario | mode | run | n | templates | ready p50 (s) | p95 | max | total | Metal3Data exists after, p50 (s) | share of time to Ready before it exists | Metal3Data per second | floor at CAPM3's rate limit (s) | CAPM3 reconciles mean / max | work max | requeues | first reconcile met a waiting claim | claims CAPM3 created | load |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, run := range r.Runs {
		floor := "–"
		if run.Floor > 0 {
			floor = fmt.Sprintf("%.1f (%s)", run.Floor, run.FloorResource)
		}
		total := fmt.Sprintf("%.1f", run.Total)
		if run.Released > 0 {
			total += fmt.Sprintf(" (%.1f after release)", run.AfterRelease)
		}
		fmt.Fprintf(out, "| %s | %s | %s | %d | %d | %d | %.2f | %.2f | %.2f | %s | %.2f | %.0f%% | %.1f | %s | %.2f / %d | %d | %d | %d | %d | %.1f |\n",
			run.Setting, run.Scenario, run.Mode, run.Repeat+1, run.N, run.Templates, run.Ready.P50, run.Ready.P95, run.Ready.Max, total,
			run.Before.P50, 100*run.BeforeShare, run.ArrivalRate, floor, run.ReconcilesMean, run.ReconcilesMax, run.WorkReconcileMax,
			run.Requeues, run.FirstReconcileSawWaitingClaim, run.ClaimsByCAPM3, run.Load)
	}
	printLoop(out, r)
	printComparisons(out, r)
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

func printComparisons(out io.Writer, r *Report) {
	fmt.Fprintln(out, "\n| setting | scenario | ready mean | p50 | p95 | max | total | last Metal3Data created | CAPM3 reconciles | noise: mean time to Ready | noise: total |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, q := range r.Comparisons {
		noise := func(v float64) string {
			if v == 0 {
				return "–"
			}
			return fmt.Sprintf("±%.0f%%", 100*v)
		}
		fmt.Fprintf(out, "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s |\n", q.Setting, q.Scenario,
			q.ReadyMean, q.ReadyP50, q.ReadyP95, q.ReadyMax, q.Total, q.ArrivalSpan, q.ReconcilesMean, noise(q.NoiseReadyMean), noise(q.NoiseTotal))
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
