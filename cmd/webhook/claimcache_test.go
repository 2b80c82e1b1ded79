package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// readerCache is a cache that only reads, through r.
type readerCache struct {
	cache.Cache
	r client.Reader
}

func (c readerCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.r.Get(ctx, key, obj, opts...)
}

func (c readerCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.r.List(ctx, list, opts...)
}

// TestWholeClaimsServeTheirMetadata: a read of a claim's metadata is served from the whole claim,
// never from a metadata informer, with the claim's metadata and kind; other kinds pass through.
func TestWholeClaimsServeTheirMetadata(t *testing.T) {
	ipClaim := &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "ua",
		Annotations: map[string]string{allocation.PreallocatedForAnnotation: "tmpl-0"}, Finalizers: []string{"f"}}}
	addressClaim := &capipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", UID: "ub"}}
	metadataReads := 0
	r := fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(ipClaim, addressClaim).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*metav1.PartialObjectMetadata); ok && obj.GetObjectKind().GroupVersionKind().Kind != "Metal3Data" {
					metadataReads++
					return errors.New("read as metadata")
				}
				return c.Get(ctx, key, obj, opts...)
			},
			List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				if _, ok := list.(*metav1.PartialObjectMetadataList); ok {
					metadataReads++
					return errors.New("listed as metadata")
				}
				return c.List(ctx, list, opts...)
			},
		}).Build()
	c := wholeClaims{readerCache{r: r}}
	ctx := context.Background()

	got := allocation.Metadata(allocation.IPClaimGVK)
	if err := c.Get(ctx, client.ObjectKeyFromObject(ipClaim), got); err != nil {
		t.Fatal(err)
	}
	if got.UID != "ua" || got.Annotations[allocation.PreallocatedForAnnotation] != "tmpl-0" || len(got.Finalizers) != 1 ||
		got.GroupVersionKind() != allocation.IPClaimGVK {
		t.Errorf("IPClaim metadata: %+v", got)
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(allocation.IPAddressClaimGVK.GroupVersion().WithKind("IPAddressClaimList"))
	if err := c.List(ctx, list, client.InNamespace("ns")); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].UID != "ub" || list.Items[0].GroupVersionKind() != allocation.IPAddressClaimGVK {
		t.Errorf("IPAddressClaim metadata: %+v", list.Items)
	}
	if metadataReads != 0 {
		t.Errorf("%d reads of claims went to a metadata informer", metadataReads)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "x"}, allocation.Metadata(allocation.Metal3AddressGVK)); err == nil || metadataReads != 1 {
		t.Errorf("an IPAddress's metadata read did not pass through: %v", err)
	}
}

// recordingCache records the objects informers and indices are asked for.
type recordingCache struct {
	cache.Cache
	asked []string
}

func (c *recordingCache) GetInformer(_ context.Context, obj client.Object, _ ...cache.InformerGetOption) (cache.Informer, error) {
	c.asked = append(c.asked, fmt.Sprintf("informer %T", obj))
	return nil, nil
}

func (c *recordingCache) IndexField(_ context.Context, obj client.Object, _ string, _ client.IndexerFunc) error {
	c.asked = append(c.asked, fmt.Sprintf("index %T", obj))
	return nil
}

// TestWholeClaimsServeTheirInformers: informers and indices asked for a claim's metadata are the
// whole claim's, so that no second informer of claims starts; other kinds keep theirs.
func TestWholeClaimsServeTheirInformers(t *testing.T) {
	rec := &recordingCache{}
	c := wholeClaims{rec}
	ctx := context.Background()
	for _, obj := range []client.Object{allocation.Metadata(allocation.IPClaimGVK), allocation.Metadata(allocation.IPAddressClaimGVK), allocation.Metadata(allocation.Metal3DataGVK)} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			t.Fatal(err)
		}
		if err := c.IndexField(ctx, obj, "f", func(client.Object) []string { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"informer *v1alpha1.IPClaim", "index *v1alpha1.IPClaim", "informer *v1beta2.IPAddressClaim", "index *v1beta2.IPAddressClaim",
		"informer *v1.PartialObjectMetadata", "index *v1.PartialObjectMetadata"}
	if !slices.Equal(rec.asked, want) {
		t.Errorf("asked for %v, want %v", rec.asked, want)
	}
}
