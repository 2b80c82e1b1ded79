package allocation

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// FuzzResolve: whatever a template and a machine's annotations hold, pool resolution does not
// panic, gives the same answer twice, and keeps CAPM3's invariants: one pool per name, group and
// kind always set, ReferencedPools failing exactly with Resolve's first error.
func FuzzResolve(f *testing.F) {
	conflicting := networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "p", FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "Machine", Annotation: ann}},
		{FromPoolRef: infrav1.IPPoolReference{Name: "p", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}},
		{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "cluster", Annotation: ann}},
	}})
	for _, seed := range []struct {
		tmpl               *infrav1.Metal3DataTemplate
		machine, m3m, host string
	}{
		{&infrav1.Metal3DataTemplate{}, "", "", ""},
		{fixtures.Template("workers"), "provisioning-from-machine", "provisioning-from-m3m", "provisioning-from-host"},
		{fixtures.Template("workers"), "pool-capi", "", "pool-v4"},
		{fixtures.ThreePoolTemplate("three"), "", "", ""},
		{conflicting, "p", "q", ""},
	} {
		data, err := json.Marshal(seed.tmpl)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, seed.machine, seed.m3m, seed.host)
	}

	f.Fuzz(func(t *testing.T, data []byte, machine, m3m, host string) {
		tmpl := &infrav1.Metal3DataTemplate{}
		if json.Unmarshal(data, tmpl) != nil {
			return
		}
		annotated := func(v string) metav1.Object {
			return &metav1.ObjectMeta{Annotations: map[string]string{ann: v, fixtures.PoolAnnotation: v}}
		}
		for _, m := range []Machine{{}, {Machine: annotated(machine), Metal3Machine: annotated(m3m), BareMetalHost: annotated(host)}} {
			pools, errs := Resolve(tmpl, m)
			again, againErrs := Resolve(tmpl, m)
			if !reflect.DeepEqual(pools, again) || fmt.Sprint(errs) != fmt.Sprint(againErrs) {
				t.Fatalf("not deterministic: %v %v, then %v %v", pools, errs, again, againErrs)
			}
			seen := map[string]bool{}
			for _, p := range pools {
				if seen[p.Name] || p.APIGroup == "" || p.Kind == "" || p.Path == nil {
					t.Fatalf("pool %+v in %v", p, pools)
				}
				seen[p.Name] = true
			}
			for _, err := range errs {
				var conflict *PoolConflictError
				if errors.As(err, &conflict) && (!errors.Is(err, errConflictingPoolTypes) ||
					conflict.Pool.Name != conflict.First.Name || conflict.Pool == conflict.First) {
					t.Fatalf("conflict %+v", conflict)
				}
			}

			refs, err := ReferencedPools(tmpl, m)
			if len(errs) > 0 {
				if refs != nil || err == nil || err.Error() != errs[0].Error() {
					t.Fatalf("ReferencedPools = %v, %v; Resolve's first error %v", refs, err, errs[0])
				}
				continue
			}
			if err != nil || len(refs) != len(pools) {
				t.Fatalf("ReferencedPools = %v, %v; Resolve %v", refs, err, pools)
			}
			for i := range refs {
				if refs[i] != pools[i].PoolRef {
					t.Fatalf("ReferencedPools = %v; Resolve %v", refs, pools)
				}
			}
		}
	})
}
