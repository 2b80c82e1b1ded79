package main

import (
	"fmt"
	"io"
	"math"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// The speed check compares each repetition's preallocated run with its baseline's (a pair: the
// two ran back to back, in alternating order, so a drift in the machine's load cancels within it)
// and judges the 90% interval of the geometric mean of the pairs' ratios of totals against a fixed
// ceiling: not slower when all of it is at or below the ceiling, slower when all of it is above,
// inconclusive when it straddles the ceiling, where the noise alone would decide. Each side is a
// one-sided test at 5%. The baseline is the no-op webhook where it ran interleaved, stock
// otherwise.
const (
	minPairs = 6
	// ceiling is how much longer than its baseline preallocation may take in total, in every
	// scenario.
	ceiling = 1.05
)

const (
	verdictNotSlower    = "not slower"
	verdictSlower       = "slower"
	verdictInconclusive = "inconclusive"
)

// Paired is the speed check's verdict on one scenario.
type Paired struct {
	Setting, Scenario string
	// Over is the baseline: stock, or the no-op webhook.
	Over string
	// Ratios are the pairs' preallocated totals over the baseline's.
	Ratios []float64
	// GeoMean is their geometric mean, Low and High its 90% interval (Student's t on the logs).
	GeoMean, Low, High float64
	Ceiling            float64
	Verdict            string
}

// pairedVerdict judges one scenario from its pairs' ratios over the baseline.
func pairedVerdict(setting, scenario, over string, ratios []float64) Paired {
	return pairedAgainst(setting, scenario, over, ratios, ceiling)
}

// pairedAgainst judges pairs' ratios against another ceiling than the totals'.
func pairedAgainst(setting, scenario, over string, ratios []float64, most float64) Paired {
	p := Paired{Setting: setting, Scenario: scenario, Over: over, Ratios: ratios, Ceiling: most, Verdict: verdictInconclusive}
	if len(ratios) < 2 {
		return p
	}
	logs := make([]float64, len(ratios))
	for i, r := range ratios {
		logs[i] = math.Log(r)
	}
	mean, sd := stat.MeanStdDev(logs, nil)
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(len(logs) - 1)}.Quantile(0.95)
	half := t * sd / math.Sqrt(float64(len(logs)))
	p.GeoMean, p.Low, p.High = math.Exp(mean), math.Exp(mean-half), math.Exp(mean+half)
	switch {
	case len(ratios) < minPairs:
	case p.High <= p.Ceiling:
		p.Verdict = verdictNotSlower
	case p.Low > p.Ceiling:
		p.Verdict = verdictSlower
	}
	return p
}

// pairedVerdicts judges every scenario's preallocated totals, but the leader-loss scenario's: a
// killed replica's claims wait for the take-over by design, a cost reported with the other ratios
// rather than held to a ceiling. Where the no-op webhook ran, preallocation is judged over it: on
// two cores at raised limits any webhook's admission round trip costs CAPM3's template loop more
// than preallocation does, a cost reported (no-op over stock) but not ours to remove.
func pairedVerdicts(comparisons, webhookCosts []Comparison) []Paired {
	faults := map[string]bool{}
	for _, s := range settings() {
		for _, sc := range s.Scenarios {
			faults[s.Name+"/"+sc.Name] = sc.LeaderLoss
		}
	}
	overNoOp := map[string]Comparison{}
	for _, q := range webhookCosts {
		if q.Of == modePreallocated {
			overNoOp[q.Setting+"/"+q.Scenario] = q
		}
	}
	var out []Paired
	for _, q := range comparisons {
		key := q.Setting + "/" + q.Scenario
		if faults[key] {
			continue
		}
		over := modeStock
		if n, ok := overNoOp[key]; ok {
			q, over = n, modeNoOp
		}
		out = append(out, pairedVerdict(q.Setting, q.Scenario, over, q.Ratio(ratioTotal).Values))
	}
	return out
}

// slowedBy is the verdicts had every preallocated total been factor times as long: what the check
// says of a slowdown measured with this run's own noise.
func slowedBy(verdicts []Paired, factor float64) []Paired {
	out := make([]Paired, len(verdicts))
	for i, p := range verdicts {
		ratios := make([]float64, len(p.Ratios))
		for j, r := range p.Ratios {
			ratios[j] = r * factor
		}
		out[i] = pairedVerdict(p.Setting, p.Scenario, p.Over, ratios)
	}
	return out
}

func (p Paired) String() string {
	return fmt.Sprintf("%s/%s: %s: total %.2f× %s's (geometric mean of %d pairs, 90%% interval %.2f–%.2f), ceiling %.2f",
		p.Setting, p.Scenario, p.Verdict, p.GeoMean, p.Over, len(p.Ratios), p.Low, p.High, p.Ceiling)
}

// printSpeedCheck prints the verdicts as a Markdown table.
func printSpeedCheck(out io.Writer, verdicts []Paired) {
	fmt.Fprintf(out, "\nSpeed check: each scenario's preallocated total over its baseline's in the same pair of runs (not leader-loss's, whose claims wait for the take-over by design): the no-op webhook's where it ran, stock's otherwise. The pairs' geometric mean and its 90%% interval against the ceiling (%.2f): not slower when all of it is at or below, slower when all above, else (or under %d pairs) inconclusive.\n",
		ceiling, minPairs)
	fmt.Fprintln(out, "\n| setting | scenario | over | pairs | geometric mean | 90% interval | ceiling | verdict |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---|")
	for _, p := range verdicts {
		fmt.Fprintf(out, "| %s | %s | %s | %d | %.2f | %.2f–%.2f | %.2f | %s |\n", p.Setting, p.Scenario, p.Over, len(p.Ratios), p.GeoMean, p.Low, p.High, p.Ceiling, p.Verdict)
	}
}
