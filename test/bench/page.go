package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// scenarioModels says what each scenario stands for, for the reader deciding whether to install.
var scenarioModels = map[string]string{
	"idle":            "machines one after another, each once the previous one is Ready",
	"burst":           "a MachineDeployment scaled up: all its Metal3DataClaims at once, one template",
	"burst-fast-ipam": "the same burst with the Metal3 IPAM's client limits raised",
	"burst-spread":    "a burst over 10 templates",
	"backlog":         "CAPM3's Metal3Data controller held while the claims arrive, then resumed (a CAPM3 restart or upgrade)",
	"leader-loss":     "a burst during which the webhook's leader is killed",
	"slow":            "a MachineDeployment scaled up machine by machine: Metal3DataClaims at a steady rate",
}

// writePage writes docs/benchmarks.md from the report: what the run measured, when preallocation
// pays first, so that the page cannot drift from the figures; then the scale run's section, if
// there is one.
func writePage(path string, r, scale *Report) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `make bench` from `bench/results/results.json` (%s); nothing here is typed by hand.\n",
		timeSpan(r.Started, r.Finished))
	writeParts(&b, r, settings())
	fmt.Fprintln(&b, "\n## When it pays")
	fmt.Fprintln(&b, "\nStock CAPM3 and CAPM3 with ip-preallocator take turns in one run. Total: from the first Metal3DataClaim to the last Metal3Data Ready; the median time to Ready; means over the repetitions. The ratio is the mean of the repetitions' preallocated over stock totals, with the noise of the two modes' own runs.")
	fmt.Fprintln(&b, "\n| setting | scenario | what it models | machines | stock: total, median (s) | preallocated: total, median (s) | total ratio | noise | verdict |")
	fmt.Fprintln(&b, "|---|---|---|---:|---:|---:|---:|---:|---|")
	for _, q := range r.Comparisons {
		stock, pre := modeMeans(r, q.Setting, q.Scenario, modeStock), modeMeans(r, q.Setting, q.Scenario, modePreallocated)
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %.1f, %.2f | %.1f, %.2f | %.2f | ±%.0f%% | %s |\n", q.Setting, q.Scenario, scenarioModels[q.Scenario],
			stock.n, stock.total, stock.median, pre.total, pre.median, q.Total, 100*q.NoiseTotal, verdict(q.Total, q.NoiseTotal))
	}
	fmt.Fprintln(&b, "\nA verdict is \"pays\" or \"costs\" only where the ratio is outside the noise.")
	fmt.Fprintln(&b, "\n## Speed check")
	printSpeedCheck(&b, r.Paired)
	writeCosts(&b, r)
	if scale != nil {
		writeScaleSection(&b, scale)
	}
	fmt.Fprintln(&b, "\n## Every ratio")
	printComparisons(&b, r)
	printAPIServerCPU(&b, r)
	fmt.Fprintln(&b, "\n![Time to Ready, every run](../bench/results/time-to-ready.png)")
	fmt.Fprintln(&b, "\n## How it was measured")
	fmt.Fprintln(&b, "\n`make bench` runs the real CAPM3 v1.13.2 Metal3DataTemplate and Metal3Data controllers and the Metal3 IPAM v1.13.2 in-process, as their `main.go` set them up (concurrency 10, client rate limit 20/s burst 30 per resource type, Secrets and BareMetalHosts read uncached), and the Cluster API in-cluster IPAM provider v1.1.0 as a process (as its `main.go` sets it up: one worker, no client rate limit), against a local kube-apiserver with an audit log. It creates Metal3DataClaims as CAPM3's Metal3Machine controller does, so the Metal3Data arrive through CAPM3's own template loop and the webhook. Each scenario runs stock (webhook not registered), preallocated and, with raised limits, a no-op webhook, alternating the order between repetitions; \"raised limits\" raises CAPM3's and the Metal3 IPAM's client limits and declares CAPM3's in its Deployment, where the webhook reads them and steps aside (\"preallocated\" there). `bench/results/results.json` has every run.")
	fmt.Fprintln(&b, "\n## Machine")
	fmt.Fprintf(&b, "\n%s cores (%s), %s memory, %s, %s. Load average (1 min) during the run: min %.1f, mean %.1f, max %.1f.\n",
		r.Machine["cpus"], r.Machine["cpu"], r.Machine["memory"], r.Machine["go"], r.Machine["os"], r.Load.Min, r.Load.Mean, r.Load.Max)
	if f := r.Webhook; f != nil {
		fmt.Fprintf(&b, "The webhook process peaked at %.0f MiB RSS.\n", f.PeakRSSMiB)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// rewritePage writes the page from the saved results of make bench and, once it has run, of make
// bench-scale.
func rewritePage(root string, c config) (*Report, error) {
	report, err := loadReport(root, c.results)
	if err != nil {
		return nil, err
	}
	scale, err := loadReport(root, c.scaleResults)
	if errors.Is(err, fs.ErrNotExist) {
		scale = nil
	} else if err != nil {
		return nil, err
	}
	if err := save(report, root, c.results, io.Discard); err != nil {
		return nil, err
	}
	if scale != nil {
		if err := save(scale, root, c.scaleResults, io.Discard); err != nil {
			return nil, err
		}
	}
	return report, writePage(filepath.Join(root, c.page), report, scale)
}

func loadReport(root, dir string) (*Report, error) {
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return nil, err
	}
	report := &Report{}
	if err := json.Unmarshal(data, report); err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	// The verdicts follow the check's rules as they are now, not as they were when saved.
	report.Paired = pairedVerdicts(report.Comparisons, report.WebhookCosts)
	return report, nil
}

type means struct {
	n             int
	total, median float64
}

// modeMeans averages one mode's runs of a scenario.
func modeMeans(r *Report, setting, scenario, mode string) means {
	var m means
	var runs float64
	for _, run := range r.Runs {
		if run.Setting == setting && run.Scenario == scenario && run.Mode == mode {
			m.n = run.N
			m.total += run.Total
			m.median += run.Ready.P50
			runs++
		}
	}
	if runs > 0 {
		m.total, m.median = m.total/runs, m.median/runs
	}
	return m
}

// verdict reads a ratio of preallocated over stock against the noise of the run.
func verdict(ratio, noise float64) string {
	switch {
	case ratio < 1-noise:
		return fmt.Sprintf("pays: %.0f%% less", 100*(1-ratio))
	case ratio > 1+noise:
		return fmt.Sprintf("costs: %.0f%% more", 100*(ratio-1))
	}
	return "no difference beyond the noise"
}

// timeSpan says when something ran, in UTC, with the end's date where it is another day's.
func timeSpan(start, end time.Time) string {
	start, end = start.UTC(), end.UTC()
	to := end.Format("15:04")
	if end.Format(time.DateOnly) != start.Format(time.DateOnly) {
		to = end.Format("2006-01-02 15:04")
	}
	return start.Format("2006-01-02 15:04") + " to " + to + " UTC"
}
