package stack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	cp, c := startWithCorrectedClient(t)
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

// TestCorrectedIPAMFreesTheAddressOfAClaimDeletedUnderIt races the double's IPAddress create with
// a DELETE of its claim, as CAPM3 deletes a claim it no longer needs: the API server removes a
// claim whose DELETE read it without finalizers even after the IPAM's is saved, and no IPAddress
// may outlive its claim then.
func TestCorrectedIPAMFreesTheAddressOfAClaimDeletedUnderIt(t *testing.T) {
	ctx := context.Background()
	cp, c := startWithCorrectedClient(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "corrected-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	deletedUnder := 0
	for i := range 300 {
		claim := &ipamv1.IPClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Namespace: ns.Name},
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
		deleted := make(chan error, 1)
		go func() { deleted <- cp.Client.Delete(ctx, claim.DeepCopy()) }()
		createErr := c.Create(ctx, address)
		if err := <-deleted; err != nil {
			t.Fatal(err)
		}
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if createErr != nil && strings.Contains(createErr.Error(), "was deleted while its IPAddress was created") {
			deletedUnder++
		}
		if err == nil {
			// The finalizer was saved first: the claim waits, Terminating, for the IPAM.
			claim.Finalizers = nil
			if err := cp.Client.Update(ctx, claim); err != nil {
				t.Fatal(err)
			}
			continue
		}
		live := &ipamv1.IPAddress{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: address.Name}, live); !apierrors.IsNotFound(err) {
			t.Errorf("%s outlived its claim %s (create: %v): %v", address.Name, claim.Name, createErr, err)
		}
	}
	// The race is what is tested: without it this test proves nothing.
	if deletedUnder == 0 {
		t.Error("no claim of 300 was deleted while its IPAddress was created: the race did not happen")
	}
	t.Logf("claims deleted while their IPAddress was created: %d of 300", deletedUnder)
}

// TestCorrectedIPAMPoolWaitsForItsClaims: a pool being deleted keeps its finalizer while a claim
// of it carries the IPAM's, and lets it go once none does.
func TestCorrectedIPAMPoolWaitsForItsClaims(t *testing.T) {
	ctx := context.Background()
	cp, c := startWithCorrectedClient(t)
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
// corrected IPAM's client.
func startWithCorrectedClient(t *testing.T) (*harness.ControlPlane, client.Client) {
	t.Helper()
	cp, err := harness.Start(context.Background(), harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	c, err := correctedIPAMClient(cp.Config, client.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cp, c
}
