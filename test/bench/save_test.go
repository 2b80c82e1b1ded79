package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEncodeReport: each machine's times are kept to the millisecond, an array of numbers or plain
// words takes one line, and nothing else changes.
func TestEncodeReport(t *testing.T) {
	report := &Report{Runs: []*Run{{
		Mode:        "stock",
		TimeToReady: []float64{167.951106414, 2},
		BeforeData:  []float64{0.0004999},
		Histories:   []string{"w,,W.", "wp,W."},
		Requests:    map[string]map[string]float64{"capm3": {"GET secrets": 2.5}},
	}, {
		Mode:      "preallocated",
		Histories: []string{"has a space"},
	}}}
	data, err := encodeReport(report)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, want := range []string{`"TimeToReady": [167.951,2]`, `"BeforeData": [0]`, `"Histories": ["w,,W.","wp,W."]`, "\"Histories\": [\n        \"has a space\"\n      ]"} {
		if !strings.Contains(text, want) {
			t.Errorf("encoded report lacks %q:\n%s", want, text)
		}
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Runs[0].TimeToReady, []float64{167.951, 2}) || back.Runs[1].Histories[0] != "has a space" || back.Runs[0].Requests["capm3"]["GET secrets"] != 2.5 {
		t.Errorf("decoded back as %+v", back.Runs)
	}
}

// TestCommittedResultsAsWritten: the committed results are what the bench writes now (a rewrite by
// --page-only changes nothing in them), and each stays under 1 MB.
func TestCommittedResultsAsWritten(t *testing.T) {
	for _, dir := range []string{"results", filepath.Join("results", "scale")} {
		path := filepath.Join("..", "..", "bench", dir, "results.json")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > 1<<20 {
			t.Errorf("%s: %d bytes, over 1 MB", path, len(data))
		}
		report := &Report{}
		if err := json.Unmarshal(data, report); err != nil {
			t.Fatal(err)
		}
		again, err := encodeReport(report)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, data) {
			t.Errorf("%s is not as the bench writes it now (%d bytes, rewritten %d): run go run ./bench --page-only", path, len(data), len(again))
		}
	}
}

func TestTimeSpan(t *testing.T) {
	start := time.Date(2026, 12, 6, 23, 29, 10, 0, time.UTC)
	for end, want := range map[time.Time]string{
		start.Add(30 * time.Minute): "2026-12-06 23:29 to 23:59 UTC",
		start.Add(36 * time.Minute): "2026-12-06 23:29 to 2026-12-07 00:05 UTC",
	} {
		if got := timeSpan(start, end); got != want {
			t.Errorf("timeSpan(%v, %v) = %q, want %q", start, end, got, want)
		}
	}
}
