package faults

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// The criterion, fixed before any trial runs: with the webhook, a count is worse than stock's when
// a one-sided quasi-Poisson score test at level criterionLevel rejects "its rate per stored
// Metal3Data is at most stock's". Trial-to-trial variance enters as the dispersion, never below a
// Poisson's, so clustered events (a bad trial) weigh as what they are. A pass needs power of at
// least criterionPower against a true rate twice stock's, wherever either arm has events.
const (
	criterionLevel = 0.05
	criterionPower = 0.80
	// criterionRatio is the harm the power is computed against.
	criterionRatio = 2.0
)

// armTrial is one trial of one arm: its events and the Metal3Data it stored; capacity is the most
// events the trial could have had, or 0 when nothing bounds them.
type armTrial struct {
	events, stored, capacity int64
}

// verdictKind is what a comparison came to.
type verdictKind string

const (
	verdictWorse = verdictKind("worse than stock")
	// verdictNotWorse is a pass: not worse, with the power the criterion asks.
	verdictNotWorse     = verdictKind("not worse")
	verdictUnderpowered = verdictKind("not worse, but too few trials to tell")
	verdictCannotFail   = verdictKind("cannot fail")
	verdictNoEvents     = verdictKind("no events in either arm")
)

// comparison is a count's comparison of the webhook's arm with stock's.
type comparison struct {
	verdict verdictKind
	// z is the score statistic; power, against criterionRatio; dispersion, as estimated.
	z, power, dispersion float64
	// trialsNeeded is, when underpowered, about how many trials of each arm the power asks.
	trialsNeeded int
}

// passes tells whether the comparison counts as a pass.
func (c comparison) passes() bool {
	return c.verdict == verdictNotWorse || c.verdict == verdictNoEvents
}

func (c comparison) String() string {
	s := fmt.Sprintf("%s (z %.2f, power %.0f%%, dispersion %.1f)", c.verdict, c.z, 100*c.power, c.dispersion)
	switch {
	case c.verdict == verdictUnderpowered && c.trialsNeeded > 0:
		s += fmt.Sprintf("; about %d trials of each arm would tell", c.trialsNeeded)
	case c.verdict == verdictUnderpowered:
		s += "; more than a thousand times as many trials would be needed"
	}
	return s
}

// arm sums an arm's trials.
type arm struct {
	events, stored float64
	trials         []armTrial
}

func sumArm(trials []armTrial) arm {
	a := arm{trials: trials}
	for _, t := range trials {
		a.events += float64(t.events)
		a.stored += float64(t.stored)
	}
	return a
}

func (a arm) rate() float64 {
	if a.stored == 0 {
		return 0
	}
	return a.events / a.stored
}

// compareArms judges the webhook's trials against stock's.
func compareArms(webhook, stock []armTrial) comparison {
	w, s := sumArm(webhook), sumArm(stock)
	phi := dispersion(w, s)
	c := comparison{dispersion: phi}
	if w.stored == 0 || s.stored == 0 {
		return comparison{verdict: verdictCannotFail, dispersion: phi}
	}
	c.z = scoreZ(w.rate(), s.rate(), w.stored, s.stored, phi)
	critical := distuv.UnitNormal.Quantile(1 - criterionLevel)
	switch {
	case c.z > critical:
		c.verdict = verdictWorse
		c.power = powerAgainst(w.stored, s.stored, pooled(w, s), phi)
		return c
	case !canFail(w, s, phi, critical):
		c.verdict = verdictCannotFail
		return c
	case w.events+s.events == 0:
		c.verdict = verdictNoEvents
		return c
	}
	c.power = powerAgainst(w.stored, s.stored, pooled(w, s), phi)
	if c.power >= criterionPower {
		c.verdict = verdictNotWorse
		return c
	}
	c.verdict, c.trialsNeeded = verdictUnderpowered, trialsForPower(w, s, phi)
	return c
}

// scoreZ is the score statistic of the rate difference, its variance under equal rates.
func scoreZ(rw, rs, nw, ns, phi float64) float64 {
	p := (rw*nw + rs*ns) / (nw + ns)
	if p == 0 {
		return 0
	}
	return (rw - rs) / math.Sqrt(phi*p*(1/nw+1/ns))
}

func pooled(w, s arm) float64 { return (w.events + s.events) / (w.stored + s.stored) }

// dispersion is the Pearson estimate over both arms' trials, each against its own arm's rate,
// and at least 1: a Poisson count's.
func dispersion(w, s arm) float64 {
	var chi2 float64
	df := -2
	for _, a := range []arm{w, s} {
		r := a.rate()
		for _, t := range a.trials {
			df++
			if expected := r * float64(t.stored); expected > 0 {
				chi2 += math.Pow(float64(t.events)-expected, 2) / expected
			}
		}
	}
	if df <= 0 {
		return 1
	}
	return math.Max(1, chi2/float64(df))
}

// powerAgainst is the chance that the test finds the webhook worse when its true rate is
// criterionRatio times stock's, the two arms' pooled rate being p.
func powerAgainst(nw, ns, p, phi float64) float64 {
	if p == 0 {
		return 0
	}
	// Stock's rate, were the pooled rate made of a webhook criterionRatio times worse.
	rs := p * (nw + ns) / (criterionRatio*nw + ns)
	rw := criterionRatio * rs
	sd0 := math.Sqrt(phi * p * (1/nw + 1/ns))
	sdAlt := math.Sqrt(phi * (rw/nw + rs/ns))
	return 1 - distuv.UnitNormal.CDF((distuv.UnitNormal.Quantile(1-criterionLevel)*sd0-(rw-rs))/sdAlt)
}

// canFail tells whether the webhook's arm could be found worse at all: with every trial at its
// capacity, where one bounds its events.
func canFail(w, s arm, phi, critical float64) bool {
	most := 0.0
	for _, t := range w.trials {
		if t.capacity <= 0 {
			return true
		}
		most += float64(t.capacity)
	}
	return scoreZ(most/w.stored, s.rate(), w.stored, s.stored, phi) > critical
}

// trialsForPower is about how many trials of each arm, at the trials' mean size, give the power.
func trialsForPower(w, s arm, phi float64) int {
	trials := max(len(w.trials), len(s.trials))
	for scale := 1.0; scale <= 1000; scale *= 1.1 {
		if powerAgainst(w.stored*scale, s.stored*scale, pooled(w, s), phi) >= criterionPower {
			return int(math.Ceil(float64(trials) * scale))
		}
	}
	return 0
}
