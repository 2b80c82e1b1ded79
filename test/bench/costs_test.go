package main

import (
	"strings"
	"testing"
)

// TestCostVerdict: a raised-limits scenario misses its bounds when preallocation slows the
// template loop, the create p99 over the no-op webhook's or the API server's CPU, and a
// default-limits one only on the API server's CPU.
func TestCostVerdict(t *testing.T) {
	jitter := []float64{1, 1.01, 0.99, 1.02, 0.98, 1}
	report := func(setting string, loop, p99, cpu float64) *Report {
		r := &Report{}
		for repeat, j := range jitter {
			add := func(mode string, loop, p99, cpu float64) {
				r.Runs = append(r.Runs, &Run{Setting: setting, Scenario: "burst", Mode: mode, Repeat: repeat, N: 10, Total: 10 * j,
					ArrivalSpan: loop * j, Server: Summary{P99: p99 * j}, CPU: map[string]float64{"kube-apiserver": cpu * j}})
			}
			add(modeStock, 1, 0.050, 1)
			add(modeNoOp, 1, 0.060, 1)
			add(modePreallocated, loop, 0.060+p99, cpu)
		}
		r.compareModes()
		return r
	}
	for _, tc := range []struct {
		name           string
		setting        string
		loop, p99, cpu float64
		want           string
	}{
		{name: "within", setting: "raised-limits", loop: 1, cpu: 1, want: "within"},
		{name: "template loop slowed", setting: "raised-limits", loop: 1.3, cpu: 1, want: "template loop above 1.10× stock"},
		{name: "create p99 above the no-op webhook's", setting: "raised-limits", loop: 1, p99: 0.030, cpu: 1, want: "create p99 more than 20 ms above"},
		{name: "API server CPU", setting: "raised-limits", loop: 1, cpu: 1.2, want: "API server CPU above 1.05× stock"},
		{name: "default limits: the loop is reported, not bound", setting: "default-limits", loop: 2, cpu: 1, want: "within"},
		{name: "default limits: API server CPU", setting: "default-limits", loop: 1, cpu: 1.2, want: "API server CPU above 1.05× stock"},
	} {
		rows := costRows(report(tc.setting, tc.loop, tc.p99, tc.cpu))
		if len(rows) != 1 {
			t.Fatalf("%s: %d rows", tc.name, len(rows))
		}
		if got := costVerdict(rows[0]); !strings.Contains(got, tc.want) {
			t.Errorf("%s: verdict %q, want %q", tc.name, got, tc.want)
		}
	}
}
