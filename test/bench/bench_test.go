package main

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestQuickBench runs make bench's program with small sizes, each mode of each scenario twice
// (stock, preallocated, preallocated, stock), and checks what the project claims against stock
// CAPM3 in the same run: preallocated is not slower than stock beyond the spread between two runs
// of one mode (the noise on this machine, whatever else runs on it) at CAPM3's default client
// limits (with them raised it is, and that is reported: issue 11), CAPM3 creates no claim next to
// the webhook, needs no more reconciles when idle and after a backlog, and after a backlog does
// its work for each Metal3Data in one reconcile.
func TestQuickBench(t *testing.T) {
	var out bytes.Buffer
	report, err := run(context.Background(), config{
		idle: 5, burst: 15, templates: 3, backlog: 15, repeats: 2, pause: 3 * time.Second, timeout: 5 * time.Minute,
	}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	checkClaims(t, report)
	for _, q := range report.Comparisons {
		key := q.Setting + "/" + q.Scenario
		if q.Setting == "raised-limits" {
			// Not met yet (issue 11): with CAPM3's client limits raised, admission paces the
			// template controller's serial creates. Reported, so the figure is in every run.
			t.Logf("%s (open, issue 11): mean time to Ready %.2f× stock's (noise ±%.0f%%), total %.2f× (noise ±%.0f%%)",
				key, q.ReadyMean, 100*q.NoiseReadyMean, q.Total, 100*q.NoiseTotal)
			continue
		}
		if q.ReadyMean > 1+q.NoiseReadyMean {
			t.Errorf("%s: mean time to Ready %.2f× stock's, beyond the noise of ±%.0f%%", key, q.ReadyMean, 100*q.NoiseReadyMean)
		}
		if q.Total > 1+q.NoiseTotal {
			t.Errorf("%s: total %.2f× stock's, beyond the noise of ±%.0f%%", key, q.Total, 100*q.NoiseTotal)
		}
		if (q.Scenario == "idle" || q.Scenario == "backlog") && q.ReconcilesMean > 1 {
			t.Errorf("%s: %.2f× stock's CAPM3 reconciles per Metal3Data", key, q.ReconcilesMean)
		}
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
			want = 0
		}
		if r.ClaimsByCAPM3 != want {
			t.Errorf("%s: CAPM3 created %d claims for %d Metal3Data, want %d", key, r.ClaimsByCAPM3, r.N, want)
		}
		if r.Mode == modePreallocated && r.Scenario == "backlog" && r.WorkReconcileMax > 1 {
			t.Errorf("%s: after the backlog a Metal3Data took %d reconciles that did work: %v", key, r.WorkReconcileMax, r.Histories)
		}
	}
}
