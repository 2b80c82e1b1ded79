// Package mutate holds the mutating admission handler that preallocates a Metal3Data's IP claims.
package mutate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-openapi/jsonpointer"
	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// hostAnnotation is where the Metal3Machine controller records its BareMetalHost.
const hostAnnotation = "metal3.io/BareMetalHost"

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
)

// +kubebuilder:webhook:path=/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate,mutating=true,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups=infrastructure.cluster.x-k8s.io,resources=metal3datas,verbs=create,versions=v1beta2,name=preallocate.metal3data.ip-preallocator.metal3.io,matchPolicy=Equivalent,reinvocationPolicy=Never,timeoutSeconds=5,admissionReviewVersions=v1

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3datatemplates;metal3machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3dataclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=metal3.io,resources=baremetalhosts,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipclaims,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;create

// Preallocator admits every Metal3Data CREATE, recording in allocation.ClaimsAnnotation the claims
// CAPM3's first reconcile would create and handing them to OnAdmitted; otherwise it changes nothing.
type Preallocator struct {
	// Reader should be the manager's cache.
	Reader client.Reader
	// APIReader is read on a cache miss: the Metal3DataClaim is created just before its Metal3Data,
	// and an informer a few milliseconds behind must not cost the preallocation.
	APIReader client.Reader
	Decoder   admission.Decoder
	// BMHNameBased mirrors CAPM3's --enable-bmh-name-based-preallocation.
	BMHNameBased bool
	// Timeout bounds one admission from the request's start, as does the API server's timeout.
	Timeout time.Duration
	// Requesters, if set, are the only users (CAPM3's) for whom the webhook reserves addresses.
	Requesters []string
	// Namespace and WatchFilter, if set, scope the webhook as CAPM3's --namespace and
	// --watch-filter scope CAPM3: its caches hold nothing else.
	Namespace, WatchFilter string
	// Deletions, if set, leaves to CAPM3 a Metal3Data whose name was deleted lately.
	Deletions *Deletions
	// OnAdmitted hears, before the answer, of every admission that recorded claims or warns. It may
	// wait for the creates to be sent, never for a write: CAPM3 creates Metal3Data one by one.
	OnAdmitted func(ctx context.Context, key types.NamespacedName, token, dataToken string, claims []allocation.Claim, warning string)
}

var _ admission.Handler = &Preallocator{}

type skip struct {
	reason string
	msg    string
}

func (s *skip) Error() string { return s.reason + ": " + s.msg }

func skipf(reason, format string, args ...any) *skip {
	return &skip{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// Handle implements admission.Handler.
func (p *Preallocator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	ctx, cancel := context.WithDeadline(ctx, deadline(ctx, p.Timeout))
	defer cancel()
	data := &infrav1.Metal3Data{}
	if err := p.Decoder.Decode(req, data); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding Metal3Data: %w", err))
	}
	logger := log.FromContext(ctx).WithValues("Metal3Data", klog.KRef(req.Namespace, data.Name))
	ctx = log.IntoContext(ctx, logger)
	if data.Namespace == "" {
		data.Namespace = req.Namespace
	}

	if req.DryRun != nil && *req.DryRun {
		return p.skipped(ctx, data, skipf(ReasonDryRun, "dry-run request"))
	}
	if len(p.Requesters) > 0 && !slices.Contains(p.Requesters, req.UserInfo.Username) {
		return p.skipped(ctx, data, skipf(ReasonRequester, "created by %q, not by a requester preallocation serves", req.UserInfo.Username))
	}
	if p.Namespace != "" && data.Namespace != p.Namespace || p.WatchFilter != "" && data.Labels[clusterv1.WatchLabel] != p.WatchFilter {
		return p.skipped(ctx, data, skipf(ReasonOutOfScope, "outside --namespace %q and --watch-filter %q", p.Namespace, p.WatchFilter))
	}
	claims, err := p.plan(ctx, data)
	if err != nil {
		var s *skip
		if !errors.As(err, &s) {
			s = skipf(ReasonReadFailed, "%v", err)
		}
		return p.skipped(ctx, data, s)
	}
	if reason := p.nameInUse(ctx, data); reason != "" {
		return p.leftToCAPM3(ctx, data, claims, skipf(ReasonNameInUse, "%s", reason))
	}
	return p.record(ctx, data, string(req.UID), claims)
}

// record records on data the claims it can create ahead of CAPM3, under the admission token, and
// leaves the others to CAPM3 with a warning.
func (p *Preallocator) record(ctx context.Context, data *infrav1.Metal3Data, token string, claims []allocation.Claim) admission.Response {
	var (
		recorded []allocation.Claim
		refs     []allocation.ClaimRef
		warnings []string
	)
	for _, c := range claims {
		name, err := allocation.Usable(ctx, p.Reader, data.Name, c)
		if err != nil {
			log.FromContext(ctx).Info("IP claim left to CAPM3", c.Kind(), klog.KRef(data.Namespace, c.Object.GetName()), "error", err)
			warnings = append(warnings, fmt.Sprintf("ip-preallocator: %s %s left to CAPM3: %v", c.Kind(), c.Object.GetName(), err))
			continue
		}
		recorded = append(recorded, c)
		refs = append(refs, allocation.ClaimRef{Kind: c.Kind(), Name: name})
	}
	if len(recorded) == 0 {
		admissionsTotal.WithLabelValues("failed", "").Inc()
		p.admitted(ctx, data, "", nil, warnings...)
		return admission.Allowed("").WithWarnings(warnings...)
	}
	record := map[string]string{allocation.ClaimsAnnotation: allocation.FormatClaims(refs), allocation.AdmissionAnnotation: token}
	if err := recordFits(data.Annotations, record); err != nil {
		return p.skipped(ctx, data, skipf(ReasonRecordTooLarge, "%v", err))
	}
	outcome := "preallocated"
	if len(warnings) > 0 {
		outcome = "partial"
	}
	admissionsTotal.WithLabelValues(outcome, "").Inc()
	log.FromContext(ctx).V(2).Info("Recorded IP claims to create ahead of CAPM3", "count", len(recorded))
	p.admitted(ctx, data, token, recorded, warnings...)
	return admission.Patched("", recordPatch(data.Annotations, record)...).WithWarnings(warnings...)
}

// nameInUse says why data's name is unsafe: CAPM3 may still release a predecessor's claims by name.
func (p *Preallocator) nameInUse(ctx context.Context, data *infrav1.Metal3Data) string {
	key := types.NamespacedName{Namespace: data.Namespace, Name: data.Name}
	predecessor := allocation.Metadata(infrav1.GroupVersion.WithKind("Metal3Data"))
	if err := p.Reader.Get(ctx, key, predecessor); err == nil {
		return fmt.Sprintf("a Metal3Data of this name is still known (uid %s), and CAPM3 releases its claims by name", predecessor.UID)
	}
	if ago, ok := p.Deletions.Since(key); ok {
		return fmt.Sprintf("a Metal3Data of this name was deleted %v ago, and CAPM3 may still release its claims by name", ago.Round(time.Millisecond))
	}
	return ""
}

func (p *Preallocator) leftToCAPM3(ctx context.Context, data *infrav1.Metal3Data, claims []allocation.Claim, s *skip) admission.Response {
	log.FromContext(ctx).V(1).Info("Not preallocating IP claims", "reason", s.reason, "detail", s.msg)
	admissionsTotal.WithLabelValues("skipped", s.reason).Inc()
	warnings := make([]string, len(claims))
	for i, c := range claims {
		warnings[i] = fmt.Sprintf("ip-preallocator: %s %s left to CAPM3: %s", c.Kind(), c.Object.GetName(), s.msg)
	}
	p.admitted(ctx, data, "", nil, warnings...)
	return admission.Allowed("").WithWarnings(warnings...)
}

// deadline leaves a margin within the API server's own timeout for the answer to travel back.
func deadline(ctx context.Context, timeout time.Duration) time.Time {
	start, apiTimeout := requestTiming(ctx)
	end := start.Add(timeout)
	if apiTimeout > 0 {
		if apiEnd := start.Add(time.Duration(float64(apiTimeout) * clock.APIServerShare)); apiEnd.Before(end) {
			end = apiEnd
		}
	}
	return end
}

// recordFits checks that the record does not make the annotations too large to store.
func recordFits(existing, record map[string]string) error {
	annotations := maps.Clone(existing)
	if annotations == nil {
		annotations = map[string]string{}
	}
	maps.Copy(annotations, record)
	if errs := apivalidation.ValidateAnnotations(annotations, field.NewPath("metadata", "annotations")); len(errs) > 0 {
		return errs.ToAggregate()
	}
	return nil
}

func (p *Preallocator) skipped(ctx context.Context, data *infrav1.Metal3Data, s *skip) admission.Response {
	log.FromContext(ctx).V(1).Info("Not preallocating IP claims", "reason", s.reason, "detail", s.msg)
	admissionsTotal.WithLabelValues("skipped", s.reason).Inc()
	resp := admission.Allowed("")
	if s.reason == ReasonInvalidReferences || s.reason == ReasonReadFailed {
		warning := "ip-preallocator: IP claims not preallocated (CAPM3 will create them): " + s.msg
		p.admitted(ctx, data, "", nil, warning)
		resp = resp.WithWarnings(warning)
	}
	return resp
}

func (p *Preallocator) admitted(ctx context.Context, data *infrav1.Metal3Data, token string, claims []allocation.Claim, warnings ...string) {
	if p.OnAdmitted != nil && data.Name != "" {
		dataToken := token
		if dataToken == "" {
			dataToken = data.Annotations[allocation.AdmissionAnnotation]
		}
		p.OnAdmitted(ctx, types.NamespacedName{Namespace: data.Namespace, Name: data.Name}, token, dataToken, claims, strings.Join(warnings, "; "))
	}
}

// recordPatch adds the record without touching anything else of the object.
func recordPatch(existing, record map[string]string) []jsonpatch.JsonPatchOperation {
	if existing == nil {
		return []jsonpatch.JsonPatchOperation{jsonpatch.NewOperation("add", "/metadata/annotations", record)}
	}
	var ops []jsonpatch.JsonPatchOperation
	for _, key := range slices.Sorted(maps.Keys(record)) {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+jsonpointer.Escape(key), record[key]))
	}
	return ops
}

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
