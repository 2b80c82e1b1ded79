package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// TestDemo runs make demo's program and checks what its table claims: both modes ran, stock
// CAPM3 created every claim and the webhook none in stock, the webhook created every claim with it
// but those it said, in a Warning Event, that CAPM3 created first, CAPM3 worked or waited in no
// more reconciles with the webhook than without, and every Metal3Data is Ready with an address
// from each of its three pools. Then it applies, to the running demo, a machine in a namespace of
// its own, which CAPM3 reconciles as on a cluster, and a Metal3Data created with generateName,
// which the demo cannot report by name: it says so and keeps running.
func TestDemo(t *testing.T) {
	out := &syncBuffer{}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		res    *result
		runErr error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, runErr = run(ctx, options{dir: dir, timeout: 2 * time.Minute, held: heldMachines, heldFor: 5 * time.Second}, out)
		if runErr != nil {
			fmt.Fprintln(out, "demo:", runErr)
		}
	}()
	waitOutput(t, out, done, "The control plane keeps running", 4*time.Minute)
	for _, ns := range heldNamespaces() {
		if !strings.Contains(out.String(), ns) {
			t.Errorf("the closing message does not name the second act's namespace %s", ns)
		}
	}
	mine := applyInNewNamespace(t, filepath.Join(dir, "kubeconfig"))
	generated := copyWithGenerateName(t, filepath.Join(dir, "kubeconfig"))
	waitOutput(t, out, done, "Metal3Data "+preallocatedNamespace+"/"+generated+" is Ready; not reported", 2*time.Minute)
	// The demo reports the machine applied in a namespace of its own as it reports the examples.
	waitOutput(t, out, done, mine.String(), 10*time.Second)
	if notReported := "Metal3Data " + mine.String() + " is Ready; not reported"; strings.Contains(out.String(), notReported) {
		t.Errorf("the demo says: %s", notReported)
	}
	select {
	case <-done:
		t.Fatalf("the demo stopped after a Metal3Data it cannot report: %v", runErr)
	default:
	}
	cancel()
	<-done
	t.Log("\n" + out.String())
	if runErr != nil {
		t.Fatal(runErr)
	}
	const pools = 3
	rows := res.Rows
	byMode := map[string]int{}
	for _, r := range rows {
		byMode[r.Mode]++
		wantCAPM3, wantWebhook := pools, 0
		if r.Mode == modePreallocated {
			// The webhook answers once its claim creates are sent, not stored; a CAPM3 reconcile
			// that comes first creates a claim itself, and the webhook says so in a Warning Event.
			wantCAPM3, wantWebhook = r.CAPM3CreatedWarned, pools-r.CAPM3CreatedWarned
		}
		if r.ClaimsByCAPM3 != wantCAPM3 || r.ClaimsByWebhook != wantWebhook {
			t.Errorf("%s %s: claims created by CAPM3 %d, by the webhook %d; want %d and %d",
				r.Mode, r.Data, r.ClaimsByCAPM3, r.ClaimsByWebhook, wantCAPM3, wantWebhook)
		}
		if r.ReadyAfter <= 0 || r.Reconciles.Work == 0 {
			t.Errorf("%s %s: ready after %v, reconciles %s", r.Mode, r.Data, r.ReadyAfter, r.Reconciles.History)
		}
		if len(r.Addresses) != pools {
			t.Errorf("%s %s: addresses %v, want one from each of %d pools", r.Mode, r.Data, r.Addresses, pools)
		}
		for pool, addr := range r.Addresses {
			if !strings.Contains(addr, "/") {
				t.Errorf("%s %s: pool %s gave %q", r.Mode, r.Data, pool, addr)
			}
		}
	}
	if byMode[modeStock] != 3 || byMode[modePreallocated] != 3 {
		t.Errorf("Metal3Data by mode: %v, want 3 stock and 3 preallocated", byMode)
	}
	stock, pre := summarize(rows, modeStock), summarize(rows, modePreallocated)
	if 2*pre.claimsByCAPM3 > pre.claims {
		t.Errorf("CAPM3 created %d of %d claims with the webhook", pre.claimsByCAPM3, pre.claims)
	}
	// Reconciles that worked or waited; the no-ops, woken by CAPM3's own status patch from a
	// cache that lags, come and go in both modes.
	busy := map[string]int{}
	for _, r := range rows {
		busy[r.Mode] += r.Reconciles.Work + r.Reconciles.Requeue
	}
	if busy[modePreallocated] > busy[modeStock] {
		t.Errorf("CAPM3 worked or waited in %d reconciles with the webhook, %d without (all reconciles: %d and %d)",
			busy[modePreallocated], busy[modeStock], pre.reconciles, stock.reconciles)
	}
	if !strings.Contains(out.String(), "With the webhook: ") {
		t.Error("no comparison printed")
	}
	checkHeld(t, res.Held, out.String())
}

const heldMachines = 6

// checkHeld: the second act ran in both modes with every machine Ready; CAPM3 created every claim
// in stock and few with the webhook, and, having found the claims in place when let go, did its
// work in one reconcile per Metal3Data, where stock needs more.
func checkHeld(t *testing.T, held []Held, out string) {
	t.Helper()
	const pools = 3
	byMode := map[string]Held{}
	for _, h := range held {
		byMode[h.Mode] = h
		if h.N != heldMachines || h.Claims != pools*h.N || h.AfterRelease <= 0 {
			t.Errorf("second act, %s: %d Metal3Data Ready %v after CAPM3 was let go, %d claims; want %d machines with %d claims each",
				h.Mode, h.N, h.AfterRelease, h.Claims, heldMachines, pools)
		}
	}
	stock, pre := byMode[modeStock], byMode[modePreallocated]
	if stock.N == 0 || pre.N == 0 {
		t.Fatalf("second act ran in modes %v, want stock and preallocated", held)
	}
	if stock.ClaimsByCAPM3 != stock.Claims {
		t.Errorf("second act, stock: CAPM3 created %d of %d claims", stock.ClaimsByCAPM3, stock.Claims)
	}
	if 10*pre.ClaimsByCAPM3 > pre.Claims {
		t.Errorf("second act, with the webhook: CAPM3 created %d of %d claims", pre.ClaimsByCAPM3, pre.Claims)
	}
	// A claim the webhook left to CAPM3 costs one more reconcile that works: the one creating it.
	if pre.Work > pre.N+pre.ClaimsByCAPM3 || stock.Work <= pre.Work {
		t.Errorf("second act: %d reconciles that did work for %d Metal3Data with the webhook (CAPM3 created %d claims), %d without; want one each, and more without",
			pre.Work, pre.N, pre.ClaimsByCAPM3, stock.Work)
	}
	if !strings.Contains(out, "With the webhook, held CAPM3: ") {
		t.Error("no comparison printed for the second act")
	}
}

// newNamespace is the namespace of one's own the closing message suggests.
const newNamespace = "mine"

// applyInNewNamespace does what the closing message says a person can: it creates a namespace
// neither act used and applies examples/10-cluster.yaml, then, once the IPAM has reconciled the
// pools, the machine of examples/more/ into it. The first act's CAPM3, still running, must
// create the Metal3Data from its Metal3DataClaim and make it Ready, the webhook having created
// its claims at admission (but those it said, in a Warning Event, it left to CAPM3). It returns
// the Metal3Data.
func applyInNewNamespace(t *testing.T, kubeconfig string) types.NamespacedName {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, c := clientFor(t, kubeconfig)
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// Started before the claims exist: only their creation tells who created them.
	origins, err := watchClaimOrigins(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: newNamespace}}); err != nil {
		t.Fatal(err)
	}
	apply := func(file string) {
		data, err := os.ReadFile(filepath.Join(root, "examples", file))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := harness.DecodeYAML(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			o.SetNamespace(newNamespace)
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("creating %s %s in %s: %v", o.GetKind(), o.GetName(), newNamespace, err)
			}
		}
	}
	apply("10-cluster.yaml")
	// Seconds at most where CAPM3 and the IPAM watch the namespace; where they do not, never.
	const within = 30 * time.Second
	waitFor(t, within, "the IPAM to reconcile the IPPools of "+newNamespace, func() bool {
		pools := &ipamv1.IPPoolList{}
		if err := c.List(ctx, pools, client.InNamespace(newNamespace)); err != nil || len(pools.Items) == 0 {
			return false
		}
		return !slices.ContainsFunc(pools.Items, func(p ipamv1.IPPool) bool { return p.Status.LastUpdated == nil })
	})
	apply("more/worker-3.yaml")
	var key types.NamespacedName
	waitFor(t, within, "CAPM3 to create the Metal3Data of "+newNamespace+"/worker-3 and make it Ready", func() bool {
		claim := &infrav1.Metal3DataClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: newNamespace, Name: "worker-3"}, claim); err != nil || claim.Status.RenderedData == nil {
			return false
		}
		key = types.NamespacedName{Namespace: newNamespace, Name: claim.Status.RenderedData.Name}
		data := &infrav1.Metal3Data{}
		return c.Get(ctx, key, data) == nil && data.Status.Ready != nil && *data.Status.Ready
	})
	left, err := harness.ClaimsLeftToCAPM3(ctx, c, newNamespace)
	if err != nil {
		t.Fatal(err)
	}
	claims := &ipamv1.IPClaimList{}
	if err := c.List(ctx, claims, client.InNamespace(newNamespace)); err != nil {
		t.Fatal(err)
	}
	const pools = 3
	var owned, byWebhook, warned int
	for _, claim := range claims.Items {
		if !ownedBy(claim.OwnerReferences, key.Name) {
			continue
		}
		owned++
		if claim.Status.Address == nil {
			t.Errorf("%s: claim %s has no address", key, claim.Name)
		}
		switch {
		case origins.createdByWebhook(client.ObjectKeyFromObject(&claim)):
			byWebhook++
		case left[allocation.KindIPClaim+"/"+claim.Name]:
			warned++
		}
	}
	if owned != pools || byWebhook+warned != pools || byWebhook == 0 {
		t.Errorf("%s: %d claims, %d created by the webhook, %d it left to CAPM3; want %d, all by the webhook but those it left",
			key, owned, byWebhook, warned, pools)
	}
	return key
}

// waitFor polls check every 100 ms, failing the test if it does not hold within timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, check func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !check(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
	}
}

func clientFor(t *testing.T, kubeconfig string) (*rest.Config, client.Client) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, c
}

// copyWithGenerateName creates, as a person could, a copy of a Ready example Metal3Data under a
// generated name, and returns that name.
func copyWithGenerateName(t *testing.T, kubeconfig string) string {
	t.Helper()
	ctx := context.Background()
	_, c := clientFor(t, kubeconfig)
	list := &infrav1.Metal3DataList{}
	if err := c.List(ctx, list, client.InNamespace(preallocatedNamespace)); err != nil || len(list.Items) == 0 {
		t.Fatalf("no example Metal3Data to copy: %v", err)
	}
	original := list.Items[0]
	copied := &infrav1.Metal3Data{
		ObjectMeta: metav1.ObjectMeta{Namespace: original.Namespace, GenerateName: "hb-", Labels: original.Labels},
		Spec:       original.Spec,
	}
	copied.Spec.MetaData, copied.Spec.NetworkData = nil, nil
	if err := c.Create(ctx, copied); err != nil {
		t.Fatal(err)
	}
	return copied.Name
}

// waitOutput waits until the demo's output holds text, failing if the demo stops first.
func waitOutput(t *testing.T, out *syncBuffer, done <-chan struct{}, text string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for !strings.Contains(out.String(), text) {
		select {
		case <-done:
			t.Fatalf("the demo stopped before printing %q:\n%s", text, out.String())
		case <-deadline:
			t.Fatalf("no %q within %v:\n%s", text, timeout, out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// syncBuffer is the demo's output, read by the test while the demo writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
