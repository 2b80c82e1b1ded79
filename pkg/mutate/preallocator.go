// Package mutate holds the mutating admission handler that preallocates a Metal3Data's IP claims.
package mutate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-openapi/jsonpointer"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
	"github.com/metal3-community/ip-preallocator/pkg/memory"
)

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
	// Compat, if set, leaves every Metal3Data to a CAPM3 whose claims the webhook does not mirror,
	// or whose client limits are raised.
	Compat *compat.Guard
	// OnAdmitted hears, before the answer, of every admission that recorded claims or warns. It may
	// wait for the creates to be sent, never for a write: CAPM3 creates Metal3Data one by one.
	OnAdmitted func(ctx context.Context, key types.NamespacedName, token, dataToken string, claims []allocation.Claim, warning string)
}

var _ admission.Handler = &Preallocator{}

var admissionsTotal = promauto.With(metrics.Registry).NewCounterVec(prometheus.CounterOpts{
	Name: "ip_preallocator_admissions_total",
	Help: "Metal3Data CREATE admissions by outcome (preallocated, partial, failed, skipped) and skip reason.",
}, []string{"outcome", "reason"})

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
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("Metal3Data", klog.KRef(req.Namespace, data.Name)))
	data.Namespace = cmp.Or(data.Namespace, req.Namespace)

	if req.DryRun != nil && *req.DryRun {
		return p.skipped(ctx, data, skipf(ReasonDryRun, "dry-run request"))
	}
	if len(p.Requesters) > 0 && !slices.Contains(p.Requesters, req.UserInfo.Username) {
		return p.skipped(ctx, data, skipf(ReasonRequester, "created by %q, not by a requester preallocation serves", req.UserInfo.Username))
	}
	if p.Namespace != "" && data.Namespace != p.Namespace || p.WatchFilter != "" && data.Labels[clusterv1.WatchLabel] != p.WatchFilter {
		return p.skipped(ctx, data, skipf(ReasonOutOfScope, "outside --namespace %q and --watch-filter %q", p.Namespace, p.WatchFilter))
	}
	if refusal := p.Compat.Refusal(); refusal != "" {
		return p.skipped(ctx, data, skipf(ReasonIncompatibleCAPM3, "%s", refusal))
	}
	if raised := p.Compat.LimitsRaised(); raised != "" {
		return p.skipped(ctx, data, skipf(ReasonLimitsRaised, "%s", raised))
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
		return p.skipped(ctx, data, skipf(ReasonNameInUse, "%s", reason), claims...)
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

// skipped admits data unchanged. It warns of each claim in left, and of invalid pool references or
// a failed read, which the operator may have to fix; other skips are expected and silent.
func (p *Preallocator) skipped(ctx context.Context, data *infrav1.Metal3Data, s *skip, left ...allocation.Claim) admission.Response {
	log.FromContext(ctx).V(1).Info("Not preallocating IP claims", "reason", s.reason, "detail", s.msg)
	admissionsTotal.WithLabelValues("skipped", s.reason).Inc()
	var warnings []string
	for _, c := range left {
		warnings = append(warnings, fmt.Sprintf("ip-preallocator: %s %s left to CAPM3: %s", c.Kind(), c.Object.GetName(), s.msg))
	}
	if s.reason == ReasonInvalidReferences || s.reason == ReasonReadFailed {
		warnings = append(warnings, "ip-preallocator: IP claims not preallocated (CAPM3 will create them): "+s.msg)
	}
	p.admitted(ctx, data, "", nil, warnings...)
	return admission.Allowed("").WithWarnings(warnings...)
}

// admitted calls OnAdmitted as its doc promises: for an admission that recorded claims or warns.
func (p *Preallocator) admitted(ctx context.Context, data *infrav1.Metal3Data, token string, claims []allocation.Claim, warnings ...string) {
	if p.OnAdmitted != nil && data.Name != "" && (len(claims) > 0 || len(warnings) > 0) {
		dataToken := cmp.Or(token, data.Annotations[allocation.AdmissionAnnotation])
		p.OnAdmitted(ctx, types.NamespacedName{Namespace: data.Namespace, Name: data.Name}, token, dataToken, claims, strings.Join(warnings, "; "))
	}
}

// recordFits checks that the record does not make the annotations too large to store.
func recordFits(existing, record map[string]string) error {
	annotations := map[string]string{}
	maps.Copy(annotations, existing)
	maps.Copy(annotations, record)
	return apivalidation.ValidateAnnotations(annotations, field.NewPath("metadata", "annotations")).ToAggregate()
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

// Deletions remembers which Metal3Data this replica saw deleted lately: CAPM3 releases their
// claims by name, and from a lagging cache also those preallocated for a new one of the same name,
// which stock CAPM3 creates only from a cache that has seen the deletion.
type Deletions struct {
	at memory.Expiring[types.NamespacedName, time.Time]
}

// NewDeletions remembers a deletion for window.
func NewDeletions(window time.Duration) *Deletions {
	return &Deletions{at: memory.Expiring[types.NamespacedName, time.Time]{TTL: window}}
}

// OnDelete is the informer's DeleteFunc for Metal3Data.
func (d *Deletions) OnDelete(obj any) {
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		d.at.Set(types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}, time.Now())
	}
}

// Since tells how long ago a Metal3Data named key was deleted, if lately.
func (d *Deletions) Since(key types.NamespacedName) (time.Duration, bool) {
	if d == nil {
		return 0, false
	}
	at, ok := d.at.Get(key)
	return time.Since(at), ok
}

type timingKey struct{}

type timing struct {
	start   time.Time
	timeout time.Duration
}

// WithRequestTiming is an admission.Webhook WithContextFunc noting when the call arrived and the API
// server's timeout for it, so the whole admission shares one deadline.
func WithRequestTiming(ctx context.Context, r *http.Request) context.Context {
	t := timing{start: time.Now()}
	t.timeout, _ = time.ParseDuration(r.URL.Query().Get("timeout"))
	return context.WithValue(ctx, timingKey{}, t)
}

// deadline leaves a margin within the API server's own timeout for the answer to travel back.
func deadline(ctx context.Context, timeout time.Duration) time.Time {
	t, ok := ctx.Value(timingKey{}).(timing)
	if !ok {
		t.start = time.Now()
	}
	if t.timeout > 0 {
		timeout = min(timeout, time.Duration(float64(t.timeout)*clock.APIServerShare))
	}
	return t.start.Add(timeout)
}
