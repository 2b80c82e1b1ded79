package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// TestDemo runs make demo's program and checks what its table claims: both modes ran, stock
// CAPM3 created every claim and the webhook none in stock, the webhook created every claim with it
// but those it said, in a Warning Event, that CAPM3 created first, CAPM3 worked or waited in no
// more reconciles with the webhook than without, and every Metal3Data is Ready with an address
// from each of its three pools. Then it applies, to the running demo, a Metal3Data created with
// generateName, which the demo cannot report by name: it says so and keeps running.
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
	generated := copyWithGenerateName(t, filepath.Join(dir, "kubeconfig"))
	waitOutput(t, out, done, "Metal3Data "+preallocatedNamespace+"/"+generated+" is Ready; not reported", 2*time.Minute)
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

// copyWithGenerateName creates, as a person could, a copy of a Ready example Metal3Data under a
// generated name, and returns that name.
func copyWithGenerateName(t *testing.T, kubeconfig string) string {
	t.Helper()
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
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
