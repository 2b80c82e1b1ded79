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
	"text/tabwriter"
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
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	s := Summary{P50: percentile(sorted, .5), P95: percentile(sorted, .95), P99: percentile(sorted, .99)}
	if len(sorted) > 0 {
		s.Max, s.Mean = sorted[len(sorted)-1], sum/float64(len(sorted))
	}
	return s
}

// Run is one mode of one scenario.
type Run struct {
	Setting, Scenario, Mode string
	N                       int
	// TimeToReady of each Metal3Data, from its create call to Ready, in seconds.
	TimeToReady   []float64
	CreateLatency []float64 `json:"-"`
	// Total is from the first create to the last Ready, in seconds.
	Total float64
	// CAPM3Started is when CAPM3 was started in a backlog, in seconds after the first create, and
	// AfterCAPM3Start how long it then took until the last Metal3Data was Ready.
	CAPM3Started               float64 `json:",omitempty"`
	AfterCAPM3Start            float64 `json:",omitempty"`
	Reconciles, WorkReconciles []int   `json:"-"`
	// Histories are each Metal3Data's CAPM3 reconciles (see stack.Stats.History).
	Histories                     []string
	Requeues                      int
	FirstReconcileSawWaitingClaim int
	ClaimsByCAPM3                 int
	// Requests per Metal3Data by component, then by "verb resource".
	Requests map[string]map[string]float64

	Ready            Summary
	ReconcilesMean   float64
	ReconcilesMax    int
	WorkReconcileMax int
	// BestTotal is the least time CAPM3's Secret requests of this run take at its client rate
	// limit, for runs whose Metal3Data arrive at once.
	BestTotal float64 `json:",omitempty"`
}

func (r *Run) finish(capm3 stack.Options) {
	r.Ready = summarize(r.TimeToReady)
	sum := 0
	for i, n := range r.Reconciles {
		sum += n
		r.ReconcilesMax = max(r.ReconcilesMax, n)
		r.WorkReconcileMax = max(r.WorkReconcileMax, r.WorkReconciles[i])
	}
	r.ReconcilesMean = float64(sum) / float64(max(1, len(r.Reconciles)))
	if r.CAPM3Started > 0 {
		r.AfterCAPM3Start = r.Total - r.CAPM3Started
	}
	if r.Scenario != "idle" {
		qps, burst := capm3.QPS, capm3.Burst
		if qps == 0 {
			qps, burst = stack.DefaultQPS, stack.DefaultBurst
		}
		secrets := 0.0
		for req, n := range r.Requests["capm3"] {
			if strings.HasSuffix(req, " secrets") {
				secrets += n * float64(r.N)
			}
		}
		r.BestTotal = math.Max(0, secrets-float64(burst)) / float64(qps)
	}
}

// Footprint is the webhook process's memory and cache.
type Footprint struct {
	PeakRSSMiB    float64
	CachedObjects map[string]float64
}

// Admission compares Metal3Data create latencies with a no-op webhook and with ours.
type Admission struct {
	NoOp, Preallocator Summary
	RatioP50, RatioP99 float64
}

// Ratio is preallocated over stock for one scenario.
type Ratio struct {
	Setting, Scenario                   string
	ReadyP50, ReadyP95, ReadyMax, Total float64
	ReconcilesMean                      float64
}

// Report is what make bench writes to bench/results/results.json.
type Report struct {
	Machine           map[string]string
	Started, Finished time.Time
	Runs              []*Run
	Ratios            []Ratio
	Admission         *Admission
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

func (r *Report) ratios() {
	for _, s := range settings() {
		for _, run := range r.Runs {
			if run.Setting == s.Name {
				run.finish(s.CAPM3)
			}
		}
	}
	byKey := map[string]map[string]*Run{}
	var order []string
	for _, run := range r.Runs {
		key := run.Setting + "/" + run.Scenario
		if byKey[key] == nil {
			byKey[key] = map[string]*Run{}
			order = append(order, key)
		}
		byKey[key][run.Mode] = run
	}
	for _, key := range order {
		stock, pre := byKey[key][modeStock], byKey[key][modePreallocated]
		if stock == nil || pre == nil {
			continue
		}
		r.Ratios = append(r.Ratios, Ratio{
			Setting: stock.Setting, Scenario: stock.Scenario,
			ReadyP50: pre.Ready.P50 / stock.Ready.P50, ReadyP95: pre.Ready.P95 / stock.Ready.P95,
			ReadyMax: pre.Ready.Max / stock.Ready.Max, Total: pre.Total / stock.Total,
			ReconcilesMean: pre.ReconcilesMean / stock.ReconcilesMean,
		})
	}
}

func printRun(out io.Writer, r *Run) {
	ready := summarize(r.TimeToReady)
	fmt.Fprintf(out, "  %-15s %-16s %-12s ready p50 %6.2fs p95 %6.2fs max %6.2fs total %6.2fs\n",
		r.Setting, r.Scenario, r.Mode, ready.P50, ready.P95, ready.Max, r.Total)
}

func printReport(out io.Writer, r *Report) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "setting\tscenario\tmode\tn\tready p50\tp95\tmax\ttotal\tbest (CAPM3 Secrets)\treconciles mean\tmax\twork max\trequeues\tfirst saw waiting\tclaims by CAPM3\t")
	for _, run := range r.Runs {
		best := "-"
		if run.BestTotal > 0 {
			best = fmt.Sprintf("%.1fs", run.BestTotal)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%.2fs\t%.2fs\t%.2fs\t%.1fs\t%s\t%.2f\t%d\t%d\t%d\t%d\t%d\t\n",
			run.Setting, run.Scenario, run.Mode, run.N, run.Ready.P50, run.Ready.P95, run.Ready.Max, run.Total, best,
			run.ReconcilesMean, run.ReconcilesMax, run.WorkReconcileMax, run.Requeues, run.FirstReconcileSawWaitingClaim, run.ClaimsByCAPM3)
	}
	w.Flush()

	fmt.Fprintln(out, "\nPreallocated / stock, same run:")
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "setting\tscenario\tready p50\tp95\tmax\ttotal\treconciles\t")
	for _, q := range r.Ratios {
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", q.Setting, q.Scenario, q.ReadyP50, q.ReadyP95, q.ReadyMax, q.Total, q.ReconcilesMean)
	}
	w.Flush()

	fmt.Fprintln(out, "\nAPI requests per Metal3Data (burst, default limits):")
	for _, run := range r.Runs {
		if run.Setting != "default-limits" || run.Scenario != "burst" {
			continue
		}
		for _, who := range slices.Sorted(maps.Keys(run.Requests)) {
			var parts []string
			for _, req := range slices.Sorted(maps.Keys(run.Requests[who])) {
				parts = append(parts, fmt.Sprintf("%s %.2f", req, run.Requests[who][req]))
			}
			fmt.Fprintf(out, "  %-12s %-14s %s\n", run.Mode, who, strings.Join(parts, ", "))
		}
	}
	if a := r.Admission; a != nil {
		fmt.Fprintf(out, "\nMetal3Data create latency: no-op webhook p50 %.1fms p99 %.1fms; ip-preallocator p50 %.1fms p99 %.1fms; ratio p50 %.2f p99 %.2f\n",
			a.NoOp.P50*1000, a.NoOp.P99*1000, a.Preallocator.P50*1000, a.Preallocator.P99*1000, a.RatioP50, a.RatioP99)
	}
	for _, run := range r.Runs {
		if run.AfterCAPM3Start > 0 {
			fmt.Fprintf(out, "%s backlog %s: last Ready %.1fs after CAPM3 started\n", run.Setting, run.Mode, run.AfterCAPM3Start)
		}
	}
	if f := r.Webhook; f != nil {
		fmt.Fprintf(out, "Webhook process: peak RSS %.0f MiB; cached objects %v\n", f.PeakRSSMiB, f.CachedObjects)
	}
}
