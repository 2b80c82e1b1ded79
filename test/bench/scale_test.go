package main

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestScaleVerdict: each of the scale targets fails its row on its own.
func TestScaleVerdict(t *testing.T) {
	within := scaleRow{setting: "default-limits", scenario: "backlog", ratio: 0.70, share: 1, admissionBound: 0.050,
		stock: modeFigures{reconciles: 2, lastCreated: 100}, pre: modeFigures{createP99: 0.040, reconciles: 1.1, lastCreated: 300}}
	for _, tc := range []struct {
		name string
		edit func(*scaleRow)
		want string
	}{
		{"within", func(*scaleRow) {}, "meets every target"},
		{"backlog slower than its target", func(r *scaleRow) { r.ratio = 0.81 }, "misses: slower than 0.80× stock"},
		{"backlog reconciled too often", func(r *scaleRow) { r.pre.reconciles = 1.3 }, "misses: CAPM3 reconciles over 0.60× stock's"},
		{"template loop slowed with raised limits", func(r *scaleRow) { r.setting, r.scenario = "raised-limits", "slow" }, "misses: template loop slower than 1.10× stock"},
		{"template loop within", func(r *scaleRow) { r.setting, r.scenario, r.pre.lastCreated = "raised-limits", "slow", 110 }, "meets every target"},
		{"burst slower than stock", func(r *scaleRow) { r.scenario, r.ratio = "burst-spread", 1.01 }, "misses: slower than 1.00× stock"},
		{"slow arrival has no time target", func(r *scaleRow) { r.scenario, r.ratio = "slow", 1.50 }, "meets every target"},
		{"claims left to CAPM3", func(r *scaleRow) { r.share = 0.985 }, "misses: under 99% preallocated"},
		{"raised limits, every admission left to CAPM3", func(r *scaleRow) {
			r.setting, r.scenario, r.pre.lastCreated, r.share, r.stepAside, r.left = "raised-limits", "slow", 110, 0, true, true
		}, "meets every target"},
		{"raised limits, an admission preallocated", func(r *scaleRow) {
			r.setting, r.scenario, r.pre.lastCreated, r.share, r.stepAside = "raised-limits", "slow", 110, 0.1, true
		}, "misses: an admission not left to CAPM3"},
		{"admission above stock's plus one write", func(r *scaleRow) { r.pre.createP99 = 0.051 }, "misses: admission above the bound"},
		{"two at once", func(r *scaleRow) { r.ratio, r.share = 0.9, 0.5 }, "misses: slower than 0.80× stock; under 99% preallocated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := within
			tc.edit(&row)
			if got := scaleVerdict(row); got != tc.want {
				t.Errorf("scaleVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestScaleSection: the section takes the share of claims preallocated from the runs' own counts,
// its least over the preallocated runs, and the admission bound from stock's p99 and the
// preallocated runs' claim writes, over the no-op webhook's p99 where it ran.
func TestScaleSection(t *testing.T) {
	run := func(mode string, repeat int, total, createP99, claimWrites float64, byCAPM3 int) *Run {
		r := &Run{Setting: "default-limits", Scenario: "burst-spread", Mode: mode, Repeat: repeat, N: 1000, Total: total,
			Claims: 3000, ClaimsByCAPM3: byCAPM3}
		r.CreateServer, r.ClaimCreates = []float64{createP99}, []float64{claimWrites}
		return r
	}
	report := &Report{Fleet: 5000, FleetSettled: 20 * time.Second, SlowRate: 10, Runs: []*Run{
		run(modeStock, 0, 400, 0.020, 0, 3000), run(modePreallocated, 0, 380, 0.030, 0.012, 0),
		run(modePreallocated, 1, 390, 0.031, 0.014, 60), run(modeStock, 1, 410, 0.022, 0, 3000),
	}}
	withNoOp := &Report{Runs: append(slices.Clone(report.Runs), run(modeNoOp, 0, 420, 0.025, 0, 0), run(modeNoOp, 1, 420, 0.027, 0, 0))}
	withNoOp.finish()
	if rows := scaleRows(withNoOp); len(rows) != 1 || !rows[0].overNoOp || math.Abs(rows[0].admissionBound-(0.026+overNoOpP99)) > 1e-9 {
		t.Errorf("with the no-op webhook: rows %+v, want the bound over its p99", rows)
	}
	report.finish()
	rows := scaleRows(report)
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	row := rows[0]
	if row.share != 0.98 {
		t.Errorf("share %v, want 0.98: the least of the preallocated runs", row.share)
	}
	if want := 0.021 + 0.013; row.admissionBound < want-1e-9 || row.admissionBound > want+1e-9 {
		t.Errorf("admission bound %v, want %v", row.admissionBound, want)
	}
	var b bytes.Buffer
	writeScaleSection(&b, report)
	for _, want := range []string{"## At scale", "5000 Ready machines", "| default-limits | burst-spread | 1000 | 2 | stock → preallocated; preallocated → stock |", "98.0%", "misses: under 99% preallocated"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("section without %q:\n%s", want, b.String())
		}
	}
	// Results from before the runs waited for a settled fleet measured it: no figures of theirs.
	report.FleetSettled = 0
	b.Reset()
	writeScaleSection(&b, report)
	if strings.Contains(b.String(), "98.0%") || !strings.Contains(b.String(), "`make bench-scale` writes this section anew") {
		t.Errorf("section of results from before the settled fleet:\n%s", b.String())
	}
}

// TestBacklogLimit: the backlog's limit is the pause plus the Secret GETs of one reconcile per
// Metal3Data at CAPM3's client limit, from stock's own requests.
func TestBacklogLimit(t *testing.T) {
	// 1,000 Metal3Data reconciled twice each: 2 GETs per reconcile and one per create of 2 Secrets.
	r := &Run{N: 1000, Released: 180, ReconcilesMean: 2, Requests: map[string]map[string]float64{
		"capm3": {"get secrets": 6, "create secrets": 2, "get baremetalhosts": 2}}}
	// One reconcile: 4 GETs per Metal3Data, 4,000 less the burst at 20/s.
	if got, want := backlogLimit([]*Run{r}), 180+(4000.0-30)/20; math.Abs(got-want) > 1e-9 {
		t.Errorf("limit %v, want %v", got, want)
	}
}

// TestScaleSectionRaisedLimits: where CAPM3's limits are raised the section says the claims were
// left to CAPM3, from each preallocated run's count of the admissions the webhook left.
func TestScaleSectionRaisedLimits(t *testing.T) {
	run := func(mode string, repeat, left int) *Run {
		r := &Run{Setting: "raised-limits", Scenario: "burst-spread", Mode: mode, Repeat: repeat, N: 1000, Total: 200,
			Claims: 3000, ClaimsByCAPM3: 3000, LeftForLimits: left, ArrivalSpan: 40}
		r.CreateServer, r.ClaimCreates = []float64{0.3}, []float64{0}
		return r
	}
	for _, tc := range []struct {
		name string
		left int
		want string
	}{
		{"every admission left", 1000, "| none: left to CAPM3 |"},
		{"one admission preallocated", 999, "| 0.0% |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			report := &Report{Fleet: 5000, FleetSettled: 20 * time.Second, Runs: []*Run{
				run(modeStock, 0, 0), run(modePreallocated, 0, 1000), run(modePreallocated, 1, tc.left), run(modeStock, 1, 0),
			}}
			report.finish()
			var b bytes.Buffer
			writeScaleSection(&b, report)
			verdict := "meets every target"
			if tc.left < 1000 {
				verdict = "misses: an admission not left to CAPM3"
			}
			for _, want := range []string{tc.want, verdict} {
				if !strings.Contains(b.String(), want) {
					t.Errorf("section without %q:\n%s", want, b.String())
				}
			}
		})
	}
}
