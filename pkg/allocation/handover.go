package allocation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClaimRef names a claim recorded in ClaimsAnnotation.
type ClaimRef struct {
	Kind string
	Name string
}

func (r ClaimRef) String() string { return r.Kind + "/" + r.Name }

// GVK is the version the claim is created with.
func (r ClaimRef) GVK() (schema.GroupVersionKind, error) {
	switch r.Kind {
	case KindIPClaim:
		return IPClaimGVK, nil
	case KindIPAddressClaim:
		return IPAddressClaimGVK, nil
	}
	return schema.GroupVersionKind{}, fmt.Errorf("unknown claim kind %q", r.Kind)
}

// FormatClaims is the value of ClaimsAnnotation for these claims.
func FormatClaims(refs []ClaimRef) string {
	parts := make([]string, len(refs))
	for i, r := range refs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// ParseClaims reads ClaimsAnnotation.
func ParseClaims(value string) ([]ClaimRef, error) {
	if value == "" {
		return nil, nil
	}
	var refs []ClaimRef
	for part := range strings.SplitSeq(value, ",") {
		kind, name, ok := strings.Cut(part, "/")
		ref := ClaimRef{Kind: kind, Name: name}
		if _, err := ref.GVK(); !ok || name == "" || err != nil {
			return nil, fmt.Errorf("annotation %s: %q is not <IPClaim|IPAddressClaim>/<name>", ClaimsAnnotation, part)
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

func jsonPointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// HandOver gives a claim preallocated for data exactly the owner references CAPM3 gives its
// claims, and drops the PreallocatedForAnnotation, in one patch that reads nothing: a JSON patch
// test makes it apply only while the claim is still waiting for this Metal3Data, so a claim is
// never written twice. onlyMarker says the claim's only annotation is ours (known from a cache,
// or assumed): then the annotations field goes away whole, as on a claim CAPM3 created; when that
// guess is wrong, the patch is retried removing only our key. It returns false, without error,
// when the claim was not waiting for data (handed over already, gone, or someone else's).
func HandOver(ctx context.Context, c client.Writer, data metav1.Object, ref ClaimRef, namespace string, onlyMarker bool) (bool, error) {
	gvk, err := ref.GVK()
	if err != nil {
		return false, err
	}
	owners := []metav1.OwnerReference{OwnerReference(data)}
	marker := "/metadata/annotations/" + jsonPointer(PreallocatedForAnnotation)
	forms := [][]patchOp{{
		{Op: "test", Path: marker, Value: data.GetName()},
		{Op: "remove", Path: marker},
		{Op: "add", Path: "/metadata/ownerReferences", Value: owners},
	}}
	if onlyMarker {
		forms = slices.Insert(forms, 0, []patchOp{
			{Op: "test", Path: "/metadata/annotations", Value: map[string]string{PreallocatedForAnnotation: data.GetName()}},
			{Op: "remove", Path: "/metadata/annotations"},
			{Op: "add", Path: "/metadata/ownerReferences", Value: owners},
		})
	}
	for _, ops := range forms {
		err = patch(ctx, c, gvk, namespace, ref.Name, ops)
		if err == nil {
			return true, nil
		}
		if !isTestFailure(err) {
			return false, client.IgnoreNotFound(err)
		}
	}
	return false, nil
}

// Release frees a claim preallocated for a Metal3Data that was never stored: it drops CAPM3's
// finalizer, only while the claim is still waiting (the JSON patch tests it), and deletes it, so
// that the IPAM returns the address to its pool. finalizers are the claim's as last seen.
func Release(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata) (bool, error) {
	gvk := claim.GroupVersionKind()
	if i := slices.Index(claim.Finalizers, infrav1.DataFinalizer); i >= 0 {
		path := fmt.Sprintf("/metadata/finalizers/%d", i)
		err := patch(ctx, c, gvk, claim.Namespace, claim.Name, []patchOp{
			{Op: "test", Path: "/metadata/annotations/" + jsonPointer(PreallocatedForAnnotation), Value: claim.Annotations[PreallocatedForAnnotation]},
			{Op: "test", Path: "/metadata/uid", Value: claim.UID},
			{Op: "test", Path: path, Value: infrav1.DataFinalizer},
			{Op: "remove", Path: path},
		})
		if isTestFailure(err) || apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	obj := Metadata(gvk)
	obj.SetNamespace(claim.Namespace)
	obj.SetName(claim.Name)
	err := c.Delete(ctx, obj, client.Preconditions{UID: &claim.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	return err == nil, err
}

func patch(ctx context.Context, c client.Writer, gvk schema.GroupVersionKind, namespace, name string, ops []patchOp) error {
	body, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	obj := Metadata(gvk)
	obj.SetNamespace(namespace)
	obj.SetName(name)
	return c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, body))
}

// isTestFailure tells a failed JSON patch test, or a path the patch expected that is not there,
// from other errors: the API server answers them with 422 Invalid.
func isTestFailure(err error) bool {
	return apierrors.IsInvalid(err)
}
