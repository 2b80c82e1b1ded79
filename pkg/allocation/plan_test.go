package allocation

import (
	"testing"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

func testData() *infrav1.Metal3Data {
	return &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{
		Name: "tmpl-0", Namespace: "ns", UID: "uid", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "c"},
	}}
}

func TestPlan(t *testing.T) {
	capiPool := PoolRef{Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}
	owner := []metav1.OwnerReference{{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: "tmpl-0", UID: "uid", Controller: ptr.To(true)}}
	ipClaim := func(name string, labels map[string]string) *ipamv1.IPClaim {
		return &ipamv1.IPClaim{
			TypeMeta: metav1.TypeMeta{APIVersion: "ipam.metal3.io/v1alpha1", Kind: "IPClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels,
				Finalizers: []string{"metal3data.infrastructure.cluster.x-k8s.io"}, OwnerReferences: owner},
			Spec: ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "m3", Namespace: "ns"}},
		}
	}
	addressClaim := &capipamv1.IPAddressClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "ipam.cluster.x-k8s.io/v1beta2", Kind: "IPAddressClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "tmpl-0-capi", Namespace: "ns", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "c"},
			Finalizers: []string{"metal3data.infrastructure.cluster.x-k8s.io"}, OwnerReferences: owner},
		Spec: capipamv1.IPAddressClaimSpec{PoolRef: capipamv1.IPPoolReference{Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}},
	}

	for _, tc := range []struct {
		name         string
		bmhNameBased bool
		want         []Claim
	}{
		{
			name: "named after the Metal3Data",
			want: []Claim{
				{Pool: metal3("m3"), Lookup: []string{"tmpl-0-m3", "host-m3"},
					Object: ipClaim("tmpl-0-m3", map[string]string{"cluster.x-k8s.io/cluster-name": "c"})},
				{Pool: capiPool, Lookup: []string{"tmpl-0-capi"}, Object: addressClaim},
			},
		},
		{
			name:         "named after the BareMetalHost, with data and pool labels on IPClaims only",
			bmhNameBased: true,
			want: []Claim{
				{Pool: metal3("m3"), Lookup: []string{"tmpl-0-m3", "host-m3"}, Object: ipClaim("host-m3", map[string]string{
					"cluster.x-k8s.io/cluster-name": "c", DataLabelName: "tmpl-0", PoolLabelName: "m3"})},
				{Pool: capiPool, Lookup: []string{"tmpl-0-capi"}, Object: addressClaim},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := testData()
			got := Plan(data, []PoolRef{metal3("m3"), capiPool}, "host", tc.bmhNameBased)
			if diff := fixtures.Diff(tc.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if diff := fixtures.Diff(testData(), data); diff != "" {
				t.Errorf("Plan modified the Metal3Data:\n%s", diff)
			}
			if got[0].Kind() != KindIPClaim || got[1].Kind() != KindIPAddressClaim {
				t.Errorf("kinds = %s, %s", got[0].Kind(), got[1].Kind())
			}
		})
	}
}

func TestPlanEachClaimCarriesItsOwnPoolLabel(t *testing.T) {
	claims := Plan(testData(), []PoolRef{metal3("a"), metal3("b")}, "host", true)
	for _, c := range claims {
		if got := c.Object.GetLabels()[PoolLabelName]; got != c.Pool.Name {
			t.Errorf("%s: pool-name label %q", c.Object.GetName(), got)
		}
	}
}

func TestPreallocated(t *testing.T) {
	data := testData()
	data.UID = ""
	data.Spec.Claim = &infrav1.Metal3ObjectRef{Name: "m3m-0", Namespace: "ns"}
	claim := Plan(data, []PoolRef{metal3("m3")}, "host", false)[0]
	got := claim.preallocated("admission-uid")
	if len(got.GetOwnerReferences()) != 0 {
		t.Errorf("owner references: %v", got.GetOwnerReferences())
	}
	want := map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "admission-uid", DataClaimAnnotation: "m3m-0"}
	if diff := fixtures.Diff(want, got.GetAnnotations()); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
	data.Spec.Claim.Namespace = "elsewhere"
	if _, ok := Plan(data, []PoolRef{metal3("m3")}, "host", false)[0].preallocated("t").GetAnnotations()[DataClaimAnnotation]; ok {
		t.Error("a Metal3DataClaim in another namespace is named")
	}
	if len(claim.Object.GetOwnerReferences()) != 1 || claim.Object.GetAnnotations() != nil {
		t.Errorf("Preallocated modified the plan: %v", claim.Object)
	}
}
