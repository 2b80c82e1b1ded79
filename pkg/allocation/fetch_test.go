package allocation

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestFetch(t *testing.T) {
	owned := []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "uid"}}
	stale := []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "old"}}
	ipClaim := func(name string, owners []metav1.OwnerReference, status ipamv1.IPClaimStatus) *ipamv1.IPClaim {
		return &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", OwnerReferences: owners}, Status: status}
	}
	allocated := ipamv1.IPClaimStatus{Address: &corev1.ObjectReference{Name: "addr-a"}}
	ipAddress := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "addr-a", Namespace: "ns"}, Spec: ipamv1.IPAddressSpec{
		Address: "192.168.0.10", Prefix: 24, Gateway: ptr.To(ipamv1.IPAddressStr("192.168.0.1")),
		DNSServers: []ipamv1.IPAddressStr{"8.8.8.8"},
	}}
	addrClaim := func(ref string, deleting bool) *capipamv1.IPAddressClaim {
		c := &capipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Name: "tmpl-0-capi", Namespace: "ns"}}
		c.Status.AddressRef.Name = ref
		if deleting {
			// Deleted by the test once stored; the finalizer keeps it.
			c.Finalizers = []string{"x"}
			c.Labels = map[string]string{"delete": "true"}
		}
		return c
	}
	capiAddress := &capipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "capi-addr", Namespace: "ns"},
		Spec: capipamv1.IPAddressSpec{Address: "10.0.0.5", Prefix: ptr.To(int32(16)), Gateway: "10.0.0.1"}}
	wantA := Address{Address: "192.168.0.10", Prefix: ptr.To(int32(24)), Gateway: "192.168.0.1", DNSServers: []string{"8.8.8.8"}}

	for _, tc := range []struct {
		name        string
		objs        []client.Object
		want        map[string]Address
		wantPending []string
		wantFailed  bool
	}{
		{name: "no claims yet", wantPending: []string{"a", "capi"}},
		{
			name:        "claim of an earlier Metal3Data with the same name",
			objs:        []client.Object{ipClaim("tmpl-0-a", stale, allocated), ipAddress},
			wantPending: []string{"a", "capi"},
		},
		{
			name:        "preallocated claim not handed over yet",
			objs:        []client.Object{ipClaim("tmpl-0-a", nil, allocated), ipAddress},
			wantPending: []string{"a", "capi"},
		},
		{
			name:        "owned, not allocated yet",
			objs:        []client.Object{ipClaim("tmpl-0-a", owned, ipamv1.IPClaimStatus{}), addrClaim("", false)},
			wantPending: []string{"a", "capi"},
		},
		{
			name:       "allocation failed",
			objs:       []client.Object{ipClaim("tmpl-0-a", owned, ipamv1.IPClaimStatus{ErrorMessage: ptr.To("pool exhausted")})},
			wantFailed: true,
		},
		{
			name:        "address object not there yet",
			objs:        []client.Object{ipClaim("tmpl-0-a", owned, allocated), addrClaim("capi-addr", false)},
			wantPending: []string{"a", "capi"},
		},
		{
			name:        "IPAddressClaim being deleted",
			objs:        []client.Object{ipClaim("tmpl-0-a", owned, allocated), ipAddress, addrClaim("capi-addr", true), capiAddress},
			want:        map[string]Address{"a": wantA},
			wantPending: []string{"capi"},
		},
		{
			name: "both fulfilled",
			objs: []client.Object{ipClaim("tmpl-0-a", owned, allocated), ipAddress, addrClaim("capi-addr", false), capiAddress},
			want: map[string]Address{"a": wantA, "capi": {Address: "10.0.0.5", Prefix: ptr.To(int32(16)), Gateway: "10.0.0.1"}},
		},
		{
			name: "IPClaim found under the host's name",
			objs: []client.Object{ipClaim("host-a", owned, allocated), ipAddress, addrClaim("capi-addr", false), capiAddress},
			want: map[string]Address{"a": wantA, "capi": {Address: "10.0.0.5", Prefix: ptr.To(int32(16)), Gateway: "10.0.0.1"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := testData()
			claims := Plan(data, []PoolRef{metal3("a"), {Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}}, "host", false)
			c := fakeClient(nil, tc.objs...)
			for _, obj := range tc.objs {
				if obj.GetLabels()["delete"] == "true" {
					if err := c.Delete(context.Background(), obj); err != nil {
						t.Fatal(err)
					}
				}
			}
			got, err := Fetch(context.Background(), c, data, claims)
			if tc.wantFailed {
				if !IsAllocationError(err) || err.Error() != "IP Allocation for a failed : pool exhausted" {
					t.Fatalf("error = %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				tc.want = map[string]Address{}
			}
			if diff := cmp.Diff(tc.want, got.ByPool); diff != "" {
				t.Errorf("addresses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantPending, got.Pending); diff != "" {
				t.Errorf("pending (-want +got):\n%s", diff)
			}
		})
	}
}
