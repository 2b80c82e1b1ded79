package allocation

import (
	"context"
	"fmt"
	"slices"
	"strings"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"gomodules.xyz/jsonpatch/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Metal3AddressGVK and Metal3AddressListGVK are the Metal3 IPAM's IPAddress.
var (
	Metal3AddressGVK     = ipamv1.GroupVersion.WithKind("IPAddress")
	Metal3AddressListGVK = ipamv1.GroupVersion.WithKind("IPAddressList")
)

// AddressClaimUID is the UID of the IPClaim owning a Metal3 IPAddress; empty once the GC dropped it.
func AddressClaimUID(address metav1.Object) types.UID {
	for _, ref := range address.GetOwnerReferences() {
		if ref.Kind == KindIPClaim {
			return ref.UID
		}
	}
	return ""
}

// AddressPool is the name of the Metal3 IPPool owning a Metal3 IPAddress.
func AddressPool(address metav1.Object) string {
	for _, ref := range address.GetOwnerReferences() {
		if ref.Kind == "IPPool" {
			return ref.Name
		}
	}
	return ""
}

// PoolGone tells, from a live read, whether the Metal3 IPPool is gone: the IPAM frees claims and
// IPAddresses only from their pool's reconcile, so it frees none of its own any more.
func PoolGone(ctx context.Context, r client.Reader, namespace, name string) (bool, error) {
	pool := Metadata(ipamv1.GroupVersion.WithKind("IPPool"))
	err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pool)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading IPPool %s/%s: %w", namespace, name, err)
	}
	return false, nil
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
	obj := Metadata(Metal3AddressGVK)
	obj.SetNamespace(address.Namespace)
	obj.SetName(address.Name)
	if address.DeletionTimestamp.IsZero() {
		err := c.Delete(ctx, obj, client.Preconditions{UID: &address.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("deleting IPAddress %s/%s: %w", address.Namespace, address.Name, err)
		}
		deleted = true
	}
	i := slices.Index(address.Finalizers, ipamv1.IPAddressFinalizer)
	if i < 0 {
		return deleted, nil
	}
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	err = patch(ctx, c, obj.GroupVersionKind(), address.Namespace, address.Name, []jsonpatch.Operation{
		jsonpatch.NewOperation("test", "/metadata/uid", address.UID),
		jsonpatch.NewOperation("test", path, ipamv1.IPAddressFinalizer),
		jsonpatch.NewOperation("remove", path, nil),
	})
	if err != nil && !IsTestFailure(err) && !apierrors.IsNotFound(err) {
		return deleted, fmt.Errorf("removing the IPAM's finalizer from IPAddress %s/%s: %w", address.Namespace, address.Name, err)
	}
	return deleted, nil
}
