package main

import (
	"context"
	"strings"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// wholeClaims serves the metadata of claims, which the hand-over, the release and admission read,
// from the informers of whole claims, which the release and the IPAM's answers need anyway: one
// watch, one event and one copy of each claim, not two. Indices and event handlers registered
// for a claim's metadata go to the whole claim's informer, and see whole claims.
type wholeClaims struct{ cache.Cache }

func newCache(config *rest.Config, opts cache.Options) (cache.Cache, error) {
	c, err := cache.New(config, opts)
	return wholeClaims{c}, err
}

// whole is the whole claim, and list, to read for obj when obj is the metadata of claims; else nil.
func whole(obj runtime.Object) (client.Object, client.ObjectList) {
	var gk schema.GroupKind
	switch o := obj.(type) {
	case *metav1.PartialObjectMetadata:
		gk = o.GroupVersionKind().GroupKind()
	case *metav1.PartialObjectMetadataList:
		gk = o.GroupVersionKind().GroupKind()
		gk.Kind = strings.TrimSuffix(gk.Kind, "List")
	}
	switch gk {
	case allocation.IPClaimGVK.GroupKind():
		return &ipamv1.IPClaim{}, &ipamv1.IPClaimList{}
	case allocation.IPAddressClaimGVK.GroupKind():
		return &capipamv1.IPAddressClaim{}, &capipamv1.IPAddressClaimList{}
	}
	return nil, nil
}

// metadataOf is the metadata of a whole claim, sharing its maps and slices: the cache's Get and
// List copied it already, unless the caller asked for the cache's own objects, read only.
func metadataOf(obj runtime.Object, gvk schema.GroupVersionKind) metav1.PartialObjectMetadata {
	m := metav1.PartialObjectMetadata{ObjectMeta: *obj.(metav1.ObjectMetaAccessor).GetObjectMeta().(*metav1.ObjectMeta)}
	m.SetGroupVersionKind(gvk)
	return m
}

func (c wholeClaims) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	w, _ := whole(obj)
	if w == nil {
		return c.Cache.Get(ctx, key, obj, opts...)
	}
	if err := c.Cache.Get(ctx, key, w, opts...); err != nil {
		return err
	}
	m := obj.(*metav1.PartialObjectMetadata)
	*m = metadataOf(w, m.GroupVersionKind())
	return nil
}

func (c wholeClaims) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	_, wl := whole(list)
	if wl == nil {
		return c.Cache.List(ctx, list, opts...)
	}
	if err := c.Cache.List(ctx, wl, opts...); err != nil {
		return err
	}
	m := list.(*metav1.PartialObjectMetadataList)
	gvk := m.GroupVersionKind()
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	m.Items = make([]metav1.PartialObjectMetadata, 0, meta.LenList(wl))
	m.ResourceVersion = wl.GetResourceVersion()
	return meta.EachListItem(wl, func(obj runtime.Object) error {
		m.Items = append(m.Items, metadataOf(obj, gvk))
		return nil
	})
}

func (c wholeClaims) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if w, _ := whole(obj); w != nil {
		obj = w
	}
	return c.Cache.GetInformer(ctx, obj, opts...)
}

func (c wholeClaims) RemoveInformer(ctx context.Context, obj client.Object) error {
	if w, _ := whole(obj); w != nil {
		obj = w
	}
	return c.Cache.RemoveInformer(ctx, obj)
}

func (c wholeClaims) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	if w, _ := whole(obj); w != nil {
		obj = w
	}
	return c.Cache.IndexField(ctx, obj, field, extract)
}
