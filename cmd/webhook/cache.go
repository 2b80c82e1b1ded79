package main

import (
	"maps"
	"strings"

	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
)

// cached lists what is read through the cache: metadata, but for the template, Metal3Machine and
// Cluster, the IPClaims' status, which the release reads to tell a busy pool, and with ipamWait the
// IPAddressClaims' status, which the hand-over waits for too.
func cached(ipamWait bool) []client.Object {
	objs := []client.Object{
		&infrav1.Metal3DataTemplate{},
		&infrav1.Metal3Machine{},
		&clusterv1.Cluster{},
		&ipamv1.IPClaim{},
		allocation.Metadata(infrav1.GroupVersion.WithKind("Metal3DataClaim")),
		allocation.Metadata(clusterv1.GroupVersion.WithKind("Machine")),
		allocation.Metadata(bmov1alpha1.GroupVersion.WithKind("BareMetalHost")),
		allocation.Metadata(allocation.IPClaimGVK),
		allocation.Metadata(allocation.IPAddressClaimGVK),
		allocation.Metadata(allocation.Metal3DataGVK),
		allocation.Metadata(allocation.Metal3AddressGVK),
	}
	if ipamWait {
		objs = append(objs, &capipamv1.IPAddressClaim{})
	}
	return objs
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
		// By kind: the informers of whole claims share it with the metadata ones.
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
	switch kindOf(obj) {
	case allocation.IPClaimGVK.GroupKind(), allocation.IPAddressClaimGVK.GroupKind():
	case allocation.Metal3AddressGVK.GroupKind():
		obj.SetAnnotations(own(obj.GetAnnotations()))
	case allocation.Metal3DataGVK.GroupKind():
		obj.SetAnnotations(own(obj.GetAnnotations()))
		obj.SetFinalizers(nil)
	default:
		obj.SetFinalizers(nil)
	}
	switch o := obj.(type) {
	case *infrav1.Metal3Machine:
		return metal3MachineAsRead(o), nil
	case *appsv1.Deployment:
		return deploymentAsRead(o), nil
	}
	return obj, nil
}

// kindOf tells the kind of a cached object: the metadata informers set it, whole objects are known
// by their type.
func kindOf(obj client.Object) schema.GroupKind {
	switch obj.(type) {
	case *metav1.PartialObjectMetadata:
		return obj.GetObjectKind().GroupVersionKind().GroupKind()
	case *ipamv1.IPClaim:
		return allocation.IPClaimGVK.GroupKind()
	case *capipamv1.IPAddressClaim:
		return allocation.IPAddressClaimGVK.GroupKind()
	}
	return schema.GroupKind{}
}

// own keeps the webhook's annotations; nil when there are none.
func own(annotations map[string]string) map[string]string {
	maps.DeleteFunc(annotations, func(key, _ string) bool { return !strings.HasPrefix(key, allocation.AnnotationPrefix) })
	if len(annotations) == 0 {
		return nil
	}
	return annotations
}

// metal3MachineAsRead keeps of a Metal3Machine what admission reads, its metadata and the template
// it names: its status and the rest of its spec grow with the fleet and are never read.
func metal3MachineAsRead(m3m *infrav1.Metal3Machine) *infrav1.Metal3Machine {
	return &infrav1.Metal3Machine{
		TypeMeta:   m3m.TypeMeta,
		ObjectMeta: m3m.ObjectMeta,
		Spec:       infrav1.Metal3MachineSpec{DataTemplate: m3m.Spec.DataTemplate},
	}
}

// deploymentAsRead keeps of CAPM3's Deployment the containers' images and flags, which the
// compatibility guard reads.
func deploymentAsRead(d *appsv1.Deployment) *appsv1.Deployment {
	containers := make([]corev1.Container, len(d.Spec.Template.Spec.Containers))
	for i, c := range d.Spec.Template.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name, Image: c.Image, Command: c.Command, Args: c.Args}
	}
	return &appsv1.Deployment{
		TypeMeta:   d.TypeMeta,
		ObjectMeta: d.ObjectMeta,
		Spec:       appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: containers}}},
	}
}
