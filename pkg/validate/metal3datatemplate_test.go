package validate

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

func validator(objs ...client.Object) *Metal3DataTemplate {
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{ipamv1.GroupVersion})
	mapper.Add(ipamv1.GroupVersion.WithKind("IPPool"), meta.RESTScopeNamespace)
	return &Metal3DataTemplate{
		Reader:     fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objs...).Build(),
		RESTMapper: mapper,
	}
}

func TestValidateWarnsAboutPoolsThatAreNotThere(t *testing.T) {
	tmpl := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "present"},
		{IPAddressFromIPPool: "absent"},
		{FromPoolRef: infrav1.IPPoolReference{Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}},
		{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "machine", Annotation: "example.com/pool"}},
	}}, nil)
	present := &ipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "present", Namespace: "ns"}}
	v := validator(present)

	for name, validate := range map[string]func() (admission.Warnings, error){
		"create": func() (admission.Warnings, error) { return v.ValidateCreate(context.Background(), tmpl) },
		"update": func() (admission.Warnings, error) {
			return v.ValidateUpdate(context.Background(), tmpl.DeepCopy(), tmpl)
		},
	} {
		t.Run(name, func(t *testing.T) {
			warnings, err := validate()
			if err != nil {
				t.Fatal(err)
			}
			want := []string{
				`spec.networkData.networks.ipv4[1].ipAddressFromIPPool: IPPool.ipam.metal3.io "absent" does not exist in namespace "ns"`,
				`spec.networkData.networks.ipv4[2].fromPoolRef: no installed API serves InClusterIPPool.ipam.cluster.x-k8s.io for pool "capi"`,
			}
			if diff := cmp.Diff(want, []string(warnings)); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidateRejectsWithFieldPaths(t *testing.T) {
	tmpl := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "p"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "Other"}},
	}}, nil)
	_, err := validator().ValidateCreate(context.Background(), tmpl)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error %v is not Invalid", err)
	}
	status := err.(apierrors.APIStatus).Status()
	if status.Details.Kind != "Metal3DataTemplate" || status.Details.Group != "infrastructure.cluster.x-k8s.io" ||
		len(status.Details.Causes) != 1 || status.Details.Causes[0].Field != "spec.networkData.networks.ipv4[1].fromPoolRef" {
		t.Errorf("details %+v", status.Details)
	}
	if !strings.Contains(err.Error(), `Metal3DataTemplate.infrastructure.cluster.x-k8s.io "t" is invalid`) {
		t.Errorf("message %q", err.Error())
	}
}

func TestDeleteIsAlwaysAllowed(t *testing.T) {
	if w, err := validator().ValidateDelete(context.Background(), template("t", infrav1.NetworkDataNetwork{}, nil)); err != nil || w != nil {
		t.Fatal(w, err)
	}
}
