package allocation

import (
	"slices"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase is where a claim is in the life the webhook gives it (docs/design.md draws it):
//
//	waiting ──hand-over──▶ owned
//	waiting ──release, namespace or person deletes it──▶ deleting ──finish──▶ gone
//	owned ──deleted, its Metal3Data gone──▶ orphaned ──finish──▶ gone
//	owned ──deleted, released by CAPM3, its IPPool gone──▶ stranded ──finish──▶ gone
type Phase int

const (
	// Owned is handed over, or never the webhook's; CAPM3's business.
	Owned Phase = iota
	// Waiting is preallocated for a Metal3Data, owned by nothing yet.
	Waiting
	// Deleting is waiting, and being deleted.
	Deleting
	// Orphaned is being deleted with CAPM3's finalizer, owned by a Metal3Data.
	Orphaned
	// Stranded is being deleted, owned, with only the Metal3 IPAM's finalizer left: the IPAM frees
	// it from its pool's reconcile, or never once the pool is gone.
	Stranded
)

// PhaseOf is the only definition of a claim's phase.
func PhaseOf(claim metav1.Object) Phase {
	_, preallocated := claim.GetAnnotations()[PreallocatedForAnnotation]
	switch {
	case preallocated && len(claim.GetOwnerReferences()) == 0 && claim.GetDeletionTimestamp() == nil:
		return Waiting
	case preallocated && len(claim.GetOwnerReferences()) == 0:
		return Deleting
	case claim.GetDeletionTimestamp() != nil && slices.Contains(claim.GetFinalizers(), infrav1.DataFinalizer) && Metal3DataOwner(claim) != nil:
		return Orphaned
	case claim.GetDeletionTimestamp() != nil && len(claim.GetOwnerReferences()) > 0 && slices.Equal(claim.GetFinalizers(), []string{ipamv1.IPClaimFinalizer}):
		return Stranded
	}
	return Owned
}

// WaitingFor names the Metal3Data a waiting or deleting claim was preallocated for.
func WaitingFor(claim metav1.Object) (string, bool) {
	if p := PhaseOf(claim); p != Waiting && p != Deleting {
		return "", false
	}
	return claim.GetAnnotations()[PreallocatedForAnnotation], true
}

// WaitsFor tells whether claim waits for the Metal3Data dataName.
func WaitsFor(claim metav1.Object, dataName string) bool {
	return PhaseOf(claim) == Waiting && claim.GetAnnotations()[PreallocatedForAnnotation] == dataName
}

// IPAMFinalized tells whether the IPAM has put its finalizer on the claim, the first of the two
// writes that answer it.
func IPAMFinalized(claim metav1.Object) bool {
	return slices.ContainsFunc(claim.GetFinalizers(), func(f string) bool { return f != infrav1.DataFinalizer })
}

// Metal3DataOwner is the claim's Metal3Data owner reference, which CAPM3 maps its events by.
func Metal3DataOwner(claim metav1.Object) *metav1.OwnerReference {
	return Owner(claim, Metal3DataGVK.Kind)
}
