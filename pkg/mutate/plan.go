package mutate

import (
	"cmp"
	"context"
	"fmt"
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

// Reasons for admitting a Metal3Data without preallocating; they are metric label values.
const (
	ReasonDryRun            = "DryRun"
	ReasonAlreadyRendered   = "AlreadyRendered"
	ReasonPaused            = "Paused"
	ReasonNoName            = "NoName"
	ReasonNoTemplate        = "NoTemplate"
	ReasonTemplateNotFound  = "TemplateNotFound"
	ReasonClusterNotFound   = "ClusterNotFound"
	ReasonTemplateMismatch  = "TemplateOfOtherCluster"
	ReasonNoPools           = "NoPools"
	ReasonInvalidName       = "InvalidName"
	ReasonObjectMissing     = "ObjectMissing"
	ReasonInvalidReferences = "InvalidPoolReferences"
	ReasonReadFailed        = "ReadFailed"
	ReasonRequester         = "RequesterNotAllowed"
	ReasonRecordTooLarge    = "RecordTooLarge"
	ReasonNameInUse         = "NameInUse"
	ReasonOutOfScope        = "OutOfScope"
	ReasonIncompatibleCAPM3 = "IncompatibleCAPM3"
	ReasonLimitsRaised      = "CAPM3LimitsRaised"
)

// WebhookName is the preallocating webhook's name in its MutatingWebhookConfiguration.
const WebhookName = "preallocate.metal3data.ip-preallocator.metal3.io"

// +kubebuilder:webhook:path=/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate,mutating=true,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups=infrastructure.cluster.x-k8s.io,resources=metal3datas,verbs=create,versions=v1beta2,name=preallocate.metal3data.ip-preallocator.metal3.io,matchPolicy=Equivalent,reinvocationPolicy=Never,timeoutSeconds=5,admissionReviewVersions=v1

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3datatemplates;metal3machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3dataclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=metal3.io,resources=baremetalhosts,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipclaims,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;create

type skip struct {
	reason string
	msg    string
}

func (s *skip) Error() string { return s.reason + ": " + s.msg }

func skipf(reason, format string, args ...any) *skip {
	return &skip{reason: reason, msg: fmt.Sprintf(format, args...)}
}

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
	if err := p.get(ctx, data.Namespace, clusterName, cluster, ReasonClusterNotFound); err != nil {
		return nil, err
	}
	if annotations.IsPaused(cluster, data) {
		return nil, skipf(ReasonPaused, "Cluster %s is paused", clusterName)
	}

	tmpl := &infrav1.Metal3DataTemplate{}
	tmplNamespace := cmp.Or(data.Spec.Template.Namespace, data.Namespace)
	if err := p.get(ctx, tmplNamespace, data.Spec.Template.Name, tmpl, ReasonTemplateNotFound); err != nil {
		return nil, err
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
	if err := p.get(ctx, data.Namespace, data.Spec.Claim.Name, claim, ReasonObjectMissing); err != nil {
		return nil, err
	}
	name := ownerName(claim.OwnerReferences, infrav1.GroupVersion.Group, "Metal3Machine")
	if name == "" {
		return nil, skipf(ReasonObjectMissing, "Metal3DataClaim %s has no Metal3Machine owner", claim.Name)
	}
	m3m := &infrav1.Metal3Machine{}
	if err := p.get(ctx, data.Namespace, name, m3m, ReasonObjectMissing); err != nil {
		return nil, err
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
	if err := p.get(ctx, m3m.Namespace, name, machine, ReasonObjectMissing); err != nil {
		return nil, err
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
	if err := p.get(ctx, m3m.Namespace, name, bmh, ReasonObjectMissing); err != nil {
		return nil, err
	}
	return bmh, nil
}

// get reads obj, from the API server if the cache misses it; an object still not found is a skip
// for notFound.
func (p *Preallocator) get(ctx context.Context, namespace, name string, obj client.Object, notFound string) error {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	kind := allocation.KindOf(obj)
	err := p.Reader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && p.APIReader != nil {
		err = p.APIReader.Get(ctx, key, obj)
	}
	if err != nil {
		err = fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	if apierrors.IsNotFound(err) {
		return skipf(notFound, "%v", err)
	}
	return err
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
