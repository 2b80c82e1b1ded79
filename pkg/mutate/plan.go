package mutate

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// hostAnnotation is where the Metal3Machine controller records its BareMetalHost.
const hostAnnotation = "metal3.io/BareMetalHost"

// plan mirrors CAPM3's checks before it creates claims; a *skip error says why none are planned.
func (p *Preallocator) plan(ctx context.Context, data *infrav1.Metal3Data) ([]allocation.Claim, error) {
	if data.Spec.MetaData != nil || data.Spec.NetworkData != nil {
		return nil, skipf(ReasonAlreadyRendered, "spec.metaData or spec.networkData is set (moved or restored)")
	}
	if data.Name == "" {
		return nil, skipf(ReasonNoName, "metadata.name is not set, so claim names are unknown")
	}
	if annotations.HasPaused(data) {
		return nil, skipf(ReasonPaused, "the Metal3Data carries %s", clusterv1.PausedAnnotation)
	}
	if data.Spec.Template == nil || data.Spec.Template.Name == "" {
		return nil, skipf(ReasonNoTemplate, "spec.template is not set")
	}

	tmpl, err := p.template(ctx, data)
	if err != nil {
		return nil, err
	}
	m3m, err := p.metal3Machine(ctx, data, tmpl)
	if err != nil {
		return nil, err
	}
	machine, err := p.ownerMachine(ctx, m3m)
	if err != nil {
		return nil, err
	}
	bmh, err := p.host(ctx, m3m)
	if err != nil {
		return nil, err
	}
	pools, err := allocation.ReferencedPools(tmpl, allocation.Machine{Machine: machine, Metal3Machine: m3m, BareMetalHost: bmh})
	if err != nil {
		return nil, skipf(ReasonInvalidReferences, "Metal3DataTemplate %s: %v", tmpl.Name, err)
	}
	return allocation.Plan(data, pools, bmh.Name, p.BMHNameBased), nil
}

// template reads the Metal3DataTemplate of data, with the checks CAPM3 makes before it claims.
func (p *Preallocator) template(ctx context.Context, data *infrav1.Metal3Data) (*infrav1.Metal3DataTemplate, error) {
	clusterName := data.Labels[clusterv1.ClusterNameLabel]
	if clusterName == "" {
		return nil, skipf(ReasonClusterNotFound, "label %s is not set", clusterv1.ClusterNameLabel)
	}
	cluster := &clusterv1.Cluster{}
	if err := p.get(ctx, data.Namespace, clusterName, cluster); err != nil {
		return nil, notFoundAs(err, ReasonClusterNotFound)
	}
	if annotations.IsPaused(cluster, data) {
		return nil, skipf(ReasonPaused, "Cluster %s is paused", clusterName)
	}

	tmplNamespace := data.Spec.Template.Namespace
	if tmplNamespace == "" {
		tmplNamespace = data.Namespace
	}
	tmpl := &infrav1.Metal3DataTemplate{}
	if err := p.get(ctx, tmplNamespace, data.Spec.Template.Name, tmpl); err != nil {
		return nil, notFoundAs(err, ReasonTemplateNotFound)
	}
	if tmpl.Spec.ClusterName != clusterName {
		return nil, skipf(ReasonTemplateMismatch, "Metal3DataTemplate %s belongs to cluster %q", tmpl.Name, tmpl.Spec.ClusterName)
	}
	if len(allocation.References(tmpl)) == 0 {
		return nil, skipf(ReasonNoPools, "Metal3DataTemplate %s references no IP pool", tmpl.Name)
	}
	// CAPM3's validating webhook rejects such a Metal3Data after us; claims for it would only be released.
	if data.Spec.Index != nil && data.Name != allocation.DataName(tmpl.Name, int(*data.Spec.Index)) {
		return nil, skipf(ReasonInvalidName, "name does not follow <template>-<index>")
	}
	return tmpl, nil
}

// metal3Machine follows the Metal3DataClaim to its Metal3Machine, as CAPM3's getM3Machine does.
func (p *Preallocator) metal3Machine(ctx context.Context, data *infrav1.Metal3Data, tmpl *infrav1.Metal3DataTemplate) (*infrav1.Metal3Machine, error) {
	if data.Spec.Claim == nil || data.Spec.Claim.Name == "" {
		return nil, skipf(ReasonObjectMissing, "spec.claim is not set")
	}
	claim := allocation.Metadata(allocation.Metal3DataClaimGVK)
	if err := p.get(ctx, data.Namespace, data.Spec.Claim.Name, claim); err != nil {
		return nil, notFoundAs(err, ReasonObjectMissing)
	}
	name := ownerName(claim.OwnerReferences, infrav1.GroupVersion.Group, "Metal3Machine")
	if name == "" {
		return nil, skipf(ReasonObjectMissing, "Metal3DataClaim %s has no Metal3Machine owner", claim.Name)
	}
	m3m := &infrav1.Metal3Machine{}
	if err := p.get(ctx, data.Namespace, name, m3m); err != nil {
		return nil, notFoundAs(err, ReasonObjectMissing)
	}
	ref := m3m.Spec.DataTemplate
	if ref == nil || ref.Name != tmpl.Name || (ref.Namespace != "" && ref.Namespace != tmpl.Namespace) {
		return nil, skipf(ReasonObjectMissing, "Metal3Machine %s does not use Metal3DataTemplate %s", name, tmpl.Name)
	}
	return m3m, nil
}

func (p *Preallocator) ownerMachine(ctx context.Context, m3m *infrav1.Metal3Machine) (*metav1.PartialObjectMetadata, error) {
	name := ownerName(m3m.OwnerReferences, clusterv1.GroupVersion.Group, "Machine")
	if name == "" {
		return nil, skipf(ReasonObjectMissing, "Metal3Machine %s has no Machine owner yet", m3m.Name)
	}
	machine := allocation.Metadata(clusterv1.GroupVersion.WithKind("Machine"))
	if err := p.get(ctx, m3m.Namespace, name, machine); err != nil {
		return nil, notFoundAs(err, ReasonObjectMissing)
	}
	return machine, nil
}

// host mirrors CAPM3's getHost: the annotation's namespace is ignored.
func (p *Preallocator) host(ctx context.Context, m3m *infrav1.Metal3Machine) (*metav1.PartialObjectMetadata, error) {
	value, ok := m3m.Annotations[hostAnnotation]
	if !ok {
		return nil, skipf(ReasonObjectMissing, "Metal3Machine %s has no BareMetalHost yet", m3m.Name)
	}
	_, name, err := cache.SplitMetaNamespaceKey(value)
	if err != nil {
		return nil, skipf(ReasonObjectMissing, "Metal3Machine %s: annotation %s: %v", m3m.Name, hostAnnotation, err)
	}
	bmh := allocation.Metadata(bmov1alpha1.GroupVersion.WithKind("BareMetalHost"))
	if err := p.get(ctx, m3m.Namespace, name, bmh); err != nil {
		return nil, notFoundAs(err, ReasonObjectMissing)
	}
	return bmh, nil
}

func (p *Preallocator) get(ctx context.Context, namespace, name string, obj client.Object) error {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	kind := kindOf(obj)
	err := p.Reader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && p.APIReader != nil {
		err = p.APIReader.Get(ctx, key, obj)
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	return nil
}

// kindOf names obj's kind in errors: metadata-only objects carry it, typed ones are named by type.
func kindOf(obj client.Object) string {
	if kind := obj.GetObjectKind().GroupVersionKind().Kind; kind != "" {
		return kind
	}
	return reflect.TypeOf(obj).Elem().Name()
}

// ownerName finds an owner by group and kind, ignoring version and UID as CAPM3 does.
func ownerName(refs []metav1.OwnerReference, group, kind string) string {
	i := slices.IndexFunc(refs, func(ref metav1.OwnerReference) bool {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		return err == nil && ref.Kind == kind && gv.Group == group
	})
	if i < 0 {
		return ""
	}
	return refs[i].Name
}

func notFoundAs(err error, reason string) error {
	if apierrors.IsNotFound(err) {
		return skipf(reason, "%v", err)
	}
	return err
}
