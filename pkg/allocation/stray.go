package allocation

import (
	"context"
	"fmt"
	"slices"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"gomodules.xyz/jsonpatch/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The Metal3 IPAM creates a claim's IPAddress before it saves its finalizer on the claim, from a
// list of claims read earlier. A claim deleted in between (a namespace deletion, a person) can no
// longer take the finalizer (the API server refuses new finalizers on an object being deleted),
// and the IPAM, which frees an address only from a deleted claim that carries no finalizer but
// its own, never frees that IPAddress: it keeps the address, and its finalizer its namespace.
// While CAPM3's finalizer keeps such a claim, the IPAddress can still be released the way the
// IPAM would release it.

// StrayAddresses lists, live, the Metal3 IPAM's IPAddresses made for claim, an IPClaim being
// deleted that the IPAM never finalized.
func StrayAddresses(ctx context.Context, r client.Reader, claim *metav1.PartialObjectMetadata) ([]metav1.PartialObjectMetadata, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(ipamv1.GroupVersion.WithKind("IPAddressList"))
	if err := r.List(ctx, list, client.InNamespace(claim.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the IPAddresses of namespace %s: %w", claim.Namespace, err)
	}
	var stray []metav1.PartialObjectMetadata
	for _, address := range list.Items {
		if slices.ContainsFunc(address.OwnerReferences, func(ref metav1.OwnerReference) bool {
			return ref.UID == claim.UID && ref.Kind == KindIPClaim
		}) {
			stray = append(stray, address)
		}
	}
	return stray, nil
}

// ReleaseStray releases an IPAddress of StrayAddresses as the IPAM releases one: deleted, and
// its IPAM finalizer removed (in that order, so that a failure in between leaves it to be found
// again). The IPAM then counts the address free on its next pass of the pool.
func ReleaseStray(ctx context.Context, c client.Writer, address *metav1.PartialObjectMetadata) error {
	obj := Metadata(ipamv1.GroupVersion.WithKind("IPAddress"))
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
