// Package addresses releases, on the leader, the Metal3 IPAddresses the IPAM will never free:
// the strays of a waiting IPClaim someone deleted, and the surplus second IPAddress its two
// IPPool controllers can allocate for one IPClaim the webhook created.
package addresses

import (
	"context"
	"fmt"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/index"
	"github.com/metal3-community/ip-preallocator/pkg/lifecycle"
)

// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipaddresses,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Addresses looks after the IPAddresses of each IPClaim, as lifecycle.DecideAddresses decides,
// from the cache's index of IPAddresses by IPClaim UID.
type Addresses struct {
	Client client.Client
	// APIReader reads the claim's status and managedFields, and its Metal3Data, live.
	APIReader client.Reader
	Recorder  events.EventRecorder
}

// SetupWithManager registers the controller under leader election.
func (a *Addresses) SetupWithManager(mgr ctrl.Manager) error {
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("surplus-addresses").
		For(allocation.Metadata(allocation.Metal3AddressGVK), builder.WithPredicates(predicate.NewPredicateFuncs(a.mayNeedRelease))).
		// A waiting claim's deletion is no event of its IPAddresses.
		Watches(allocation.Metadata(allocation.IPClaimGVK), handler.EnqueueRequestsFromMapFunc(a.addressesOf),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return allocation.PhaseOf(o) == allocation.Deleting }))).
		WithOptions(controller.Options{MaxConcurrentReconciles: clock.Concurrency}).
		Complete(a); err != nil {
		return fmt.Errorf("setting up controller surplus-addresses: %w", err)
	}
	return nil
}

// mayNeedRelease passes the events of an IPAddress Reconcile could release: its claim is not in
// the cache, is being deleted, or has two IPAddresses or more. Every other one, each IPAddress of a
// standing fleet at start-up among them, would cost a reconcile that decides nothing, and the
// queue the memory of them all at once.
func (a *Addresses) mayNeedRelease(address client.Object) bool {
	owner := allocation.Owner(address, allocation.KindIPClaim)
	if owner == nil || !address.GetDeletionTimestamp().IsZero() {
		return false
	}
	ctx := context.Background()
	claim := allocation.Metadata(allocation.IPClaimGVK)
	if err := a.Client.Get(ctx, types.NamespacedName{Namespace: address.GetNamespace(), Name: owner.Name}, claim); err != nil ||
		claim.UID != owner.UID || allocation.PhaseOf(claim) == allocation.Deleting {
		return true
	}
	addresses, err := index.Addresses(ctx, a.Client, address.GetNamespace(), owner.UID)
	return err != nil || len(addresses) >= 2
}

func (a *Addresses) addressesOf(ctx context.Context, claim client.Object) []reconcile.Request {
	addresses, err := index.Addresses(ctx, a.Client, claim.GetNamespace(), claim.GetUID())
	if err != nil {
		log.FromContext(ctx).Error(err, "Cannot list the IPAddresses of a claim", "IPClaim", klog.KObj(claim))
	}
	reqs := make([]reconcile.Request, len(addresses))
	for i := range addresses {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&addresses[i])}
	}
	return reqs
}

// Reconcile gathers the facts of the IPAddresses of one IPAddress's claim, decides and acts.
func (a *Addresses) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	address := allocation.Metadata(allocation.Metal3AddressGVK)
	if err := a.Client.Get(ctx, req.NamespacedName, address); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	owner := allocation.Owner(address, allocation.KindIPClaim)
	if owner == nil || !address.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	f, addresses, claim, err := a.facts(ctx, address, owner)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := lifecycle.DecideAddresses(f)
	logger := log.FromContext(ctx).WithValues("IPClaim", klog.KRef(req.Namespace, owner.Name))
	if d.Why != "" {
		logger.Info(d.Why)
	}
	for i := range addresses {
		address := &addresses[i]
		var kind, note string
		switch {
		case d.Step == lifecycle.ReleaseStrays:
			kind, note = "stray", "Released an IPAddress of a deleted waiting IPClaim, which the IPAM would not free (it frees one per claim, only from a claim it finalized, and only while the pool exists)"
		case d.Step == lifecycle.ReleaseSurplus && address.Name != claim.Status.Address.Name:
			kind, note = "surplus", "Released a second IPAddress the IPAM allocated for IPClaim "+claim.Name+", whose status names "+claim.Status.Address.Name
		default:
			continue
		}
		deleted, err := allocation.ReleaseAddress(ctx, a.Client, address)
		if err != nil {
			return ctrl.Result{}, err
		}
		if deleted {
			logger.Info(note, "IPAddress", klog.KObj(address))
			addressesReleasedTotal.WithLabelValues(kind).Inc()
			a.Recorder.Eventf(address, nil, corev1.EventTypeNormal, "IPAddressReleased", "Release", "%s", note)
		}
	}
	return ctrl.Result{RequeueAfter: d.After}, nil
}

var addressesReleasedTotal = promauto.With(metrics.Registry).NewCounterVec(prometheus.CounterOpts{
	Name: "ip_preallocator_addresses_released_total",
	Help: "Metal3 IPAddresses the webhook deleted because the IPAM would never free them, by kind (stray: of a deleted waiting IPClaim; surplus: a second one for one IPClaim).",
}, []string{"kind"})

// facts reads the claim's IPAddresses and the claim from the cache, and, for a claim with two
// IPAddresses or more that is not being deleted, the claim and its Metal3Data live.
func (a *Addresses) facts(ctx context.Context, address *metav1.PartialObjectMetadata, owner *metav1.OwnerReference) (
	f lifecycle.AddressFacts, addresses []metav1.PartialObjectMetadata, claim *ipamv1.IPClaim, err error) {
	if addresses, err = index.Addresses(ctx, a.Client, address.Namespace, owner.UID); err != nil {
		return f, nil, nil, err
	}
	f.Addresses = len(addresses)
	var youngest time.Time
	for _, addr := range addresses {
		if addr.CreationTimestamp.After(youngest) {
			youngest = addr.CreationTimestamp.Time
		}
	}
	f.Youngest = time.Since(youngest)
	key := types.NamespacedName{Namespace: address.Namespace, Name: owner.Name}
	cached := allocation.Metadata(allocation.IPClaimGVK)
	err = a.Client.Get(ctx, key, cached)
	if apierrors.IsNotFound(err) {
		// The IPAM answers a claim the cache may not hold yet.
		err = a.APIReader.Get(ctx, key, cached)
	}
	if err != nil || cached.UID != owner.UID {
		return f, addresses, nil, client.IgnoreNotFound(err)
	}
	f.ClaimFound, f.Deleting, f.IPAMFinalized = true, allocation.PhaseOf(cached) == allocation.Deleting, allocation.IPAMFinalized(cached)
	if f.Deleting && !lifecycle.Strays(f.Addresses, f.IPAMFinalized, false) {
		pool := ptr.Deref(allocation.Owner(address, "IPPool"), metav1.OwnerReference{})
		f.PoolGone, err = allocation.PoolGone(ctx, a.APIReader, address.Namespace, pool.Name)
		return f, addresses, nil, err
	}
	if f.Deleting || f.Addresses < 2 {
		return f, addresses, nil, nil
	}
	claim = &ipamv1.IPClaim{}
	if err := a.APIReader.Get(ctx, key, claim); err != nil || claim.UID != owner.UID {
		f.ClaimFound = false
		return f, addresses, nil, client.IgnoreNotFound(err)
	}
	f.CreatedHere, f.Answered = allocation.CreatedHere(claim), claim.Status.Address != nil
	f.Rendered, err = rendered(ctx, a.APIReader, claim)
	return f, addresses, claim, err
}

// rendered tells, from a live read, whether the Metal3Data that owns the claim is Ready.
func rendered(ctx context.Context, r client.Reader, claim *ipamv1.IPClaim) (bool, error) {
	owner := allocation.Metal3DataOwner(claim)
	if owner == nil {
		return false, nil
	}
	data := &infrav1.Metal3Data{}
	found, err := allocation.Read(ctx, r, types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}, data)
	return found && data.UID == owner.UID && ptr.Deref(data.Status.Ready, false), err
}
