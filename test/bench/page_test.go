package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPageFromResults: the page make bench writes from the committed results opens with when it
// pays, names every compared scenario (and every scale scenario, once make bench-scale's results
// are committed), stays under 15 KB and quotes no commit.
func TestPageFromResults(t *testing.T) {
	report, scale, text := pageFromResults(t)
	if len(text) > 15000 {
		t.Errorf("page of %d bytes, want at most 15000", len(text))
	}
	if pays, ratios := strings.Index(text, "## When it pays"), strings.Index(text, "## Every ratio"); pays < 0 || ratios < pays {
		t.Errorf("the page does not open with when it pays (at %d, every ratio at %d)", pays, ratios)
	}
	for _, q := range report.Comparisons {
		if !strings.Contains(text, "| "+q.Setting+" | "+q.Scenario+" | ") {
			t.Errorf("no row for %s/%s", q.Setting, q.Scenario)
		}
	}
	if scale != nil && (scale.Fleet == 0 || scale.FleetSettled > 0) {
		_, section, found := strings.Cut(text, "## At scale")
		if !found {
			t.Fatal("scale results, but no At scale section")
		}
		for _, row := range scaleRows(scale) {
			if !strings.Contains(section, fmt.Sprintf("| %s | %s | %d | %d |", row.setting, row.scenario, row.machines, row.reps)) {
				t.Errorf("no At scale row for %s/%s", row.setting, row.scenario)
			}
		}
	}
	if hash := regexp.MustCompile(`\b[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*\b|\b[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b`).FindAllString(text, -1); len(hash) > 0 {
		for _, h := range hash {
			if len(h) >= 7 {
				t.Errorf("the page quotes %q, like a commit", h)
			}
		}
	}
}

func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		ratio, noise float64
		want         string
	}{
		{0.70, 0.10, "pays: 30% less"},
		{0.95, 0.10, "no difference beyond the noise"},
		{1.05, 0.10, "no difference beyond the noise"},
		{1.20, 0.10, "costs: 20% more"},
	} {
		if got := verdict(tc.ratio, tc.noise); got != tc.want {
			t.Errorf("verdict(%v, %v) = %q, want %q", tc.ratio, tc.noise, got, tc.want)
		}
	}
}

// pageFromResults writes the page from the committed results, as make bench does.
func pageFromResults(t *testing.T) (report, scale *Report, page string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "bench", "results", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	report = &Report{}
	if err := json.Unmarshal(data, report); err != nil {
		t.Fatal(err)
	}
	scale, err = loadReport(filepath.Join("..", ".."), filepath.Join("bench", "results", "scale"))
	if errors.Is(err, fs.ErrNotExist) {
		scale = nil
	} else if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := writePage(path, report, scale); err != nil {
		t.Fatal(err)
	}
	written, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return report, scale, string(written)
}

// readmeScenarios are the rows of the README's "When it pays" table, by the scenario they quote.
var readmeScenarios = map[string]string{
	"CAPM3 held, then resumed (a restart or upgrade under load)": "default-limits/backlog",
	"machines one after another":                                 "default-limits/idle",
	"a burst, the Metal3 IPAM's limits raised":                   "default-limits/burst-fast-ipam",
	"a burst at CAPM3's default limits":                          "default-limits/burst",
	"the same burst while the webhook's leader is killed":        "default-limits/leader-loss",
	"a burst, CAPM3's and the IPAM's limits raised":              "raised-limits/burst",
	"the same, over 10 templates":                                "raised-limits/burst-spread",
}

// TestReadmeQuotesTheResults: the README's "When it pays" table quotes the committed results as
// the page has them: each row's machines and both totals, and the page's verdict, to which it may
// add words but no figure the page does not check.
func TestReadmeQuotesTheResults(t *testing.T) {
	for _, q := range readmeQuotes(t, "| setting | scenario | what it models |", "| scenario | machines | stock |", readmeScenarios) {
		m, quoted := q.measured, q.quoted
		if got, want := quoted[1:4], []string{m[3], totalOf(m[4]), totalOf(m[5])}; !slices.Equal(got, want) {
			t.Errorf("%s: the README says machines, stock, preallocated %q; the results %q", q.scenario, got, want)
		}
		verdict, said := m[len(m)-1], quoted[4]
		added, ok := strings.CutPrefix(said, verdict)
		if !ok {
			t.Errorf("%s: the README says %q; the results %q", q.scenario, said, verdict)
		} else if proseFigure.MatchString(added) {
			t.Errorf("%s: the README adds %q to the results' verdict, with a figure no test checks", q.scenario, added)
		}
	}
}

// proseFigure is a number in prose: digits not inside a name such as CAPM3.
var proseFigure = regexp.MustCompile(`(^|\W)\d`)

// tableRows are the cells of the rows of the Markdown table under header.
func tableRows(text, header string) [][]string {
	_, table, found := strings.Cut(text, header)
	if !found {
		return nil
	}
	var rows [][]string
	for i, line := range strings.Split(table, "\n") {
		if i < 2 {
			continue // the rest of the header, and its rule
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows = append(rows, cells)
	}
	return rows
}

// readmeScaleScenarios are the scale scenarios the README's "at scale" table quotes, by its labels.
var readmeScaleScenarios = map[string]string{
	"CAPM3 held, then resumed":  "default-limits/backlog",
	"a burst over 10 templates": "default-limits/burst-spread",
}

// TestReadmeQuotesTheScaleResults: the README's "at scale" table quotes the committed scale
// results as the page has them: both totals and the ratio of every scale scenario.
func TestReadmeQuotesTheScaleResults(t *testing.T) {
	for _, q := range readmeQuotes(t, "| setting | scenario | machines | runs of each mode |", "| at scale | stock |", readmeScaleScenarios) {
		if got, want := q.quoted[1:4], []string{totalOf(q.measured[5]), totalOf(q.measured[6]), q.measured[7] + "×"}; !slices.Equal(got, want) {
			t.Errorf("%s: the README says stock, preallocated, ratio %q; the results %q", q.scenario, got, want)
		}
	}
}

// quote is a row of a README table and the page's row of the scenario it names.
type quote struct {
	scenario         string
	quoted, measured []string
}

// readmeQuotes pairs each row of the README's table under readmeHeader with the row of the page's
// table under pageHeader for the scenario scenarios gives for its label; the README quotes every
// one of them, and nothing else.
func readmeQuotes(t *testing.T, pageHeader, readmeHeader string, scenarios map[string]string) []quote {
	t.Helper()
	_, _, page := pageFromResults(t)
	measured := map[string][]string{}
	for _, cells := range tableRows(page, pageHeader) {
		measured[cells[0]+"/"+cells[1]] = cells
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := tableRows(string(readme), readmeHeader)
	if len(rows) != len(scenarios) {
		t.Errorf("the README's table %q has %d rows, want %d", readmeHeader, len(rows), len(scenarios))
	}
	var quotes []quote
	for _, row := range rows {
		if m := measured[scenarios[row[0]]]; m != nil {
			quotes = append(quotes, quote{scenarios[row[0]], row, m})
		} else {
			t.Errorf("the README's row %q quotes no measured scenario", row[0])
		}
	}
	return quotes
}

// totalOf is a page's "total, p50, ..." cell's total as the README quotes it.
func totalOf(cell string) string { return strings.Split(cell, ",")[0] + " s" }
