package stack

import (
	"testing"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// TestClaimRead: what CAPM3's first reconcile of a Metal3Data read of its claims, and nothing
// a later reconcile read.
func TestClaimRead(t *testing.T) {
	owned := []metav1.OwnerReference{{Kind: "Metal3Data", Name: "d", UID: "u"}}
	waiting := map[string]string{allocation.PreallocatedForAnnotation: "d"}
	address := &corev1.ObjectReference{Name: "d-a"}
	for _, tc := range []struct {
		name                string
		claim               client.Object
		after               bool
		waiting, unanswered bool
	}{
		{name: "waiting, unanswered", claim: &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Annotations: waiting}}, waiting: true, unanswered: true},
		{name: "waiting, answered", claim: &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Annotations: waiting}, Status: ipamv1.IPClaimStatus{Address: address}}, waiting: true},
		{name: "owned, unanswered", claim: &capipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{OwnerReferences: owned}}, unanswered: true},
		{name: "owned, answered", claim: &capipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{OwnerReferences: owned},
			Status: capipamv1.IPAddressClaimStatus{AddressRef: capipamv1.IPAddressReference{Name: "d-a"}}}},
		{name: "read by a later reconcile", claim: &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Annotations: waiting}}, after: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Counter{}
			key := types.NamespacedName{Name: "d"}
			if tc.after {
				c.reconciled(key, time.Now(), reconcile.Result{}, nil, &reconcileWrites{})
			}
			c.claimRead(tc.claim)
			s := c.Of(key)
			if s.FirstReconcileSawWaitingClaim != tc.waiting || s.FirstReconcileSawUnansweredClaim != tc.unanswered {
				t.Errorf("waiting %v, unanswered %v; want %v, %v", s.FirstReconcileSawWaitingClaim, s.FirstReconcileSawUnansweredClaim, tc.waiting, tc.unanswered)
			}
		})
	}
}
