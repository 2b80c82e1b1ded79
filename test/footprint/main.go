// Command footprint measures the webhook's memory against the size of the fleet it caches: it
// writes a standing fleet of Ready machines (Metal3Data, claims, IPAddresses, BareMetalHosts and
// the CAPI and CAPM3 objects around them) directly, as a restore from backup would, over 10
// namespaces with three pools each, starts the webhook on it, and reads its resident memory once
// its caches have synced; then grows the fleet and starts it again. It writes docs/footprint.md
// and fails when the largest fleet takes more than the budget.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

const (
	// namespaces the fleet is spread over, each with its own three pools.
	namespaces = 10
	// budgetMiB is the most the webhook may hold resident with the largest fleet cached.
	budgetMiB = 200
	// settle is how long the webhook runs on a synced cache before its memory is read: past the
	// Go runtime's forced collection every two minutes, so that the garbage of the initial lists
	// is collected and returned, as in a webhook that has run for a while.
	settle = 150 * time.Second
)

type measurement struct {
	machines  int
	rssMiB    float64
	peakMiB   float64
	heapMiB   float64
	cached    map[string]float64
	syncedIn  time.Duration
	writtenIn time.Duration
}

func main() {
	sizes := flag.String("sizes", "0,1000,5000", "Fleet sizes, ascending, at which the webhook's memory is read.")
	page := flag.String("page", "docs/footprint.md", "Page written from the measurements, relative to the repository; empty for none.")
	flag.Parse()
	log.SetLogger(klog.NewKlogr())
	if err := runUntilSignal(*sizes, *page); err != nil {
		fmt.Fprintln(os.Stderr, "footprint:", err)
		os.Exit(1)
	}
}

// runUntilSignal measures, cancelled by an interrupt or SIGTERM.
func runUntilSignal(sizes, page string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, sizes, page)
}

func run(ctx context.Context, sizeList, page string) error {
	var sizes []int
	for _, s := range strings.Split(sizeList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || len(sizes) > 0 && n < sizes[len(sizes)-1] {
			return fmt.Errorf("--sizes %q: want ascending fleet sizes", sizeList)
		}
		sizes = append(sizes, n)
	}
	started := time.Now()
	cp, err := harness.Start(ctx, harness.Options{Webhook: true})
	if err != nil {
		return err
	}
	defer cp.Stop()
	templates, err := prepare(ctx, cp)
	if err != nil {
		return err
	}
	var results []measurement
	written := 0
	for _, n := range sizes {
		begin := time.Now()
		if err := harness.WriteFleet(ctx, cp.Client, templates, written, n); err != nil {
			return err
		}
		m, err := measure(ctx, cp, n)
		if err != nil {
			return err
		}
		m.writtenIn = time.Since(begin) - m.syncedIn - settle
		written = n
		fmt.Printf("%d machines: RSS %.0f MiB (peak %.0f), heap in use %.0f MiB, cache synced in %s, cached %v\n", n, m.rssMiB, m.peakMiB, m.heapMiB, m.syncedIn.Round(time.Millisecond), m.cached)
		results = append(results, m)
	}
	text := report(results, started)
	fmt.Print(text)
	if page != "" {
		root, err := harness.RepoRoot()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, page), []byte(text), 0o644); err != nil {
			return err
		}
	}
	if last := results[len(results)-1]; last.rssMiB > budgetMiB {
		return fmt.Errorf("%d machines: the webhook holds %.0f MiB resident, above the budget of %d MiB", last.machines, last.rssMiB, budgetMiB)
	}
	return nil
}

// prepare stores the fleet's namespaces while the webhook runs (it validates templates), then
// takes the webhook out of the Metal3Data path and stops it, so that the fleet is written as a
// restore would write it and each measurement starts a fresh process.
func prepare(ctx context.Context, cp *harness.ControlPlane) ([]*infrav1.Metal3DataTemplate, error) {
	templates, err := harness.FleetNamespaces(ctx, cp.Client, namespaces)
	if err != nil {
		return nil, err
	}
	if err := cp.UnregisterMutatingWebhooks(ctx); err != nil {
		return nil, err
	}
	cp.StopWebhook()
	return templates, nil
}

// measure starts the webhook on the fleet, waits for its caches, lets it settle and reads its
// resident memory, its Go heap and its cache sizes, then stops it.
func measure(ctx context.Context, cp *harness.ControlPlane, machines int) (measurement, error) {
	m := measurement{machines: machines, cached: map[string]float64{}}
	start := time.Now()
	if err := cp.StartWebhook(ctx); err != nil {
		return m, err
	}
	defer cp.StopWebhook()
	m.syncedIn = time.Since(start)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return m, ctx.Err()
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cp.WebhookPid()))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			m.rssMiB = kibToMiB(v)
		}
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			m.peakMiB = kibToMiB(v)
		}
	}
	metrics, err := cp.Metrics()
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			b, _ := strconv.ParseFloat(v, 64)
			m.heapMiB = b / (1 << 20)
		}
		if series, ok := strings.CutPrefix(line, "ip_preallocator_cached_objects{"); ok {
			labels, value, _ := strings.Cut(series, "} ")
			v, _ := strconv.ParseFloat(value, 64)
			m.cached[labels] = v
		}
	}
	return m, nil
}

func kibToMiB(field string) float64 {
	kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(field), " kB"))
	return float64(kb) / 1024
}

// report is the page: the figures per fleet size and the growth per 1,000 machines between the
// two largest.
func report(results []measurement, started time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Memory: the webhook against the size of the fleet\n\nWritten by `make footprint` on %s UTC, from the figures that run measured; nothing here is typed by hand.\n\n",
		started.UTC().Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, "A standing fleet of Ready machines, written directly as a restore from backup would, over %d namespaces with two Metal3 IPPools and one InClusterIPPool each: per machine a Machine, a BareMetalHost, a Metal3Machine with the status of a provisioned host, a Metal3DataClaim, a Metal3Data, two IPClaims with their IPAddresses and an IPAddressClaim. The webhook starts on it with the release's flags (leader election on), and its memory is read %s after its caches synced.\n\n", namespaces, settle)
	fmt.Fprintln(&b, "| machines | resident (MiB) | peak resident since start, in practice while the caches synced (MiB) | Go heap in use (MiB) | caches synced in | objects cached |")
	fmt.Fprintln(&b, "|---:|---:|---:|---:|---:|---:|")
	for _, m := range results {
		total := 0.0
		for _, v := range m.cached {
			total += v
		}
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.0f | %s | %.0f |\n", m.machines, m.rssMiB, m.peakMiB, m.heapMiB, m.syncedIn.Round(100*time.Millisecond), total)
	}
	if n := len(results); n >= 2 && results[n-1].machines > results[n-2].machines {
		hi, lo := results[n-1], results[n-2]
		per := 1000 * (hi.rssMiB - lo.rssMiB) / float64(hi.machines-lo.machines)
		heap := 1000 * (hi.heapMiB - lo.heapMiB) / float64(hi.machines-lo.machines)
		verdict := "within it"
		if hi.rssMiB > budgetMiB {
			verdict = "**above it**"
		}
		fmt.Fprintf(&b, "\nEach 1,000 machines add %.0f MiB resident (%.0f MiB of Go heap), from %d to %d machines. Budget: %d MiB resident with %d machines cached: %s.\n",
			per, heap, lo.machines, hi.machines, budgetMiB, hi.machines, verdict)
	}
	return b.String()
}
