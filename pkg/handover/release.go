package handover

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
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

// dataClaimGVK is the version the release controller watches Metal3DataClaims in.
var dataClaimGVK = infrav1.GroupVersion.WithKind("Metal3DataClaim")

// Release finishes every claim still waiting for its Metal3Data. Two instances share the work.
// On every replica (TakeOver), because a hand-over is safe from anywhere and must not wait for a
// new leader after the leader died:
//   - its Metal3Data is stored but carries no record of it (the admission response was lost, or a
//     later admission of the same name reclaimed it): handed over at once;
//   - its Metal3Data records it but the admitting replica, another one or this one once it has
//     forgotten the admission, did not hand it over within HandOverDelay (it died): handed over
//     with the other claims the Metal3Data records, once the IPAM has answered them all or
//     IPAMWait has passed (see IPAMWait).
//
// On the leader, because these remove or release:
//   - being deleted (a person, a namespace deletion): CAPM3's finalizer goes, as CAPM3 would do;
//   - its Metal3Data is not stored GracePeriod after the last admission claimed it: released,
//     but not before the IPAM answered it (see ipamHandled) nor while the Metal3DataClaim it was
//     planned for still waits for data (see dataClaimWaits), for at most HoldLimit more;
//   - being deleted, owned by a Metal3Data that is gone: CAPM3's finalizer goes.
//
// Time is measured on this replica's clock from when it first saw the claim's current admission,
// so clock skew between replicas and the API server cannot shorten a grace period.
type Release struct {
	Client client.Client
	// APIReader confirms, live, that a Metal3Data is not stored before its claim is released,
	// reads the Metal3Data a claim is handed over to without a record, and the Metal3DataClaim
	// a claim is kept for.
	APIReader   client.Reader
	Recorder    events.EventRecorder
	GracePeriod time.Duration
	// HoldLimit bounds how long past GracePeriod a claim is kept unanswered by the IPAM or while
	// its Metal3DataClaim waits for data: a Metal3Data rejected for good, or an IPAM that is down,
	// must not keep claims for ever.
	HoldLimit     time.Duration
	HandOverDelay time.Duration
	// IPAMWait, when above HandOverDelay, is how long a TakeOver instance keeps the claims a
	// Metal3Data records while the IPAM has not answered them all (their status, from the
	// informer of whole claims): the admitting replica waits that long for a lagging IPAM
	// (Admissions.IPAMWait), and a take-over before the answers would cut that wait short while
	// the replica lives, each of the IPAM's later writes then waking CAPM3 for nothing. A replica
	// that died costs no more for it: CAPM3 can use no claim before its answer.
	IPAMWait time.Duration
	// Admissions are this replica's: a TakeOver instance leaves what this replica admitted to
	// its own HandOver.
	Admissions *Admissions
	// ClaimGVK is the claim kind this instance watches.
	ClaimGVK schema.GroupVersionKind
	// TakeOver makes this the instance that runs on every replica and only hands over; the
	// other runs on the leader and only releases and finishes.
	TakeOver bool

	mu   sync.Mutex
	seen map[types.NamespacedName]sighting
}

type sighting struct {
	uid   types.UID
	token string
	at    time.Time
	// waited tells that the take-over found a claim of the Metal3Data unanswered after the
	// take-over delay, and answered when it then found them all answered.
	waited   bool
	answered time.Time
}

// waitingFor returns the Metal3Data a claim waits for, if it waits.
func waitingFor(o metav1.Object) (string, bool) {
	name, ok := o.GetAnnotations()[allocation.PreallocatedForAnnotation]
	return name, ok && len(o.GetOwnerReferences()) == 0
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
// Metal3DataClaim that one answers; both instances of Release use it.
func IndexWaitingFor(ctx context.Context, mgr ctrl.Manager, gvk schema.GroupVersionKind) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, allocation.Metadata(gvk), waitingForIndex, waitingForValue); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, allocation.Metadata(gvk), heldForIndex, heldForValue)
}

// waitingOrOrphaned passes the claims Release looks after.
var waitingOrOrphaned = predicate.NewPredicateFuncs(func(o client.Object) bool {
	_, ok := waitingFor(o)
	return ok || orphanOwner(o) != nil
})

// answeredWhileWaiting passes the event in which the IPAM's answer to a waiting claim is seen.
var answeredWhileWaiting = predicate.And(waitingOrOrphaned, answeredNow)

// SetupWithManager registers the controller: under leader election unless TakeOver.
func (r *Release) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	claim := allocation.Metadata(r.ClaimGVK)
	created := predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	name := "preallocation-release-"
	if r.TakeOver {
		name = "preallocation-takeover-"
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(name+r.ClaimGVK.Kind).
		For(claim, builder.WithPredicates(waitingOrOrphaned)).
		// A stored Metal3Data is what a waiting claim waits for: look at its claims at once.
		Watches(allocation.Metadata(allocation.Metal3DataGVK), handler.EnqueueRequestsFromMapFunc(r.claimsWaitingFor),
			builder.WithPredicates(created))
	if r.TakeOver && r.IPAMWait > r.HandOverDelay {
		// The metadata event of the IPAM's status write can come before this informer holds the
		// status: its own event is what ends the take-over's wait.
		b = b.Watches(wholeClaim(r.ClaimGVK.Kind), &handler.EnqueueRequestForObject{}, builder.WithPredicates(answeredWhileWaiting))
	}
	if !r.TakeOver {
		// A Metal3DataClaim that gets its data or goes ends the hold of the claims planned for it.
		b = b.Watches(allocation.Metadata(dataClaimGVK), handler.EnqueueRequestsFromMapFunc(r.claimsHeldFor))
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: concurrency, NeedLeaderElection: ptr.To(!r.TakeOver)}).
		Complete(r)
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

// age is how long this replica has seen the claim claimed by its current admission.
func (r *Release) age(key types.NamespacedName, claim *metav1.PartialObjectMetadata) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.seen == nil {
		r.seen = map[types.NamespacedName]sighting{}
	}
	token := claim.Annotations[allocation.AdmissionAnnotation]
	s, ok := r.seen[key]
	if !ok || s.uid != claim.UID || s.token != token {
		s = sighting{uid: claim.UID, token: token, at: now}
		r.seen[key] = s
	}
	return now.Sub(s.at)
}

func (r *Release) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.seen, key)
}

// Reconcile implements reconcile.Reconciler.
func (r *Release) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	claim := allocation.Metadata(r.ClaimGVK)
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	p := phaseOf(claim)
	if p == owned || p == orphaned {
		r.forget(req.NamespacedName)
	}
	switch {
	case p == waiting:
		return r.reconcileWaiting(ctx, req.NamespacedName, claim)
	case r.TakeOver || p == owned:
		// Only the leader removes finalizers.
		return ctrl.Result{}, nil
	case p == orphaned:
		return r.finishOrphan(ctx, claim, orphanOwner(claim))
	}
	return r.finishDeleted(ctx, claim)
}

// reconcileWaiting gathers the facts decideWaiting needs and carries out its decision.
func (r *Release) reconcileWaiting(ctx context.Context, key types.NamespacedName, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	dataName, _ := waitingFor(claim)
	logger := log.FromContext(ctx).WithValues("Metal3Data", klog.KRef(claim.Namespace, dataName))
	ctx = log.IntoContext(ctx, logger)
	f := waitingFacts{takeOver: r.TakeOver, age: r.age(key, claim), ipamHandled: ipamHandled(claim)}
	data := allocation.Metadata(allocation.Metal3DataGVK)
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: dataName}, data)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reading the Metal3Data %s/%s a claim waits for: %w", claim.Namespace, dataName, err)
	}
	f.stored = err == nil && data.DeletionTimestamp.IsZero()
	if f.stored && r.TakeOver {
		f.recorded = r.recordedOn(data, claim)
		f.admittedHere = r.Admissions != nil && r.Admissions.Pending(types.NamespacedName{Namespace: claim.Namespace, Name: dataName}, data.Annotations)
	}
	t := timings{grace: r.GracePeriod, hold: r.HoldLimit, handOverDelay: r.HandOverDelay}
	d := decideWaiting(f, t)
	if d.action == readDataClaim {
		waits, err := r.dataClaimWaits(ctx, claim)
		if err != nil {
			// Not an error to back off from: that could keep the claim past the hold limit.
			logger.Error(err, "Cannot read the Metal3DataClaim of a waiting claim", r.ClaimGVK.Kind, klog.KObj(claim))
			return ctrl.Result{RequeueAfter: min(t.grace+t.hold-f.age, t.grace)}, nil
		}
		f.dataClaimWaits = &waits
		d = decideWaiting(f, t)
	}
	switch d.action {
	case handOverUnrecorded:
		return ctrl.Result{}, r.handOverUnrecorded(ctx, claim, dataName)
	case handOverRecorded:
		return r.handOverRecorded(ctx, key, claim, data, f.age)
	case release:
		return ctrl.Result{}, r.release(ctx, key, dataName)
	}
	if d.why != "" {
		logger.V(1).Info(d.why, r.ClaimGVK.Kind, klog.KObj(claim))
	}
	return ctrl.Result{RequeueAfter: d.after}, nil
}

// finishDeleted removes CAPM3's finalizer from a waiting claim someone deleted. With the IPAM's
// finalizer on it, the IPAM frees the address once ours is gone (the Metal3 IPAM deletes an
// IPAddress only when its own is the claim's last finalizer). Without, ours keeps the claim, and
// its name, until no IPAddress the IPAM may still make for it can stray.
func (r *Release) finishDeleted(ctx context.Context, claim *metav1.PartialObjectMetadata) (ctrl.Result, error) {
	if wait, err := r.releaseStrays(ctx, claim); wait > 0 || err != nil {
		return ctrl.Result{RequeueAfter: wait}, err
	}
	log.FromContext(ctx).Info("Removing CAPM3's finalizer from a waiting claim that is being deleted", r.ClaimGVK.Kind, klog.KObj(claim))
	_, err := allocation.Finish(ctx, r.Client, claim)
	return ctrl.Result{}, err
}

// handOverRecorded hands over all the claims the stored Metal3Data records at once, as the
// admitting replica would: handed over one by one as each is answered, each would wake CAPM3 to
// find the others unusable. It waits for the IPAM's answers first (see holdForAnswers).
func (r *Release) handOverRecorded(ctx context.Context, key types.NamespacedName, claim, data *metav1.PartialObjectMetadata, age time.Duration) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	refs, _ := allocation.ParseClaims(data.Annotations[allocation.ClaimsAnnotation])
	if wait := r.holdForAnswers(ctx, key, claim.Namespace, refs, age); wait > 0 {
		logger.V(1).Info("Leaving a claim whose Metal3Data's claims the IPAM has not all answered to its admitting replica",
			r.ClaimGVK.Kind, klog.KObj(claim))
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	handed, err := handOverAll(ctx, r.Client, r.Recorder, data, refs, claim.Annotations[allocation.AdmissionAnnotation], "takeover")
	if len(handed) > 0 {
		logger.Info("Handed over claims their admitting replica did not", "claims", allocation.FormatClaims(handed))
	}
	return ctrl.Result{}, err
}

// strayWait is how long after its deletion a waiting IPClaim is kept: long enough for a pass of
// the pool that listed the claim before the deletion to end.
const strayWait = 10 * time.Second

// releaseStrays releases the IPAddresses of a deleted waiting IPClaim that the Metal3 IPAM will
// not free (see allocation.ClaimAddresses), and returns how much longer the claim is kept for
// such addresses to appear. The IPAM frees one IPAddress per claim, by claim name, and only from
// a claim it finalized: every address of a claim it never finalized strays, and so does one of
// two its pool controllers both allocated for the claim, which only it can free. Released here,
// all of them, the IPAM finds none left to free.
func (r *Release) releaseStrays(ctx context.Context, claim *metav1.PartialObjectMetadata) (time.Duration, error) {
	if r.ClaimGVK.Kind != allocation.KindIPClaim {
		return 0, nil
	}
	addresses, err := allocation.ClaimAddresses(ctx, r.APIReader, claim)
	if err != nil {
		return 0, err
	}
	if len(addresses) > 1 || len(addresses) == 1 && !ipamHandled(claim) {
		for i := range addresses {
			log.FromContext(ctx).Info("Releasing an IPAddress of a deleted waiting claim that the IPAM would not free",
				r.ClaimGVK.Kind, klog.KObj(claim), "IPAddress", klog.KObj(&addresses[i]), "addresses", len(addresses))
			if err := allocation.ReleaseAddress(ctx, r.Client, &addresses[i]); err != nil {
				return 0, err
			}
		}
		// Until the released addresses are gone.
		return time.Second, nil
	}
	return min(strayWait, strayWait-time.Since(claim.DeletionTimestamp.Time)), nil
}

// answerGrace is how long a take-over that waited for the IPAM's answers leaves them to the
// admitting replica, which is woken by the same answer and, alive, hands over at once: long
// enough for its patches to reach this replica's cache, short next to the take-over delay.
const answerGrace = time.Second

// holdForAnswers returns how much longer the take-over of key waits for the IPAM (see IPAMWait):
// while a claim the Metal3Data records still waits unanswered, at most until IPAMWait, and once
// they are all answered after such a wait, answerGrace more. A recorded claim that is not in the
// cache after the take-over delay was never created (CAPM3 creates it), and is not waited for.
func (r *Release) holdForAnswers(ctx context.Context, key types.NamespacedName, namespace string, refs []allocation.ClaimRef, age time.Duration) time.Duration {
	left := r.IPAMWait - age
	if left <= 0 {
		return 0
	}
	waiting, _ := unansweredClaims(ctx, r.Client, namespace, refs)
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.seen[key]
	switch {
	case !ok:
		return 0
	case waiting > 0:
		// The IPAM's answers are events here; this is the bound.
		s.waited = true
		r.seen[key] = s
		return left
	case !s.waited:
		// Answered before the take-over delay ended: the admitting replica had that long.
		return 0
	}
	now := time.Now()
	if s.answered.IsZero() {
		s.answered = now
		r.seen[key] = s
	}
	return min(left, answerGrace-now.Sub(s.answered))
}

// ipamHandled tells whether the IPAM has handled the claim: it adds its finalizer (the Metal3
// IPAM, and Cluster API IPAM providers their ReleaseAddress one) in the first of the two writes
// that answer it, the status with the address or the error following in a second request. Until
// then the IPAM may still be working from a list of claims it read before the claim was deleted,
// and allocates for it: an IPAddress whose claim is gone, which nobody releases and which keeps
// its namespace.
func ipamHandled(claim metav1.Object) bool {
	return slices.ContainsFunc(claim.GetFinalizers(), func(f string) bool { return f != infrav1.DataFinalizer })
}

// dataClaimWaits tells, from a live read, whether the Metal3DataClaim a waiting claim was planned
// for still exists without data. CAPM3's template controller then retries the Metal3Data's create
// under the same name (the lowest free index), and the retried admission reclaims the claim.
// Released instead, the claim would be created again under its name moments after the old one
// went, and the Metal3 IPAM, which keys allocations by claim name in its cache, can answer that
// with the address it just freed and hands out again: the same address twice.
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

// orphanOwner is the Metal3Data owner of a claim that is being deleted with CAPM3's finalizer: if
// that Metal3Data is gone, nobody else will remove the finalizer.
func orphanOwner(o metav1.Object) *metav1.OwnerReference {
	if o.GetDeletionTimestamp() == nil || !slices.Contains(o.GetFinalizers(), infrav1.DataFinalizer) {
		return nil
	}
	return allocation.Metal3DataOwner(o)
}

// finishOrphan removes CAPM3's finalizer from a claim being deleted once a live read shows that
// its Metal3Data is gone; while it exists, releasing the claim is CAPM3's, and this looks again
// later, since the Metal3Data's disappearance is no event of the claim.
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

func (r *Release) ref(claim *metav1.PartialObjectMetadata) allocation.ClaimRef {
	return allocation.ClaimRef{Kind: r.ClaimGVK.Kind, Name: claim.Name}
}

// recordedOn tells whether data's record names the claim, from the admission that claimed it.
func (r *Release) recordedOn(data, claim *metav1.PartialObjectMetadata) bool {
	token := claim.Annotations[allocation.AdmissionAnnotation]
	if token == "" || data.Annotations[allocation.AdmissionAnnotation] != token {
		return false
	}
	recorded, _ := allocation.ParseClaims(data.Annotations[allocation.ClaimsAnnotation])
	return slices.Contains(recorded, r.ref(claim))
}

// handOverUnrecorded hands a claim over to the Metal3Data read live, so that the owner reference
// carries the UID of the object that exists now.
func (r *Release) handOverUnrecorded(ctx context.Context, claim *metav1.PartialObjectMetadata, dataName string) error {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: dataName}, data)
	if apierrors.IsNotFound(err) || err == nil && !data.DeletionTimestamp.IsZero() {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Metal3Data %s/%s to hand a claim over: %w", claim.Namespace, dataName, err)
	}
	log.FromContext(ctx).Info("Handing over a claim its Metal3Data does not record", r.ClaimGVK.Kind, klog.KObj(claim))
	_, err = handOverAll(ctx, r.Client, r.Recorder, data, []allocation.ClaimRef{r.ref(claim)},
		claim.Annotations[allocation.AdmissionAnnotation], "takeover")
	return err
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
