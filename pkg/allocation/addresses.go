package allocation

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"gomodules.xyz/jsonpatch/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Metal3AddressGVK is the Metal3 IPAM's IPAddress.
var Metal3AddressGVK = ipamv1.GroupVersion.WithKind("IPAddress")

// Owner is obj's owner reference of the kind; a Metal3 IPAddress has one of kind IPClaim (until
// the GC drops it) and one of kind IPPool.
func Owner(obj metav1.Object, kind string) *metav1.OwnerReference {
	refs := obj.GetOwnerReferences()
	if i := slices.IndexFunc(refs, func(ref metav1.OwnerReference) bool { return ref.Kind == kind }); i >= 0 {
		return &refs[i]
	}
	return nil
}

// Read reads obj; found is false, with no error, when it does not exist.
func Read(ctx context.Context, r client.Reader, key types.NamespacedName, obj client.Object) (found bool, err error) {
	err = r.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s %s: %w", KindOf(obj), key, err)
	}
	return true, nil
}

// KindOf is obj's kind, from its TypeMeta or, as a typed read clears it, its Go type.
func KindOf(obj client.Object) string {
	if kind := obj.GetObjectKind().GroupVersionKind().Kind; kind != "" {
		return kind
	}
	return reflect.TypeOf(obj).Elem().Name()
}

// PoolGone tells, from a live read, whether the Metal3 IPPool is gone: the IPAM frees claims and
// IPAddresses only from their pool's reconcile, so it frees none of its own any more.
func PoolGone(ctx context.Context, r client.Reader, namespace, name string) (bool, error) {
	found, err := Read(ctx, r, types.NamespacedName{Namespace: namespace, Name: name}, Metadata(ipamv1.GroupVersion.WithKind("IPPool")))
	return err == nil && !found, err
}

// FieldManager tells, in managedFields, the webhook's claims from CAPM3's after the hand-over.
const FieldManager = "ip-preallocator"

// CreatedHere tells whether the webhook created claim; read it live, as the caches strip managedFields.
func CreatedHere(claim metav1.Object) bool {
	return slices.ContainsFunc(claim.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool {
		return f.Manager == FieldManager && f.FieldsV1 != nil && strings.Contains(string(f.FieldsV1.Raw), `"f:spec"`)
	})
}

// ReleaseAddress releases, as the IPAM would, an IPAddress the IPAM never frees: one made for a claim
// deleted before the IPAM could add its finalizer, or a second one its two IPPool controllers made
// for one claim. It deletes before it removes the finalizer, so a half-done release is found again;
// deleted tells whether this call deleted it.
func ReleaseAddress(ctx context.Context, c client.Writer, address *metav1.PartialObjectMetadata) (deleted bool, err error) {
	if address.DeletionTimestamp.IsZero() {
		if deleted, err = deleteUnchanged(ctx, c, address, client.Preconditions{UID: &address.UID}); !deleted {
			return false, err
		}
	}
	i := slices.Index(address.Finalizers, ipamv1.IPAddressFinalizer)
	if i < 0 {
		return deleted, nil
	}
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	err = patch(ctx, c, Metal3AddressGVK, address.Namespace, address.Name, []jsonpatch.Operation{
		jsonpatch.NewOperation("test", "/metadata/uid", address.UID),
		jsonpatch.NewOperation("test", path, ipamv1.IPAddressFinalizer),
		jsonpatch.NewOperation("remove", path, nil),
	})
	if err != nil && !IsTestFailure(err) && !apierrors.IsNotFound(err) {
		return deleted, fmt.Errorf("removing the IPAM's finalizer from IPAddress %s/%s: %w", address.Namespace, address.Name, err)
	}
	return deleted, nil
}
