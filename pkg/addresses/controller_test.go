package addresses

import (
	"testing"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/index"
)

// TestMayNeedRelease: only the IPAddresses Reconcile could release reach its queue; those of a
// settled claim with one IPAddress, a standing fleet's at start-up, do not.
func TestMayNeedRelease(t *testing.T) {
	now := metav1.Now()
	claim := func(name string, uid types.UID, deleting bool) *ipamv1.IPClaim {
		c := &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid}}
		if deleting {
			// A waiting claim, preallocated and never handed over, deleted.
			c.DeletionTimestamp, c.Finalizers = &now, []string{ipamv1.IPClaimFinalizer}
			c.Annotations = map[string]string{allocation.PreallocatedForAnnotation: "d"}
		}
		return c
	}
	address := func(name string, of *ipamv1.IPClaim) *ipamv1.IPAddress {
		return &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: ipamv1.GroupVersion.String(), Kind: allocation.KindIPClaim, Name: of.Name, UID: of.UID},
		}}}
	}
	settled, twice, deleted := claim("settled", "u1", false), claim("twice", "u2", false), claim("deleted", "u3", true)
	gone := claim("gone", "u4", false)
	objects := []client.Object{settled, twice, deleted,
		address("pool-10-0-0-1", settled), address("pool-10-0-0-2", twice), address("pool-10-0-0-3", twice), address("pool-10-0-0-4", deleted)}
	b := fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objects...)
	for _, f := range index.Fields() {
		b = b.WithIndex(f.Object, f.Name, f.Extract)
	}
	a := &Addresses{Client: b.Build()}
	for _, tc := range []struct {
		name    string
		address client.Object
		want    bool
	}{
		{"of a settled claim", address("pool-10-0-0-1", settled), false},
		{"one of two of a claim", address("pool-10-0-0-2", twice), true},
		{"of a waiting claim being deleted", address("pool-10-0-0-4", deleted), true},
		{"of a claim not in the cache", address("pool-10-0-0-5", gone), true},
		{"of another claim of that name", address("pool-10-0-0-6", claim("settled", "u5", false)), true},
		{"of no claim", &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool-10-0-0-7"}}, false},
	} {
		if got := a.mayNeedRelease(tc.address); got != tc.want {
			t.Errorf("an IPAddress %s: mayNeedRelease = %v, want %v", tc.name, got, tc.want)
		}
	}
}
