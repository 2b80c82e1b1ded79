package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

// Part is one invocation of a run split by scenario (SCENARIOS= of make bench and make
// bench-scale), so that a run longer than a session is gathered over several into one results
// file.
type Part struct {
	Started, Finished time.Time
	Scenarios         []string
	// FleetSettled is how long the IPAMs took to leave this part's standing fleet alone.
	FleetSettled time.Duration `json:",omitempty"`
	Load         Load
}

// sizes is what makes two parts' runs comparable besides the product code: every size and
// setting a scenario's runs depend on.
func (c config) sizes() string {
	return fmt.Sprintf("idle %d, burst %d (%d with raised limits) over %d templates, backlog %d held %s, slow %d at %g/s, leader-loss %d, fleet %d, %d repetitions, webhook flags %q",
		c.idle, c.burst, c.raisedBurst, c.templates, c.backlog, c.pause, c.slow, c.slowRate, c.leaderLoss, c.fleet, c.repeats, c.webhookArgs)
}

// mergeEarlier adds to r, the report of the part just run, the runs of the other scenarios saved
// before it, when they measured the same product code at the same sizes; r's own scenarios
// replace theirs. It says why it did not merge otherwise: r then starts the results anew.
func mergeEarlier(r, earlier *Report, order []string) error {
	switch {
	case harness.Uncommitted(r.Product):
		return errors.New("the product code has uncommitted changes")
	case earlier.Product != r.Product:
		return fmt.Errorf("the earlier results measured other product code (%s)", earlier.Product)
	case earlier.Sizes != r.Sizes:
		return fmt.Errorf("the earlier results ran other sizes (%s)", earlier.Sizes)
	}
	ran := r.Parts[len(r.Parts)-1].Scenarios
	var runs []*Run
	for _, run := range earlier.Runs {
		if !slices.Contains(ran, run.Setting+"/"+run.Scenario) {
			runs = append(runs, run)
		}
	}
	r.Runs = append(runs, r.Runs...)
	// The page lists scenarios in the order the settings give, whichever part ran them.
	slices.SortStableFunc(r.Runs, func(a, b *Run) int {
		return slices.Index(order, a.Setting+"/"+a.Scenario) - slices.Index(order, b.Setting+"/"+b.Scenario)
	})
	r.Parts = append(earlier.Parts, r.Parts...)
	r.Started = earlier.Started
	r.FleetSettled = max(r.FleetSettled, earlier.FleetSettled)
	if f := earlier.Webhook; f != nil && (r.Webhook == nil || f.PeakRSSMiB > r.Webhook.PeakRSSMiB) {
		r.Webhook = f
	}
	r.Load = Load{}
	for i, p := range r.Parts {
		if i == 0 || p.Load.Min < r.Load.Min {
			r.Load.Min = p.Load.Min
		}
		r.Load.Max = max(r.Load.Max, p.Load.Max)
		r.Load.Samples += p.Load.Samples
	}
	for _, p := range r.Parts {
		r.Load.Mean += p.Load.Mean * float64(p.Load.Samples) / float64(max(r.Load.Samples, 1))
	}
	return nil
}

// withEarlierParts merges the saved results into r where mergeEarlier allows, and says what it
// did.
func withEarlierParts(r *Report, root string, c config) string {
	earlier, err := loadReport(root, c.resultsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return "no earlier part: the results start with this one"
	}
	if err == nil {
		err = mergeEarlier(r, earlier, scenarioNames(c.settings()))
	}
	if err != nil {
		return fmt.Sprintf("the earlier parts are replaced: %v", err)
	}
	return fmt.Sprintf("merged with the earlier parts (%d runs in all)", len(r.Runs))
}

// scenarioNames are the setting/scenario names of settings, in their order.
func scenarioNames(settings []setting) []string {
	var names []string
	for _, s := range settings {
		for _, sc := range s.Scenarios {
			names = append(names, s.Name+"/"+sc.Name)
		}
	}
	return names
}

// notRun names the scenarios of settings that no run of r measured, "" when none is missing:
// the page says a run in parts is not complete yet. The slow arrival counts only where its run
// asked for it (--slow).
func notRun(r *Report, settings []setting) string {
	ran := ranScenarios(r)
	var missing []string
	for _, s := range settings {
		for _, sc := range s.Scenarios {
			name := s.Name + "/" + sc.Name
			if !slices.Contains(ran, name) && (sc.Kind != "slow" || r.SlowRate > 0) {
				missing = append(missing, name)
			}
		}
	}
	return strings.Join(missing, ", ")
}

// writeParts says, for results gathered in more than one part, when each ran and what, and which
// scenarios are still to run.
func writeParts(b *bytes.Buffer, r *Report, settings []setting) {
	if missing := notRun(r, settings); missing != "" {
		fmt.Fprintf(b, "\n**Incomplete: not run yet: %s.**\n", missing)
	}
	if len(r.Parts) < 2 {
		return
	}
	fmt.Fprintf(b, "\nRun in %d parts on the same product code and sizes:", len(r.Parts))
	for i, p := range r.Parts {
		sep := ";"
		if i == len(r.Parts)-1 {
			sep = "."
		}
		fmt.Fprintf(b, " %s, %s%s", timeSpan(p.Started, p.Finished), strings.Join(p.Scenarios, ", "), sep)
	}
	fmt.Fprintln(b)
}

// ranScenarios are the setting/scenario names r's runs measured, in their order.
func ranScenarios(r *Report) []string {
	var names []string
	for _, run := range r.Runs {
		if name := run.Setting + "/" + run.Scenario; !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}
