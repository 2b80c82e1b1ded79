// Command demo runs ip-preallocator on an embedded control plane next to the real CAPM3 v1.13.2
// Metal3Data controller and the real Metal3 IPAM v1.13.2, applies examples/, and reports for each
// Metal3Data its claims, addresses, time to Ready and CAPM3's reconciles.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

type options struct {
	dir     string
	exit    bool
	timeout time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".demo", "Directory for the kubeconfig and the logs, relative to the repository.")
	flag.BoolVar(&o.exit, "exit-after-summary", false, "Stop once every example Metal3Data is Ready and reported.")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "How long the examples may take to become Ready.")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// Row is the report of one Metal3Data.
type Row struct {
	Name          string
	ReadyAfter    time.Duration
	Reconciles    int
	Requeues      int
	ClaimsByCAPM3 int
	// Claims maps a claim to its allocated address.
	Claims map[string]string
}

func run(ctx context.Context, o options, out io.Writer) ([]Row, error) {
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
	cp, err := harness.Start(ctx, harness.Options{Webhook: true, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.Rename(cp.Kubeconfig, kubeconfig); err != nil {
		return nil, err
	}
	cp.Kubeconfig = kubeconfig

	fmt.Fprintln(out, "Starting CAPM3 v1.13.2's Metal3Data controller and Metal3 IPAM v1.13.2 in-process...")
	ipam, err := stack.StartIPAM(ctx, cp.Config, stack.Options{})
	if err != nil {
		return nil, err
	}
	defer ipam.Stop()
	capm3, err := stack.StartCAPM3(ctx, cp.Config, stack.Options{})
	if err != nil {
		return nil, err
	}
	defer capm3.Stop()

	ready, err := stack.WatchReadiness(ctx, cp.Config)
	if err != nil {
		return nil, err
	}

	fmt.Fprintln(out, "kubectl apply -f examples/")
	stdout, _, err := cp.Kubectl(ctx, nil, "apply", "-f", filepath.Join(root, "examples"))
	fmt.Fprint(out, indent(stdout))
	if err != nil {
		return nil, err
	}
	names, _, err := cp.Kubectl(ctx, nil, "get", "-f", filepath.Join(root, "examples", "30-metal3data.yaml"), "-o", "name")
	if err != nil {
		return nil, err
	}
	want := len(strings.Fields(names))

	deadline := time.After(o.timeout)
	for len(ready.ReadyIn("")) < want {
		select {
		case <-ready.News:
		case <-deadline:
			return nil, fmt.Errorf("only %d of %d Metal3Data became Ready within %v; see %s", len(ready.ReadyIn("")), want, o.timeout, dir)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// CAPM3's reconcile that follows its own status update finishes after Ready is observed.
	time.Sleep(time.Second)
	rows, err := report(ctx, cp.Client, capm3.Counter, ready)
	if err != nil {
		return nil, err
	}
	printRows(out, rows)
	if o.exit {
		return rows, nil
	}

	fmt.Fprintf(out, "\nThe control plane keeps running. Try:\n  kubectl --kubeconfig %s get metal3datas,ipclaims,ipaddresses -A\n", kubeconfig)
	fmt.Fprintf(out, "  kubectl --kubeconfig %s apply -f examples/more/\nNew Metal3Data are reported when Ready. Interrupt to stop.\n", kubeconfig)
	for {
		select {
		case <-ctx.Done():
			return rows, nil
		case key := <-ready.News:
			more, err := report(ctx, cp.Client, capm3.Counter, ready)
			if err != nil {
				return rows, err
			}
			printRows(out, slices.DeleteFunc(more, func(r Row) bool { return r.Name != key.String() }))
		}
	}
}

func report(ctx context.Context, c client.Client, counter *stack.Counter, ready *stack.Readiness) ([]Row, error) {
	var rows []Row
	for key, at := range ready.ReadyIn("") {
		seen, _ := ready.Seen(key)
		stats := counter.Of(key)
		row := Row{Name: key.String(), ReadyAfter: at.Sub(seen), Reconciles: stats.Reconciles, Requeues: stats.Requeues,
			ClaimsByCAPM3: stats.ClaimsCreated, Claims: map[string]string{}}
		claims := &ipamv1.IPClaimList{}
		if err := c.List(ctx, claims, client.InNamespace(key.Namespace)); err != nil {
			return nil, err
		}
		for _, claim := range claims.Items {
			if !ownedBy(claim.OwnerReferences, key.Name) || claim.Status.Address == nil {
				continue
			}
			addr := &ipamv1.IPAddress{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: claim.Status.Address.Name}, addr); err != nil {
				return nil, err
			}
			row.Claims["IPClaim/"+claim.Name] = fmt.Sprintf("%s/%d", addr.Spec.Address, addr.Spec.Prefix)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b Row) int { return strings.Compare(a.Name, b.Name) })
	return rows, nil
}

func ownedBy(refs []metav1.OwnerReference, name string) bool {
	return slices.ContainsFunc(refs, func(r metav1.OwnerReference) bool { return r.Kind == "Metal3Data" && r.Name == name })
}

func printRows(out io.Writer, rows []Row) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nMETAL3DATA\tREADY AFTER\tCAPM3 RECONCILES\tREQUEUES\tCLAIMS BY CAPM3\tCLAIMS AND ADDRESSES")
	for _, r := range rows {
		var claims []string
		for _, name := range slices.Sorted(maps.Keys(r.Claims)) {
			claims = append(claims, name+"="+r.Claims[name])
		}
		fmt.Fprintf(w, "%s\t%v\t%d\t%d\t%d\t%s\n", r.Name, r.ReadyAfter.Round(time.Millisecond), r.Reconciles, r.Requeues,
			r.ClaimsByCAPM3, strings.Join(claims, " "))
	}
	w.Flush()
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}
