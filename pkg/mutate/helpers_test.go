package mutate

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
)

// newPreallocator reads through c; what it admits is created at once, where the replica's
// Admissions answers once the creates are sent.
func newPreallocator(c client.Client, bmhNameBased bool) *Preallocator {
	creator := &allocation.Creator{Client: c, Cache: c, APIReader: c}
	return &Preallocator{
		Reader:       c,
		Decoder:      admission.NewDecoder(fixtures.Scheme()),
		BMHNameBased: bmhNameBased,
		Timeout:      time.Second,
		OnAdmitted: func(_ context.Context, key types.NamespacedName, token, _ string, claims []allocation.Claim, _ string) {
			creator.Create(context.Background(), key.Name, token, claims, nil)
		},
	}
}

// guardBeside is a Guard that checked a CAPM3 v1.13.2 Deployment running with args.
func guardBeside(t *testing.T, args ...string) *compat.Guard {
	t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "capm3-system", Name: "capm3-controller-manager"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "manager", Image: "quay.io/metal3-io/cluster-api-provider-metal3:v1.13.2", Args: args},
		}}}},
	}
	g := &compat.Guard{Client: fake.NewClientBuilder().WithObjects(d).Build()}
	if _, err := g.Reconcile(context.Background(), ctrl.Request{}); err != nil {
		t.Fatal(err)
	}
	if refusal := g.Refusal(); refusal != "" {
		t.Fatalf("the guard refuses: %s", refusal)
	}
	return g
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
	return fixtures.Diff(want, got)
}
