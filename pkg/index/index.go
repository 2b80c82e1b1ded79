// Package index holds the cache indices the controllers list by, registered in one place.
package index

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

const (
	// WaitingFor indexes waiting and deleting claims by the Metal3Data they were preallocated for.
	WaitingFor = "ip-preallocator.metal3.io/waiting-for"
	// HeldFor indexes them by the Metal3DataClaim they were planned for.
	HeldFor = "ip-preallocator.metal3.io/held-for"
	// ClaimUID indexes Metal3 IPAddresses by the UID of the IPClaim they were made for.
	ClaimUID = "ip-preallocator.metal3.io/claim-uid"
)

// ClaimGVKs are the kinds of claims the webhook creates.
var ClaimGVKs = []schema.GroupVersionKind{allocation.IPClaimGVK, allocation.IPAddressClaimGVK}

// Field is one index: the objects it indexes, its name, and their values.
type Field struct {
	Object  client.Object
	Name    string
	Extract client.IndexerFunc
}

// Fields are every index the controllers list by.
func Fields() []Field {
	var fields []Field
	for _, gvk := range ClaimGVKs {
		fields = append(fields, Field{allocation.Metadata(gvk), WaitingFor, waitingFor}, Field{allocation.Metadata(gvk), HeldFor, heldFor})
	}
	return append(fields, Field{allocation.Metadata(allocation.Metal3AddressGVK), ClaimUID, claimUID})
}

// Setup registers every index; the caches must not have started.
func Setup(ctx context.Context, indexer client.FieldIndexer) error {
	for _, f := range Fields() {
		if err := indexer.IndexField(ctx, f.Object, f.Name, f.Extract); err != nil {
			return fmt.Errorf("indexing %ss by %s: %w", f.Object.GetObjectKind().GroupVersionKind().Kind, f.Name, err)
		}
	}
	return nil
}

func waitingFor(o client.Object) []string {
	if name, ok := allocation.WaitingFor(o); ok {
		return []string{name}
	}
	return nil
}

func heldFor(o client.Object) []string {
	if _, ok := allocation.WaitingFor(o); ok && o.GetAnnotations()[allocation.DataClaimAnnotation] != "" {
		return []string{o.GetAnnotations()[allocation.DataClaimAnnotation]}
	}
	return nil
}

func claimUID(o client.Object) []string {
	if owner := allocation.Owner(o, allocation.KindIPClaim); owner != nil {
		return []string{string(owner.UID)}
	}
	return nil
}

// List lists, from the cache, the metadata of the objects of kind gvk in namespace that index
// names value in.
func List(ctx context.Context, c client.Reader, gvk schema.GroupVersionKind, namespace, index, value string) ([]metav1.PartialObjectMetadata, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingFields{index: value}); err != nil {
		return nil, fmt.Errorf("listing the %ss of namespace %s by %s=%s: %w", gvk.Kind, namespace, index, value, err)
	}
	for i := range list.Items {
		list.Items[i].SetGroupVersionKind(gvk)
	}
	return list.Items, nil
}

// Addresses lists, from the cache, the IPAddresses made for the IPClaim uid that are not being deleted.
func Addresses(ctx context.Context, c client.Reader, namespace string, uid types.UID) ([]metav1.PartialObjectMetadata, error) {
	all, err := List(ctx, c, allocation.Metal3AddressGVK, namespace, ClaimUID, string(uid))
	return slices.DeleteFunc(all, func(a metav1.PartialObjectMetadata) bool { return !a.DeletionTimestamp.IsZero() }), err
}
