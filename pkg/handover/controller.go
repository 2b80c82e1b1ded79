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

// HandOver hands the claims a replica preallocated over to their Metal3Data once it is stored and
// they are created, and, when the IPAM is behind, once it has answered them. It runs on every
// replica, without the lease, and acts only on the Metal3Data this replica admitted: it reacts to
// the create event from its own metadata cache, to the end of the claims' creation and to the
// IPAM's answers, and patches all claims at once, without reading from the API server. Release
// (on every replica) takes over what a replica that died could not finish.
//
// Why it waits for a lagging IPAM: CAPM3 maps every event of a claim to the Metal3Data its owner
// reference names. A claim handed over before the IPAM answers wakes CAPM3 once for the hand-over
// and again for each of the IPAM's writes (its finalizer, then its status), each a reconcile with
// two uncached Secret GETs that finds no address yet. Handed over once answered, the IPAM's
// writes wake nobody, and the hand-over wakes the reconcile that renders. CAPM3 treats an IPClaim
// not owned by its Metal3Data as it treats one without an address (requeue, no error), so a
// reconcile that comes before the hand-over costs what it costs without the wait. When the IPAM
// keeps up, the claims are handed over at once: CAPM3's first reconcile reads them tens of
// milliseconds after the Metal3Data is stored, and whether it then needs another depends on the
// IPAM having answered by then (see Admissions.IPAMWait).
type HandOver struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Admissions says what this replica admitted and, with its IPAMWait, how long a hand-over
	// waits for the IPAM's answer when the IPAM is behind: an IPAM that is down or slow delays it
	// no longer than that.
	Admissions *Admissions
}

// SetupWithManager registers the controller on every replica.
func (h *HandOver) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	admittedHere := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return h.Admissions.Pending(client.ObjectKeyFromObject(o), o.GetAnnotations())
	})
	// Only the create event matters; after a restart this replica remembers no admission, so the
	// replay of every Metal3Data writes nothing.
	createOnly := predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("preallocation-handover").
		For(allocation.Metadata(allocation.Metal3DataGVK), builder.WithPredicates(admittedHere, createOnly)).
		WatchesRawSource(source.Channel(h.Admissions.Created(), &handler.EnqueueRequestForObject{}))
	if h.Admissions.IPAMWait > 0 {
		for _, kind := range []string{allocation.KindIPClaim, allocation.KindIPAddressClaim} {
			b = b.Watches(wholeClaim(kind), handler.EnqueueRequestsFromMapFunc(h.admittedDataOf), builder.WithPredicates(answeredNow))
		}
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: concurrency, NeedLeaderElection: ptr.To(false)}).
		Complete(h)
}

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

// answeredNow passes the event in which a claim is first seen answered by the IPAM. CAPM3 is woken
// by each of the IPAM's writes once the claim is handed over, so the hand-over waits for the
// status, which CAPM3 reads, not the finalizer written before it; an IPAddressClaim whose pool
// fails it is handed over by the wait's bound.
var answeredNow = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return allocation.Answered(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return !allocation.Answered(e.ObjectOld) && allocation.Answered(e.ObjectNew)
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// admittedDataOf maps a claim to the Metal3Data it waits for, when this replica admitted it.
func (h *HandOver) admittedDataOf(_ context.Context, claim client.Object) []reconcile.Request {
	name, ok := waitingFor(claim)
	if !ok {
		return nil
	}
	key := types.NamespacedName{Namespace: claim.GetNamespace(), Name: name}
	// A waiting claim carries the admission token its Metal3Data records, which is what Pending
	// compares.
	if !h.Admissions.Pending(key, claim.GetAnnotations()) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// Reconcile implements reconcile.Reconciler.
func (h *HandOver) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	if err := h.Client.Get(ctx, req.NamespacedName, data); err != nil {
		// Not stored yet: its create event comes back here.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	token := data.Annotations[allocation.AdmissionAnnotation]
	if warning := h.Admissions.TakeWarning(req.NamespacedName, token); warning != "" {
		h.Recorder.Eventf(data, nil, corev1.EventTypeWarning, "PreallocationIncomplete", "Preallocate", "%s", warning)
	}
	refs, answerBy, ok := h.Admissions.Claims(req.NamespacedName, token)
	if !ok {
		// Not this replica's admission, or its claims are still being created: the end of their
		// creation comes back here.
		return ctrl.Result{}, nil
	}
	if !data.DeletionTimestamp.IsZero() {
		h.Admissions.Done(req.NamespacedName, token)
		return ctrl.Result{}, nil
	}
	if wait := h.unanswered(ctx, data.Namespace, refs, answerBy); wait > 0 {
		// The IPAM's answer comes back here; the requeue is the bound.
		log.FromContext(ctx).V(1).Info("Waiting for the IPAM's answer before handing over", "limitIn", wait)
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	start := time.Now()
	_, err := handOverAll(ctx, h.Client, h.Recorder, data, refs, token, "admission")
	handOverSeconds.Observe(time.Since(start).Seconds())
	if err == nil {
		h.Admissions.Done(req.NamespacedName, token)
	}
	return ctrl.Result{}, err
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
