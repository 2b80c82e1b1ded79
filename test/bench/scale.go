package main

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/stat"

	"github.com/metal3-community/ip-preallocator/test/stack"
)

// scaleSettings are make bench-scale's scenarios, at the sizes users run (its BENCH_SCALE_ARGS):
// a burst spread over the templates and a backlog, at CAPM3's default limits, where the webhook
// preallocates. The backlog's IPAM runs with raised limits, as in settings, so that the backlog
// measures CAPM3's Metal3Data queue. With withRaised (--scale-raised), also the raised-limits
// setting, where the webhook leaves every Metal3Data to CAPM3: the spread burst beside the no-op
// webhook, and with --slow the slow arrival of a MachineDeployment scaled up machine by machine.
// At CAPM3's default limits its uncached Secret reads pace it below ten Metal3Data a second (the
// runs' floor), so a slow arrival at that rate would be a burst: it runs with raised limits, where
// the arrival sets the pace. make bench-scale leaves the raised setting out to finish within 90
// minutes; make bench measures it against the no-op webhook with 6 pairs.
func scaleSettings(withRaised bool) []setting {
	scale := []setting{{
		Name: "default-limits",
		Scenarios: []scenario{
			{Name: "burst-spread", Kind: "burst", Spread: true},
			{Name: "backlog", Kind: "backlog", Spread: true, IPAM: &raised},
		},
	}}
	if !withRaised {
		return scale
	}
	return append(scale, setting{
		Name:  "raised-limits",
		CAPM3: raised,
		IPAM:  raised,
		Scenarios: []scenario{
			{Name: "burst-spread", Kind: "burst", Spread: true, NoOp: true},
			{Name: "slow", Kind: "slow", Spread: true, NoOp: true},
		},
	})
}

func (c config) settings() []setting {
	if c.scale {
		return scaleSettings(c.scaleRaised)
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
var scaleTargets = map[string]float64{"backlog": 0.80, "burst-spread": 1.00}

const (
	// backlogReconciles is the most CAPM3's reconciles per Metal3Data in a backlog may be,
	// preallocated over stock: its first reconcile should find the addresses and render.
	backlogReconciles = 0.60
	// loopSlowdown is the most "last Metal3Data created" may take, preallocated over stock, where
	// CAPM3's limits are raised and its serial template loop is what machines wait for.
	loopSlowdown = 1.10
	// overNoOpP99 is how much the webhook may add to the no-op webhook's p99 Metal3Data create at
	// the API server, where the no-op webhook ran.
	overNoOpP99 = 0.020
	// mostRSSMiB is the most the webhook process may take with the fleet and a run cached; the
	// manifest's memory request and limit are set from the measured peak.
	mostRSSMiB = 200
)

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
	// share is the least share of claims preallocated over the preallocated runs; stepAside says
	// that the webhook was to leave every admission to CAPM3 (its limits raised), left that it did
	// in every preallocated run.
	share           float64
	stepAside, left bool
	// admissionBound is the no-op webhook's p99 Metal3Data create at the API server plus
	// overNoOpP99, where it ran; elsewhere stock's p99 (no webhook call at all) plus one write:
	// the median time the webhook's claim creates of one admission took.
	admissionBound float64
	overNoOp       bool
	held           int
	// limit is, for a backlog, the least total preallocation could reach over stock's (see
	// backlogLimit); 0 elsewhere.
	limit float64
	// order is the modes in the order they ran, one repetition after another.
	order string
}

// modeFigures are one mode's means over its runs of a scenario.
type modeFigures struct {
	total, lastCreated, p50, p99, createP50, createP99, reconciles, capm3Requests, ipamRequests, webhookCPU, apiserverCPU float64
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
		lastCreated:   mean(func(r *Run) float64 { return r.ArrivalSpan }),
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
			stock: figuresOf(stock), pre: figuresOf(pre), ratio: q.Total, share: 1, order: runOrder(order),
			left: true}
		for _, s := range scaleSettings(true) {
			row.stepAside = row.stepAside || s.Name == q.Setting && s.limitsRaised()
		}
		var claimWrites []float64
		for _, run := range pre {
			row.share = min(row.share, preallocatedShare(run))
			row.left = row.left && run.LeftForLimits == run.N
			claimWrites = append(claimWrites, run.Admission.ClaimCreates)
			row.held = max(row.held, run.HeldBacklog)
		}
		row.admissionBound = row.stock.createP99 + stat.Mean(claimWrites, nil)
		if len(noOp) > 0 {
			row.admissionBound, row.overNoOp = figuresOf(noOp).createP99+overNoOpP99, true
		}
		if q.Scenario == "backlog" {
			row.limit = backlogLimit(stock) / row.stock.total
		}
		rows = append(rows, row)
	}
	return rows
}

// backlogLimit is the least total a backlog can take, whoever creates the claims: CAPM3's
// Metal3Data controller is held until Released, then must render every Metal3Data. CAPM3 reads
// both Secrets of a Metal3Data on every reconcile and once more before it creates each, at its
// client limit for Secrets (a client-go limiter per resource type); with one reconcile per
// Metal3Data that is (GETs - creates) / reconciles + creates per Metal3Data, from stock's own
// requests. Means over stock's runs.
func backlogLimit(stock []*Run) float64 {
	var limits []float64
	for _, r := range stock {
		get, create := r.Requests["capm3"]["get secrets"], r.Requests["capm3"]["create secrets"]
		perData := create
		if r.ReconcilesMean > 0 {
			perData += (get - create) / r.ReconcilesMean
		}
		limits = append(limits, r.Released+max(0, perData*float64(r.N)-stack.DefaultBurst)/stack.DefaultQPS)
	}
	return stat.Mean(limits, nil)
}

// writeScaleSection writes the page's section on the scale run.
func writeScaleSection(b *bytes.Buffer, r *Report) {
	if r.Fleet > 0 && r.FleetSettled == 0 {
		fmt.Fprintf(b, "\n## At scale\n\n`bench/results/scale/results.json` (%s UTC) comes from before the runs waited for the IPAMs to leave the standing fleet alone, so its figures measured the fleet's answering too; `make bench-scale` writes this section anew.\n",
			r.Started.UTC().Format("2006-01-02 15:04"))
		return
	}
	fmt.Fprintf(b, "\n## At scale\n\nWritten by `make bench-scale` from `bench/results/scale/results.json` (%s). The runs stand beside a fleet of %d Ready machines over %d namespaces, written as a restore from backup would (IPClaims answered, with the Metal3 IPAM's finalizers; IPAddressClaims answered by the in-cluster IPAM; the first run starts once no IPAM has written to the fleet for %s, and a run during which one does fails). CAPM3 and the Metal3 IPAM watch only the run's namespace. Each scenario spreads its Metal3DataClaims over 10 templates; the backlog holds CAPM3's Metal3Data controller while they arrive (its IPAM with raised limits)%s. Times are means over the repetitions, in seconds.\n",
		timeSpan(r.Started, r.Finished), r.Fleet, fleetNamespaces, fleetQuiet, slowClause(r.SlowRate))
	writeParts(b, r, scaleSettings(r.ScaleRaised))
	rows := scaleRows(r)
	fmt.Fprintln(b, "\n| setting | scenario | machines | runs of each mode | order of the runs | stock: total, p50, p99 | preallocated: total, p50, p99 | total ratio | target | last Metal3Data created (s): stock, preallocated, ratio | claims preallocated (least of the runs) | Metal3Data create at the API server p50 / p99 (ms): stock, preallocated | p99 bound (ms) | verdict |")
	fmt.Fprintln(b, "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, row := range rows {
		target := "–"
		if t, ok := scaleTargets[row.scenario]; ok {
			target = fmt.Sprintf("≤ %.2f", t)
		}
		bound := fmt.Sprintf("%.0f", 1000*row.admissionBound)
		if row.overNoOp {
			bound += " (*)"
		}
		share := fmt.Sprintf("%.1f%%", 100*row.share)
		if row.stepAside && row.left {
			share = "none: left to CAPM3"
		}
		fmt.Fprintf(b, "| %s | %s | %d | %d | %s | %.0f, %.1f, %.1f | %.0f, %.1f, %.1f | %.2f | %s | %.0f, %.0f, %.2f | %s | %.0f / %.0f, %.0f / %.0f | %s | %s |\n",
			row.setting, row.scenario, row.machines, row.reps, row.order, row.stock.total, row.stock.p50, row.stock.p99, row.pre.total, row.pre.p50, row.pre.p99,
			row.ratio, target, row.stock.lastCreated, row.pre.lastCreated, row.pre.lastCreated/max(row.stock.lastCreated, 1e-9), share, 1000*row.stock.createP50, 1000*row.stock.createP99, 1000*row.pre.createP50, 1000*row.pre.createP99,
			bound, scaleVerdict(row))
	}
	if r.ScaleRaised {
		fmt.Fprintf(b, "\nThe p99 bound is the no-op webhook's p99 plus %.0f ms where it ran (*), with raised limits; elsewhere stock's, which has no webhook call at all, plus one claim write (the median time the webhook's claim creates of one admission took). With raised limits CAPM3's template loop creates the Metal3Data one after another, each waiting for the admission, and the webhook leaves every admission to CAPM3 (\"preallocated\" is the webhook stepping aside); \"last Metal3Data created\" may take at most %.2f× stock's there. A backlog's CAPM3 reconciles per Metal3Data may be at most %.2f× stock's.\n",
			1000*overNoOpP99, loopSlowdown, backlogReconciles)
	} else {
		fmt.Fprintf(b, "\nThe p99 bound is stock's (no webhook call) plus one claim write (the median of the webhook's claim creates per admission). A backlog's CAPM3 reconciles per Metal3Data may be at most %.2f× stock's. With raised limits the webhook leaves every Metal3Data to CAPM3: make bench measures that, and `--scale-raised` adds it here (about 30 minutes).\n",
			backlogReconciles)
	}
	for _, row := range rows {
		if row.limit > 0 {
			fmt.Fprintf(b, "\nThe %s backlog's limit, which no webhook can beat, is %.2f× stock's total: the pause, then CAPM3 rendering every Metal3Data in one reconcile at its client limit of %.0f requests/s, with stock's own Secret reads ((GETs − creates) / reconciles + creates per Metal3Data: both Secrets on each reconcile, once more before each create).\n",
				row.setting, row.limit, float64(stack.DefaultQPS))
		}
	}
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
		verdict := "within"
		if f.PeakRSSMiB > mostRSSMiB {
			verdict = "**above**"
		}
		fmt.Fprintf(b, "\nThe webhook process, with the fleet and one run's machines in its caches (each run's objects are dropped once it is measured), peaked at %.0f MiB RSS: %s the %d MiB target.\n", f.PeakRSSMiB, verdict, mostRSSMiB)
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
	if row.scenario == "backlog" && row.stock.reconciles > 0 && row.pre.reconciles/row.stock.reconciles > backlogReconciles {
		missed = append(missed, fmt.Sprintf("CAPM3 reconciles over %.2f× stock's", backlogReconciles))
	}
	if row.setting == "raised-limits" && row.stock.lastCreated > 0 && row.pre.lastCreated/row.stock.lastCreated > loopSlowdown {
		missed = append(missed, fmt.Sprintf("template loop slower than %.2f× stock", loopSlowdown))
	}
	switch {
	case row.stepAside && !row.left:
		missed = append(missed, "an admission not left to CAPM3")
	case !row.stepAside && row.share < leastPreallocated:
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
