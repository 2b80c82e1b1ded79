package stack

import (
	"context"
	"fmt"
	"slices"
	"testing"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// TestCorrectedIPAMFinalizesTheClaimFirst: the double's IPAddress create leaves the claim with the
// IPAM's finalizer exactly when the address exists. Against a real API server, because what it
// guards against is the API server's: no new finalizer on an object being deleted, no new object
// in a namespace being deleted.
func TestCorrectedIPAMFinalizesTheClaimFirst(t *testing.T) {
	ctx := context.Background()
	// No namespace controller: a deleted namespace stays Terminating, its claims with it.
	cp, c := startWithCorrectedClient(t, FinalizerFirst)
	const keep = "metal3data.infrastructure.cluster.x-k8s.io"
	for _, tc := range []struct {
		name                       string
		deleteClaim, deleteNS      bool
		wantCreated, wantFinalizer bool
	}{
		{name: "claim and namespace live", wantCreated: true, wantFinalizer: true},
		{name: "claim being deleted", deleteClaim: true},
		// The pool counts only IPAddresses before it lets itself go: a finalizer kept here would
		// leave the claim Terminating once CAPM3's goes, and its namespace with it.
		{name: "namespace being deleted", deleteNS: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "corrected-"}}
			if err := cp.Client.Create(ctx, ns); err != nil {
				t.Fatal(err)
			}
			claim := &ipamv1.IPClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: ns.Name, Finalizers: []string{keep}},
				Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "pool"}},
			}
			if err := cp.Client.Create(ctx, claim); err != nil {
				t.Fatal(err)
			}
			if tc.deleteClaim {
				if err := cp.Client.Delete(ctx, claim); err != nil {
					t.Fatal(err)
				}
			}
			if tc.deleteNS {
				if err := cp.Client.Delete(ctx, ns); err != nil {
					t.Fatal(err)
				}
			}
			address := &ipamv1.IPAddress{
				ObjectMeta: metav1.ObjectMeta{Name: "pool-10-0-0-1", Namespace: ns.Name, Finalizers: []string{ipamv1.IPAddressFinalizer},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: ipamv1.GroupVersion.String(), Kind: "IPClaim", Name: claim.Name, UID: claim.UID}}},
				Spec: ipamv1.IPAddressSpec{Address: "10.0.0.1", Pool: corev1.ObjectReference{Name: "pool"}, Claim: corev1.ObjectReference{Name: claim.Name}},
			}
			err := c.Create(ctx, address)
			if created := err == nil; created != tc.wantCreated {
				t.Errorf("IPAddress created: %v (%v), want %v", created, err, tc.wantCreated)
			}
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			if finalized := slices.Contains(claim.Finalizers, ipamv1.IPClaimFinalizer); finalized != tc.wantFinalizer {
				t.Errorf("claim's finalizers %v: the IPAM's there %v, want %v", claim.Finalizers, finalized, tc.wantFinalizer)
			}
		})
	}
}

// TestCorrectedIPAMFinalizesOnlyAHeldClaim races the double's IPAddress create with CAPM3's
// release of a claim (its finalizer taken off, then a DELETE without preconditions): the API
// server removes a claim whose DELETE read it without finalizers even after the IPAM's is saved
// (kubernetes/kubernetes#77988), and no IPAddress may outlive its claim then.
func TestCorrectedIPAMFinalizesOnlyAHeldClaim(t *testing.T) {
	ctx := context.Background()
	cp, c := startWithCorrectedClient(t, FinalizerFirst, HeldClaimsOnly)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "corrected-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	const keep, tries = "metal3data.infrastructure.cluster.x-k8s.io", 300
	overlapped := 0
	for i := range tries {
		claim := &ipamv1.IPClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Namespace: ns.Name, Finalizers: []string{keep}},
			Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "pool"}},
		}
		if err := cp.Client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		address := &ipamv1.IPAddress{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pool-10-0-%d-%d", i/256, i%256), Namespace: ns.Name, Finalizers: []string{ipamv1.IPAddressFinalizer},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: ipamv1.GroupVersion.String(), Kind: "IPClaim", Name: claim.Name, UID: claim.UID}}},
			Spec: ipamv1.IPAddressSpec{Address: "10.0.0.1", Pool: corev1.ObjectReference{Name: "pool"}, Claim: corev1.ObjectReference{Name: claim.Name}},
		}
		released := make(chan error, 1)
		go func() {
			held := claim.DeepCopy()
			held.Finalizers = nil
			if err := cp.Client.Update(ctx, held); err != nil {
				released <- err
				return
			}
			released <- cp.Client.Delete(ctx, held)
		}()
		createErr := c.Create(ctx, address)
		if err := <-released; err != nil && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err == nil {
			// The IPAM's finalizer was saved first: CAPM3's release met a conflict, or the claim
			// waits, Terminating, for the IPAM.
			claim.Finalizers = nil
			if err := cp.Client.Update(ctx, claim); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if createErr != nil {
			overlapped++
		}
		live := &ipamv1.IPAddress{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: address.Name}, live); !apierrors.IsNotFound(err) {
			t.Errorf("%s outlived its claim %s (create: %v): %v", address.Name, claim.Name, createErr, err)
		}
	}
	// The race is what is tested: without it this test proves nothing.
	if overlapped == 0 {
		t.Errorf("no create of %d met its claim being released", tries)
	}
	t.Logf("creates that met their claim being released and were refused: %d of %d", overlapped, tries)
}

// TestCorrectedIPAMPatchesOnlyTheClaimItRead: the IPAM's patches of a claim it listed land on
// that claim, not on one created again under its name meanwhile, which would take the old one's
// finalizer and error and never be answered.
func TestCorrectedIPAMPatchesOnlyTheClaimItRead(t *testing.T) {
	ctx := context.Background()
	cp, c := startWithCorrectedClient(t, UIDBoundPatches)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "corrected-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	claim := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: ns.Name},
		Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "pool"}},
	}
	if err := cp.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	// As the IPAM does: the claims listed at the start of a pass, written back with CAPI's patch
	// helper, which sends a status patch with the name and resourceVersion read but no UID.
	claims := &ipamv1.IPClaimList{}
	if err := c.List(ctx, claims, client.InNamespace(ns.Name)); err != nil || len(claims.Items) != 1 {
		t.Fatalf("listing the claims: %v, %d", err, len(claims.Items))
	}
	listed := &claims.Items[0]
	patchBoth := func() error {
		claim := listed.DeepCopy()
		helper, err := patch.NewHelper(claim, c)
		if err != nil {
			t.Fatal(err)
		}
		claim.Finalizers = []string{ipamv1.IPClaimFinalizer}
		claim.Status.ErrorMessage = ptr.To("Failed to create associated IPAddress object")
		return helper.Patch(ctx, claim)
	}
	if err := patchBoth(); err != nil {
		t.Fatalf("patching the claim it read: %v", err)
	}
	if err := cp.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	live := &ipamv1.IPClaim{}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), live); err != nil {
		t.Fatal(err)
	}
	live.Finalizers = nil
	if err := cp.Client.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	again := &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: claim.Name, Namespace: ns.Name}, Spec: claim.Spec}
	if err := cp.Client.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := patchBoth(); err == nil {
		t.Error("patching a claim created again under the name it read: not refused")
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(again), again); err != nil {
		t.Fatal(err)
	}
	if len(again.Finalizers) > 0 || again.Status.ErrorMessage != nil {
		t.Errorf("the claim created again took the old one's finalizers %v and error %v", again.Finalizers, ptr.Deref(again.Status.ErrorMessage, ""))
	}
}

// TestCorrectedIPAMPoolWaitsForItsClaims: a pool being deleted keeps its finalizer while a claim
// of it carries the IPAM's, and lets it go once none does.
func TestCorrectedIPAMPoolWaitsForItsClaims(t *testing.T) {
	ctx := context.Background()
	cp, c := startWithCorrectedClient(t, PoolWaitsForClaims)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "corrected-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pool := fixtures.Metal3Pool("pool", "10.0")
	pool.Namespace, pool.Finalizers = ns.Name, []string{ipamv1.IPPoolFinalizer}
	claim := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: ns.Name, Finalizers: []string{ipamv1.IPClaimFinalizer}},
		Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: pool.Name}},
	}
	other := claim.DeepCopy()
	other.Name, other.Spec.Pool.Name = "of-another-pool", "another"
	for _, obj := range []client.Object{pool, claim, other} {
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.Client.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	letGo := func() error {
		live := &ipamv1.IPPool{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), live); err != nil {
			return err
		}
		before := live.DeepCopy()
		live.Finalizers = nil
		return c.Patch(ctx, live, client.MergeFrom(before))
	}
	if err := letGo(); !apierrors.IsConflict(err) {
		t.Fatalf("the pool let its finalizer go while its claim carried the IPAM's: %v", err)
	}
	claim.Finalizers = nil
	if err := cp.Client.Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	// The other pool's claim still carries the finalizer: it does not hold this pool.
	if err := letGo(); err != nil {
		t.Fatalf("the pool could not let its finalizer go once no claim of it carried the IPAM's: %v", err)
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pool), &ipamv1.IPPool{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pool is still there: %v", err)
	}
}

// startWithCorrectedClient starts a control plane without controllers and returns it with the
// corrected IPAM's client, making fixes.
func startWithCorrectedClient(t *testing.T, fixes ...Correction) (*harness.ControlPlane, client.Client) {
	t.Helper()
	cp, err := harness.Start(context.Background(), harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	c, err := correctedIPAMClient(fixes)(cp.Config, client.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cp, c
}

// TestParseCorrections: the fault suite's FAULTS_IPAM_CORRECTIONS, every correction described.
func TestParseCorrections(t *testing.T) {
	all, err := ParseCorrections("all")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(Describe) {
		t.Errorf("all is %v; described: %d", all, len(Describe))
	}
	named, err := ParseCorrections("named, uid-bound-patches,live-reads")
	if want := (Corrections{FinalizerFirst, LiveReads, OnePoolController, UIDBoundPatches}); err != nil || !slices.Equal(named, want) {
		t.Errorf("named plus two: %v, %v; want %v", named, err, want)
	}
	if _, err := ParseCorrections("named,no-such"); err == nil {
		t.Error("an unknown correction was accepted")
	}
}
