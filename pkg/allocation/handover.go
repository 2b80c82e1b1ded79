package allocation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-openapi/jsonpointer"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"gomodules.xyz/jsonpatch/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// ClaimRef names a claim recorded in ClaimsAnnotation, in the Metal3Data's namespace.
type ClaimRef struct {
	Kind string
	Name string
}

// String is the ref as ClaimsAnnotation writes it, kind/name.
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

// ParseClaims reads ClaimsAnnotation. Names must be object names, so no ref leaves the namespace.
func ParseClaims(value string) ([]ClaimRef, error) {
	if value == "" {
		return nil, nil
	}
	var refs []ClaimRef
	for part := range strings.SplitSeq(value, ",") {
		kind, name, ok := strings.Cut(part, "/")
		ref := ClaimRef{Kind: kind, Name: name}
		if _, err := ref.GVK(); !ok || err != nil || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return nil, fmt.Errorf("annotation %s: %q is not <IPClaim|IPAddressClaim>/<name>", ClaimsAnnotation, part)
		}
		if slices.Contains(refs, ref) {
			continue
		}
		if len(refs) == clock.MaxRecordedClaims {
			return nil, fmt.Errorf("annotation %s: more than %d claims", ClaimsAnnotation, clock.MaxRecordedClaims)
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

func annotationPath(key string) string {
	return "/metadata/annotations/" + jsonpointer.Escape(key)
}

// waitingTests hold while the claim waits for dataName and token; a valueless test means unowned.
func waitingTests(dataName, token string) []jsonpatch.Operation {
	ops := []jsonpatch.Operation{
		jsonpatch.NewOperation("test", annotationPath(PreallocatedForAnnotation), dataName),
		{Operation: "test", Path: "/metadata/ownerReferences"},
	}
	if token != "" {
		ops = append(ops, jsonpatch.NewOperation("test", annotationPath(AdmissionAnnotation), token))
	}
	return ops
}

// HandOver gives a claim waiting for data CAPM3's owner reference and drops our annotations, in one
// patch whose tests hold only while it waits (with token, for that very admission). Annotations that
// are only ours go whole, as on a claim CAPM3 created. It returns false if the claim was not waiting.
func HandOver(ctx context.Context, c client.Writer, data metav1.Object, ref ClaimRef, token string, annotations map[string]string) (bool, error) {
	gvk, err := ref.GVK()
	if err != nil {
		return false, err
	}
	// A claim being deleted still shows the address the IPAM is freeing; CAPM3 must not render it.
	tests := append(waitingTests(data.GetName(), token), jsonpatch.Operation{Operation: "test", Path: "/metadata/deletionTimestamp"})
	own := jsonpatch.NewOperation("add", "/metadata/ownerReferences", []metav1.OwnerReference{OwnerReference(data)})
	removeKeys := slices.Concat(tests, []jsonpatch.Operation{
		jsonpatch.NewOperation("remove", annotationPath(PreallocatedForAnnotation), nil),
	}, removeIfPresent(DataClaimAnnotation))
	if token != "" {
		removeKeys = append(removeKeys, jsonpatch.NewOperation("remove", annotationPath(AdmissionAnnotation), nil))
	}
	forms := [][]jsonpatch.Operation{append(removeKeys, own)}
	if onlyOurs(annotations) {
		forms = slices.Insert(forms, 0, slices.Concat(tests, []jsonpatch.Operation{
			jsonpatch.NewOperation("test", "/metadata/annotations", annotations),
			jsonpatch.NewOperation("remove", "/metadata/annotations", nil),
			own,
		}))
	}
	for _, ops := range forms {
		err = patch(ctx, c, gvk, data.GetNamespace(), ref.Name, ops)
		if err == nil {
			return true, nil
		}
		if !IsTestFailure(err) {
			return false, client.IgnoreNotFound(err)
		}
	}
	return false, nil
}

func onlyOurs(annotations map[string]string) bool {
	if len(annotations) == 0 {
		return false
	}
	return !slices.ContainsFunc(slices.Collect(maps.Keys(annotations)), func(k string) bool {
		return k != PreallocatedForAnnotation && k != AdmissionAnnotation && k != DataClaimAnnotation
	})
}

// removeIfPresent adds the key first because JSON patch cannot remove a missing one.
func removeIfPresent(key string) []jsonpatch.Operation {
	return []jsonpatch.Operation{
		jsonpatch.NewOperation("add", annotationPath(key), ""),
		jsonpatch.NewOperation("remove", annotationPath(key), nil),
	}
}

// Release deletes a waiting claim whose Metal3Data is not stored, if unchanged since the live read
// that found it, and reports whether it did. No hand-over can follow: it refuses a claim being deleted.
func Release(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata) (bool, error) {
	return deleteUnchanged(ctx, c, claim, client.Preconditions{UID: &claim.UID, ResourceVersion: &claim.ResourceVersion})
}

// deleteUnchanged deletes obj under the preconditions and reports whether it did; a conflict or
// an object gone is no error.
func deleteUnchanged(ctx context.Context, c client.Writer, obj *metav1.PartialObjectMetadata, preconditions client.Preconditions) (bool, error) {
	target := Metadata(obj.GroupVersionKind())
	target.SetNamespace(obj.Namespace)
	target.SetName(obj.Name)
	err := c.Delete(ctx, target, preconditions)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("deleting %s %s/%s: %w", obj.Kind, obj.Namespace, obj.Name, err)
	}
	return true, nil
}

// Finish removes CAPM3's finalizer from a waiting claim being deleted; nobody else would.
func Finish(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata) (bool, error) {
	return removeDataFinalizer(ctx, c, claim, true,
		waitingTests(claim.Annotations[PreallocatedForAnnotation], claim.Annotations[AdmissionAnnotation])...)
}

// FinishForIPAM removes CAPM3's finalizer and the IPAM's from a waiting claim being deleted whose
// pool is gone: the IPAM would free it only from that pool's reconcile.
func FinishForIPAM(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata) (bool, error) {
	return removeFinalizers(ctx, c, claim, []string{infrav1.DataFinalizer, ipamv1.IPClaimFinalizer},
		waitingTests(claim.Annotations[PreallocatedForAnnotation], claim.Annotations[AdmissionAnnotation])...)
}

// FinishStranded removes the IPAM's finalizer from a stranded claim whose pool is gone: the IPAM
// would free it only from that pool's reconcile.
func FinishStranded(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata) (bool, error) {
	return removeFinalizers(ctx, c, claim, []string{ipamv1.IPClaimFinalizer}, jsonpatch.NewOperation("test", "/metadata/finalizers", []string{ipamv1.IPClaimFinalizer}))
}

// FinishOrphan removes CAPM3's finalizer from a claim being deleted after its owner Metal3Data:
// CAPM3 releases nothing for a Metal3Data deleted before its first reconcile.
func FinishOrphan(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata, owner types.UID) (bool, error) {
	o := slices.IndexFunc(claim.OwnerReferences, func(ref metav1.OwnerReference) bool { return ref.UID == owner })
	if o < 0 {
		return false, nil
	}
	return removeDataFinalizer(ctx, c, claim, false, jsonpatch.NewOperation("test", fmt.Sprintf("/metadata/ownerReferences/%d/uid", o), owner))
}

// removeDataFinalizer removes CAPM3's finalizer under tests and the claim's UID; a claim without
// it counts as finished when finished says so.
func removeDataFinalizer(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata, finished bool, tests ...jsonpatch.Operation) (bool, error) {
	if !slices.Contains(claim.Finalizers, infrav1.DataFinalizer) {
		return finished, nil
	}
	return removeFinalizers(ctx, c, claim, []string{infrav1.DataFinalizer}, tests...)
}

// removeFinalizers removes those of the finalizers the claim has, each tested at its index, under
// tests and the claim's UID; a failed test or a claim gone is no error, and no removal.
func removeFinalizers(ctx context.Context, c client.Writer, claim *metav1.PartialObjectMetadata, finalizers []string, tests ...jsonpatch.Operation) (bool, error) {
	ops := append(tests, jsonpatch.NewOperation("test", "/metadata/uid", claim.UID))
	// From the last index down, so that each removal leaves the others' indices as read.
	for i := len(claim.Finalizers) - 1; i >= 0; i-- {
		if slices.Contains(finalizers, claim.Finalizers[i]) {
			path := fmt.Sprintf("/metadata/finalizers/%d", i)
			ops = append(ops, jsonpatch.NewOperation("test", path, claim.Finalizers[i]), jsonpatch.NewOperation("remove", path, nil))
		}
	}
	err := patch(ctx, c, claim.GroupVersionKind(), claim.Namespace, claim.Name, ops)
	if IsTestFailure(err) || apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("removing finalizers %v from %s %s/%s: %w", finalizers, claim.Kind, claim.Namespace, claim.Name, err)
	}
	return true, nil
}

// Reclaim binds a waiting claim, unchanged since read, to a new admission; its grace period restarts.
func Reclaim(ctx context.Context, c client.Writer, claim client.Object, token, dataClaim string) error {
	ops := []jsonpatch.Operation{
		jsonpatch.NewOperation("test", "/metadata/resourceVersion", claim.GetResourceVersion()),
		jsonpatch.NewOperation("test", annotationPath(PreallocatedForAnnotation), claim.GetAnnotations()[PreallocatedForAnnotation]),
		{Operation: "test", Path: "/metadata/ownerReferences"},
		jsonpatch.NewOperation("add", annotationPath(AdmissionAnnotation), token),
	}
	if dataClaim != "" {
		ops = append(ops, jsonpatch.NewOperation("add", annotationPath(DataClaimAnnotation), dataClaim))
	} else {
		ops = append(ops, removeIfPresent(DataClaimAnnotation)...)
	}
	return patch(ctx, c, claim.GetObjectKind().GroupVersionKind(), claim.GetNamespace(), claim.GetName(), ops)
}

func patch(ctx context.Context, c client.Writer, gvk schema.GroupVersionKind, namespace, name string, ops []jsonpatch.Operation) error {
	body, err := json.Marshal(ops)
	if err != nil {
		return fmt.Errorf("encoding the JSON patch: %w", err)
	}
	obj := Metadata(gvk)
	obj.SetNamespace(namespace)
	obj.SetName(name)
	return c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, body))
}

// IsTestFailure tells a JSON patch whose test failed or whose path is missing from other rejections:
// the API server answers those with 422 Invalid and no causes.
func IsTestFailure(err error) bool {
	if !apierrors.IsInvalid(err) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	details := status.Status().Details
	return details == nil || len(details.Causes) == 0
}

// Answered tells whether the IPAM has written the status CAPM3 reads: the address or, for an
// IPClaim, an error. The IPAMs write their finalizer first and the status in a second request.
func Answered(claim client.Object) bool {
	switch c := claim.(type) {
	case *ipamv1.IPClaim:
		return c.Status.Address != nil || c.Status.ErrorMessage != nil
	case *capipamv1.IPAddressClaim:
		return c.Status.AddressRef.Name != ""
	}
	return false
}
