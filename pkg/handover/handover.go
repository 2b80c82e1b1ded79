// Package handover holds the controllers that finish what admission started: they hand claims
// preallocated for a Metal3Data over to it once it is stored, and release the claims of a
// Metal3Data that never was.
package handover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// HandOver hands the claims preallocated for a Metal3Data over to it once it is stored. It runs
// on every replica, without the lease, so that no hand-over waits for a new leader: at once for
// the claims this replica's admission created and for claims the Metal3Data does not record (a
// lost admission response), and after TakeOverDelay for the claims another replica admitted and
// did not hand over (it died).
//
// When the IPAM is behind, the hand-over waits for its answers, at most IPAMWait: CAPM3 maps every
// event of a claim to the Metal3Data its owner reference names, so a claim handed over before the
// IPAM answers wakes CAPM3 again for each of the IPAM's writes, each a reconcile that finds no
// address yet. When the IPAM keeps up, waiting would only delay CAPM3's first reconcile.
type HandOver struct {
	Client client.Client
	// APIReader reads, live, the Metal3Data a claim it does not record is handed over to.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Admissions says what this replica admitted and whether the IPAM was behind then; Created
	// tells when an admission's claims are created.
	Admissions    *Admissions
	Created       <-chan event.GenericEvent
	TakeOverDelay time.Duration
	// IPAMWait bounds how long a take-over waits for the IPAM to answer the claims, as the
	// admitting replica would have.
	IPAMWait time.Duration

	seen sightings
}

// SetupWithManager registers the controller on every replica.
func (h *HandOver) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	// After a restart this replica remembers no admission: the replay of every Metal3Data finds
	// at most claims to take over.
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
			// The metadata event of the IPAM's status write can come before the whole claim's
			// informer holds the status: its own event ends the wait.
			b = b.Watches(wholeClaim(gvk.Kind), handler.EnqueueRequestsFromMapFunc(dataWaitedFor), builder.WithPredicates(answeredNow))
		}
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: concurrency, NeedLeaderElection: ptr.To(false)}).
		Complete(h)
}

// stillWaiting passes the events of claims that wait for a Metal3Data.
var stillWaiting = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return phaseOf(o) == waiting
})

// wholeClaim is an empty claim of the kind, as the informers of whole claims hold it; nil for an
// unknown kind.
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
// status, which CAPM3 reads, not the finalizer written before it.
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
		// Not stored yet: its create event comes back here.
		h.seen.forget(req.NamespacedName)
		return ctrl.Result{}, client.IgnoreNotFound(err)
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
		age:             h.seen.age(req.NamespacedName, data.UID, token),
	}
	d := decideHandOver(f, h.TakeOverDelay)
	switch d.action {
	case handOverUnrecorded:
		// The rest in the next pass.
		return ctrl.Result{Requeue: true}, h.handOverUnrecorded(ctx, req.NamespacedName, unrecorded)
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

// unrecordedClaims are the waiting claims that the Metal3Data's record, from the admission token,
// does not name.
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

// handOverUnrecorded hands claims over to the Metal3Data read live, so that the owner reference
// carries the UID of the object that exists now, not of one the cache still holds.
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
	if wait := h.unanswered(ctx, data.Namespace, refs, answerBy); wait > 0 {
		// The IPAM's answer comes back here; the requeue is the bound.
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

// handOverRecorded hands over all the claims the Metal3Data records at once, as the admitting
// replica would: handed over one by one as each is answered, each would wake CAPM3 to find the
// others unusable.
func (h *HandOver) handOverRecorded(ctx context.Context, data *metav1.PartialObjectMetadata, refs []allocation.ClaimRef, token string, age time.Duration) (ctrl.Result, error) {
	if wait := h.holdForAnswers(ctx, data, refs, age); wait > 0 {
		log.FromContext(ctx).V(1).Info("Leaving claims the IPAM has not all answered to their admitting replica", "limitIn", wait)
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	handed, err := handOverAll(ctx, h.Client, h.Recorder, data, refs, token, "takeover")
	if len(handed) > 0 {
		log.FromContext(ctx).Info("Handed over claims their admitting replica did not", "claims", allocation.FormatClaims(handed))
	}
	return ctrl.Result{}, err
}

// answerGrace is how long a take-over that waited for the IPAM's answers leaves them to the
// admitting replica, which is woken by the same answer and, alive, hands over at once.
const answerGrace = time.Second

// holdForAnswers returns how much longer the take-over waits for the IPAM: while a recorded claim
// still waits unanswered, until IPAMWait, and once they are all answered after such a wait,
// answerGrace more. A recorded claim that is not in the cache was never created (CAPM3 creates
// it), and is not waited for.
func (h *HandOver) holdForAnswers(ctx context.Context, data *metav1.PartialObjectMetadata, refs []allocation.ClaimRef, age time.Duration) time.Duration {
	left := h.IPAMWait - age
	if left <= 0 {
		return 0
	}
	key := client.ObjectKeyFromObject(data)
	if waiting, _ := unansweredClaims(ctx, h.Client, data.Namespace, refs); waiting > 0 {
		if _, ok := h.seen.update(key, func(s *sighting) { s.waited = true }); ok {
			// The IPAM's answers are events here; this is the bound.
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
		// Answered before the take-over delay ended: the admitting replica had that long.
		return 0
	}
	return min(left, answerGrace-now.Sub(s.answered))
}

// unanswered returns how much longer the hand-over waits for the IPAM: zero once the cache shows
// every claim answered, being deleted, owned or failing to read (the hand-over then reports it),
// or from answerBy on. A claim the cache does not hold yet was created moments ago, and its
// answer is an event too.
func (h *HandOver) unanswered(ctx context.Context, namespace string, refs []allocation.ClaimRef, answerBy time.Time) time.Duration {
	left := time.Until(answerBy)
	if left <= 0 {
		return 0
	}
	if waiting, absent := unansweredClaims(ctx, h.Client, namespace, refs); waiting+absent == 0 {
		return 0
	}
	return left
}

// unansweredClaims counts, in the informer of whole claims, the claims that still wait for their
// Metal3Data unanswered by the IPAM, and those it does not hold. A claim being deleted, owned
// already (handed over, or CAPM3's) or failing to read counts as neither: nothing the IPAM writes
// to it can change what the hand-over does.
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

// handOverAll patches, concurrently, every listed claim that the cache does not show as owned by
// data already, waits for every patch, and records an Event on data when one failed. The patches'
// tests decide what is still waiting: a stale cache can cost a request, never a hand-over. It
// returns the claims it handed over.
func handOverAll(ctx context.Context, c client.Client, recorder events.EventRecorder, data *metav1.PartialObjectMetadata,
	refs []allocation.ClaimRef, token, path string) ([]allocation.ClaimRef, error) {
	logger := log.FromContext(ctx)
	var (
		mu      sync.Mutex
		handed  []allocation.ClaimRef
		errs    []error
		pending sync.WaitGroup
	)
	for _, ref := range refs {
		gvk, err := ref.GVK()
		if err != nil {
			continue
		}
		cached := allocation.Metadata(gvk)
		switch err := c.Get(ctx, types.NamespacedName{Namespace: data.Namespace, Name: ref.Name}, cached); {
		case err == nil && slices.ContainsFunc(cached.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == data.UID }):
			continue
		case err != nil && !apierrors.IsNotFound(err):
			mu.Lock()
			errs = append(errs, fmt.Errorf("%s: %w", ref, err))
			mu.Unlock()
			continue
		}
		pending.Go(func() {
			var (
				ok  bool
				err error
			)
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("%s: %w", ref, err))
				case ok:
					handOversTotal.WithLabelValues(ref.Kind, path).Inc()
					handed = append(handed, ref)
				}
			}()
			logger.V(2).Info("Handing preallocated claim over", ref.Kind, klog.KRef(data.Namespace, ref.Name))
			ok, err = allocation.HandOver(ctx, c, data, ref, token, cached.Annotations)
		})
	}
	pending.Wait()
	slices.SortFunc(handed, func(a, b allocation.ClaimRef) int { return strings.Compare(a.String(), b.String()) })
	if len(handed) > 0 {
		// A log line, not an Event: every API write per Metal3Data costs CAPM3's template loop
		// where the API server is the bottleneck; failures are Events.
		logger.V(1).Info("Handed over preallocated claims", "claims", allocation.FormatClaims(handed))
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		recorder.Eventf(data, nil, corev1.EventTypeWarning, "PreallocatedClaimsHandOverFailed", "HandOver",
			"Handing over preallocated claims failed, retrying: %v", err)
		return handed, fmt.Errorf("handing over claims of Metal3Data %s: %w", klog.KObj(data), err)
	}
	return handed, nil
}
