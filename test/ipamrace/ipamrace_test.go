// Package ipamrace reproduces, with the Metal3 IPAM v1.13.2 alone (no CAPM3, no webhook), the
// race that leaks addresses when an IPClaim is deleted while the IPAM answers it: the IPAM creates
// the claim's IPAddress before it saves its finalizer on the claim, and the API server refuses a
// new finalizer on an object being deleted. Once the claim's other finalizer (CAPM3's, here a
// stand-in) goes, the claim is gone and its IPAddress stays, holding its address, and with its
// finalizer, its namespace. The same loop against the corrected IPAM test double of test/stack,
// with the corrections the fault suite's corrected runs make, leaks nothing.
//
// An upstream maintainer can run it as it is: `go test ./ipamrace` in test/ after `make tools`.
// If the real IPAM stops leaking, TestRealIPAMLeaks fails: the release controller's guard for
// stray IPAddresses can then go.
package ipamrace

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// claims is how many claims each test deletes while the IPAM answers them; in runs on a 2-core
// machine a few in ten leaked.
const claims = 40

// keep stands in for CAPM3's finalizer, which it removes when it releases a claim.
const keep = "metal3data.infrastructure.cluster.x-k8s.io"

var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "ip-preallocator-ipamrace-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := harness.LogControllersTo(dir + "/controllers.log"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if cp, err = harness.Start(ctx, harness.Options{Dir: dir}); err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		return 1
	}
	defer cp.Stop()
	for _, ipam := range []struct {
		ns        string
		corrected stack.Corrections
	}{{"real", nil}, {"corrected", stack.NamedRaces}} {
		if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ipam.ns}}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// The IPAM answers a pool's claims once the pool's Cluster exists.
		cluster := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), 0).InNamespace(ipam.ns).Cluster
		if err := cp.Client.Create(ctx, cluster); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		pool := fixtures.Metal3Pool("pool", "10.1")
		pool.Namespace = ipam.ns
		if err := cp.Client.Create(ctx, pool); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := stack.StartIPAM(ctx, cp.Config, stack.Options{Namespaces: []string{ipam.ns}, CorrectedIPAM: ipam.corrected}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := answered(ctx, ipam.ns); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "logs of the control plane and the IPAMs are in", dir)
	}
	return code
}

// answered waits until the IPAM of ns answers a claim, and deletes it.
func answered(ctx context.Context, ns string) error {
	probe := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns, Finalizers: []string{keep}},
		Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "pool", Namespace: ns}},
	}
	if err := cp.Client.Create(ctx, probe); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); probe.Status.Address == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the IPAM of %s did not answer a claim within 30s", ns)
		}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(probe), probe); err != nil {
			return err
		}
	}
	if err := cp.Client.Delete(ctx, probe); err != nil {
		return err
	}
	// As CAPM3 releases a claim: its finalizer off once the Metal3Data is going.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(probe), probe); err != nil {
			return err
		}
		controllerutil.RemoveFinalizer(probe, keep)
		return cp.Client.Update(ctx, probe)
	})
}

func TestRealIPAMLeaks(t *testing.T) {
	if leaked := deleteWhileAnswered(t, "real"); len(leaked) == 0 {
		t.Errorf("no IPAddress outlived its IPClaim in %d tries: the IPAM no longer leaks this way", claims)
	} else {
		t.Logf("%d of %d IPClaims deleted while the IPAM answered them left their IPAddress behind: %v", len(leaked), claims, leaked)
	}
}

func TestCorrectedIPAMDoesNotLeak(t *testing.T) {
	if leaked := deleteWhileAnswered(t, "corrected"); len(leaked) > 0 {
		t.Errorf("%d of %d IPClaims deleted while the corrected IPAM answered them left their IPAddress behind: %v", len(leaked), claims, leaked)
	}
}

// deleteWhileAnswered creates claims in the pool of ns, deleting each within 20 ms of its create, and
// removing the stand-in for CAPM3's finalizer a moment later, as CAPM3 releases a claim whose
// Metal3Data goes; it returns the IPAddresses left whose claim is gone.
func deleteWhileAnswered(t *testing.T, ns string) []string {
	t.Helper()
	ctx := context.Background()
	for i := range claims {
		claim := &ipamv1.IPClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Namespace: ns, Finalizers: []string{keep}},
			Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "pool", Namespace: ns}},
		}
		if err := cp.Client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		// Somewhere in the IPAM's answer: its pass started from a list that has the claim.
		time.Sleep(time.Duration(i%20) * time.Millisecond)
		if err := cp.Client.Delete(ctx, claim); err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(200 * time.Millisecond)
			patch := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"test","path":"/metadata/uid","value":"`+string(claim.UID)+`"},{"op":"remove","path":"/metadata/finalizers/0"}]`))
			_ = client.IgnoreNotFound(cp.Client.Patch(ctx, claim, patch))
		}()
		time.Sleep(20 * time.Millisecond)
	}
	var leaked []string
	harness.Eventually(t, 30*time.Second, func() error {
		leaked = nil
		claimList, addresses := &ipamv1.IPClaimList{}, &ipamv1.IPAddressList{}
		if err := cp.Client.List(ctx, claimList, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(claimList.Items) > 0 {
			return fmt.Errorf("%d IPClaims still there", len(claimList.Items))
		}
		if err := cp.Client.List(ctx, addresses, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, a := range addresses.Items {
			leaked = append(leaked, fmt.Sprintf("%s (of %s)", a.Name, a.Spec.Claim.Name))
		}
		return nil
	})
	return leaked
}
