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

// The Metal3 IPAM creates a claim's IPAddress before it saves its finalizer on the claim, from a
// list of claims read earlier. A claim deleted in between (a namespace deletion, a person) can no
// longer take the finalizer (the API server refuses new finalizers on an object being deleted),
// and the IPAM, which frees an address only from a deleted claim that carries no finalizer but
// its own, never frees that IPAddress: it keeps the address, and its finalizer its namespace.
// Its two IPPool controllers can also both allocate for one claim, and it frees only one IPAddress
// per claim, by name. While CAPM3's finalizer keeps such a claim, its IPAddresses can still be
// released the way the IPAM would release them.

// Metal3AddressGVK and Metal3AddressListGVK are the Metal3 IPAM's IPAddress.
var (
	Metal3AddressGVK     = ipamv1.GroupVersion.WithKind("IPAddress")
	Metal3AddressListGVK = ipamv1.GroupVersion.WithKind("IPAddressList")
)

// AddressClaimUID is the UID of the IPClaim a Metal3 IPAddress was made for, from its owner
// reference; empty once the garbage collector removed that reference.
func AddressClaimUID(address metav1.Object) types.UID {
	for _, ref := range address.GetOwnerReferences() {
		if ref.Kind == KindIPClaim {
			return ref.UID
		}
	}
	return ""
}

// FieldManager is the field manager of the claims the webhook creates: their managedFields tell
// them from CAPM3's after the hand-over.
const FieldManager = "ip-preallocator"

// CreatedHere tells whether the webhook created the claim, from its managedFields (as read live:
// the caches strip them).
func CreatedHere(claim metav1.Object) bool {
	return slices.ContainsFunc(claim.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool {
		return f.Manager == FieldManager && f.FieldsV1 != nil && strings.Contains(string(f.FieldsV1.Raw), `"f:spec"`)
	})
}

// ClaimAddresses lists, live, the Metal3 IPAM's IPAddresses made for claim, an IPClaim.
func ClaimAddresses(ctx context.Context, r client.Reader, claim *metav1.PartialObjectMetadata) ([]metav1.PartialObjectMetadata, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(Metal3AddressListGVK)
	if err := r.List(ctx, list, client.InNamespace(claim.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the IPAddresses of namespace %s: %w", claim.Namespace, err)
	}
	var stray []metav1.PartialObjectMetadata
	for _, address := range list.Items {
		if AddressClaimUID(&address) == claim.UID {
			stray = append(stray, address)
		}
	}
	return stray, nil
}

// ReleaseAddress releases an IPAddress the IPAM will never release itself (a stray, or a surplus)
// as the IPAM releases one: deleted, and its IPAM finalizer removed (in that order, so that a
// failure in between leaves it to be found again). The IPAM then counts the address free on its
// next pass of the pool.
func ReleaseAddress(ctx context.Context, c client.Writer, address *metav1.PartialObjectMetadata) error {
	obj := Metadata(Metal3AddressGVK)
	obj.SetNamespace(address.Namespace)
	obj.SetName(address.Name)
	if address.DeletionTimestamp.IsZero() {
		err := c.Delete(ctx, obj, client.Preconditions{UID: &address.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("deleting IPAddress %s/%s: %w", address.Namespace, address.Name, err)
		}
	}
	i := slices.Index(address.Finalizers, ipamv1.IPAddressFinalizer)
	if i < 0 {
		return nil
	}
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	err := patch(ctx, c, obj.GroupVersionKind(), address.Namespace, address.Name, []jsonpatch.Operation{
		jsonpatch.NewOperation("test", "/metadata/uid", address.UID),
		jsonpatch.NewOperation("test", path, ipamv1.IPAddressFinalizer),
		jsonpatch.NewOperation("remove", path, nil),
	})
	if IsTestFailure(err) || apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing the IPAM's finalizer from IPAddress %s/%s: %w", address.Namespace, address.Name, err)
	}
	return nil
}
