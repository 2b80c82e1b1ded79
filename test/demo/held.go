package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// Held is one mode of the second act: machines that arrive while CAPM3's Metal3Data controller is
// held, as after a CAPM3 restart or upgrade, then let go.
type Held struct {
	Mode string
	N    int
	// AfterRelease is from letting CAPM3 go to the last Metal3Data Ready; MedianAfterRelease the
	// median over the machines.
	AfterRelease, MedianAfterRelease time.Duration
	// CAPM3's reconciles of the act's Metal3Data: all of them, those that did work (created claims
	// or rendered the data) and those that asked to run again.
	Reconciles, Work, Requeues int
	Claims, ClaimsByCAPM3      int
}

// heldNamespace is the second act's namespace of a mode.
func heldNamespace(m mode) string { return m.namespace + "-held" }

// heldNamespaces are the second act's namespaces, known before the first act's CAPM3 starts: it
// leaves them to the second act's.
func heldNamespaces() []string {
	var out []string
	for _, m := range modes {
		out = append(out, heldNamespace(m))
	}
	return out
}

// heldAct runs the second act in every mode. Each mode has a CAPM3 of its own, watching only its
// namespace and held from the start; the first act's CAPM3 watches every namespace but these.
func (d *demo) heldAct(ctx context.Context, n int, pause time.Duration) ([]Held, error) {
	fmt.Fprintln(d.out, wrap(fmt.Sprintf("\nSecond act: CAPM3's Metal3Data controller is held while %d machines arrive, then let go %v after "+
		"the first, as after a CAPM3 restart or upgrade under load. Its Metal3DataTemplate controller and the IPAM keep working.", n, pause)))
	var out []Held
	for _, m := range modes {
		h, err := d.heldMode(ctx, m, n, pause)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	printHeld(d.out, out, pause)
	return out, nil
}

func (d *demo) heldMode(ctx context.Context, m mode, n int, pause time.Duration) (Held, error) {
	ns := heldNamespace(m)
	fmt.Fprintf(d.out, "\n%s, namespace %s\n", m.name, ns)
	if err := d.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return Held{}, err
	}
	if err := d.setWebhook(ctx, ns, m.webhook); err != nil {
		return Held{}, err
	}
	capm3, err := stack.StartCAPM3(ctx, d.cp.Config, stack.Options{Namespaces: []string{ns}, Templates: true, HoldMetal3Data: true})
	if err != nil {
		return Held{}, err
	}
	defer func() { _ = capm3.Stop() }()
	if err := capm3.WarmUp(ctx); err != nil {
		return Held{}, err
	}
	if err := d.apply(ctx, ns, "10-cluster.yaml"); err != nil {
		return Held{}, err
	}
	if _, err := d.waitPools(ctx, ns); err != nil {
		return Held{}, err
	}
	machines, claims, err := d.heldMachines(n, ns)
	if err != nil {
		return Held{}, err
	}
	if err := createAll(ctx, d.cp.Client, machines); err != nil {
		return Held{}, err
	}
	first := time.Now()
	if err := createAll(ctx, d.cp.Client, claims); err != nil {
		return Held{}, err
	}
	fmt.Fprintf(d.out, "  %d machines created, their Metal3DataClaims at once; CAPM3's Metal3Data controller held\n", n)
	time.Sleep(time.Until(first.Add(pause)))
	released := time.Now()
	capm3.ReleaseMetal3Data()
	keys, err := d.dataOfClaims(ctx, ns, claims)
	if err != nil {
		return Held{}, err
	}
	if err := d.waitReady(ctx, keys); err != nil {
		return Held{}, err
	}
	time.Sleep(settle)
	h, err := d.heldResult(ctx, m.name, ns, capm3.Counter, keys, released)
	if err == nil {
		fmt.Fprintf(d.out, "  CAPM3 let go; %d Metal3Data Ready %v later\n", h.N, h.AfterRelease.Round(time.Millisecond))
	}
	return h, err
}

// heldMachines makes n machines from examples/20-machines.yaml's first one (worker-0 on host-0),
// renamed held-<i> on held-host-<i>, in namespace ns: their Machine, BareMetalHost and
// Metal3Machine, and their Metal3DataClaim apart.
func (d *demo) heldMachines(n int, ns string) (machines, claims []*unstructured.Unstructured, err error) {
	data, err := os.ReadFile(filepath.Join(d.root, "examples", "20-machines.yaml"))
	if err != nil {
		return nil, nil, err
	}
	var first []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains(doc, "name: worker-0\n") || strings.Contains(doc, "name: host-0\n") {
			first = append(first, doc)
		}
	}
	for i := range n {
		text := strings.Join(first, "\n---\n")
		text = strings.NewReplacer("worker-0", fmt.Sprintf("held-%d", i), "host-0", fmt.Sprintf("held-host-%d", i)).Replace(text)
		objs, err := harness.DecodeYAML([]byte(text))
		if err != nil {
			return nil, nil, err
		}
		for _, o := range objs {
			o.SetNamespace(ns)
			if o.GetKind() == "Metal3DataClaim" {
				claims = append(claims, o)
			} else {
				machines = append(machines, o)
			}
		}
	}
	if len(claims) != n || len(machines) != 3*n {
		return nil, nil, fmt.Errorf("examples/20-machines.yaml: %d claims and %d other objects for %d machines, want one claim and a Machine, BareMetalHost and Metal3Machine each", len(claims), len(machines), n)
	}
	return machines, claims, nil
}

// createAll creates the objects at once, as controllers would.
func createAll(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	errs := make(chan error, len(objs))
	var wg sync.WaitGroup
	for _, o := range objs {
		wg.Go(func() {
			if err := c.Create(ctx, o); err != nil {
				errs <- fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// dataOfClaims waits until CAPM3's template controller has created a Metal3Data for each claim
// and names them.
func (d *demo) dataOfClaims(ctx context.Context, ns string, claims []*unstructured.Unstructured) ([]types.NamespacedName, error) {
	return poll(ctx, d.timeout, "CAPM3 to create the Metal3Data", func() ([]types.NamespacedName, bool, error) {
		var keys []types.NamespacedName
		for _, u := range claims {
			claim := &infrav1.Metal3DataClaim{}
			if err := d.cp.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: u.GetName()}, claim); err != nil {
				return nil, false, err
			}
			if claim.Status.RenderedData == nil {
				return nil, false, nil
			}
			keys = append(keys, types.NamespacedName{Namespace: ns, Name: claim.Status.RenderedData.Name})
		}
		return keys, true, nil
	})
}

func (d *demo) heldResult(ctx context.Context, mode, ns string, counter *stack.Counter, keys []types.NamespacedName, released time.Time) (Held, error) {
	h := Held{Mode: mode, N: len(keys)}
	var after []time.Duration
	for _, key := range keys {
		readyAt, _ := d.ready.Ready(key)
		after = append(after, readyAt.Sub(released))
		h.AfterRelease = max(h.AfterRelease, readyAt.Sub(released))
		stats := counter.Of(key)
		h.Reconciles += stats.Reconciles
		h.Work += stats.WorkReconciles
		h.Requeues += stats.Requeues
		h.ClaimsByCAPM3 += stats.ClaimsCreated
	}
	h.MedianAfterRelease = median(after)
	claims := &ipamv1.IPClaimList{}
	if err := d.cp.Client.List(ctx, claims, client.InNamespace(ns)); err != nil {
		return Held{}, err
	}
	h.Claims = len(claims.Items)
	return h, nil
}

// printHeld prints the second act's table and what the webhook changed.
func printHeld(out io.Writer, held []Held, pause time.Duration) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nMODE\tMACHINES\tLAST READY AFTER LET GO\tMEDIAN\tRECONCILES PER METAL3DATA\tOF WHICH WORK\tREQUEUED\tCLAIMS CREATED BY CAPM3")
	byMode := map[string]Held{}
	for _, h := range held {
		byMode[h.Mode] = h
		fmt.Fprintf(w, "%s\t%d\t%v\t%v\t%.2f\t%.2f\t%.2f\t%d of %d\n", h.Mode, h.N, h.AfterRelease.Round(time.Millisecond),
			h.MedianAfterRelease.Round(time.Millisecond), perData(h.Reconciles, h.N), perData(h.Work, h.N), perData(h.Requeues, h.N),
			h.ClaimsByCAPM3, h.Claims)
	}
	w.Flush()
	stock, pre := byMode[modeStock], byMode[modePreallocated]
	if stock.N == 0 || pre.N == 0 {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, wrap(fmt.Sprintf("With the webhook, held CAPM3: the last Metal3Data Ready %v after CAPM3 was let go instead of %v (%.2f×), "+
		"%.2f reconciles that did work per Metal3Data instead of %.2f. Why: while CAPM3 was held for %v, the webhook had created "+
		"the claims at admission and the IPAM had filled them, so CAPM3 renders each Metal3Data in its first reconcile; "+
		"stock CAPM3 only starts creating claims once let go, then waits for the IPAM.",
		pre.AfterRelease.Round(time.Millisecond), stock.AfterRelease.Round(time.Millisecond),
		ratio(float64(pre.AfterRelease), float64(stock.AfterRelease)), perData(pre.Work, pre.N), perData(stock.Work, stock.N), pause)))
}

func perData(count, n int) float64 { return ratio(float64(count), float64(n)) }
