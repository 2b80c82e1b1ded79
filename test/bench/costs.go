package main

import (
	"bytes"
	"fmt"
	"math"
	"strings"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// costRow is what one make bench scenario cost CAPM3's template loop and the API server, judged
// pair by pair as the speed check judges totals.
type costRow struct {
	setting, scenario string
	// raised: CAPM3's limits raised, where its template loop is what machines wait for.
	raised bool
	// loop and apiserver are preallocated over stock: "last Metal3Data created" and API server
	// CPU per Metal3Data; webhookAPIServer is the no-op webhook's API server CPU over stock.
	loop, apiserver, webhookAPIServer Paired
	// overNoOp are the pairs' preallocated Metal3Data create p99 at the API server minus the no-op
	// webhook's (s); nil where the no-op webhook did not run.
	overNoOp []float64
	// p99 are the modes' mean create p99 at the API server (s).
	p99 map[string]float64
}

// costRows judges every scenario that ran in both modes, in the order of the comparisons.
func costRows(r *Report) []costRow {
	raised := map[string]bool{}
	for _, s := range settings() {
		raised[s.Name] = s.limitsRaised()
	}
	noOpCosts := map[string]Comparison{}
	for _, q := range r.WebhookCosts {
		if q.Of == modeNoOp {
			noOpCosts[q.Setting+"/"+q.Scenario] = q
		}
	}
	var rows []costRow
	for _, q := range r.Comparisons {
		row := costRow{setting: q.Setting, scenario: q.Scenario, raised: raised[q.Setting], p99: map[string]float64{},
			loop:      pairedAgainst(q.Setting, q.Scenario, modeStock, q.Ratio(ratioLastCreated).Values, loopSlowdown),
			apiserver: pairedAgainst(q.Setting, q.Scenario, modeStock, q.Ratio(ratioAPIServer).Values, ceiling)}
		if n, ok := noOpCosts[q.Setting+"/"+q.Scenario]; ok {
			row.webhookAPIServer = pairedAgainst(q.Setting, q.Scenario, modeStock, n.Ratio(ratioAPIServer).Values, ceiling)
		}
		byRepeat := map[int]map[string]float64{}
		byMode := map[string][]*Run{}
		for _, run := range r.Runs {
			if run.Setting != q.Setting || run.Scenario != q.Scenario {
				continue
			}
			if byRepeat[run.Repeat] == nil {
				byRepeat[run.Repeat] = map[string]float64{}
			}
			byRepeat[run.Repeat][run.Mode] = run.Server.P99
			byMode[run.Mode] = append(byMode[run.Mode], run)
		}
		for mode, runs := range byMode {
			row.p99[mode] = figuresOf(runs).createP99
		}
		for repeat := range len(byRepeat) {
			pre, okPre := byRepeat[repeat][modePreallocated]
			noOp, okNoOp := byRepeat[repeat][modeNoOp]
			if okPre && okNoOp {
				row.overNoOp = append(row.overNoOp, pre-noOp)
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// p99OverNoOp is the mean of the pairs' differences and its 90% interval.
func (row costRow) p99OverNoOp() (mean, low, high float64) {
	mean, sd := stat.MeanStdDev(row.overNoOp, nil)
	if len(row.overNoOp) < 2 {
		return mean, math.Inf(-1), math.Inf(1)
	}
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(len(row.overNoOp) - 1)}.Quantile(0.95)
	half := t * sd / math.Sqrt(float64(len(row.overNoOp)))
	return mean, mean - half, mean + half
}

// costVerdict names every bound a scenario missed or could not be shown to meet, each judged as the
// speed check judges totals: with raised limits the template loop's 1.10× stock and the create
// p99 within 20 ms of the no-op webhook's (the pairs' mean difference), and everywhere the API
// server's CPU per Metal3Data within 1.05×.
func costVerdict(row costRow) string {
	var missed []string
	judge := func(p Paired, what string) {
		switch p.Verdict {
		case verdictSlower:
			missed = append(missed, fmt.Sprintf("%s above %.2f× stock", what, p.Ceiling))
		case verdictInconclusive:
			missed = append(missed, what+" inconclusive")
		}
	}
	if row.raised {
		judge(row.loop, "template loop")
	}
	if len(row.overNoOp) > 0 {
		switch _, low, high := row.p99OverNoOp(); {
		case low > overNoOpP99:
			missed = append(missed, fmt.Sprintf("create p99 more than %.0f ms above the no-op webhook's", 1000*overNoOpP99))
		case high > overNoOpP99:
			missed = append(missed, "create p99 over the no-op webhook's inconclusive")
		}
	}
	judge(row.apiserver, "API server CPU")
	if len(missed) == 0 {
		return "within"
	}
	return strings.Join(missed, "; ")
}

// writeCosts writes the page's section on what the webhook costs CAPM3's template loop and the
// API server.
func writeCosts(b *bytes.Buffer, r *Report) {
	fmt.Fprintln(b, "\n## CAPM3's template loop and the API server")
	fmt.Fprintf(b, "\nEach create of CAPM3's template loop waits for the admission. Geometric means of the pairs' preallocated over stock, 90%% intervals, judged as the speed check judges totals. With raised limits, where machines wait for the loop, last Metal3Data created may be at most %.2f× stock and the create p99 at most %.0f ms above the no-op webhook's (mean of the pairs); everywhere, API server CPU per Metal3Data at most %.2f× (the no-op webhook's beside it).\n",
		loopSlowdown, 1000*overNoOpP99, ceiling)
	fmt.Fprintln(b, "\n| setting | scenario | last Metal3Data created | create p99 at the API server (ms): stock, no-op, preallocated | preallocated − no-op, 90% upper | API server CPU | no-op webhook's | verdict |")
	fmt.Fprintln(b, "|---|---|---:|---:|---:|---:|---:|---|")
	for _, row := range costRows(r) {
		noOp, diff, webhook := "–", "–", "–"
		if len(row.overNoOp) > 0 {
			mean, _, high := row.p99OverNoOp()
			noOp, diff = fmt.Sprintf("%.0f", 1000*row.p99[modeNoOp]), fmt.Sprintf("%+.0f, %+.0f", 1000*mean, 1000*high)
			webhook = interval(row.webhookAPIServer)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.0f, %s, %.0f | %s | %s | %s | %s |\n", row.setting, row.scenario, interval(row.loop),
			1000*row.p99[modeStock], noOp, 1000*row.p99[modePreallocated], diff, interval(row.apiserver), webhook, costVerdict(row))
	}
	fmt.Fprintln(b, "\nAt default limits the admission creates the claims (and on an idle cluster waits up to a second for the IPAM's answers), so the loop ends later than stock's; machines wait for CAPM3's Metal3Data controller there, and the totals show whether they wait less. Each preallocated claim costs the API server a create and the hand-over's ownership patch (the UID exists only once the Metal3Data is stored) where CAPM3 writes once, against the CAPM3 reconciles saved.")
}

// interval prints a paired judgement's geometric mean and 90% interval.
func interval(p Paired) string {
	if len(p.Ratios) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", p.GeoMean, p.Low, p.High)
}
