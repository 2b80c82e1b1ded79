package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMergeParts: a part keeps the earlier parts' runs of the scenarios it left out, replaces
// those of the scenarios it ran, and merges only on the same product code and sizes.
func TestMergeParts(t *testing.T) {
	day := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	run := func(scenario, mode string, total float64) *Run {
		return &Run{Setting: "default-limits", Scenario: scenario, Mode: mode, N: 10, Total: total}
	}
	earlierOf := func() *Report {
		return &Report{Product: "abc", Sizes: "s", Started: day, FleetSettled: time.Minute, Webhook: &Footprint{PeakRSSMiB: 180},
			Runs:  []*Run{run("burst-spread", modeStock, 1), run("burst-spread", modePreallocated, 2), run("backlog", modeStock, 3), run("backlog", modePreallocated, 4)},
			Parts: []Part{{Started: day, Finished: day.Add(time.Hour), Scenarios: []string{"default-limits/burst-spread", "default-limits/backlog"}, Load: Load{Min: 1, Mean: 2, Max: 3, Samples: 10}}}}
	}
	partOf := func(product, sizes string) *Report {
		later := day.Add(2 * time.Hour)
		return &Report{Product: product, Sizes: sizes, Started: later, FleetSettled: 30 * time.Second, Webhook: &Footprint{PeakRSSMiB: 150},
			Runs:  []*Run{run("backlog", modePreallocated, 40), run("backlog", modeStock, 30)},
			Parts: []Part{{Started: later, Finished: later.Add(time.Hour), Scenarios: []string{"default-limits/backlog"}, Load: Load{Min: 2, Mean: 4, Max: 5, Samples: 30}}}}
	}
	order := []string{"default-limits/burst-spread", "default-limits/backlog"}

	r := partOf("abc", "s")
	if err := mergeEarlier(r, earlierOf(), order); err != nil {
		t.Fatal(err)
	}
	var totals []float64
	for _, run := range r.Runs {
		totals = append(totals, run.Total)
	}
	if got, want := totals, []float64{1, 2, 40, 30}; !slices.Equal(got, want) {
		t.Errorf("runs' totals %v, want %v: the earlier burst-spread, then this part's backlog", got, want)
	}
	if len(r.Parts) != 2 || !r.Started.Equal(day) || r.Webhook.PeakRSSMiB != 180 || r.FleetSettled != time.Minute {
		t.Errorf("parts %d, started %s, peak %v, settled %s: want 2 parts from the first's start, the higher peak and the longer settling", len(r.Parts), r.Started, r.Webhook.PeakRSSMiB, r.FleetSettled)
	}
	if want := (Load{Min: 1, Mean: 3.5, Max: 5, Samples: 40}); r.Load != want {
		t.Errorf("load %+v, want %+v over both parts' samples", r.Load, want)
	}
	r.compareModes()
	if len(r.Comparisons) != 2 || r.Comparisons[0].Scenario != "burst-spread" {
		t.Errorf("comparisons %+v, want both scenarios in the settings' order", r.Comparisons)
	}

	for name, part := range map[string]*Report{
		"other product code":  partOf("def", "s"),
		"uncommitted changes": partOf("abc, with uncommitted changes", "s"),
		"other sizes":         partOf("abc", "t"),
	} {
		if err := mergeEarlier(part, earlierOf(), order); err == nil || len(part.Runs) != 2 {
			t.Errorf("%s: merged (%v, %d runs), want refused", name, err, len(part.Runs))
		}
	}
}

// TestWritePartsNamesWhatIsMissing: the page lists the parts and, until every scenario ran, says
// the results are incomplete.
func TestWritePartsNamesWhatIsMissing(t *testing.T) {
	day := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	r := &Report{Runs: []*Run{{Setting: "default-limits", Scenario: "backlog"}}, Parts: []Part{
		{Started: day, Finished: day.Add(time.Hour), Scenarios: []string{"default-limits/backlog"}},
		{Started: day.Add(2 * time.Hour), Finished: day.Add(3 * time.Hour), Scenarios: []string{"default-limits/backlog"}},
	}}
	var b bytes.Buffer
	writeParts(&b, r, scaleSettings(true))
	for _, want := range []string{"**Incomplete: not run yet: default-limits/burst-spread, raised-limits/burst-spread.**", "Run in 2 parts", "2026-12-06 12:00 to 13:00 UTC, default-limits/backlog."} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("without %q:\n%s", want, b.String())
		}
	}
	r.SlowRate = 10
	b.Reset()
	writeParts(&b, r, scaleSettings(true))
	if want := "not run yet: default-limits/burst-spread, raised-limits/burst-spread, raised-limits/slow."; !strings.Contains(b.String(), want) {
		t.Errorf("with the slow arrival asked for, without %q:\n%s", want, b.String())
	}
	for _, s := range scaleSettings(true) {
		for _, sc := range s.Scenarios {
			r.Runs = append(r.Runs, &Run{Setting: s.Name, Scenario: sc.Name})
		}
	}
	b.Reset()
	writeParts(&b, r, scaleSettings(true))
	if strings.Contains(b.String(), "Incomplete") {
		t.Errorf("every scenario ran, yet:\n%s", b.String())
	}
}
