package faults

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"
)

// evidence is what the JSON file beside the page holds: every arm of every scenario with each
// trial's counts, so that every verdict on the page can be computed again, and so that a run split
// by scenario into parts (FAULTS_MERGE=1, each part within a session) is one page.
type evidence struct {
	Seed  uint64 `json:"seed"`
	Sizes string `json:"sizes"`
	// Product is the last commit that changed the product (cmd, pkg, config, go.mod): parts of
	// other product code are never merged.
	Product     string             `json:"product"`
	Corrections []string           `json:"corrections,omitempty"`
	Parts       []partEvidence     `json:"parts"`
	Scenarios   []scenarioEvidence `json:"scenarios"`
}

type partEvidence struct {
	Started   time.Time `json:"started"`
	Took      string    `json:"took"`
	Scenarios []string  `json:"scenarios"`
}

type scenarioEvidence struct {
	Name     string          `json:"name"`
	Title    string          `json:"title"`
	Stock    bool            `json:"stock"`
	Failed   bool            `json:"failed,omitempty"`
	Compared []string        `json:"compared,omitempty"`
	Took     string          `json:"took"`
	Attempts int             `json:"attempts"`
	Admitted int             `json:"admitted"`
	Faults   []countEvidence `json:"faults,omitempty"`
	Counts   []countEvidence `json:"counts"`
	Info     []countEvidence `json:"info,omitempty"`
	Trials   []trialEvidence `json:"trials"`
	Lost     []int           `json:"lost,omitempty"`
}

type countEvidence struct {
	Name string `json:"name"`
	N    int64  `json:"n"`
}

type trialEvidence struct {
	// Table is the scenario's own table of the trial, Evidence the first events of each count.
	Table    []string            `json:"table,omitempty"`
	Evidence map[string][]string `json:"evidence,omitempty"`
	Load     string              `json:"load"`
	Stored   int                 `json:"stored"`
	Counts   map[string]int64    `json:"counts"`
	Capacity map[string]int64    `json:"capacity,omitempty"`
	Figures  []string            `json:"figures,omitempty"`
}

func jsonBeside(page string) string {
	return strings.TrimSuffix(page, ".md") + ".json"
}

// evidenceOf is the report's results, this part's (its scenarios ran) with the earlier parts'.
func (r *suiteReport) evidenceOf(s sizes, product string, ran []string) evidence {
	e := evidence{Seed: runSeed, Sizes: s.name, Product: product, Parts: slices.Clone(r.parts)}
	for _, c := range ipamCorrections {
		e.Corrections = append(e.Corrections, string(c))
	}
	part := partEvidence{Started: r.started, Took: time.Since(r.started).Round(time.Second).String(), Scenarios: ran}
	for _, res := range r.results {
		e.Scenarios = append(e.Scenarios, toEvidence(res))
	}
	e.Parts = append(e.Parts, part)
	return e
}

func toEvidence(res *scenarioResult) scenarioEvidence {
	counts := func(cs []namedCount) []countEvidence {
		var out []countEvidence
		for _, c := range cs {
			out = append(out, countEvidence{Name: c.name, N: c.n})
		}
		return out
	}
	se := scenarioEvidence{Name: res.name, Title: res.title, Stock: res.control, Failed: res.failed, Compared: res.compared,
		Took: res.duration.Round(time.Second).String(), Attempts: res.attempts, Admitted: res.admitted,
		Faults: counts(res.faults), Counts: counts(res.counts), Info: counts(res.info), Lost: res.lost}
	for i, tr := range res.perTrial {
		te := trialEvidence{Load: tr.load, Stored: tr.stored, Counts: tr.counts, Capacity: tr.capacity, Evidence: tr.evidence, Figures: tr.figures}
		if i < len(res.tables) {
			te.Table = res.tables[i]
		}
		se.Trials = append(se.Trials, te)
	}
	return se
}

func fromEvidence(se scenarioEvidence) *scenarioResult {
	counts := func(cs []countEvidence) []namedCount {
		var out []namedCount
		for _, c := range cs {
			out = append(out, namedCount{name: c.Name, n: c.N})
		}
		return out
	}
	took, _ := time.ParseDuration(se.Took)
	res := &scenarioResult{name: se.Name, title: se.Title, control: se.Stock, failed: se.Failed, compared: se.Compared,
		trials: len(se.Trials), duration: took, attempts: se.Attempts, admitted: se.Admitted,
		faults: counts(se.Faults), counts: counts(se.Counts), info: counts(se.Info), lost: se.Lost}
	for _, te := range se.Trials {
		res.perTrial = append(res.perTrial, trialCounts{load: te.Load, stored: te.Stored, counts: te.Counts, capacity: te.Capacity,
			evidence: te.Evidence, figures: te.Figures})
		if len(te.Table) > 0 {
			res.tables = append(res.tables, te.Table)
		}
	}
	return res
}

// resume takes up the earlier parts of a run from the evidence at path, when they measured the
// same product code at the same sizes against the same IPAM: their seed becomes this part's, and
// their scenarios this part does not run again go on the page; with more, the trials this part
// runs add to theirs instead of replacing them. It says what it did.
func (r *suiteReport) resume(path string, s sizes, product string, more bool) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "no earlier part in " + path, nil
	}
	if err != nil {
		return "", err
	}
	var e evidence
	if err := json.Unmarshal(data, &e); err != nil {
		return "the earlier parts in " + path + " are not this suite's evidence; starting afresh", nil
	}
	var corrections []string
	for _, c := range ipamCorrections {
		corrections = append(corrections, string(c))
	}
	switch {
	case e.Product != product || strings.Contains(product, "uncommitted"):
		return fmt.Sprintf("the earlier parts in %s measured other product code (%s, not %s); starting afresh", path, e.Product, product), nil
	case e.Sizes != s.name || !slices.Equal(e.Corrections, corrections):
		return fmt.Sprintf("the earlier parts in %s ran at the %s sizes with corrections %v; starting afresh", path, e.Sizes, e.Corrections), nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	runSeed = e.Seed
	r.parts, r.more = e.Parts, more
	for _, se := range e.Scenarios {
		if more {
			r.results = append(r.results, fromEvidence(se))
		} else {
			r.earlier = append(r.earlier, fromEvidence(se))
		}
	}
	return fmt.Sprintf("resuming a run of %d earlier parts from %s (seed %d)", len(e.Parts), path, e.Seed), nil
}

// merged puts the earlier parts' results of scenarios this part did not run beside this part's,
// in the suite's order of scenarios, and says which this part ran.
func (r *suiteReport) merged() []string {
	ran := r.ran
	if ran == nil {
		ran = map[string]bool{}
		for _, res := range r.results {
			ran[baseName(res.name)] = true
		}
	}
	var names []string
	for _, s := range scenarios {
		if ran[s.name] {
			names = append(names, s.name)
		}
	}
	for _, res := range r.earlier {
		if !ran[baseName(res.name)] {
			r.results = append(r.results, res)
		}
	}
	r.earlier = nil
	order := func(res *scenarioResult) int {
		i := slices.IndexFunc(scenarios, func(s scenarioSpec) bool { return s.name == baseName(res.name) })
		if res.control {
			return 2*i + 1
		}
		return 2 * i
	}
	slices.SortStableFunc(r.results, func(a, b *scenarioResult) int { return order(a) - order(b) })
	if r.more {
		// The earlier parts' trials of the scenarios this part ran are still on the page.
		return names
	}
	for i, p := range r.parts {
		p.Scenarios = slices.DeleteFunc(p.Scenarios, func(name string) bool { return ran[name] })
		r.parts[i] = p
	}
	r.parts = slices.DeleteFunc(r.parts, func(p partEvidence) bool { return len(p.Scenarios) == 0 })
	return names
}

func baseName(name string) string { return strings.TrimSuffix(name, "-stock") }

// missing are the suite's scenarios with no result on the page.
func (r *suiteReport) missing() []string {
	var out []string
	for _, s := range scenarios {
		if !slices.ContainsFunc(r.results, func(res *scenarioResult) bool { return res.name == s.name }) {
			out = append(out, s.name)
		}
	}
	return out
}

func writeEvidence(path string, e evidence) error {
	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// trialsDone is how many trials of a scenario the report holds: those of the earlier parts a part
// adds to (resume's more), which its trials follow.
func (r *suiteReport) trialsDone(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, res := range r.results {
		if res.name == name {
			return len(res.perTrial)
		}
	}
	return 0
}
