package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"

	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
)

// cached lists what is read through the cache: metadata, but for the template, Metal3Machine and
// Cluster, and the claims, whose status the release (an IPClaim's busy pool) and the IPAM's
// answers read, and whose metadata wholeClaims serves from them.
func cached() []client.Object {
	return []client.Object{
		&infrav1.Metal3DataTemplate{},
		&infrav1.Metal3Machine{},
		&clusterv1.Cluster{},
		&ipamv1.IPClaim{},
		&capipamv1.IPAddressClaim{},
		allocation.Metadata(infrav1.GroupVersion.WithKind("Metal3DataClaim")),
		allocation.Metadata(clusterv1.GroupVersion.WithKind("Machine")),
		allocation.Metadata(bmov1alpha1.GroupVersion.WithKind("BareMetalHost")),
		allocation.Metadata(allocation.Metal3DataGVK),
		allocation.Metadata(allocation.Metal3AddressGVK),
	}
}

// watchCached gets the informers of objs before the manager starts, which makes them part of the
// readiness cache sync, and exports, when scraped, how many objects each holds.
func watchCached(ctx context.Context, mgr ctrl.Manager, objs []client.Object) error {
	for _, obj := range objs {
		gvk, err := apiutil.GVKForObject(obj, mgr.GetScheme())
		if err != nil {
			return fmt.Errorf("finding the kind of a cached %T: %w", obj, err)
		}
		var empty client.ObjectList = &metav1.PartialObjectMetadataList{}
		content, listGVK := "metadata", gvk.GroupVersion().WithKind(gvk.Kind+"List")
		empty.GetObjectKind().SetGroupVersionKind(listGVK)
		if _, ok := obj.(*metav1.PartialObjectMetadata); !ok {
			l, err := mgr.GetScheme().New(listGVK)
			if err != nil {
				return fmt.Errorf("making an empty %s: %w", listGVK.Kind, err)
			}
			empty, content = l.(client.ObjectList), "object"
		}
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("getting the %s informer of %s: %w", content, gvk.Kind, err)
		}
		metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "ip_preallocator_cached_objects",
			Help:        "Objects in the informer cache, by kind and by what the informer holds (metadata, or the whole object).",
			ConstLabels: prometheus.Labels{"kind": gvk.Kind, "content": content},
		}, func() float64 {
			list := empty.DeepCopyObject().(client.ObjectList)
			ctx, cancel := context.WithTimeout(context.Background(), clock.MetricsRead)
			defer cancel()
			if err := mgr.GetCache().List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
				return -1
			}
			return float64(meta.LenList(list))
		}))
	}
	return nil
}

// cacheOptions restrict the caches to the namespace and watch filter served. The watch filter
// selects the Metal3Data and their claims, which carry their labels (CAPM3 copies them too); the
// objects they refer to are read whatever their labels.
func cacheOptions(o options) cache.Options {
	everywhere := map[string]cache.Config{cache.AllNamespaces: {}}
	opts := cache.Options{DefaultTransform: asRead, ByObject: map[client.Object]cache.ByObject{
		// CAPM3 runs in a namespace of its own, whatever the namespace served.
		&appsv1.Deployment{}:     {Label: labels.SelectorFromSet(labels.Set{compat.ProviderLabel: compat.ProviderLabelValue}), Namespaces: everywhere},
		&clusterctlv1.Provider{}: {Namespaces: everywhere},
	}}
	if o.namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{o.namespace: {}}
	}
	if o.watchFilter != "" {
		selector := labels.SelectorFromSet(labels.Set{clusterv1.WatchLabel: o.watchFilter})
		// By kind, so that the whole claims' informers, which serve their metadata too, have it.
		for _, obj := range []client.Object{
			allocation.Metadata(allocation.Metal3DataGVK), allocation.Metadata(allocation.IPClaimGVK), allocation.Metadata(allocation.IPAddressClaimGVK),
		} {
			opts.ByObject[obj] = cache.ByObject{Label: selector}
		}
	}
	return opts
}

// asRead keeps of a cached object what the webhook reads; the caches hold every machine of the
// fleet, so what is never read is memory for nothing. Labels go: the watch filter selects on the
// server. Claims keep their finalizers and annotations, which the hand-over's patches test whole;
// IPAddresses their finalizers, which the release's patch tests. Of the annotations of Metal3Data
// and IPAddresses only ours are read; the objects a template's fromAnnotation may name keep theirs.
func asRead(in any) (any, error) {
	obj, ok := in.(client.Object)
	if !ok {
		return in, nil
	}
	obj.SetManagedFields(nil)
	obj.SetLabels(nil)
	switch o := obj.(type) {
	case *ipamv1.IPClaim, *capipamv1.IPAddressClaim:
		return obj, nil
	case *infrav1.Metal3Machine:
		// Admission reads its metadata and the template it names: its status and the rest of its
		// spec grow with the fleet and are never read.
		o.Finalizers = nil
		return &infrav1.Metal3Machine{
			TypeMeta:   o.TypeMeta,
			ObjectMeta: o.ObjectMeta,
			Spec:       infrav1.Metal3MachineSpec{DataTemplate: o.Spec.DataTemplate},
		}, nil
	case *appsv1.Deployment:
		// Of CAPM3's Deployment the compatibility guard reads the containers' images and flags.
		o.Finalizers = nil
		containers := make([]corev1.Container, len(o.Spec.Template.Spec.Containers))
		for i, c := range o.Spec.Template.Spec.Containers {
			containers[i] = corev1.Container{Name: c.Name, Image: c.Image, Command: c.Command, Args: c.Args}
		}
		return &appsv1.Deployment{
			TypeMeta:   o.TypeMeta,
			ObjectMeta: o.ObjectMeta,
			Spec:       appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: containers}}},
		}, nil
	case *metav1.PartialObjectMetadata:
		switch o.GroupVersionKind().GroupKind() {
		case allocation.IPClaimGVK.GroupKind(), allocation.IPAddressClaimGVK.GroupKind():
			return obj, nil
		case allocation.Metal3AddressGVK.GroupKind():
			o.Annotations = own(o.Annotations)
			return obj, nil
		case allocation.Metal3DataGVK.GroupKind():
			o.Annotations = own(o.Annotations)
		}
	}
	obj.SetFinalizers(nil)
	return obj, nil
}

// own keeps the webhook's annotations; nil when there are none.
func own(annotations map[string]string) map[string]string {
	maps.DeleteFunc(annotations, func(key, _ string) bool { return !strings.HasPrefix(key, allocation.AnnotationPrefix) })
	if len(annotations) == 0 {
		return nil
	}
	return annotations
}

// cacheSynced keeps the webhook unready until the informers sync, lest admissions find nothing.
func cacheSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), clock.ReadyPoll)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced yet")
		}
		return nil
	}
}
