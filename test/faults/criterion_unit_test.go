package faults

import (
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// trials spreads counts over trials of stored Metal3Data each, capacity bounding each trial's.
func trials(stored, capacity int64, counts ...int64) []armTrial {
	out := make([]armTrial, len(counts))
	for i, k := range counts {
		out[i] = armTrial{events: k, stored: stored, capacity: capacity}
	}
	return out
}

func TestCompareArms(t *testing.T) {
	for _, tc := range []struct {
		name            string
		webhook, stock  []armTrial
		want            verdictKind
		minPower        float64
		overdispersed   bool
		wantTrialsAbove int
	}{
		{name: "clearly worse", webhook: trials(100, 0, 4, 5, 3, 4, 4), stock: trials(100, 0, 1, 1, 0, 2, 1), want: verdictWorse},
		{name: "the same rate, enough events", webhook: trials(200, 0, 8, 7, 9, 8, 8), stock: trials(200, 0, 8, 9, 7, 8, 8), want: verdictNotWorse, minPower: criterionPower},
		{name: "the same rate, too few events", webhook: trials(60, 0, 1, 0, 0, 1, 0), stock: trials(60, 0, 0, 1, 0, 0, 1), want: verdictUnderpowered, wantTrialsAbove: 5},
		// The webhook's most (one late namespace in each of 5 trials of 100) is below stock's rate.
		{name: "bounded below stock's rate", webhook: trials(100, 1, 0, 0, 0, 0, 0), stock: trials(60, 0, 2, 1, 2, 1, 2), want: verdictCannotFail},
		{name: "nothing in either arm", webhook: trials(100, 0, 0, 0, 0), stock: trials(100, 0, 0, 0, 0), want: verdictNoEvents},
		// Five trials of 60 with 0, 2, 1, 6, 2: a variance of 5.2 on a mean of 2.2 is no Poisson's.
		{name: "clustered events", webhook: trials(60, 0, 0, 2, 1, 6, 2), stock: trials(60, 0, 2, 1, 2, 1, 2), want: verdictUnderpowered, overdispersed: true, wantTrialsAbove: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := compareArms(tc.webhook, tc.stock)
			if c.verdict != tc.want {
				t.Fatalf("%v, want %s", c, tc.want)
			}
			if c.power < tc.minPower {
				t.Errorf("power %.2f, want at least %.2f", c.power, tc.minPower)
			}
			if tc.overdispersed != (c.dispersion > 1.2) {
				t.Errorf("dispersion %.2f", c.dispersion)
			}
			if c.trialsNeeded < tc.wantTrialsAbove {
				t.Errorf("%d trials needed, want more than %d", c.trialsNeeded, tc.wantTrialsAbove)
			}
			if c.passes() != (tc.want == verdictNotWorse || tc.want == verdictNoEvents) {
				t.Errorf("passes: %v", c.passes())
			}
		})
	}
}

// TestCriterionPower: at the sizes where the criterion claims 80% power against a true 2x, a
// simulated webhook arm at twice stock's rate is found worse at least about that often, and at
// stock's own rate at most about 5% of the time, with clustered (negative binomial) counts.
func TestCriterionPower(t *testing.T) {
	rng := newRand(1)
	const trialsPerArm, stored = 20, 200
	const rate, cluster = 0.05, 2.0 // events per Metal3Data; gamma shape of the trial's rate
	draw := func(r float64) []armTrial {
		out := make([]armTrial, trialsPerArm)
		for i := range out {
			out[i] = armTrial{events: poisson(rng, gamma(rng, cluster, r*stored/cluster)), stored: stored}
		}
		return out
	}
	worse, falseAlarm, powered := 0, 0, 0
	const runs = 400
	for range runs {
		c := compareArms(draw(2*rate), draw(rate))
		if c.verdict == verdictWorse {
			worse++
		}
		if compareArms(draw(rate), draw(rate)).verdict == verdictWorse {
			falseAlarm++
		}
		if c.power >= criterionPower {
			powered++
		}
	}
	t.Logf("claimed the power in %d of %d runs; found a true 2x worse in %d, equal rates in %d", powered, runs, worse, falseAlarm)
	if powered < runs/2 {
		t.Fatalf("only %d of %d runs claimed the power; the sizes here are meant to", powered, runs)
	}
	if got := float64(worse) / runs; got < criterionPower-0.1 {
		t.Errorf("a true 2x found worse in %.0f%% of runs, want about %.0f%% or more", 100*got, 100*criterionPower)
	}
	if got := float64(falseAlarm) / runs; got > 2*criterionLevel {
		t.Errorf("equal rates found worse in %.0f%% of runs, want about %.0f%%", 100*got, 100*criterionLevel)
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

// gamma draws a trial's mean count: shape alpha, scale theta (so mean alpha·theta).
func gamma(rng *rand.Rand, alpha, theta float64) float64 {
	return distuv.Gamma{Alpha: alpha, Beta: 1 / theta, Src: rng}.Rand()
}

func poisson(rng *rand.Rand, mean float64) int64 {
	return int64(distuv.Poisson{Lambda: mean, Src: rng}.Rand())
}
