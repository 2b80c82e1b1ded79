package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPageFromResults: the page make bench writes from the committed results opens with when it
// pays, names every compared scenario (and every scale scenario, once make bench-scale's results
// are committed), stays under 15 KB and quotes no commit.
func TestPageFromResults(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "bench", "results", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	report := &Report{}
	if err := json.Unmarshal(data, report); err != nil {
		t.Fatal(err)
	}
	scale, err := loadReport(filepath.Join("..", ".."), filepath.Join("bench", "results", "scale"))
	if errors.Is(err, fs.ErrNotExist) {
		scale = nil
	} else if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := writePage(path, report, scale); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	if len(page) > 15000 {
		t.Errorf("page of %d bytes, want at most 15000", len(page))
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
