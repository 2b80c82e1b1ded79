// Package integration tests the hand-over and release controllers against a real API server and
// the real garbage collector, with the webhook binary running as its own process.
package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

const gracePeriod = 3 * time.Second

var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	dir, err := os.MkdirTemp("", "ip-preallocator-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The in-process controllers log to a file; the test output keeps the reports.
	if _, err := harness.LogControllersTo(dir + "/controllers.log"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cp, err = harness.Start(ctx, harness.Options{
		Dir:              dir,
		GarbageCollector: true,
		Webhook:          true,
		WebhookArgs:      []string{"--release-grace-period=" + gracePeriod.String()},
	})
	if err == nil {
		err = cp.InstallRejector(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "logs of the webhook and the controllers are in", dir)
	}
	cancel()
	cp.Stop()
	os.Exit(code)
}

func newNamespace(t *testing.T, name string) string {
	t.Helper()
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// machines stores n machines of ThreePoolTemplate in ns, without their Metal3Data.
func machines(t *testing.T, ns string, n int) []*fixtures.Machine {
	t.Helper()
	out := make([]*fixtures.Machine, n)
	for i := range out {
		out[i] = fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), i).InNamespace(ns)
		if err := harness.CreateMachine(context.Background(), cp.Client, out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// ipamFinalizer is the finalizer the IPAM of pool puts on the claims it answers.
func ipamFinalizer(pool string) string {
	if pool == fixtures.ExternalPool {
		return "ipam.cluster.x-k8s.io/ReleaseAddress"
	}
	return "ipclaim.ipam.metal3.io"
}

// finalizers is a merge patch that sets a claim's finalizers.
type finalizers []string

func (finalizers) Type() types.PatchType { return types.MergePatchType }

func (f finalizers) Data(client.Object) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": []string(f)}})
}

// answer writes the status the Metal3 IPAM answers an IPClaim with, as the IPAM does.
func answer(t *testing.T, m *fixtures.Machine, pool string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		claim := &ipamv1.IPClaim{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: m.Data.Namespace, Name: m.Data.Name + "-" + pool}, claim); err != nil {
			return err
		}
		claim.Status.Address = &corev1.ObjectReference{Name: pool + "-192-168-0-99", Namespace: claim.Namespace}
		return cp.Client.Status().Update(ctx, claim)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// claimOf reads a claim of the ThreePoolTemplate by pool.
func claimOf(ctx context.Context, m *fixtures.Machine, pool string) (client.Object, error) {
	var obj client.Object = &ipamv1.IPClaim{}
	if pool == fixtures.ExternalPool {
		obj = &capipamv1.IPAddressClaim{}
	}
	err := cp.Client.Get(ctx, client.ObjectKey{Namespace: m.Data.Namespace, Name: m.Data.Name + "-" + pool}, obj)
	return obj, err
}

var pools = []string{fixtures.ProvisioningPool, fixtures.BaremetalPool, fixtures.ExternalPool}

// handedOver tells whether the claim ended exactly as CAPM3 would have created it, as far as
// metadata goes: only CAPM3's owner reference, no annotation, CAPM3's finalizer.
func handedOver(claim client.Object, data *infrav1.Metal3Data) string {
	want := []metav1.OwnerReference{{
		APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: data.Name, UID: data.UID, Controller: ptr.To(true),
	}}
	if diff := cmp.Diff(want, claim.GetOwnerReferences()); diff != "" {
		return "owner references: " + diff
	}
	if claim.GetAnnotations() != nil {
		return fmt.Sprintf("annotations %v", claim.GetAnnotations())
	}
	if claim.GetDeletionTimestamp() != nil {
		return "being deleted"
	}
	if diff := cmp.Diff([]string{infrav1.DataFinalizer}, claim.GetFinalizers()); diff != "" {
		return "finalizers: " + diff
	}
	return ""
}

// claimHandedOver checks the claim of m for pool.
func claimHandedOver(ctx context.Context, m *fixtures.Machine, pool string) error {
	claim, err := claimOf(ctx, m, pool)
	if err != nil {
		return err
	}
	if problem := handedOver(claim, m.Data); problem != "" {
		return fmt.Errorf("%s: %s", claim.GetName(), problem)
	}
	return nil
}

// allHandedOver checks every claim of the machines, recording their resource versions when asked.
func allHandedOver(ctx context.Context, ms []*fixtures.Machine, versions map[string]string) error {
	for _, m := range ms {
		for _, pool := range pools {
			claim, err := claimOf(ctx, m, pool)
			if err != nil {
				return err
			}
			if problem := handedOver(claim, m.Data); problem != "" {
				return fmt.Errorf("%s: %s", claim.GetName(), problem)
			}
			if versions != nil {
				versions[claim.GetName()] = claim.GetResourceVersion()
			}
		}
	}
	return nil
}

// TestHandOverUnderConcurrentCreations creates many Metal3Data at once with the garbage collector
// running: every claim ends with CAPM3's owner reference, and none is deleted, stripped of its
// reference or left Terminating.
func TestHandOverUnderConcurrentCreations(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "handover")
	ms := machines(t, ns, 60)

	var wg sync.WaitGroup
	errs := make(chan error, len(ms))
	for _, m := range ms {
		wg.Go(func() {
			if err := cp.Client.Create(ctx, m.Data); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	check := func() error { return allHandedOver(ctx, ms, nil) }
	// No IPAM answers here: an admission that finds a claim of an earlier one unanswered for
	// 250ms takes the IPAM for behind, and its hand-over waits for answers that never come, up to
	// --handover-ipam-wait (30s). Whether that happens depends on how fast this machine admits.
	harness.Eventually(t, 45*time.Second, check)
	// The collector looks owners up within milliseconds of seeing a dependent; give it time to
	// do anything it would do.
	time.Sleep(3 * time.Second)
	if err := check(); err != nil {
		t.Fatalf("after the garbage collector had its chance: %v", err)
	}

	events := &eventsv1.EventList{}
	if err := cp.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning {
			t.Errorf("Warning Event %s on %s/%s: %s", e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Note)
		}
	}
}

// TestReleaseWhenNeverStored: a later validating webhook rejects a Metal3Data our webhook has
// preallocated for; its claims are kept past the grace period while its Metal3DataClaim waits for
// data (CAPM3's template controller would retry, and the retry reclaims them) and, once that is
// deleted, while another claim of their Metal3 pool waits for the IPAM; released within a grace
// period once neither holds, and the claims of an accepted neighbour are not touched.
func TestReleaseWhenNeverStored(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "release")
	ms := machines(t, ns, 2)
	rejected, accepted := ms[0], ms[1]
	rejected.Data.Labels[harness.RejectLabel] = ""
	// The pools exist, as with an IPAM: the finish of a claim whose pool is gone does not wait.
	for _, pool := range []*ipamv1.IPPool{fixtures.Metal3Pool(fixtures.ProvisioningPool, "172.16"), fixtures.Metal3Pool(fixtures.BaremetalPool, "10.16")} {
		pool.Namespace = ns
		if err := cp.Client.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}

	if err := cp.Client.Create(ctx, rejected.Data); err == nil || !strings.Contains(err.Error(), "rejected by the test's validating webhook") {
		t.Fatalf("create of the rejected Metal3Data: %v", err)
	}
	if err := cp.Client.Create(ctx, accepted.Data); err != nil {
		t.Fatal(err)
	}
	// Admission answered once the creates were sent; they are stored moments later.
	harness.Eventually(t, 2*time.Second, func() error {
		for _, pool := range pools {
			claim, err := claimOf(ctx, rejected, pool)
			if err != nil {
				return fmt.Errorf("the preallocated claim is missing before the grace period ends: %w", err)
			}
			if claim.GetAnnotations()[allocation.PreallocatedForAnnotation] != rejected.Data.Name {
				return fmt.Errorf("%s: %v", claim.GetName(), claim.GetAnnotations())
			}
		}
		return nil
	})
	// No IPAM runs here: the test answers the claims as one does, with its finalizer.
	for _, pool := range pools {
		claim, err := claimOf(ctx, rejected, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := cp.Client.Patch(ctx, claim, finalizers(append(claim.GetFinalizers(), ipamFinalizer(pool)))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(gracePeriod + 2*time.Second)
	for _, pool := range pools {
		if claim, err := claimOf(ctx, rejected, pool); err != nil || !claim.GetDeletionTimestamp().IsZero() {
			t.Fatalf("%s released while its Metal3DataClaim waits for data: %v", pool, err)
		}
	}
	if err := cp.Client.Delete(ctx, rejected.DataClaim); err != nil {
		t.Fatal(err)
	}
	// The neighbour's IPClaims wait for the IPAM's answer in the same pools: the IPClaims of the
	// rejected one are kept until it comes, their IPAddressClaim is not.
	harness.Eventually(t, gracePeriod+10*time.Second, func() error {
		if claim, err := claimOf(ctx, rejected, fixtures.ExternalPool); err != nil || claim.GetDeletionTimestamp().IsZero() {
			return fmt.Errorf("%s not released: %v", fixtures.ExternalPool, err)
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	for _, pool := range []string{fixtures.ProvisioningPool, fixtures.BaremetalPool} {
		if claim, err := claimOf(ctx, rejected, pool); err != nil || !claim.GetDeletionTimestamp().IsZero() {
			t.Fatalf("%s released while another claim of its pool waits for the IPAM: %v", pool, err)
		}
		answer(t, accepted, pool)
	}
	start := time.Now()
	// Released, and CAPM3's finalizer gone at once: the IPAM's is there, which the IPAM removes
	// once it has freed the address; the test does that for it.
	harness.Eventually(t, gracePeriod+10*time.Second, func() error {
		for _, pool := range pools {
			claim, err := claimOf(ctx, rejected, pool)
			if err != nil {
				return err
			}
			if claim.GetDeletionTimestamp().IsZero() || !slices.Equal(claim.GetFinalizers(), []string{ipamFinalizer(pool)}) {
				return fmt.Errorf("%s: deleted %v, finalizers %v", pool, claim.GetDeletionTimestamp(), claim.GetFinalizers())
			}
		}
		return nil
	})
	t.Logf("released %v after the neighbour's claims were answered", time.Since(start).Round(100*time.Millisecond))
	for _, pool := range pools {
		claim, err := claimOf(ctx, rejected, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := cp.Client.Patch(ctx, claim, finalizers(nil)); err != nil {
			t.Fatal(err)
		}
		if _, err := claimOf(ctx, rejected, pool); !apierrors.IsNotFound(err) {
			t.Errorf("%s still there once the IPAM's finalizer went: %v", pool, err)
		}
	}
	for _, pool := range pools {
		claim, err := claimOf(ctx, accepted, pool)
		if err != nil {
			t.Fatal(err)
		}
		if problem := handedOver(claim, accepted.Data); problem != "" {
			t.Errorf("%s: %s", claim.GetName(), problem)
		}
	}
}

// TestResyncHandsOverUnrecordedClaims: when admission's response is lost (the webhook dies after
// creating claims), the Metal3Data is stored without a record; the claims still reach it.
func TestResyncHandsOverUnrecordedClaims(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "resync")
	m := machines(t, ns, 1)[0]
	claim := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Data.Name + "-" + fixtures.ProvisioningPool, Namespace: ns, Labels: m.Data.Labels,
			Annotations: map[string]string{allocation.PreallocatedForAnnotation: m.Data.Name},
			Finalizers:  []string{infrav1.DataFinalizer},
		},
		Spec: ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: fixtures.ProvisioningPool, Namespace: ns}},
	}
	if err := cp.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	cp.StopWebhook()
	if err := cp.Client.Create(ctx, m.Data); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 15*time.Second, func() error {
		return claimHandedOver(ctx, m, fixtures.ProvisioningPool)
	})
}

// TestRestartWritesNothing: a restarted webhook replays every Metal3Data and finds nothing to do.
func TestRestartWritesNothing(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "restart")
	ms := machines(t, ns, 3)
	for _, m := range ms {
		if err := cp.Client.Create(ctx, m.Data); err != nil {
			t.Fatal(err)
		}
	}
	versions := map[string]string{}
	harness.Eventually(t, 10*time.Second, func() error { return allHandedOver(ctx, ms, versions) })
	cp.StopWebhook()
	if err := cp.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for _, m := range ms {
		for _, pool := range pools {
			claim, err := claimOf(ctx, m, pool)
			if err != nil {
				t.Fatal(err)
			}
			if claim.GetResourceVersion() != versions[claim.GetName()] {
				t.Errorf("%s was written after the restart", claim.GetName())
			}
		}
	}
}

// waitingClaim creates a claim as admission does: unowned, annotated for m's Metal3Data.
func waitingClaim(t *testing.T, m *fixtures.Machine, token string) *ipamv1.IPClaim {
	t.Helper()
	claim := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Data.Name + "-" + fixtures.ProvisioningPool, Namespace: m.Data.Namespace, Labels: m.Data.Labels,
			Annotations: map[string]string{allocation.PreallocatedForAnnotation: m.Data.Name, allocation.AdmissionAnnotation: token},
			Finalizers:  []string{infrav1.DataFinalizer},
		},
		Spec: ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: fixtures.ProvisioningPool, Namespace: m.Data.Namespace}},
	}
	if err := cp.Client.Create(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	return claim
}

// TestLostResponseHandedOverAtOnce: claims were created but the Metal3Data was stored without a
// record (the admission response was lost): they are handed over as soon as it is stored, not
// after the grace period.
func TestLostResponseHandedOverAtOnce(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "lost-response")
	m := machines(t, ns, 1)[0]
	waitingClaim(t, m, "lost-admission")
	if err := cp.UnregisterMutatingWebhooks(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.RegisterMutatingWebhooks(ctx); err != nil {
			t.Error(err)
		}
	})
	// Let the release controller see the claim first, so that only the Metal3Data's arrival can
	// make it act before the grace period.
	time.Sleep(500 * time.Millisecond)
	if err := cp.Client.Create(ctx, m.Data); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	harness.Eventually(t, gracePeriod+10*time.Second, func() error {
		return claimHandedOver(ctx, m, fixtures.ProvisioningPool)
	})
	if elapsed := time.Since(start); elapsed > gracePeriod/2 {
		t.Errorf("handed over %v after the Metal3Data was stored; the grace period is %v", elapsed, gracePeriod)
	}
}

// TestWaitingClaimDeletedIsFinished: a waiting claim deleted by hand (or with its namespace) loses
// CAPM3's finalizer, so that it, its address and its namespace go.
func TestWaitingClaimDeletedIsFinished(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "deleted-while-waiting")
	m := machines(t, ns, 1)[0]
	claim := waitingClaim(t, m, "some-admission")
	if err := cp.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, strayWait+10*time.Second, func() error {
		got, err := claimOf(ctx, m, fixtures.ProvisioningPool)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("claim still there (%v): finalizers %v", err, got.GetFinalizers())
	})
}

// strayWait is how long the webhook keeps a deleted waiting claim the IPAM never finalized.
const strayWait = 10 * time.Second

// TestStrayAddressOfDeletedWaitingClaimIsReleased plays the Metal3 IPAM's race: a pass that listed
// a waiting claim before it was deleted creates its IPAddress after (it then fails to save its
// finalizer on the claim). The webhook keeps the claim while the IPAM may still do that, releases
// the IPAddress as the IPAM would, and only then lets the claim go; finished at once, the claim
// would leave the IPAddress holding its address, and its finalizer the namespace, for ever.
func TestStrayAddressOfDeletedWaitingClaimIsReleased(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "stray-address")
	m := machines(t, ns, 1)[0]
	claim := waitingClaim(t, m, "stray-admission")
	if err := cp.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	address := &ipamv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{
			Name: fixtures.ProvisioningPool + "-192-168-0-10", Namespace: ns,
			Finalizers: []string{ipamv1.IPAddressFinalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: ipamv1.GroupVersion.String(), Kind: "IPClaim", Name: claim.Name, UID: claim.UID,
			}},
		},
		Spec: ipamv1.IPAddressSpec{
			Address: "192.168.0.10",
			Pool:    corev1.ObjectReference{Name: fixtures.ProvisioningPool, Namespace: ns},
			Claim:   corev1.ObjectReference{Name: claim.Name, Namespace: ns},
		},
	}
	if err := cp.Client.Create(ctx, address); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
		t.Fatalf("the claim went before the IPAM could have made its address: %v", err)
	}
	harness.Eventually(t, strayWait+10*time.Second, bothGone(ctx, address, claim))
}

// bothGone tells, for harness.Eventually, whether the IPAddress and the claim are gone.
func bothGone(ctx context.Context, address *ipamv1.IPAddress, claim *ipamv1.IPClaim) func() error {
	return func() error {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(address), address); !apierrors.IsNotFound(err) {
			return fmt.Errorf("IPAddress still there (%v): finalizers %v", err, address.Finalizers)
		}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there (%v): finalizers %v", err, claim.Finalizers)
		}
		return nil
	}
}

// TestWaitingClaimOfGonePoolIsFinished: a waiting IPClaim the IPAM answered is deleted after its
// IPPool went (a namespace's deletion takes both in any order). The IPAM frees a claim and its
// IPAddress only from their pool's reconcile, so the webhook releases the IPAddress and removes
// both finalizers from the claim: kept, they would hold the namespace's deletion for ever.
func TestWaitingClaimOfGonePoolIsFinished(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "gone-pool")
	m := machines(t, ns, 1)[0]
	claim := waitingClaim(t, m, "gone-pool-admission")
	claim.Finalizers = append(claim.Finalizers, ipamv1.IPClaimFinalizer)
	if err := cp.Client.Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	pool := fixtures.Metal3Pool(fixtures.ProvisioningPool, "192.168")
	pool.SetNamespace(ns)
	if err := cp.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	address := &ipamv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{
			Name: fixtures.ProvisioningPool + "-192-168-0-11", Namespace: ns,
			Finalizers: []string{ipamv1.IPAddressFinalizer},
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: ipamv1.GroupVersion.String(), Kind: "IPPool", Name: pool.GetName(), UID: pool.GetUID()},
				{APIVersion: ipamv1.GroupVersion.String(), Kind: "IPClaim", Name: claim.Name, UID: claim.UID},
			},
		},
		Spec: ipamv1.IPAddressSpec{
			Address: "192.168.0.11",
			Pool:    corev1.ObjectReference{Name: pool.GetName(), Namespace: ns},
			Claim:   corev1.ObjectReference{Name: claim.Name, Namespace: ns},
		},
	}
	if err := cp.Client.Create(ctx, address); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, bothGone(ctx, address, claim))
}

// readyData stores a Metal3Data whose status says CAPM3 rendered it.
func readyData(t *testing.T, ns string) *infrav1.Metal3Data {
	t.Helper()
	ctx := context.Background()
	data := machines(t, ns, 1)[0].Data
	if err := cp.Client.Create(ctx, data); err != nil {
		t.Fatal(err)
	}
	data.Status.Ready = ptr.To(true)
	if err := cp.Client.Status().Update(ctx, data); err != nil {
		t.Fatal(err)
	}
	return data
}

// TestPatchRejectionsAreTold: the API server answers a failed JSON patch test with a 422 that
// IsTestFailure recognises, and a patch producing an invalid object with one it does not.
func TestPatchRejectionsAreTold(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "patch-rejections")
	m := machines(t, ns, 1)[0]
	claim := waitingClaim(t, m, "t1")
	data := m.Data.DeepCopy()
	data.UID = "not-stored"

	handed, err := allocation.HandOver(ctx, cp.Client, data, allocation.ClaimRef{Kind: allocation.KindIPClaim, Name: claim.Name}, "another-admission", nil)
	if handed || err != nil {
		t.Fatalf("hand-over with a failing test: %v, %v", handed, err)
	}
	data.UID = ""
	_, err = allocation.HandOver(ctx, cp.Client, data, allocation.ClaimRef{Kind: allocation.KindIPClaim, Name: claim.Name}, "t1", nil)
	if err == nil || allocation.IsTestFailure(err) {
		t.Fatalf("an owner reference without UID must be a reported rejection, got %v", err)
	}
}

// TestSurplusAddressReleased plays the Metal3 IPAM's double allocation: its two IPPool controllers
// both allocate for one claim, and the claim's status names the last. For a claim the webhook
// created, the IPAddress the status does not name is released once both are older than the
// IPAM's writes can be; the one it names, both of a claim CAPM3 created, and both of a claim whose
// Metal3Data is rendered (CAPM3 rendered whichever the status named then) are left alone.
func TestSurplusAddressReleased(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "surplus-address")
	ours := claimWithAddresses(t, ns, "ours-provisioning", allocation.FieldManager, nil, "192.168.0.10", "192.168.0.11")
	capm3s := claimWithAddresses(t, ns, "capm3s-provisioning", "manager", nil, "192.168.0.20", "192.168.0.21")
	renderedData := readyData(t, ns)
	rendered := claimWithAddresses(t, ns, "rendered-provisioning", allocation.FieldManager, renderedData, "192.168.0.30", "192.168.0.31")
	harness.Eventually(t, 30*time.Second, func() error {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(ours[1]), &ipamv1.IPAddress{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the surplus IPAddress %s is still there (%v)", ours[1].Name, err)
		}
		return nil
	})
	for _, kept := range []*ipamv1.IPAddress{ours[0], capm3s[0], capm3s[1], rendered[0], rendered[1]} {
		got := &ipamv1.IPAddress{}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(kept), got); err != nil || got.DeletionTimestamp != nil {
			t.Errorf("IPAddress %s was released (%v)", kept.Name, err)
		}
	}
}

// claimWithAddresses creates an IPClaim as manager, owned by owner if not nil, two IPAddresses made
// for it, and its status naming the first.
func claimWithAddresses(t *testing.T, ns, name, manager string, owner *infrav1.Metal3Data, ips ...ipamv1.IPAddressStr) []*ipamv1.IPAddress {
	t.Helper()
	ctx := context.Background()
	claim := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Finalizers: []string{infrav1.DataFinalizer}},
		Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: fixtures.ProvisioningPool, Namespace: ns}},
	}
	if owner != nil {
		claim.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: infrav1.GroupVersion.String(), Kind: "Metal3Data", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true),
		}}
	}
	if err := cp.Client.Create(ctx, claim, client.FieldOwner(manager)); err != nil {
		t.Fatal(err)
	}
	var addresses []*ipamv1.IPAddress
	for _, ip := range ips {
		address := &ipamv1.IPAddress{
			ObjectMeta: metav1.ObjectMeta{
				Name: fixtures.ProvisioningPool + "-" + strings.ReplaceAll(string(ip), ".", "-"), Namespace: ns,
				Finalizers:      []string{ipamv1.IPAddressFinalizer},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: ipamv1.GroupVersion.String(), Kind: "IPClaim", Name: claim.Name, UID: claim.UID}},
			},
			Spec: ipamv1.IPAddressSpec{
				Address: ip,
				Pool:    corev1.ObjectReference{Name: fixtures.ProvisioningPool, Namespace: ns},
				Claim:   corev1.ObjectReference{Name: claim.Name, Namespace: ns},
			},
		}
		if err := cp.Client.Create(ctx, address); err != nil {
			t.Fatal(err)
		}
		addresses = append(addresses, address)
	}
	claim.Status.Address = &corev1.ObjectReference{Name: addresses[0].Name, Namespace: ns}
	if err := cp.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, a := range addresses {
			_ = cp.Client.Patch(ctx, a, finalizers(nil))
		}
		_ = cp.Client.Patch(ctx, claim, finalizers(nil))
	})
	return addresses
}
