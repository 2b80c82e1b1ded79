package main

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestPairedVerdict: the 90% interval of the pairs' geometric mean is held to the ceiling: not
// slower all below it, slower all above it; an interval across it, or too few pairs, decides
// neither.
func TestPairedVerdict(t *testing.T) {
	for _, tc := range []struct {
		name, setting, over string
		ratios              []float64
		want                string
	}{
		{"faster", "default-limits", modeStock, []float64{0.85, 0.84, 0.82, 0.86, 0.83, 0.85}, verdictNotSlower},
		{"just below the ceiling", "default-limits", modeStock, []float64{1.02, 1.03, 1.04, 1.03, 1.02, 1.04}, verdictNotSlower},
		{"across the ceiling", "default-limits", modeStock, []float64{1.04, 1.05, 1.06, 1.05, 1.04, 1.06}, verdictInconclusive},
		{"above the ceiling", "default-limits", modeStock, []float64{1.06, 1.07, 1.08, 1.07, 1.06, 1.08}, verdictSlower},
		{"raised limits, the same ceiling", "raised-limits", modeStock, []float64{1.06, 1.07, 1.08, 1.07, 1.06, 1.08}, verdictSlower},
		{"over the no-op webhook at raised limits", "raised-limits", modeNoOp, []float64{1.01, 0.99, 1.02, 1.00, 0.98, 1.01}, verdictNotSlower},
		{"above the ceiling over the no-op webhook", "raised-limits", modeNoOp, []float64{1.06, 1.07, 1.08, 1.07, 1.06, 1.08}, verdictSlower},
		// make test's quick raised-limits burst, where the webhook steps aside: its pairs scatter
		// more than the ceiling's margin.
		{"the quick raised-limits burst", "raised-limits", modeNoOp, []float64{0.90, 1.25, 1.31, 1.11, 1.11, 1.08}, verdictInconclusive},
		{"five pairs", "default-limits", modeStock, []float64{0.85, 0.84, 0.82, 0.86, 0.83}, verdictInconclusive},
		{"pairs that disagree", "default-limits", modeStock, []float64{0.6, 1.4, 0.7, 1.3, 0.8, 1.2}, verdictInconclusive},
	} {
		if got := pairedVerdict(tc.setting, "s", tc.over, tc.ratios); got.Verdict != tc.want {
			t.Errorf("%s: %v", tc.name, got)
		}
	}
	p := pairedVerdict("default-limits", "s", modeStock, []float64{0.9, 1.1, 0.9, 1.1, 0.9, 1.1})
	if math.Abs(p.GeoMean-math.Sqrt(0.99)) > 1e-9 || p.Low >= p.GeoMean || p.High <= p.GeoMean {
		t.Errorf("geometric mean %v, interval %v–%v; want %v inside its interval", p.GeoMean, p.Low, p.High, math.Sqrt(0.99))
	}
}

// TestPairedVerdictPower simulates the check with pairs whose log ratios scatter as make bench's
// did at CAPM3's default limits (a standard deviation of 0.08, against at most 0.06), and as make
// test's quick raised-limits burst's do (0.17): an unchanged preallocation is judged slower at most
// 2% of the time, and one 1.3× slower nearly never not slower and most often slower.
func TestPairedVerdictPower(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const trials = 2000
	verdicts := func(trueRatio, sd float64) map[string]int {
		out := map[string]int{}
		for range trials {
			ratios := make([]float64, minPairs)
			for i := range ratios {
				ratios[i] = trueRatio * math.Exp(sd*rng.NormFloat64())
			}
			out[pairedVerdict("default-limits", "s", modeStock, ratios).Verdict]++
		}
		return out
	}
	for _, tc := range []struct {
		name                  string
		unchanged, sd         float64
		notSlower, slowerHits int // the fewest in 100
	}{
		{"make bench at default limits", 0.9, 0.08, 95, 85},
		{"the quick raised-limits burst", 1.0, 0.17, 0, 75},
	} {
		unchanged, slowed := verdicts(tc.unchanged, tc.sd), verdicts(tc.unchanged*1.3, tc.sd)
		if unchanged[verdictSlower] > trials/50 || unchanged[verdictNotSlower] < trials*tc.notSlower/100 {
			t.Errorf("%s: unchanged: %v of %d", tc.name, unchanged, trials)
		}
		if slowed[verdictNotSlower] > trials/100 || slowed[verdictSlower] < trials*tc.slowerHits/100 {
			t.Errorf("%s: 1.3× slower: %v of %d", tc.name, slowed, trials)
		}
		t.Logf("%s: unchanged %v, 1.3× slower %v", tc.name, unchanged, slowed)
	}
}

// TestCheckSpeed: a slower scenario fails the check, an inconclusive one does not pass it, and a
// run where nothing could be judged fails.
func TestCheckSpeed(t *testing.T) {
	notSlower := Paired{Setting: "default-limits", Scenario: "idle", Verdict: verdictNotSlower}
	slower := Paired{Setting: "default-limits", Scenario: "burst", Verdict: verdictSlower}
	inconclusive := Paired{Setting: "raised-limits", Scenario: "burst", Verdict: verdictInconclusive}
	if f := checkSpeed([]Paired{notSlower, inconclusive}); len(f) != 0 {
		t.Errorf("one not slower, one inconclusive: %q", f)
	}
	if f := checkSpeed([]Paired{notSlower, slower}); len(f) != 1 || !strings.Contains(f[0], "burst: slower") {
		t.Errorf("one slower: %q", f)
	}
	if f := checkSpeed([]Paired{inconclusive, inconclusive}); len(f) != 1 {
		t.Errorf("nothing judged: %q", f)
	}
}

// TestSlowedBy: the injected slowdown multiplies every pair's ratio and judges again.
func TestSlowedBy(t *testing.T) {
	verdicts := []Paired{pairedVerdict("default-limits", "burst", modeStock, []float64{0.9, 0.92, 0.88, 0.9, 0.91, 0.89})}
	if verdicts[0].Verdict != verdictNotSlower {
		t.Fatalf("unchanged: %v", verdicts[0])
	}
	slowed := slowedBy(verdicts, 1.3)
	if slowed[0].Verdict != verdictSlower || math.Abs(slowed[0].GeoMean-1.3*verdicts[0].GeoMean) > 1e-9 {
		t.Errorf("1.3× slower: %v", slowed[0])
	}
}

// TestNoOpBesideRaisedLimits: where CAPM3's limits are raised, its template loop is what machines
// wait for, and each burst runs beside the no-op webhook, which tells what any admission costs
// (the leader loss, which kills the webhook, aside).
func TestNoOpBesideRaisedLimits(t *testing.T) {
	for _, s := range settings() {
		for _, sc := range s.Scenarios {
			if s.Name == "raised-limits" && !sc.LeaderLoss && !sc.NoOp {
				t.Errorf("%s/%s runs without the no-op webhook", s.Name, sc.Name)
			}
		}
	}
}
