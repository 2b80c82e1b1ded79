// Package equivalence pins the preallocator to CAPM3's own code: it runs CAPM3 v1.13.2's
// DataManager next to our admission handler on the same fixtures.
package equivalence

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/metal3-io/cluster-api-provider-metal3/baremetal"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/mutate"
)

// comparable is what must be equal between CAPM3's claim and ours.
type comparableClaim struct {
	Kind, Name, Namespace string
	Labels                map[string]string
	Finalizers            []string
	Spec                  any
}

func comparableOf(obj client.Object) comparableClaim {
	c := comparableClaim{Name: obj.GetName(), Namespace: obj.GetNamespace(), Labels: obj.GetLabels(), Finalizers: obj.GetFinalizers()}
	switch o := obj.(type) {
	case *ipamv1.IPClaim:
		c.Kind, c.Spec = allocation.KindIPClaim, o.Spec
	case *capipamv1.IPAddressClaim:
		c.Kind, c.Spec = allocation.KindIPAddressClaim, o.Spec
	}
	return c
}

// TestClaimsEqualCAPM3 runs CAPM3 v1.13.2's own DataManager and our preallocator on the same
// fixtures, each against its own fake client, and compares the claims they create.
func TestClaimsEqualCAPM3(t *testing.T) {
	// A claim left by an earlier Metal3Data of the host, named <bmh>-<pool>: CAPM3 uses it as it
	// is in both naming modes and creates no claim for that pool.
	leftover := &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{
		Name: "host-3-pool-v4", Namespace: fixtures.Namespace, Finalizers: []string{"metal3data.infrastructure.cluster.x-k8s.io"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: "tmpl-1", UID: "old"}},
	}, Spec: ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "pool-v4", Namespace: fixtures.Namespace}}}

	for _, tc := range []struct {
		name         string
		bmhNameBased bool
		existing     []client.Object
	}{
		{name: "metal3data-names"},
		{name: "bmh-names", bmhNameBased: true},
		{name: "metal3data-names-with-host-claim", existing: []client.Object{leftover}},
		{name: "bmh-names-with-host-claim", bmhNameBased: true, existing: []client.Object{leftover}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
			objs := append(m.Objects(), tc.existing...)

			capm3Client := fixtures.NewClient(objs, nil)
			capm3Data := m.Data.DeepCopy()
			capm3Data.UID = "metal3data-uid"
			baremetal.EnableBMHNameBasedPreallocation = tc.bmhNameBased
			t.Cleanup(func() { baremetal.EnableBMHNameBasedPreallocation = false })
			dm, err := baremetal.NewDataManager(capm3Client, capm3Data, logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			// The claims are not fulfilled, so CAPM3 creates them and asks to be requeued.
			if err := dm.Reconcile(context.Background()); err == nil {
				t.Fatal("CAPM3 reconcile did not wait for the claims")
			}
			want := fixtures.Claims(t, capm3Client)

			ourClient := fixtures.NewClient(objs, nil)
			resp := preallocator(ourClient, tc.bmhNameBased).Handle(context.Background(), fixtures.CreateRequest(t, m.Data, false))
			if !resp.Allowed || len(resp.Warnings) != len(tc.existing) {
				t.Fatalf("admission: allowed=%v warnings=%v", resp.Allowed, resp.Warnings)
			}
			got := fixtures.Claims(t, ourClient)

			if len(want) != len(fixtures.AllPools) {
				t.Fatalf("CAPM3 ends with %d claims, the fixtures reference %d pools", len(want), len(fixtures.AllPools))
			}
			if diff := cmp.Diff(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got))); diff != "" {
				t.Fatalf("claim names differ (-CAPM3 +ours):\n%s", diff)
			}
			for _, obj := range tc.existing {
				if diff := cmp.Diff(obj.GetResourceVersion(), got[obj.GetName()].GetResourceVersion()); diff != "" {
					t.Errorf("existing claim %s was modified", obj.GetName())
				}
				delete(want, obj.GetName())
			}
			for name, capm3Claim := range want {
				w, g := comparableOf(capm3Claim), comparableOf(got[name])
				if w.Kind == allocation.KindIPAddressClaim && tc.bmhNameBased {
					// CAPM3 shares its label map between the Metal3Data and its claims, so an
					// IPAddressClaim carries the data/pool labels of whichever Metal3 pool its map
					// iteration reached first, if any. It can only be a Metal3 pool.
					if pool, ok := w.Labels[allocation.PoolLabelName]; ok && (!slices.Contains(fixtures.AllPools, pool) || pool == "pool-capi") {
						t.Errorf("%s: CAPM3 gave pool-name label %q", name, pool)
					}
					delete(w.Labels, allocation.PoolLabelName)
					delete(w.Labels, allocation.DataLabelName)
				}
				if diff := cmp.Diff(w, g); diff != "" {
					t.Errorf("claim %s differs (-CAPM3 +ours):\n%s", name, diff)
				}
				if got[name].GetAnnotations()[allocation.PreallocatedForAnnotation] != m.Data.Name {
					t.Errorf("claim %s is not marked as preallocated for %s", name, m.Data.Name)
				}
				if refs := got[name].GetOwnerReferences(); len(refs) != 0 {
					t.Errorf("claim %s has owner references before the Metal3Data exists: %v", name, refs)
				}
			}

			// The plan carries the owner reference CAPM3 gives, once the UID is known.
			pools, err := allocation.ReferencedPools(m.Template, allocation.Machine{Machine: m.Machine, Metal3Machine: m.Metal3Machine, BareMetalHost: m.Host})
			if err != nil {
				t.Fatal(err)
			}
			for _, claim := range allocation.Plan(capm3Data, pools, m.Host.Name, tc.bmhNameBased) {
				if capm3Claim, ok := want[claim.Object.GetName()]; ok {
					if diff := cmp.Diff(capm3Claim.GetOwnerReferences(), claim.Object.GetOwnerReferences()); diff != "" {
						t.Errorf("owner references of %s differ (-CAPM3 +ours):\n%s", claim.Object.GetName(), diff)
					}
				}
			}
		})
	}
}

// preallocator admits through c and creates what it admitted at once, where the replica's
// Admissions answers once the creates are sent.
func preallocator(c client.Client, bmhNameBased bool) *mutate.Preallocator {
	creator := &allocation.Creator{Client: c, Cache: c, APIReader: c}
	return &mutate.Preallocator{
		Reader:       c,
		Decoder:      admission.NewDecoder(fixtures.Scheme()),
		BMHNameBased: bmhNameBased,
		Timeout:      time.Second,
		OnAdmitted: func(_ context.Context, key types.NamespacedName, token, _ string, claims []allocation.Claim, _ string) {
			creator.Create(context.Background(), key.Name, token, claims, nil)
		},
	}
}
