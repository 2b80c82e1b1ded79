package mutate

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
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
