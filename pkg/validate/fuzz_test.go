package validate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// FuzzTemplate: whatever two templates hold, validation does not panic, gives the same answer
// twice, points every error into spec, and never blocks what must pass: an update that keeps the
// spec, an update of an object being deleted, or an error the stored object has already.
func FuzzTemplate(f *testing.F) {
	conflicting := template("t", infrav1.NetworkDataNetwork{
		IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: "p"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "Other"}}},
		IPv6: []infrav1.NetworkDataIPv6{{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "cluster", Annotation: "bad key"}}},
	}, &infrav1.MetaData{GatewaysFromPool: []infrav1.FromPool{{Key: "gw", Name: "Pool_1", Kind: "Other"}}})
	long := template(strings.Repeat("t", 10), infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: strings.Repeat("p", 238)}}}, nil)
	for _, seed := range [][2]*infrav1.Metal3DataTemplate{
		{nil, fixtures.Template("workers")},
		{fixtures.Template("workers"), conflicting},
		{conflicting, fixtures.ThreePoolTemplate("three")},
		{conflicting, conflicting},
		{nil, long},
	} {
		var old []byte
		if seed[0] != nil {
			var err error
			if old, err = json.Marshal(seed[0]); err != nil {
				f.Fatal(err)
			}
		}
		tmpl, err := json.Marshal(seed[1])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(old, tmpl)
	}

	f.Fuzz(func(t *testing.T, oldData, data []byte) {
		tmpl := &infrav1.Metal3DataTemplate{}
		if json.Unmarshal(data, tmpl) != nil {
			return
		}
		var old *infrav1.Metal3DataTemplate
		if len(oldData) > 0 {
			old = &infrav1.Metal3DataTemplate{}
			if json.Unmarshal(oldData, old) != nil {
				return
			}
		}

		errs, warnings := Template(old, tmpl)
		again, againWarnings := Template(old, tmpl)
		if fmt.Sprint(errs, warnings) != fmt.Sprint(again, againWarnings) {
			t.Fatalf("not deterministic: %v %v, then %v %v", errs, warnings, again, againWarnings)
		}
		created, _ := Template(nil, tmpl)
		onCreate := map[errorKey]bool{}
		for _, err := range created {
			if !strings.HasPrefix(err.Field, "spec.") {
				t.Fatalf("error outside spec: %v", err)
			}
			onCreate[keyOf(err)] = true
		}
		for _, err := range errs {
			if !onCreate[keyOf(err)] {
				t.Fatalf("an update rejects %v, which a create does not", err)
			}
		}

		for name, rejected := range map[string]field.ErrorList{
			"unchanged spec": first(Template(tmpl, tmpl.DeepCopy())),
			"stored errors":  first(Template(tmpl, otherCluster(tmpl))),
			"being deleted":  first(Template(old, deleting(tmpl))),
		} {
			if len(rejected) > 0 {
				t.Fatalf("%s: rejected %v", name, rejected)
			}
		}
	})
}

// first drops the warnings.
func first(errs field.ErrorList, _ []string) field.ErrorList { return errs }

// otherCluster is tmpl with a spec change away from its pools, so that its errors stay in place.
func otherCluster(tmpl *infrav1.Metal3DataTemplate) *infrav1.Metal3DataTemplate {
	tmpl = tmpl.DeepCopy()
	tmpl.Spec.ClusterName += "-renamed"
	return tmpl
}

func deleting(tmpl *infrav1.Metal3DataTemplate) *infrav1.Metal3DataTemplate {
	tmpl = tmpl.DeepCopy()
	tmpl.DeletionTimestamp = &metav1.Time{Time: time.Unix(0, 0)}
	return tmpl
}
