package main

import (
	"testing"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// TestScopedCaches: --namespace restricts every informer to that namespace but CAPM3's
// Deployments and clusterctl's Providers, which live in CAPM3's own; --watch-filter the Metal3Data
// and the claims, which carry its label.
func TestScopedCaches(t *testing.T) {
	for _, o := range []options{{}, {namespace: "plane-a", watchFilter: "a"}} {
		opts := cacheOptions(o)
		if opts.DefaultTransform == nil {
			t.Errorf("%+v: no transform", o)
		}
		if o.namespace == "" && opts.DefaultNamespaces != nil {
			t.Errorf("unscoped: namespaces %v", opts.DefaultNamespaces)
		}
		if _, ok := opts.DefaultNamespaces[o.namespace]; o.namespace != "" && (!ok || len(opts.DefaultNamespaces) != 1) {
			t.Errorf("namespaces %v, want %s", opts.DefaultNamespaces, o.namespace)
		}
		kinds := map[string]bool{}
		for obj, by := range opts.ByObject {
			kind := obj.GetObjectKind().GroupVersionKind().Kind
			want, namespaces := "cluster.x-k8s.io/watch-filter=a", 0
			switch obj.(type) {
			case *appsv1.Deployment:
				kind, want, namespaces = "Deployment", "cluster.x-k8s.io/provider=infrastructure-metal3", 1
			case *clusterctlv1.Provider:
				kind, want, namespaces = "Provider", "", 1
			}
			kinds[kind] = true
			label := ""
			if by.Label != nil {
				label = by.Label.String()
			}
			if _, all := by.Namespaces[cache.AllNamespaces]; label != want || by.Transform != nil || len(by.Namespaces) != namespaces || namespaces == 1 && !all {
				t.Errorf("%+v: %s: label selector %q, own transform %t, namespaces %v", o, kind, by.Label, by.Transform != nil, by.Namespaces)
			}
		}
		want := []string{"Deployment", "Provider"}
		if o.watchFilter != "" {
			want = append(want, "Metal3Data", "IPClaim", "IPAddressClaim")
		}
		if len(kinds) != len(want) {
			t.Errorf("%+v: ByObject for %v, want %v", o, kinds, want)
		}
		for _, kind := range want {
			if !kinds[kind] {
				t.Errorf("%+v: nothing in ByObject for %s: %v", o, kind, kinds)
			}
		}
	}
}

// TestAsRead: the caches keep what the webhook reads of each kind and nothing else: no labels or
// managed fields; finalizers on claims and IPAddresses; every annotation on claims, which the
// hand-over tests whole, and on the machine's objects; only ours on IPAddresses and Metal3Data; of
// a Metal3Machine only its template.
func TestAsRead(t *testing.T) {
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name: "worker-0", Namespace: "ns",
			Labels:          map[string]string{clusterv1.ClusterNameLabel: "c", clusterv1.WatchLabel: "a"},
			Annotations:     map[string]string{allocation.AdmissionAnnotation: "uid-1", "pool": "provisioning"},
			Finalizers:      []string{infrav1.DataFinalizer, ipamv1.IPClaimFinalizer},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Metal3Data", Name: "worker-0"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "capm3"}},
		}
	}
	// read is meta as the cache keeps it.
	read := func(annotations map[string]string, finalizers []string) metav1.ObjectMeta {
		m := meta()
		m.Labels, m.ManagedFields, m.Annotations, m.Finalizers = nil, nil, annotations, finalizers
		return m
	}
	ours := map[string]string{allocation.AdmissionAnnotation: "uid-1"}
	all := meta().Annotations
	metadata := func(gvk schema.GroupVersionKind) client.Object {
		return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}, ObjectMeta: meta()}
	}
	keptMetadata := func(gvk schema.GroupVersionKind, m metav1.ObjectMeta) client.Object {
		return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}, ObjectMeta: m}
	}
	status := ipamv1.IPClaimStatus{Address: &corev1.ObjectReference{Name: "provisioning-10-0-0-10"}}
	spec := ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: "provisioning"}}
	for _, tc := range []struct {
		name     string
		in, want client.Object
	}{
		{
			name: "IPClaim metadata",
			in:   metadata(allocation.IPClaimGVK),
			want: keptMetadata(allocation.IPClaimGVK, read(all, meta().Finalizers)),
		},
		{
			name: "whole IPClaim",
			in:   &ipamv1.IPClaim{ObjectMeta: meta(), Spec: spec, Status: status},
			want: &ipamv1.IPClaim{ObjectMeta: read(all, meta().Finalizers), Spec: spec, Status: status},
		},
		{
			name: "IPAddressClaim metadata",
			in:   metadata(allocation.IPAddressClaimGVK),
			want: keptMetadata(allocation.IPAddressClaimGVK, read(all, meta().Finalizers)),
		},
		{
			name: "IPAddress metadata",
			in:   metadata(allocation.Metal3AddressGVK),
			want: keptMetadata(allocation.Metal3AddressGVK, read(ours, meta().Finalizers)),
		},
		{
			name: "Metal3Data metadata",
			in:   metadata(allocation.Metal3DataGVK),
			want: keptMetadata(allocation.Metal3DataGVK, read(ours, nil)),
		},
		{
			name: "Machine metadata, which a fromAnnotation may name",
			in:   metadata(clusterv1.GroupVersion.WithKind("Machine")),
			want: keptMetadata(clusterv1.GroupVersion.WithKind("Machine"), read(all, nil)),
		},
		{
			name: "Metal3Machine",
			in: &infrav1.Metal3Machine{
				ObjectMeta: meta(),
				Spec: infrav1.Metal3MachineSpec{
					DataTemplate: &infrav1.Metal3ObjectRef{Name: "workers"},
					Image:        infrav1.Image{URL: "http://images.example.com/node.qcow2"},
				},
				Status: infrav1.Metal3MachineStatus{RenderedData: &infrav1.Metal3ObjectRef{Name: "workers-0"}, Addresses: []clusterv1.MachineAddress{{Type: "InternalIP", Address: "10.0.0.1"}}},
			},
			want: &infrav1.Metal3Machine{ObjectMeta: read(all, nil), Spec: infrav1.Metal3MachineSpec{DataTemplate: &infrav1.Metal3ObjectRef{Name: "workers"}}},
		},
		{
			name: "CAPM3's Deployment",
			in: &appsv1.Deployment{ObjectMeta: meta(), Spec: appsv1.DeploymentSpec{Replicas: new(int32(1)), Template: corev1.PodTemplateSpec{
				ObjectMeta: meta(),
				Spec: corev1.PodSpec{ServiceAccountName: "manager", Containers: []corev1.Container{{
					Name: "manager", Image: "capm3:v1.13.2", Command: []string{"/manager"}, Args: []string{"--enable-bmh-name-based-preallocation=true"},
					Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
				}}},
			}}},
			want: &appsv1.Deployment{ObjectMeta: read(all, nil), Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "manager", Image: "capm3:v1.13.2", Command: []string{"/manager"}, Args: []string{"--enable-bmh-name-based-preallocation=true"},
			}}}}}},
		},
		{
			name: "Cluster",
			in:   &clusterv1.Cluster{ObjectMeta: meta(), Spec: clusterv1.ClusterSpec{Paused: new(true)}},
			want: &clusterv1.Cluster{ObjectMeta: read(all, nil), Spec: clusterv1.ClusterSpec{Paused: new(true)}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := asRead(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("cached\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
	if got, err := asRead("not an object"); got != "not an object" || err != nil {
		t.Errorf("a value that is no object: %v, %v", got, err)
	}
}
