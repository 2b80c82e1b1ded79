// Package handover finishes what admission started: it creates the claims an admission planned,
// hands them over to their Metal3Data once it is stored, and releases those of a Metal3Data that
// never was.
package handover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

var (
	handOversTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_handovers_total",
		Help: "Preallocated claims handed over to their Metal3Data, by claim kind and by path (admission: by the replica that admitted the Metal3Data; takeover: by the take-over on any replica).",
	}, []string{"kind", "path"})
	releasesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_releases_total",
		Help: "Preallocated claims released because their Metal3Data was never stored, by claim kind.",
	}, []string{"kind"})
	claimsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_claims_total",
		Help: "Claims recorded during admission, by kind and by what their creation, which the admission answers once it is sent, came to (created, reused, foreign, failed).",
	}, []string{"kind", "outcome"})
	claimCreationSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_claim_creation_duration_seconds",
		Help:    "Time spent creating (or reclaiming) the claims of one admitted Metal3Data, from the admission until the last is stored; the admission answers once they are sent.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
	handOverSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_handover_duration_seconds",
		Help:    "Time to patch all claims of one Metal3Data once it is stored and its claims are created.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
)

func init() {
	metrics.Registry.MustRegister(handOversTotal, releasesTotal, claimsTotal, claimCreationSeconds, handOverSeconds)
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3datas,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipaddresses,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// HandOver hands the claims preallocated for a Metal3Data over to it once it is stored. It runs on
// every replica, without the lease, so that no hand-over waits for a new leader: at once for its
// own admissions and for claims the Metal3Data does not record (a lost response), after
// TakeOverDelay for another replica's (it died).
//
// When the IPAM is behind, it waits for the IPAM's answers, at most IPAMWait: a claim handed over
// unanswered wakes CAPM3 again for each of the IPAM's writes, each a reconcile that finds no address.
type HandOver struct {
	Client client.Client
	// APIReader reads the Metal3Data a claim it does not record is handed over to.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Admissions says what this replica admitted and whether the IPAM was behind then; Created
	// tells when an admission's claims are created.
	Admissions    *Admissions
	Created       <-chan event.GenericEvent
	TakeOverDelay time.Duration
	// IPAMWait bounds how long a take-over waits for the IPAM's answers, as the admitting replica would.
	IPAMWait time.Duration

	seen sightings
}

// SetupWithManager registers the controller on every replica.
func (h *HandOver) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	createOnly := predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("preallocation-handover").
		For(allocation.Metadata(allocation.Metal3DataGVK), builder.WithPredicates(createOnly)).
		WatchesRawSource(source.Channel(h.Created, &handler.EnqueueRequestForObject{}))
	for _, gvk := range []schema.GroupVersionKind{allocation.IPClaimGVK, allocation.IPAddressClaimGVK} {
		b = b.Watches(allocation.Metadata(gvk), handler.EnqueueRequestsFromMapFunc(dataWaitedFor), builder.WithPredicates(stillWaiting))
		if h.IPAMWait > 0 {
			// The metadata informer can see the IPAM's status write before the whole claim's has it.
			b = b.Watches(wholeClaim(gvk.Kind), handler.EnqueueRequestsFromMapFunc(dataWaitedFor), builder.WithPredicates(answeredNow))
		}
	}
	if err := b.WithOptions(controller.Options{MaxConcurrentReconciles: concurrency, NeedLeaderElection: ptr.To(false)}).
		Complete(h); err != nil {
		return fmt.Errorf("setting up controller preallocation-handover: %w", err)
	}
	return nil
}

// stillWaiting passes the events of claims that wait for a Metal3Data.
var stillWaiting = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return phaseOf(o) == waiting
})

// wholeClaim is an empty claim of the kind; nil for an unknown kind.
func wholeClaim(kind string) client.Object {
	switch kind {
	case allocation.KindIPClaim:
		return &ipamv1.IPClaim{}
	case allocation.KindIPAddressClaim:
		return &capipamv1.IPAddressClaim{}
	}
	return nil
}

// answeredNow passes the event in which a waiting claim is first seen answered by the IPAM: its
// status, which CAPM3 reads, not its finalizer.
var answeredNow = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return phaseOf(e.Object) == waiting && allocation.Answered(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return phaseOf(e.ObjectNew) == waiting && !allocation.Answered(e.ObjectOld) && allocation.Answered(e.ObjectNew)
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// dataWaitedFor maps a claim to the Metal3Data it waits for.
func dataWaitedFor(_ context.Context, claim client.Object) []reconcile.Request {
	name, ok := waitingFor(claim)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: claim.GetNamespace(), Name: name}}}
}

// Reconcile implements reconcile.Reconciler.
func (h *HandOver) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	if err := h.Client.Get(ctx, req.NamespacedName, data); err != nil {
		h.seen.forget(req.NamespacedName)
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading Metal3Data %s: %w", req.NamespacedName, err)
	}
	token := data.Annotations[allocation.AdmissionAnnotation]
	if warning := h.Admissions.takeWarning(req.NamespacedName, token); warning != "" {
		h.Recorder.Eventf(data, nil, corev1.EventTypeWarning, "PreallocationIncomplete", "Preallocate", "%s", warning)
	}
	if !data.DeletionTimestamp.IsZero() {
		h.Admissions.done(req.NamespacedName, token)
		h.seen.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	claims, err := waitingClaims(ctx, h.Client, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}
	recorded, _ := allocation.ParseClaims(data.Annotations[allocation.ClaimsAnnotation])
	unrecorded := unrecordedClaims(claims, recorded, token)
	refs, answerBy, created := h.Admissions.claims(req.NamespacedName, token)
	f := handOverFacts{
		unrecorded:      len(unrecorded) > 0,
		admitted:        created || h.Admissions.admittedHere(req.NamespacedName, token),
		created:         created,
		recordedWaiting: len(claims) > len(unrecorded),
	}
	if f.recordedWaiting {
		f.age = h.seen.age(req.NamespacedName, data.UID, token)
	} else {
		h.seen.forget(req.NamespacedName)
	}
	d := decideHandOver(f, h.TakeOverDelay)
	if d.action == handOverUnrecorded {
		if err := h.handOverUnrecorded(ctx, req.NamespacedName, unrecorded); err != nil {
			return ctrl.Result{}, err
		}
		f.unrecorded = false
		d = decideHandOver(f, h.TakeOverDelay)
	}
	switch d.action {
	case handOverAdmitted:
		return h.handOverAdmitted(ctx, data, refs, answerBy, token)
	case handOverRecorded:
		return h.handOverRecorded(ctx, data, recorded, token, f.age)
	}
	return ctrl.Result{RequeueAfter: d.after}, nil
}

// waitingClaims lists, from the cache, the claims of both kinds that wait for the Metal3Data key.
func waitingClaims(ctx context.Context, c client.Reader, key types.NamespacedName) ([]metav1.PartialObjectMetadata, error) {
	var claims []metav1.PartialObjectMetadata
	for _, gvk := range []schema.GroupVersionKind{allocation.IPClaimGVK, allocation.IPAddressClaimGVK} {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := c.List(ctx, list, client.InNamespace(key.Namespace), client.MatchingFields{waitingForIndex: key.Name}); err != nil {
			return nil, fmt.Errorf("listing the %ss waiting for Metal3Data %s: %w", gvk.Kind, key, err)
		}
		for i := range list.Items {
			list.Items[i].SetGroupVersionKind(gvk)
			if list.Items[i].DeletionTimestamp.IsZero() {
				claims = append(claims, list.Items[i])
			}
		}
	}
	return claims, nil
}

// unrecordedClaims are the waiting claims the Metal3Data's record, under its admission token, does
// not name.
func unrecordedClaims(claims []metav1.PartialObjectMetadata, recorded []allocation.ClaimRef, token string) []metav1.PartialObjectMetadata {
	var out []metav1.PartialObjectMetadata
	for _, claim := range claims {
		ref := allocation.ClaimRef{Kind: claim.Kind, Name: claim.Name}
		if token == "" || claim.Annotations[allocation.AdmissionAnnotation] != token || !slices.Contains(recorded, ref) {
			out = append(out, claim)
		}
	}
	return out
}

// handOverUnrecorded hands claims over to the Metal3Data read live: the owner reference must carry
// the UID of the object that exists now, not of one the cache still holds.
func (h *HandOver) handOverUnrecorded(ctx context.Context, key types.NamespacedName, claims []metav1.PartialObjectMetadata) error {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	err := h.APIReader.Get(ctx, key, data)
	if apierrors.IsNotFound(err) || err == nil && !data.DeletionTimestamp.IsZero() {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Metal3Data %s to hand claims over: %w", key, err)
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

// handOverAdmitted hands over the claims this replica's admission created, once the IPAM has
// answered them or answerBy has passed.
func (h *HandOver) handOverAdmitted(ctx context.Context, data *metav1.PartialObjectMetadata, refs []allocation.ClaimRef, answerBy time.Time, token string) (ctrl.Result, error) {
	if wait := h.waitForAnswers(ctx, data.Namespace, refs, answerBy); wait > 0 {
		log.FromContext(ctx).V(1).Info("Waiting for the IPAM's answer before handing over", "limitIn", wait)
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	start := time.Now()
	_, err := handOverAll(ctx, h.Client, h.Recorder, data, refs, token, "admission")
	handOverSeconds.Observe(time.Since(start).Seconds())
	if err == nil {
		h.Admissions.done(client.ObjectKeyFromObject(data), token)
	}
	return ctrl.Result{}, err
}

// handOverRecorded hands over all the claims the Metal3Data records at once: handed over one by
// one, each would wake CAPM3 to find the others unusable.
func (h *HandOver) handOverRecorded(ctx context.Context, data *metav1.PartialObjectMetadata, refs []allocation.ClaimRef, token string, age time.Duration) (ctrl.Result, error) {
	if wait := h.holdForAnswers(ctx, data, refs, age); wait > 0 {
		log.FromContext(ctx).V(1).Info("Leaving claims the IPAM has not all answered to their admitting replica", "limitIn", wait)
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	handed, err := handOverAll(ctx, h.Client, h.Recorder, data, refs, token, "takeover")
	if len(handed) > 0 {
		log.FromContext(ctx).Info("Handed over claims their admitting replica did not", "claims", allocation.FormatClaims(handed))
	}
	if err == nil {
		h.seen.forget(client.ObjectKeyFromObject(data))
	}
	return ctrl.Result{}, err
}

// answerGrace is how long a take-over that waited for the IPAM's answers leaves them to the
// admitting replica, woken by the same answers.
const answerGrace = time.Second

// holdForAnswers returns how much longer the take-over waits for the IPAM: while a recorded claim
// waits unanswered, until IPAMWait; once all are answered after such a wait, answerGrace more. A
// recorded claim not in the cache was never created, and is not waited for.
func (h *HandOver) holdForAnswers(ctx context.Context, data *metav1.PartialObjectMetadata, refs []allocation.ClaimRef, age time.Duration) time.Duration {
	left := h.IPAMWait - age
	if left <= 0 {
		return 0
	}
	key := client.ObjectKeyFromObject(data)
	if waiting, _ := unansweredClaims(ctx, h.Client, data.Namespace, refs); waiting > 0 {
		if _, ok := h.seen.update(key, func(s *sighting) { s.waited = true }); ok {
			return left
		}
		return 0
	}
	now := time.Now()
	s, ok := h.seen.update(key, func(s *sighting) {
		if s.waited && s.answered.IsZero() {
			s.answered = now
		}
	})
	if !ok || !s.waited {
		return 0
	}
	return min(left, answerGrace-now.Sub(s.answered))
}

// waitForAnswers returns how much longer the hand-over of an admission waits for the IPAM: until
// answerBy, while a claim waits unanswered or is not in the cache yet.
func (h *HandOver) waitForAnswers(ctx context.Context, namespace string, refs []allocation.ClaimRef, answerBy time.Time) time.Duration {
	left := time.Until(answerBy)
	if left <= 0 {
		return 0
	}
	if waiting, absent := unansweredClaims(ctx, h.Client, namespace, refs); waiting+absent == 0 {
		return 0
	}
	return left
}

// unansweredClaims counts, in the informer of whole claims, the claims that wait unanswered by the
// IPAM, and those it does not hold; what the IPAM writes to any other cannot change the hand-over.
func unansweredClaims(ctx context.Context, c client.Reader, namespace string, refs []allocation.ClaimRef) (waiting, absent int) {
	for _, ref := range refs {
		claim := wholeClaim(ref.Kind)
		if claim == nil {
			continue
		}
		switch err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, claim); {
		case apierrors.IsNotFound(err):
			absent++
		case err == nil && claim.GetDeletionTimestamp().IsZero() && len(claim.GetOwnerReferences()) == 0 && !allocation.Answered(claim):
			waiting++
		}
	}
	return waiting, absent
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
