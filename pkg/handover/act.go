package handover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/lifecycle"
)

// act carries out the decision.
func (h *HandOver) act(ctx context.Context, s scope, d lifecycle.HandOverDecision) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(s.data)
	switch d.Step {
	case lifecycle.HandOverUnrecorded:
		if err := h.handOverUnrecorded(ctx, key, s.unrecorded); err != nil {
			return ctrl.Result{}, err
		}
		// The claims the record names are decided on right after.
		return ctrl.Result{RequeueAfter: clock.Next}, nil
	case lifecycle.HandOverAdmitted:
		start := time.Now()
		_, err := handOverAll(ctx, h.Client, h.Recorder, s.data, s.admitted, s.token, "admission")
		handOverSeconds.Observe(time.Since(start).Seconds())
		if err == nil {
			h.Admissions.done(key, s.token)
		}
		return ctrl.Result{}, err
	case lifecycle.HandOverRecorded:
		handed, err := handOverAll(ctx, h.Client, h.Recorder, s.data, s.recorded, s.token, "takeover")
		if len(handed) > 0 {
			log.FromContext(ctx).Info("Handed over claims their admitting replica did not", "claims", allocation.FormatClaims(handed))
		}
		if err == nil {
			h.seen.Delete(key)
		}
		return ctrl.Result{}, err
	}
	if d.Note != lifecycle.NoNote {
		// answeredAt is read only under NoteAnswered.
		now := time.Now()
		h.seen.Note(key, func(t *takeOver) { t.note, t.answeredAt = d.Note, now })
	}
	if d.Why != "" {
		log.FromContext(ctx).V(1).Info(d.Why, "limitIn", d.After)
	}
	return ctrl.Result{RequeueAfter: d.After}, nil
}

// handOverUnrecorded hands claims over to the Metal3Data read live: the owner reference must carry
// the UID of the object that exists now, not of one the cache still holds.
func (h *HandOver) handOverUnrecorded(ctx context.Context, key types.NamespacedName, claims []metav1.PartialObjectMetadata) error {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	if found, err := allocation.Read(ctx, h.APIReader, key, data); !found || !data.DeletionTimestamp.IsZero() {
		return err
	}
	var errs []error
	for _, claim := range claims {
		ref := allocation.ClaimRef{Kind: claim.Kind, Name: claim.Name}
		handed, err := handOverAll(ctx, h.Client, h.Recorder, data, []allocation.ClaimRef{ref}, claim.Annotations[allocation.AdmissionAnnotation], "takeover")
		if len(handed) > 0 {
			log.FromContext(ctx).Info("Handed over a claim its Metal3Data does not record", ref.Kind, klog.KObj(&claim))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// handOverAll hands the listed claims over to data concurrently and records an Event on data when
// one failed. It returns the claims it handed over.
func handOverAll(ctx context.Context, c client.Client, recorder events.EventRecorder, data *metav1.PartialObjectMetadata,
	refs []allocation.ClaimRef, token, path string) ([]allocation.ClaimRef, error) {
	handed, errs := make([]bool, len(refs)), make([]error, len(refs))
	var pending sync.WaitGroup
	for i, ref := range refs {
		pending.Go(func() { handed[i], errs[i] = handOverOne(ctx, c, data, ref, token) })
	}
	pending.Wait()
	var done []allocation.ClaimRef
	for i, ref := range refs {
		if errs[i] != nil {
			errs[i] = fmt.Errorf("%s: %w", ref, errs[i])
		} else if handed[i] {
			handOversTotal.WithLabelValues(ref.Kind, path).Inc()
			done = append(done, ref)
		}
	}
	if len(done) > 0 {
		// A log line, not an Event: every write per Metal3Data costs CAPM3's template loop.
		log.FromContext(ctx).V(1).Info("Handed over preallocated claims", "claims", allocation.FormatClaims(done))
	}
	if err := errors.Join(errs...); err != nil {
		recorder.Eventf(data, nil, corev1.EventTypeWarning, "PreallocatedClaimsHandOverFailed", "HandOver",
			"Handing over preallocated claims failed, retrying: %v", err)
		return done, fmt.Errorf("handing over claims of Metal3Data %s: %w", klog.KObj(data), err)
	}
	return done, nil
}

// handOverOne hands a claim over unless the cache shows it owned by data already. The patch's
// tests decide whether it still waits: a stale cache can cost a request, never a hand-over.
func handOverOne(ctx context.Context, c client.Client, data *metav1.PartialObjectMetadata, ref allocation.ClaimRef, token string) (bool, error) {
	gvk, err := ref.GVK()
	if err != nil {
		return false, err
	}
	cached := allocation.Metadata(gvk)
	switch err := c.Get(ctx, types.NamespacedName{Namespace: data.Namespace, Name: ref.Name}, cached); {
	case err == nil && slices.ContainsFunc(cached.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == data.UID }):
		return false, nil
	case err != nil && !apierrors.IsNotFound(err):
		return false, fmt.Errorf("reading it from the cache: %w", err)
	}
	log.FromContext(ctx).V(2).Info("Handing preallocated claim over", ref.Kind, klog.KRef(data.Namespace, ref.Name))
	return allocation.HandOver(ctx, c, data, ref, token, cached.Annotations)
}
