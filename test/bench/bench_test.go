package main

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestQuickBench runs make bench's program with small sizes and checks what the project claims
// against stock CAPM3 in the same run.
func TestQuickBench(t *testing.T) {
	var out bytes.Buffer
	report, err := run(context.Background(), config{
		idle: 10, burst: 15, backlog: 15, pause: 3 * time.Second, timeout: 5 * time.Minute,
	}, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	stock := map[string]*Run{}
	for _, r := range report.Runs {
		if r.Mode == modeStock {
			stock[r.Setting+"/"+r.Scenario] = r
		}
	}
	for _, r := range report.Runs {
		if r.Mode != modePreallocated {
			continue
		}
		key := r.Setting + "/" + r.Scenario
		if r.ClaimsByCAPM3 != 0 {
			t.Errorf("%s: CAPM3 created %d claims next to the webhook", key, r.ClaimsByCAPM3)
		}
		if stock[key].ClaimsByCAPM3 != 3*stock[key].N {
			t.Errorf("%s: stock CAPM3 created %d claims for %d Metal3Data", key, stock[key].ClaimsByCAPM3, stock[key].N)
		}
		if (r.Scenario == "idle" || r.Scenario == "backlog") && r.ReconcilesMean > stock[key].ReconcilesMean {
			t.Errorf("%s: %.2f CAPM3 reconciles per Metal3Data, stock needs %.2f", key, r.ReconcilesMean, stock[key].ReconcilesMean)
		}
		if r.Scenario == "backlog" && r.WorkReconcileMax > 1 {
			t.Errorf("%s: after the backlog a Metal3Data took %d reconciles that did work: %v", key, r.WorkReconcileMax, r.Histories)
		}
	}
}
