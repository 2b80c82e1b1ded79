// Package release finishes, on the leader, the claims the hand-over will not: it releases a
// waiting claim whose Metal3Data was never stored, and removes CAPM3's finalizer from a waiting
// claim someone deleted and from a claim whose Metal3Data is gone.
package release

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
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

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/index"
	"github.com/metal3-community/ip-preallocator/pkg/lifecycle"
	"github.com/metal3-community/ip-preallocator/pkg/memory"
)

var (
	releasesTotal = promauto.With(metrics.Registry).NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_releases_total",
		Help: "Preallocated claims released because their Metal3Data was never stored, by claim kind.",
	}, []string{"kind"})
	finalizersRemovedTotal = promauto.With(metrics.Registry).NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_capm3_finalizers_removed_total",
		Help: "CAPM3 finalizers the webhook removed from claims CAPM3 would never release, by claim kind and case (deleted-waiting: deleted before its Metal3Data was stored; pool-gone: that, and its IPPool gone, the IPAM's finalizer removed too; orphan: its Metal3Data deleted before CAPM3's first reconcile; stranded: released by CAPM3 and its IPPool gone, the IPAM's finalizer removed).",
	}, []string{"kind", "case"})
)

// Release looks after the waiting, deleting and orphaned claims of one kind, as the decisions of
// package lifecycle say: DecideRelease, DecideFinish and DecideOrphan.
type Release struct {
	Client client.Client
	// APIReader confirms what a release or a finish acts on.
	APIReader   client.Reader
	GracePeriod time.Duration
	// HoldLimit bounds how long past GracePeriod a claim is held.
	HoldLimit time.Duration
	ClaimGVK  schema.GroupVersionKind
	Recorder  events.EventRecorder

	// seen holds, beside each waiting claim's first sight, its holds once read, for the next look.
	seen memory.Sightings[*lifecycle.Holds]
}

// SetupWithManager registers the controller under leader election.
func (r *Release) SetupWithManager(mgr ctrl.Manager) error {
	r.seen.TTL = 2 * (r.GracePeriod + r.HoldLimit)
	created := predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	name := "preallocation-release-" + r.ClaimGVK.Kind
	if err := r.registerWaiting(mgr.GetCache()); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(allocation.Metadata(r.ClaimGVK), builder.WithPredicates(notOwned)).
		// A release that found its Metal3Data stored ahead of the cache comes back with it.
		Watches(allocation.Metadata(allocation.Metal3DataGVK), r.claimsIndexed(index.WaitingFor), builder.WithPredicates(created)).
		// A Metal3DataClaim that gets its data or goes ends the hold of the claims planned for it.
		Watches(allocation.Metadata(allocation.Metal3DataClaimGVK), r.claimsIndexed(index.HeldFor)).
		WithOptions(controller.Options{MaxConcurrentReconciles: clock.Concurrency}).
		Complete(r); err != nil {
		return fmt.Errorf("setting up controller %s: %w", name, err)
	}
	return nil
}

var notOwned = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return allocation.PhaseOf(o) != allocation.Owned
})

func (r *Release) claimsIndexed(name string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		return r.claimsIn(ctx, obj, name)
	})
}

// claimsIn maps an object to the claims of its namespace that the index names it in.
func (r *Release) claimsIn(ctx context.Context, obj client.Object, name string) []reconcile.Request {
	claims, err := index.List(ctx, r.Client, r.ClaimGVK, obj.GetNamespace(), name, obj.GetName())
	if err != nil {
		log.FromContext(ctx).Error(err, "Cannot list waiting claims", obj.GetObjectKind().GroupVersionKind().Kind, klog.KObj(obj))
		return nil
	}
	reqs := make([]reconcile.Request, len(claims))
	for i := range claims {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&claims[i])}
	}
	return reqs
}

// Reconcile dispatches a claim by its phase.
func (r *Release) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	claim := allocation.Metadata(r.ClaimGVK)
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		r.seen.Delete(req.NamespacedName)
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	phase := allocation.PhaseOf(claim)
	if phase != allocation.Waiting {
		r.seen.Delete(req.NamespacedName)
	}
	switch phase {
	case allocation.Waiting:
		return r.reconcileWaiting(ctx, claim)
	case allocation.Deleting:
		return r.reconcileDeleting(ctx, claim)
	case allocation.Orphaned:
		return r.reconcileOrphan(ctx, claim)
	case allocation.Stranded:
		return r.reconcileStranded(ctx, claim)
	}
	return ctrl.Result{}, nil
}

// registerWaiting exports, when scraped, how many claims of the kind wait for their Metal3Data and
// the oldest one's age, from one list of the cache: a claim waits seconds when its Metal3Data is
// stored, and at most the grace period and the hold limit when it never is.
func (r *Release) registerWaiting(c client.Reader) error {
	kind := prometheus.Labels{"kind": r.ClaimGVK.Kind}
	w := &waiting{cache: c, gvk: r.ClaimGVK,
		count: prometheus.NewDesc("ip_preallocator_waiting_claims",
			"Preallocated claims waiting for their Metal3Data to be stored (not handed over, not released), by kind.", nil, kind),
		oldest: prometheus.NewDesc("ip_preallocator_oldest_waiting_claim_age_seconds",
			"Age of the oldest preallocated claim waiting for its Metal3Data, by kind; 0 when none waits.", nil, kind),
	}
	if err := metrics.Registry.Register(w); err != nil {
		return fmt.Errorf("registering the waiting claims gauges of %s: %w", r.ClaimGVK.Kind, err)
	}
	return nil
}

// waiting collects both gauges of one claim kind from one list of the cache.
type waiting struct {
	cache         client.Reader
	gvk           schema.GroupVersionKind
	count, oldest *prometheus.Desc
}

func (w *waiting) Describe(ch chan<- *prometheus.Desc) {
	ch <- w.count
	ch <- w.oldest
}

func (w *waiting) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), clock.MetricsRead)
	defer cancel()
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(w.gvk.GroupVersion().WithKind(w.gvk.Kind + "List"))
	n, oldest := 0, time.Duration(0)
	if err := w.cache.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		n, oldest = -1, -1
	}
	for i := range list.Items {
		if allocation.PhaseOf(&list.Items[i]) == allocation.Waiting {
			n++
			oldest = max(oldest, time.Since(list.Items[i].CreationTimestamp.Time))
		}
	}
	ch <- prometheus.MustNewConstMetric(w.count, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(w.oldest, prometheus.GaugeValue, oldest.Seconds())
}
