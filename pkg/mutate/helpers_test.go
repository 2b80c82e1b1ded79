package mutate

import (
	"context"
	"encoding/json"

	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

func newClient(objs []client.Object, funcs *interceptor.Funcs) client.WithWatch {
	b := fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func newPreallocator(c client.Client, bmhNameBased bool) *Preallocator {
	return &Preallocator{
		Reader:       c,
		Creator:      &allocation.Creator{Client: c, Cache: c, APIReader: c},
		Decoder:      admission.NewDecoder(fixtures.Scheme()),
		BMHNameBased: bmhNameBased,
		Timeout:      time.Second,
	}
}

func createRequest(t *testing.T, data *infrav1.Metal3Data, dryRun bool) admission.Request {
	t.Helper()
	raw, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "request-uid",
		Kind:      metav1.GroupVersionKind{Group: infrav1.GroupVersion.Group, Version: infrav1.GroupVersion.Version, Kind: "Metal3Data"},
		Resource:  metav1.GroupVersionResource{Group: infrav1.GroupVersion.Group, Version: infrav1.GroupVersion.Version, Resource: "metal3datas"},
		Name:      data.Name,
		Namespace: data.Namespace,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
		DryRun:    ptr.To(dryRun),
	}}
}

// claimsIn lists every IPClaim and IPAddressClaim in the namespace, by name.
func claimsIn(t *testing.T, c client.Reader) map[string]client.Object {
	t.Helper()
	out := map[string]client.Object{}
	ipClaims := &ipamv1.IPClaimList{}
	if err := c.List(context.Background(), ipClaims, client.InNamespace(fixtures.Namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range ipClaims.Items {
		out[ipClaims.Items[i].Name] = &ipClaims.Items[i]
	}
	addrClaims := &capipamv1.IPAddressClaimList{}
	if err := c.List(context.Background(), addrClaims, client.InNamespace(fixtures.Namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range addrClaims.Items {
		out[addrClaims.Items[i].Name] = &addrClaims.Items[i]
	}
	return out
}

// applyPatch applies an admission response's JSON patch to the request's object.
func applyPatch(t *testing.T, req admission.Request, resp admission.Response) *infrav1.Metal3Data {
	t.Helper()
	if err := resp.Complete(req); err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(req.Object.Raw)
	if err != nil {
		t.Fatal(err)
	}
	out := &infrav1.Metal3Data{}
	if err := json.Unmarshal(patched, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func cmpData(want, got *infrav1.Metal3Data) string {
	return cmp.Diff(want, got)
}
