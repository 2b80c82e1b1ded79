// Command demo runs ip-preallocator on an embedded control plane next to the real CAPM3 v1.13.2
// Metal3DataTemplate and Metal3Data controllers and the real Metal3 IPAM v1.13.2, applies examples/
// once with stock CAPM3 (the mutating webhook not registered) and once with the webhook, and
// reports side by side, for each machine, when CAPM3's template controller created its Metal3Data,
// its time to Ready, CAPM3's reconciles, who created its claims and its addresses. A second act
// holds CAPM3's Metal3Data controller while a batch of machines arrives, then lets it go, in both
// modes: where preallocation pays.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

type options struct {
	dir     string
	exit    bool
	timeout time.Duration
	// held machines arrive in the second act, while CAPM3 is held for heldFor.
	held    int
	heldFor time.Duration
}

// result is what the demo reported: one row per example Metal3Data, and the second act by mode.
type result struct {
	Rows []Row
	Held []Held
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".demo", "Directory for the kubeconfig and the logs, relative to the repository.")
	flag.BoolVar(&o.exit, "exit-after-summary", false, "Stop once every example Metal3Data is Ready and reported.")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "How long the examples may take to become Ready.")
	flag.IntVar(&o.held, "held-machines", 12, "Machines that arrive in the second act, while CAPM3's Metal3Data controller is held.")
	flag.DurationVar(&o.heldFor, "held-for", 10*time.Second, "How long CAPM3's Metal3Data controller is held in the second act, from the first machine.")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	_, err := run(ctx, o, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, out io.Writer) (*result, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir := o.dir
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logs, err := harness.LogControllersTo(filepath.Join(dir, "controllers.log"))
	if err != nil {
		return nil, err
	}
	defer logs.Close()

	fmt.Fprintln(out, "Starting etcd, kube-apiserver and the ip-preallocator webhook...")
	// The audit log tells when each create request arrived and whether the webhook answered it.
	cp, err := harness.Start(ctx, harness.Options{Webhook: true, Dir: dir, AuditLog: true})
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.Rename(cp.Kubeconfig, kubeconfig); err != nil {
		return nil, err
	}
	cp.Kubeconfig = kubeconfig

	fmt.Fprintln(out, "Starting CAPM3 v1.13.2's Metal3DataTemplate and Metal3Data controllers and Metal3 IPAM v1.13.2 in-process, their caches synced...")
	ipam, err := stack.StartIPAM(ctx, cp.Config, stack.Options{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = ipam.Stop() }()
	// The second act's namespaces have a CAPM3 of their own; this one, which keeps running after
	// the acts, reconciles every other namespace, as CAPM3 does on a cluster.
	capm3, err := stack.StartCAPM3(ctx, cp.Config, stack.Options{Templates: true, ExceptNamespaces: heldNamespaces()})
	if err != nil {
		return nil, err
	}
	defer func() { _ = capm3.Stop() }()
	if err := capm3.WarmUp(ctx); err != nil {
		return nil, err
	}
	d := &demo{cp: cp, root: root, out: out, counter: capm3.Counter, timeout: o.timeout}
	if d.ready, err = stack.WatchReadiness(ctx, cp.Config); err != nil {
		return nil, err
	}
	if d.origins, err = watchClaimOrigins(ctx, cp.Config); err != nil {
		return nil, err
	}

	res, err := d.compare(ctx, o)
	if err != nil {
		return nil, err
	}
	if o.exit {
		return res, nil
	}
	// Relative to the repository, like examples/more/: make demo runs from there.
	if rel, err := filepath.Rel(root, kubeconfig); err == nil && !strings.HasPrefix(rel, "..") {
		kubeconfig = rel
	}
	fmt.Fprintln(out, "\n"+wrap(fmt.Sprintf("The control plane keeps running, with the webhook registered, and CAPM3 and the IPAM reconcile every "+
		"namespace but the second act's (%s, whose CAPM3 has stopped): what you apply in %s or a namespace of your own "+
		"is admitted, preallocated and made Ready as on a cluster. Try:", strings.Join(heldNamespaces(), ", "), preallocatedNamespace)))
	fmt.Fprintf(out, "  kubectl --kubeconfig %s get metal3datas,ipclaims,ipaddresses -A\n", kubeconfig)
	fmt.Fprintf(out, "  kubectl --kubeconfig %s apply -n %s -f examples/more/\n", kubeconfig, preallocatedNamespace)
	fmt.Fprintf(out, "  kubectl --kubeconfig %s create namespace mine\n", kubeconfig)
	fmt.Fprintf(out, "  kubectl --kubeconfig %s apply -n mine -f examples/10-cluster.yaml -f examples/20-machines.yaml\n", kubeconfig)
	fmt.Fprintln(out, "New Metal3Data are reported when Ready. Interrupt to stop.")
	d.reportNew(ctx, res.Rows)
	return res, nil
}

// compare runs examples/ in every mode, prints the table and the comparison, runs the second act,
// and leaves the webhook registered.
func (d *demo) compare(ctx context.Context, o options) (*result, error) {
	var keys []types.NamespacedName
	for _, m := range modes {
		k, err := d.runMode(ctx, m)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k...)
	}
	rows, err := d.rows(ctx, keys)
	if err != nil {
		return nil, err
	}
	// The baseline first, then what the webhook changes.
	display := []string{modeStock, modePreallocated}
	slices.SortStableFunc(rows, func(a, b Row) int { return slices.Index(display, a.Mode) - slices.Index(display, b.Mode) })
	fmt.Fprintln(d.out)
	printTable(d.out, rows)
	fmt.Fprintln(d.out, wrap(legend))
	printComparison(d.out, rows)
	held, err := d.heldAct(ctx, o.held, o.heldFor)
	if err != nil {
		return nil, err
	}
	if err := d.setWebhook(ctx, preallocatedNamespace, true); err != nil {
		return nil, err
	}
	return &result{Rows: rows, Held: held}, nil
}

// reportNew reports each Metal3Data that becomes Ready from now on, until ctx ends.
func (d *demo) reportNew(ctx context.Context, reported []Row) {
	done := map[types.NamespacedName]bool{}
	for _, r := range reported {
		done[r.Data] = true
	}
	for {
		select {
		case <-ctx.Done():
			return
		case key := <-d.ready.News:
			if done[key] {
				continue
			}
			done[key] = true
			// Let CAPM3's reconcile woken by its own status update be counted.
			time.Sleep(settle)
			// Whatever a person applies, the demo keeps running: a Metal3Data it cannot report (one
			// created with generateName has no name in the audit log) gets a line, not an exit.
			rows, err := d.rows(ctx, []types.NamespacedName{key})
			if err != nil {
				fmt.Fprintf(d.out, "\nMetal3Data %s is Ready; not reported: %v\n", key, err)
				continue
			}
			fmt.Fprintln(d.out)
			printTable(d.out, rows)
		}
	}
}
