package main

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/stat"
)

// scaleSettings are make bench-scale's scenarios, at the sizes users run (its BENCH_SCALE_ARGS):
// bursts spread over the templates at both limit settings, a backlog, and the slow arrival of a
// MachineDeployment scaled up machine by machine. The backlog's IPAM runs with raised limits, as
// in settings, so that the backlog measures CAPM3's Metal3Data queue. At CAPM3's default limits
// its uncached Secret reads pace it below ten Metal3Data a second (the runs' floor), so a slow
// arrival at that rate would be a burst: it runs with raised limits, where the arrival sets the
// pace, and also with the no-op webhook, whose admission the preallocating one's is held to.
func scaleSettings() []setting {
	return []setting{
		{
			Name: "default-limits",
			Scenarios: []scenario{
				{Name: "burst-spread", Kind: "burst", Spread: true},
				{Name: "backlog", Kind: "backlog", Spread: true, IPAM: &raised},
			},
		},
		{
			Name:  "raised-limits",
			CAPM3: raised,
			IPAM:  raised,
			Scenarios: []scenario{
				{Name: "burst-spread", Kind: "burst", Spread: true},
				{Name: "slow", Kind: "slow", Spread: true, NoOp: true},
			},
		},
	}
}

func (c config) settings() []setting {
	if c.scale {
		return scaleSettings()
	}
	return settings()
}

// resultsDir is where this run's results go.
func (c config) resultsDir() string {
	if c.scale {
		return c.scaleResults
	}
	return c.results
}

// scaleTargets are the most a scale scenario's total may take, preallocated over stock (mean of
// the repetitions): a backlog is where preallocation pays most, and no burst may be slower.
var scaleTargets = map[string]float64{"backlog": 0.75, "burst-spread": 1.00}

// leastPreallocated is the smallest share of claims the webhook must create itself in every
// preallocated run at scale; the rest are left to CAPM3.
const leastPreallocated = 0.99

// preallocatedShare is the share of a run's claims that CAPM3 did not create.
func preallocatedShare(r *Run) float64 {
	if r.Claims == 0 {
		return 0
	}
	return 1 - float64(r.ClaimsByCAPM3)/float64(r.Claims)
}

// scaleRow is what the page says of one scale scenario: both modes' means over the repetitions,
// the preallocated runs' least share of claims preallocated, and the admission's cost at the API
// server.
type scaleRow struct {
	setting, scenario string
	machines, reps    int
	stock, pre        modeFigures
	ratio             float64
	// share is the least share of claims preallocated over the preallocated runs.
	share float64
	// admissionBound is the no-op webhook's p99 Metal3Data create at the API server, where it
	// ran, or stock's (stricter: no webhook call at all), plus one write: the median time the
	// webhook's claim creates of one admission took.
	admissionBound float64
	overNoOp       bool
	held           int
	// order is the modes in the order they ran, one repetition after another.
	order string
}

// modeFigures are one mode's means over its runs of a scenario.
type modeFigures struct {
	total, p50, p99, createP50, createP99, reconciles, capm3Requests, ipamRequests, webhookCPU, apiserverCPU float64
}

func figuresOf(runs []*Run) modeFigures {
	mean := func(of func(*Run) float64) float64 {
		values := make([]float64, len(runs))
		for i, r := range runs {
			values[i] = of(r)
		}
		return stat.Mean(values, nil)
	}
	perData := func(r *Run, v float64) float64 { return v / float64(max(1, r.N)) }
	requests := func(r *Run, who string) float64 { return floats.Sum(slices.Collect(maps.Values(r.Requests[who]))) }
	return modeFigures{
		total:         mean(func(r *Run) float64 { return r.Total }),
		p50:           mean(func(r *Run) float64 { return r.Ready.P50 }),
		p99:           mean(func(r *Run) float64 { return r.Ready.P99 }),
		createP50:     mean(func(r *Run) float64 { return r.Server.P50 }),
		createP99:     mean(func(r *Run) float64 { return r.Server.P99 }),
		reconciles:    mean(func(r *Run) float64 { return r.ReconcilesMean }),
		capm3Requests: mean(func(r *Run) float64 { return requests(r, "capm3") }),
		ipamRequests:  mean(func(r *Run) float64 { return requests(r, "metal3-ipam") }),
		webhookCPU:    mean(func(r *Run) float64 { return perData(r, r.CPU["webhook"]) }),
		apiserverCPU:  mean(func(r *Run) float64 { return perData(r, r.CPU["kube-apiserver"]) }),
	}
}

// scaleRows summarises every scale scenario that ran in both modes, in the order they ran.
func scaleRows(r *Report) []scaleRow {
	var rows []scaleRow
	for _, q := range r.Comparisons {
		var stock, pre, noOp []*Run
		order := map[int][]string{}
		for _, run := range r.Runs {
			if run.Setting != q.Setting || run.Scenario != q.Scenario {
				continue
			}
			order[run.Repeat] = append(order[run.Repeat], run.Mode)
			switch run.Mode {
			case modeStock:
				stock = append(stock, run)
			case modePreallocated:
				pre = append(pre, run)
			case modeNoOp:
				noOp = append(noOp, run)
			}
		}
		row := scaleRow{setting: q.Setting, scenario: q.Scenario, machines: stock[0].N, reps: q.Repetitions,
			stock: figuresOf(stock), pre: figuresOf(pre), ratio: q.Total, share: 1, order: runOrder(order)}
		var claimWrites []float64
		for _, run := range pre {
			row.share = min(row.share, preallocatedShare(run))
			claimWrites = append(claimWrites, run.Admission.ClaimCreates)
			row.held = max(row.held, run.HeldBacklog)
		}
		row.admissionBound = row.stock.createP99 + stat.Mean(claimWrites, nil)
		if len(noOp) > 0 {
			row.admissionBound, row.overNoOp = figuresOf(noOp).createP99+stat.Mean(claimWrites, nil), true
		}
		rows = append(rows, row)
	}
	return rows
}

// writeScaleSection writes the page's section on the scale run.
func writeScaleSection(b *bytes.Buffer, r *Report) {
	if r.Fleet > 0 && r.FleetSettled == 0 {
		fmt.Fprintf(b, "\n## At scale\n\n`bench/results/scale/results.json` (%s UTC) comes from before the runs waited for the IPAMs to leave the standing fleet alone, so its figures measured the fleet's answering too; `make bench-scale` writes this section anew.\n",
			r.Started.UTC().Format("2006-01-02 15:04"))
		return
	}
	fmt.Fprintf(b, "\n## At scale\n\nWritten by `make bench-scale` (`go run ./bench --scale`; the runs column says how many pairs ran) from `bench/results/scale/results.json` (%s to %s UTC). Beside a standing fleet of %d Ready machines over %d namespaces, written directly as a restore from backup would (its IPClaims answered, with the Metal3 IPAM's finalizers; its IPAddressClaims answered by the in-cluster IPAM before the first run, which starts once no IPAM has written to the fleet for %s; a run during which one does fails), stock, preallocated and, in the slow arrival, the no-op webhook take turns, in the order the table gives. CAPM3 and the Metal3 IPAM watch only the run's namespace. Each scenario spreads its Metal3DataClaims over 10 templates; the backlog holds CAPM3's Metal3Data controller while they arrive (its IPAM with raised limits, as in make bench's backlog)%s. Times are means over the repetitions, in seconds.\n",
		r.Started.UTC().Format("2006-01-02 15:04"), r.Finished.UTC().Format("15:04"), r.Fleet, fleetNamespaces, fleetQuiet, slowClause(r.SlowRate))
	rows := scaleRows(r)
	fmt.Fprintln(b, "\n| setting | scenario | machines | runs of each mode | order of the runs | stock: total, p50, p99 | preallocated: total, p50, p99 | total ratio | target | claims preallocated (least of the runs) | Metal3Data create at the API server p50 / p99 (ms): stock, preallocated | p99 bound: one claim write over the no-op webhook's (*) or stock's | verdict |")
	fmt.Fprintln(b, "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, row := range rows {
		target := "–"
		if t, ok := scaleTargets[row.scenario]; ok {
			target = fmt.Sprintf("≤ %.2f", t)
		}
		bound := fmt.Sprintf("%.0f", 1000*row.admissionBound)
		if row.overNoOp {
			bound += " (*)"
		}
		fmt.Fprintf(b, "| %s | %s | %d | %d | %s | %.0f, %.1f, %.1f | %.0f, %.1f, %.1f | %.2f | %s | %.1f%% | %.0f / %.0f, %.0f / %.0f | %s | %s |\n",
			row.setting, row.scenario, row.machines, row.reps, row.order, row.stock.total, row.stock.p50, row.stock.p99, row.pre.total, row.pre.p50, row.pre.p99,
			row.ratio, target, 100*row.share, 1000*row.stock.createP50, 1000*row.stock.createP99, 1000*row.pre.createP50, 1000*row.pre.createP99,
			bound, scaleVerdict(row))
	}
	fmt.Fprintln(b, "\nThe admission bound is over the no-op webhook's p99 where it ran (*), the slow arrival; elsewhere over stock's, which has no webhook call at all and so is stricter.")
	fmt.Fprintln(b, "\nPer Metal3Data, means over the repetitions: CAPM3's reconciles and API requests, the Metal3 IPAM's API requests, and the CPU time (ms) of the webhook and of the API server.")
	fmt.Fprintln(b, "\n| setting | scenario | mode | CAPM3 reconciles | CAPM3 requests | Metal3 IPAM requests | webhook CPU | API server CPU |")
	fmt.Fprintln(b, "|---|---|---|---:|---:|---:|---:|---:|")
	for _, row := range rows {
		for _, m := range []struct {
			mode string
			f    modeFigures
		}{{modeStock, row.stock}, {modePreallocated, row.pre}} {
			fmt.Fprintf(b, "| %s | %s | %s | %.2f | %.1f | %.1f | %.1f | %.1f |\n", row.setting, row.scenario, m.mode,
				m.f.reconciles, m.f.capm3Requests, m.f.ipamRequests, 1000*m.f.webhookCPU, 1000*m.f.apiserverCPU)
		}
	}
	for _, row := range rows {
		if row.held > 0 {
			fmt.Fprintf(b, "\nThe %s backlog held at most %d of %d Metal3Data when CAPM3's controller was let go.\n", row.setting, row.held, row.machines)
		}
	}
	if f := r.Webhook; f != nil {
		fmt.Fprintf(b, "\nThe webhook process, with the fleet and every run's machines in its caches, peaked at %.0f MiB RSS.\n", f.PeakRSSMiB)
	}
}

// runOrder says in which order the modes ran, repetition by repetition.
func runOrder(byRepeat map[int][]string) string {
	var reps []string
	for _, r := range slices.Sorted(maps.Keys(byRepeat)) {
		reps = append(reps, strings.Join(byRepeat[r], " → "))
	}
	return strings.Join(reps, "; ")
}

// scaleVerdict names every target a scale scenario missed.
func scaleVerdict(row scaleRow) string {
	var missed []string
	if t, ok := scaleTargets[row.scenario]; ok && row.ratio > t {
		missed = append(missed, fmt.Sprintf("slower than %.2f× stock", t))
	}
	if row.share < leastPreallocated {
		missed = append(missed, fmt.Sprintf("under %.0f%% preallocated", 100*leastPreallocated))
	}
	if row.pre.createP99 > row.admissionBound {
		missed = append(missed, "admission above the bound")
	}
	if len(missed) == 0 {
		return "meets every target"
	}
	return "misses: " + strings.Join(missed, "; ")
}

// slowClause says at what rate the slow arrival ran, if it did.
func slowClause(rate float64) string {
	if rate == 0 {
		return ""
	}
	return fmt.Sprintf("; the slow arrival, with raised limits, creates them %.0f a second", rate)
}
