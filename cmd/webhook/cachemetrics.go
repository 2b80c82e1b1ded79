package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// registerCacheSizes exports, when scraped, how many objects of each kind the informer cache holds.
func registerCacheSizes(c cache.Cache, scheme *runtime.Scheme, objs []client.Object) error {
	for _, obj := range objs {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			return fmt.Errorf("finding the kind of a cached %T: %w", obj, err)
		}
		listGVK := gvk.GroupVersion().WithKind(gvk.Kind + "List")
		_, metadataOnly := obj.(*metav1.PartialObjectMetadata)
		content := "object"
		if metadataOnly {
			content = "metadata"
		}
		newList := func() (client.ObjectList, error) {
			if metadataOnly {
				l := &metav1.PartialObjectMetadataList{}
				l.SetGroupVersionKind(listGVK)
				return l, nil
			}
			l, err := scheme.New(listGVK)
			if err != nil {
				return nil, fmt.Errorf("making an empty %s: %w", listGVK.Kind, err)
			}
			return l.(client.ObjectList), nil
		}
		if _, err := newList(); err != nil {
			return err
		}
		gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "ip_preallocator_cached_objects",
			Help:        "Objects in the informer cache, by kind and by what the informer holds (metadata, or the whole object).",
			ConstLabels: prometheus.Labels{"kind": gvk.Kind, "content": content},
		}, func() float64 {
			list, _ := newList()
			ctx, cancel := context.WithTimeout(context.Background(), clock.MetricsRead)
			defer cancel()
			if err := c.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
				return -1
			}
			return float64(meta.LenList(list))
		})
		if err := metrics.Registry.Register(gauge); err != nil {
			return fmt.Errorf("registering the cached objects gauge of %s %s: %w", gvk.Kind, content, err)
		}
	}
	return nil
}
