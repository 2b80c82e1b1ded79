package release

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/index"
	"github.com/metal3-community/ip-preallocator/pkg/lifecycle"
)

// reconcileWaiting gathers the facts of a waiting claim, decides with DecideRelease and acts.
func (r *Release) reconcileWaiting(ctx context.Context, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(claim)
	dataName, _ := allocation.WaitingFor(claim)
	logger := log.FromContext(ctx).WithValues("Metal3Data", klog.KRef(claim.Namespace, dataName))
	ctx = log.IntoContext(ctx, logger)
	sighting := r.seen.See(key, claim.UID, claim.Annotations[allocation.AdmissionAnnotation])
	f := lifecycle.ReleaseFacts{Age: time.Since(sighting.At), IPAMFinalized: allocation.IPAMFinalized(claim), Holds: sighting.Noted}
	if f.Holds != nil {
		// Read for this look only: the next reads them again.
		r.seen.Note(key, func(h **lifecycle.Holds) { *h = nil })
	}
	data := allocation.Metadata(allocation.Metal3DataGVK)
	stored, err := allocation.Read(ctx, r.Client, types.NamespacedName{Namespace: claim.Namespace, Name: dataName}, data)
	if err != nil {
		return ctrl.Result{}, err
	}
	f.Stored = stored && data.DeletionTimestamp.IsZero()
	d := lifecycle.DecideRelease(f, r.GracePeriod, r.HoldLimit)
	switch d.Step {
	case lifecycle.ReadHolds:
		h, err := r.readHolds(ctx, claim)
		if err != nil {
			// Not an error to back off from: that could keep the claim past the hold limit.
			logger.Error(err, "Cannot read what holds a waiting claim", r.ClaimGVK.Kind, klog.KObj(claim))
			return ctrl.Result{RequeueAfter: min(r.GracePeriod+r.HoldLimit-f.Age, r.GracePeriod)}, nil
		}
		r.seen.Note(key, func(held **lifecycle.Holds) { *held = &h })
		return ctrl.Result{RequeueAfter: clock.Next}, nil
	case lifecycle.Release:
		return ctrl.Result{}, r.release(ctx, key, dataName)
	}
	if d.Why != "" {
		logger.V(1).Info(d.Why, r.ClaimGVK.Kind, klog.KObj(claim))
	}
	return ctrl.Result{RequeueAfter: d.After}, nil
}

// readHolds reads the pool from the cache first: while it is busy the claim is looked at every
// clock.PoolRecheck, and the live read of its Metal3DataClaim waits until it is not.
func (r *Release) readHolds(ctx context.Context, claim *metav1.PartialObjectMetadata) (lifecycle.Holds, error) {
	whole, err := r.wholeIPClaim(ctx, claim)
	if err != nil {
		return lifecycle.Holds{}, err
	}
	busy, err := r.poolBusy(ctx, whole)
	if err != nil || busy {
		return lifecycle.Holds{PoolBusy: busy}, err
	}
	waits, err := r.dataClaimWaits(ctx, claim)
	return lifecycle.Holds{DataClaimWaits: waits}, err
}

// release frees a claim once live reads show it still waiting and its Metal3Data not stored.
func (r *Release) release(ctx context.Context, key types.NamespacedName, dataName string) error {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	// Stored, the cache is behind: the Metal3Data's create event brings the claim back.
	if stored, err := allocation.Read(ctx, r.APIReader, types.NamespacedName{Namespace: key.Namespace, Name: dataName}, data); err != nil ||
		stored && data.DeletionTimestamp.IsZero() {
		return err
	}
	claim := allocation.Metadata(r.ClaimGVK)
	if found, err := allocation.Read(ctx, r.APIReader, key, claim); !found || !allocation.WaitsFor(claim, dataName) {
		return err
	}
	log.FromContext(ctx).Info("Releasing a claim preallocated for a Metal3Data that was never stored", r.ClaimGVK.Kind, klog.KObj(claim))
	released, err := allocation.Release(ctx, r.Client, claim)
	if released {
		releasesTotal.WithLabelValues(r.ClaimGVK.Kind).Inc()
	}
	return err
}

// reconcileDeleting gathers the facts of a waiting claim being deleted, decides with
// DecideFinish and acts.
func (r *Release) reconcileDeleting(ctx context.Context, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	f := lifecycle.FinishFacts{IPClaim: r.ClaimGVK.Kind == allocation.KindIPClaim, SinceDeleted: time.Since(claim.DeletionTimestamp.Time),
		IPAMFinalized: slices.Contains(claim.Finalizers, ipamv1.IPClaimFinalizer)}
	if f.IPClaim {
		whole, err := r.wholeIPClaim(ctx, claim)
		if err != nil {
			return ctrl.Result{}, err
		}
		addresses, err := index.Addresses(ctx, r.Client, claim.Namespace, claim.UID)
		if err != nil {
			return ctrl.Result{}, err
		}
		if f.PoolGone, err = r.poolGone(ctx, claim, whole); err != nil {
			return ctrl.Result{}, err
		}
		f.Strays = lifecycle.Strays(len(addresses), allocation.IPAMFinalized(claim), f.PoolGone)
		if f.PoolBusy, err = r.poolBusy(ctx, whole); err != nil {
			return ctrl.Result{}, err
		}
	}
	d := lifecycle.DecideFinish(f, r.HoldLimit)
	switch d.Step {
	case lifecycle.Finish:
		removed, err := allocation.Finish(ctx, r.Client, claim)
		if removed && slices.Contains(claim.Finalizers, infrav1.DataFinalizer) {
			r.finalizerRemoved(ctx, claim, "deleted-waiting", "Removed CAPM3's finalizer from a waiting claim being deleted: no Metal3Data will release it")
		}
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: d.After}, nil
	case lifecycle.FinishForIPAM:
		removed, err := allocation.FinishForIPAM(ctx, r.Client, claim)
		if removed {
			r.finalizerRemoved(ctx, claim, "pool-gone", "Removed CAPM3's and the IPAM's finalizers from a waiting claim being deleted: its IPPool is gone, and the IPAM frees claims only from their pool")
		}
		return ctrl.Result{}, err
	}
	if d.Why != "" {
		log.FromContext(ctx).V(1).Info(d.Why, r.ClaimGVK.Kind, klog.KObj(claim))
	}
	return ctrl.Result{RequeueAfter: d.After}, nil
}

// wholeIPClaim reads the whole IPClaim of claim from the cache; nil for an IPAddressClaim or a
// claim gone.
func (r *Release) wholeIPClaim(ctx context.Context, claim *metav1.PartialObjectMetadata) (*ipamv1.IPClaim, error) {
	if r.ClaimGVK.Kind != allocation.KindIPClaim {
		return nil, nil
	}
	whole := &ipamv1.IPClaim{}
	if found, err := allocation.Read(ctx, r.Client, client.ObjectKeyFromObject(claim), whole); !found {
		return nil, err
	}
	return whole, nil
}

// poolGone tells, for a deleted IPClaim that still has the IPAM's finalizer, whether its pool is
// gone: read live, since a pool's deletion is no event of the claim.
func (r *Release) poolGone(ctx context.Context, claim *metav1.PartialObjectMetadata, whole *ipamv1.IPClaim) (bool, error) {
	if whole == nil || !slices.Contains(claim.Finalizers, ipamv1.IPClaimFinalizer) {
		return false, nil
	}
	return allocation.PoolGone(ctx, r.APIReader, cmp.Or(whole.Spec.Pool.Namespace, claim.Namespace), whole.Spec.Pool.Name)
}

// finalizerRemoved tells of a removal of CAPM3's finalizer, which CAPM3 would otherwise remove, or
// of the IPAM's from a stranded claim.
func (r *Release) finalizerRemoved(ctx context.Context, claim *metav1.PartialObjectMetadata, kind, note string) {
	log.FromContext(ctx).Info(note, r.ClaimGVK.Kind, klog.KObj(claim))
	finalizersRemovedTotal.WithLabelValues(r.ClaimGVK.Kind, kind).Inc()
	reason := "CAPM3FinalizerRemoved"
	if kind == "stranded" {
		reason = "IPAMFinalizerRemoved"
	}
	r.Recorder.Eventf(claim, nil, corev1.EventTypeNormal, reason, "Finish", "%s", note)
}

// reconcileOrphan removes CAPM3's finalizer from a claim being deleted once a live read shows its
// Metal3Data gone, as DecideOrphan decides.
func (r *Release) reconcileOrphan(ctx context.Context, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	owner := allocation.Metal3DataOwner(claim)
	data := allocation.Metadata(allocation.Metal3DataGVK)
	found, err := allocation.Read(ctx, r.APIReader, types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}, data)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := lifecycle.DecideOrphan(found && data.UID == owner.UID)
	if d.Step != lifecycle.Finish {
		return ctrl.Result{RequeueAfter: d.After}, nil
	}
	removed, err := allocation.FinishOrphan(ctx, r.Client, claim, owner.UID)
	if removed {
		r.finalizerRemoved(ctx, claim, "orphan", "Removed CAPM3's finalizer from a claim whose Metal3Data "+owner.Name+" is gone: CAPM3 releases nothing for a Metal3Data deleted before its first reconcile")
	}
	return ctrl.Result{}, err
}

// reconcileStranded removes the IPAM's finalizer from a claim the webhook created, which CAPM3
// released and whose pool is gone, as DecideStranded decides.
func (r *Release) reconcileStranded(ctx context.Context, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	whole, err := r.wholeIPClaim(ctx, claim)
	if err != nil || whole == nil {
		return ctrl.Result{}, err
	}
	var f lifecycle.StrandedFacts
	if f.PoolGone, err = r.poolGone(ctx, claim, whole); err != nil || !f.PoolGone {
		return ctrl.Result{RequeueAfter: lifecycle.DecideStranded(f).After}, err
	}
	// The cache strips managedFields, which tell who created the claim.
	live := allocation.Metadata(r.ClaimGVK)
	if found, err := allocation.Read(ctx, r.APIReader, client.ObjectKeyFromObject(claim), live); !found || live.UID != claim.UID {
		return ctrl.Result{}, err
	}
	addresses, err := index.Addresses(ctx, r.Client, claim.Namespace, claim.UID)
	if err != nil {
		return ctrl.Result{}, err
	}
	f.CreatedHere, f.Addresses = allocation.CreatedHere(live), len(addresses)
	d := lifecycle.DecideStranded(f)
	if d.Step != lifecycle.FinishForIPAM {
		if d.Why != "" {
			log.FromContext(ctx).V(1).Info(d.Why, r.ClaimGVK.Kind, klog.KObj(claim))
		}
		return ctrl.Result{RequeueAfter: d.After}, nil
	}
	removed, err := allocation.FinishStranded(ctx, r.Client, live)
	if removed {
		r.finalizerRemoved(ctx, claim, "stranded", "Removed the IPAM's finalizer from a claim the webhook created, which CAPM3 released: its IPPool is gone, and the IPAM frees claims only from their pool")
	}
	return ctrl.Result{}, err
}

// poolBusy tells, from the cache of whole IPClaims, whether another IPClaim of the claim's Metal3
// IPPool waits for the IPAM's answer. Claims being deleted do not count: nothing is allocated for
// them, and none other comes to a namespace being deleted.
func (r *Release) poolBusy(ctx context.Context, whole *ipamv1.IPClaim) (bool, error) {
	if whole == nil {
		return false, nil
	}
	others := &ipamv1.IPClaimList{}
	// Read only, and polled while a pool is busy: the cache's objects, not copies.
	if err := r.Client.List(ctx, others, client.InNamespace(whole.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return false, fmt.Errorf("listing the IPClaims of namespace %s: %w", whole.Namespace, err)
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
	found, err := allocation.Read(ctx, r.APIReader, types.NamespacedName{Namespace: claim.Namespace, Name: name}, dataClaim)
	return found && dataClaim.DeletionTimestamp.IsZero() && dataClaim.Status.RenderedData == nil, err
}
