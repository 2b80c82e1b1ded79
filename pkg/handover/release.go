package handover

import (
	"context"
	"fmt"
	"slices"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// orphanRecheck is how often a claim being deleted is looked at again while its Metal3Data exists.
const orphanRecheck = 30 * time.Second

const (
	// waitingForIndex indexes claims that wait for a Metal3Data by its name.
	waitingForIndex = "ip-preallocator.metal3.io/waiting-for"
	// heldForIndex indexes claims that wait for a Metal3Data by the Metal3DataClaim it answers.
	heldForIndex = "ip-preallocator.metal3.io/held-for"
)

var dataClaimGVK = infrav1.GroupVersion.WithKind("Metal3DataClaim")

// Release finishes, on the leader, the claims of one kind the hand-over will not: it releases a
// waiting claim whose Metal3Data is not stored GracePeriod after the last admission claimed it,
// and removes CAPM3's finalizer from a waiting claim someone deleted and from a claim whose
// Metal3Data is gone.
type Release struct {
	Client client.Client
	// APIReader confirms that a Metal3Data is not stored before its claim is released.
	APIReader   client.Reader
	GracePeriod time.Duration
	// HoldLimit bounds how long past GracePeriod a claim is kept unanswered by the IPAM or while
	// its Metal3DataClaim waits for data.
	HoldLimit time.Duration
	ClaimGVK  schema.GroupVersionKind

	seen sightings
}

func waitingForValue(o client.Object) []string {
	if name, ok := waitingFor(o); ok {
		return []string{name}
	}
	return nil
}

func heldForValue(o client.Object) []string {
	if _, ok := waitingFor(o); ok && o.GetAnnotations()[allocation.DataClaimAnnotation] != "" {
		return []string{o.GetAnnotations()[allocation.DataClaimAnnotation]}
	}
	return nil
}

// IndexWaitingFor indexes the claims of kind gvk by the Metal3Data they wait for and by the
// Metal3DataClaim that one answers.
func IndexWaitingFor(ctx context.Context, mgr ctrl.Manager, gvk schema.GroupVersionKind) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, allocation.Metadata(gvk), waitingForIndex, waitingForValue); err != nil {
		return fmt.Errorf("indexing %ss by the Metal3Data they wait for: %w", gvk.Kind, err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, allocation.Metadata(gvk), heldForIndex, heldForValue); err != nil {
		return fmt.Errorf("indexing %ss by the Metal3DataClaim they are held for: %w", gvk.Kind, err)
	}
	return nil
}

// waitingOrOrphaned passes the claims Release looks after.
var waitingOrOrphaned = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return phaseOf(o) != owned
})

// SetupWithManager registers the controller under leader election.
func (r *Release) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	created := predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	name := "preallocation-release-" + r.ClaimGVK.Kind
	if err := ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(allocation.Metadata(r.ClaimGVK), builder.WithPredicates(waitingOrOrphaned)).
		// A release that found its Metal3Data stored ahead of the cache comes back with it.
		Watches(allocation.Metadata(allocation.Metal3DataGVK), handler.EnqueueRequestsFromMapFunc(r.claimsWaitingFor),
			builder.WithPredicates(created)).
		// A Metal3DataClaim that gets its data or goes ends the hold of the claims planned for it.
		Watches(allocation.Metadata(dataClaimGVK), handler.EnqueueRequestsFromMapFunc(r.claimsHeldFor)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(r); err != nil {
		return fmt.Errorf("setting up controller %s: %w", name, err)
	}
	return nil
}

func (r *Release) claimsWaitingFor(ctx context.Context, data client.Object) []reconcile.Request {
	return r.claimsIndexed(ctx, data, waitingForIndex)
}

func (r *Release) claimsHeldFor(ctx context.Context, dataClaim client.Object) []reconcile.Request {
	return r.claimsIndexed(ctx, dataClaim, heldForIndex)
}

// claimsIndexed lists the waiting claims of obj's namespace that index names obj in.
func (r *Release) claimsIndexed(ctx context.Context, obj client.Object, index string) []reconcile.Request {
	claims := &metav1.PartialObjectMetadataList{}
	claims.SetGroupVersionKind(r.ClaimGVK.GroupVersion().WithKind(r.ClaimGVK.Kind + "List"))
	if err := r.Client.List(ctx, claims, client.InNamespace(obj.GetNamespace()), client.MatchingFields{index: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "Cannot list waiting claims", obj.GetObjectKind().GroupVersionKind().Kind, klog.KObj(obj))
		return nil
	}
	reqs := make([]reconcile.Request, len(claims.Items))
	for i := range claims.Items {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&claims.Items[i])}
	}
	return reqs
}

// Reconcile implements reconcile.Reconciler.
func (r *Release) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	claim := allocation.Metadata(r.ClaimGVK)
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		r.seen.forget(req.NamespacedName)
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading %s %s: %w", r.ClaimGVK.Kind, req.NamespacedName, err)
	}
	switch phaseOf(claim) {
	case waiting:
		return r.reconcileWaiting(ctx, req.NamespacedName, claim)
	case deleting:
		return r.finishDeleted(ctx, claim)
	case orphaned:
		r.seen.forget(req.NamespacedName)
		return r.finishOrphan(ctx, claim, orphanOwner(claim))
	}
	r.seen.forget(req.NamespacedName)
	return ctrl.Result{}, nil
}

// reconcileWaiting gathers the facts decideRelease needs and carries out its decision.
func (r *Release) reconcileWaiting(ctx context.Context, key types.NamespacedName, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	dataName, _ := waitingFor(claim)
	logger := log.FromContext(ctx).WithValues("Metal3Data", klog.KRef(claim.Namespace, dataName))
	ctx = log.IntoContext(ctx, logger)
	f := releaseFacts{age: r.seen.age(key, claim.UID, claim.Annotations[allocation.AdmissionAnnotation]), ipamFinalized: ipamFinalized(claim)}
	data := allocation.Metadata(allocation.Metal3DataGVK)
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: dataName}, data)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reading the Metal3Data %s/%s a claim waits for: %w", claim.Namespace, dataName, err)
	}
	f.stored = err == nil && data.DeletionTimestamp.IsZero()
	d := decideRelease(f, r.GracePeriod, r.HoldLimit)
	if d.action == readHolds {
		h, err := r.readHolds(ctx, claim)
		if err != nil {
			// Not an error to back off from: that could keep the claim past the hold limit.
			logger.Error(err, "Cannot read what holds a waiting claim", r.ClaimGVK.Kind, klog.KObj(claim))
			return ctrl.Result{RequeueAfter: min(r.GracePeriod+r.HoldLimit-f.age, r.GracePeriod)}, nil
		}
		f.holds = &h
		d = decideRelease(f, r.GracePeriod, r.HoldLimit)
	}
	if d.action == release {
		return ctrl.Result{}, r.release(ctx, key, dataName)
	}
	if d.why != "" {
		logger.V(1).Info(d.why, r.ClaimGVK.Kind, klog.KObj(claim))
	}
	return ctrl.Result{RequeueAfter: d.after}, nil
}

// finishDeleted removes CAPM3's finalizer from a waiting claim someone deleted, once no IPAddress
// the IPAM may still make for it can stray and, within the hold limit, its pool is not busy.
func (r *Release) finishDeleted(ctx context.Context, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	if wait, err := r.releaseStrays(ctx, claim); wait > 0 || err != nil {
		return ctrl.Result{RequeueAfter: wait}, err
	}
	if left := r.HoldLimit - time.Since(claim.DeletionTimestamp.Time); left > 0 {
		busy, err := r.poolBusy(ctx, claim)
		if err != nil {
			return ctrl.Result{}, err
		}
		if busy {
			log.FromContext(ctx).V(1).Info("Keeping CAPM3's finalizer on a deleted waiting claim while the IPAM allocates in its pool", r.ClaimGVK.Kind, klog.KObj(claim))
			return ctrl.Result{RequeueAfter: min(poolRecheck, left)}, nil
		}
	}
	log.FromContext(ctx).Info("Removing CAPM3's finalizer from a waiting claim that is being deleted", r.ClaimGVK.Kind, klog.KObj(claim))
	_, err := allocation.Finish(ctx, r.Client, claim)
	return ctrl.Result{}, err
}

// strayWait is how long after its deletion a waiting IPClaim is kept: long enough for an IPAM
// pass that listed the claim before the deletion to end.
const strayWait = 10 * time.Second

// releaseStrays releases the IPAddresses of a deleted waiting IPClaim that the Metal3 IPAM will not
// free, and returns how much longer the claim is kept for such addresses to appear. The IPAM frees
// one IPAddress per claim, by name, and only from a claim it finalized.
func (r *Release) releaseStrays(ctx context.Context, claim *metav1.PartialObjectMetadata) (time.Duration, error) {
	if r.ClaimGVK.Kind != allocation.KindIPClaim {
		return 0, nil
	}
	addresses, err := allocation.ClaimAddresses(ctx, r.APIReader, claim)
	if err != nil {
		return 0, err
	}
	if len(addresses) > 1 || len(addresses) == 1 && !ipamFinalized(claim) {
		for i := range addresses {
			log.FromContext(ctx).Info("Releasing an IPAddress of a deleted waiting claim that the IPAM would not free",
				r.ClaimGVK.Kind, klog.KObj(claim), "IPAddress", klog.KObj(&addresses[i]), "addresses", len(addresses))
			if err := allocation.ReleaseAddress(ctx, r.Client, &addresses[i]); err != nil {
				return 0, err
			}
		}
		return time.Second, nil
	}
	return min(strayWait, strayWait-time.Since(claim.DeletionTimestamp.Time)), nil
}

// readHolds reads the pool from the cache first: while it is busy the claim is looked at every
// poolRecheck, and the live read of its Metal3DataClaim waits until it is not.
func (r *Release) readHolds(ctx context.Context, claim *metav1.PartialObjectMetadata) (holds, error) {
	busy, err := r.poolBusy(ctx, claim)
	if err != nil || busy {
		return holds{poolBusy: busy}, err
	}
	waits, err := r.dataClaimWaits(ctx, claim)
	return holds{dataClaimWaits: waits}, err
}

// poolBusy tells, from the cache of whole IPClaims, whether another IPClaim of the claim's Metal3
// IPPool waits for the IPAM's answer. Claims being deleted do not count: nothing is allocated for
// them, and none other comes to a namespace being deleted.
func (r *Release) poolBusy(ctx context.Context, claim *metav1.PartialObjectMetadata) (bool, error) {
	if r.ClaimGVK.Kind != allocation.KindIPClaim {
		return false, nil
	}
	whole := &ipamv1.IPClaim{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(claim), whole); err != nil {
		return false, client.IgnoreNotFound(fmt.Errorf("reading IPClaim %s/%s: %w", claim.Namespace, claim.Name, err))
	}
	others := &ipamv1.IPClaimList{}
	// Read only, and polled while a pool is busy: the cache's objects, not copies.
	if err := r.Client.List(ctx, others, client.InNamespace(claim.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return false, fmt.Errorf("listing the IPClaims of namespace %s: %w", claim.Namespace, err)
	}
	return slices.ContainsFunc(others.Items, func(c ipamv1.IPClaim) bool {
		return c.UID != whole.UID && c.Spec.Pool.Name == whole.Spec.Pool.Name && c.DeletionTimestamp.IsZero() && !allocation.Answered(&c)
	}), nil
}

// dataClaimWaits tells, from a live read, whether the Metal3DataClaim a waiting claim was planned
// for still exists without data: CAPM3 then retries the Metal3Data's create under the same name,
// and the retried admission reclaims the claim.
func (r *Release) dataClaimWaits(ctx context.Context, claim *metav1.PartialObjectMetadata) (bool, error) {
	name := claim.Annotations[allocation.DataClaimAnnotation]
	if name == "" {
		return false, nil
	}
	dataClaim := &infrav1.Metal3DataClaim{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: name}, dataClaim)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading Metal3DataClaim %s/%s: %w", claim.Namespace, name, err)
	}
	return dataClaim.DeletionTimestamp.IsZero() && dataClaim.Status.RenderedData == nil, nil
}

// finishOrphan removes CAPM3's finalizer from a claim being deleted once a live read shows its
// Metal3Data gone; that is no event of the claim, so it looks again later.
func (r *Release) finishOrphan(ctx context.Context, claim *metav1.PartialObjectMetadata, owner *metav1.OwnerReference) (ctrl.Result, error) {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}, data)
	if err == nil && data.UID == owner.UID {
		return ctrl.Result{RequeueAfter: orphanRecheck}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reading Metal3Data %s/%s, owner of a claim being deleted: %w", claim.Namespace, owner.Name, err)
	}
	log.FromContext(ctx).Info("Removing CAPM3's finalizer from a claim whose Metal3Data is gone", r.ClaimGVK.Kind, klog.KObj(claim),
		"Metal3Data", klog.KRef(claim.Namespace, owner.Name))
	_, err = allocation.FinishOrphan(ctx, r.Client, claim, owner.UID)
	return ctrl.Result{}, err
}

// release frees a claim once live reads show it still waiting and its Metal3Data not stored.
func (r *Release) release(ctx context.Context, key types.NamespacedName, dataName string) error {
	logger := log.FromContext(ctx)
	data := allocation.Metadata(allocation.Metal3DataGVK)
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: dataName}, data)
	switch {
	case err == nil && data.DeletionTimestamp.IsZero():
		// The cache is behind: the Metal3Data's create event brings the claim back.
		return nil
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("reading Metal3Data %s/%s before releasing its claim: %w", key.Namespace, dataName, err)
	}
	claim := allocation.Metadata(r.ClaimGVK)
	if err := r.APIReader.Get(ctx, key, claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading %s %s before releasing it: %w", r.ClaimGVK.Kind, key, err)
	}
	if name, ok := waitingFor(claim); !ok || name != dataName {
		return nil
	}
	logger.Info("Releasing a claim preallocated for a Metal3Data that was never stored", r.ClaimGVK.Kind, klog.KObj(claim))
	released, err := allocation.Release(ctx, r.Client, claim)
	if released {
		releasesTotal.WithLabelValues(r.ClaimGVK.Kind).Inc()
	}
	return err
}
