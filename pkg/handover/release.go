package handover

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Release watches claims still waiting for their Metal3Data. When the Metal3Data is stored it
// hands them over (when admission's response was lost, the Metal3Data carries no record); when it
// is not stored within GracePeriod of the claim's creation it releases them.
type Release struct {
	Client      client.Client
	Recorder    events.EventRecorder
	GracePeriod time.Duration
	// ClaimGVK is the claim kind this instance watches.
	ClaimGVK schema.GroupVersionKind
}

// SetupWithManager registers the controller; it runs under leader election.
func (r *Release) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	waiting := predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := o.GetAnnotations()[allocation.PreallocatedForAnnotation]
		return ok && len(o.GetOwnerReferences()) == 0
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("preallocation-release-"+r.ClaimGVK.Kind).
		For(allocation.Metadata(r.ClaimGVK), builder.WithPredicates(waiting)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Release) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	claim := allocation.Metadata(r.ClaimGVK)
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	dataName, ok := claim.Annotations[allocation.PreallocatedForAnnotation]
	if !ok || len(claim.OwnerReferences) > 0 || !claim.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx).WithValues("Metal3Data", klog.KRef(claim.Namespace, dataName))

	data := allocation.Metadata(Metal3DataGVK)
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: dataName}, data)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	ref := allocation.ClaimRef{Kind: r.ClaimGVK.Kind, Name: claim.Name}
	if err == nil && data.DeletionTimestamp.IsZero() {
		if recorded, _ := allocation.ParseClaims(data.Annotations[allocation.ClaimsAnnotation]); slices.Contains(recorded, ref) {
			// The hand-over controller reacts to the Metal3Data's create event for recorded
			// claims; another patch attempt here would only race it.
			return ctrl.Result{}, nil
		}
		handed, err := handOverAll(ctx, r.Client, data, []allocation.ClaimRef{ref}, "resync")
		if len(handed) > 0 {
			r.Recorder.Eventf(data, nil, "Normal", "PreallocatedClaimsHandedOver", "HandOver",
				"Handed over preallocated claims %s", allocation.FormatClaims(handed))
		}
		return ctrl.Result{}, err
	}

	if wait := time.Until(claim.CreationTimestamp.Add(r.GracePeriod)); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	logger.Info("Releasing a claim preallocated for a Metal3Data that was never stored", r.ClaimGVK.Kind, klog.KObj(claim))
	released, err := allocation.Release(ctx, r.Client, claim)
	if released {
		releasesTotal.WithLabelValues(r.ClaimGVK.Kind).Inc()
	}
	return ctrl.Result{}, err
}
