// Package mutate holds the mutating admission handler that preallocates a Metal3Data's IP claims.
package mutate

import (
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
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
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
	// Compat, if set, leaves every Metal3Data to a CAPM3 whose claims the webhook does not mirror.
	Compat *compat.Guard
	// OnAdmitted hears, before the answer, of every admission that recorded claims or warns. It may
	// wait for the creates to be sent, never for a write: CAPM3 creates Metal3Data one by one.
	OnAdmitted func(ctx context.Context, key types.NamespacedName, token, dataToken string, claims []allocation.Claim, warning string)
}

var _ admission.Handler = &Preallocator{}

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
	if refusal := p.Compat.Refusal(); refusal != "" {
		return p.skipped(ctx, data, skipf(ReasonIncompatibleCAPM3, "%s", refusal))
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
