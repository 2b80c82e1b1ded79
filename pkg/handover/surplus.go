package handover

import (
	"context"
	"fmt"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// claimUIDIndex indexes Metal3 IPAddresses by the UID of the IPClaim they were made for.
const claimUIDIndex = "ip-preallocator.metal3.io/claim-uid"

// surplusAge is how old every IPAddress of a claim must be before one the claim's status does not
// name counts as surplus: by then every pass that allocated for it has written its status.
const surplusAge = 10 * time.Second

// Surplus releases, on the leader, the second IPAddress the Metal3 IPAM allocated for one IPClaim
// the webhook created: its two IPPool controllers, each from its own list of claims, can both
// allocate for a claim, whose status names the last; the IPAM frees only one, by claim name. Once
// the claim's Metal3Data is rendered, both are kept.
type Surplus struct {
	// Client reads the metadata of IPAddresses from the cache, where they are indexed by claim.
	Client client.Client
	// APIReader reads the claim's status and managedFields, live.
	APIReader client.Reader
}

// SetupWithManager indexes the IPAddresses and registers the controller.
func (s *Surplus) SetupWithManager(ctx context.Context, mgr ctrl.Manager, concurrency int) error {
	address := allocation.Metadata(allocation.Metal3AddressGVK)
	if err := mgr.GetFieldIndexer().IndexField(ctx, address, claimUIDIndex, func(o client.Object) []string {
		if uid := allocation.AddressClaimUID(o); uid != "" {
			return []string{string(uid)}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing IPAddresses by the UID of their IPClaim: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("surplus-addresses").
		For(address).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(s); err != nil {
		return fmt.Errorf("setting up controller surplus-addresses: %w", err)
	}
	return nil
}

// Reconcile implements reconcile.Reconciler.
func (s *Surplus) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	address := allocation.Metadata(allocation.Metal3AddressGVK)
	if err := s.Client.Get(ctx, req.NamespacedName, address); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading IPAddress %s: %w", req.NamespacedName, err)
	}
	uid := allocation.AddressClaimUID(address)
	if uid == "" || !address.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	addresses, youngest, err := s.claimAddresses(ctx, req.Namespace, uid)
	if err != nil || len(addresses) < 2 {
		return ctrl.Result{}, err
	}
	if wait := surplusAge - time.Since(youngest); wait > 0 {
		return ctrl.Result{RequeueAfter: min(wait, surplusAge)}, nil
	}
	claimName := ownerName(address, uid)
	claim := &ipamv1.IPClaim{}
	err = s.APIReader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: claimName}, claim)
	if apierrors.IsNotFound(err) || err == nil && (claim.UID != uid || !allocation.CreatedHere(claim)) {
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading IPClaim %s/%s: %w", req.Namespace, claimName, err)
	}
	if claim.Status.Address == nil {
		// The IPAM has not written its answer yet; its write is an event of no IPAddress.
		return ctrl.Result{RequeueAfter: surplusAge}, nil
	}
	logger := log.FromContext(ctx).WithValues("IPClaim", klog.KObj(claim))
	if rendered, err := s.rendered(ctx, claim); err != nil || rendered {
		if rendered {
			// CAPM3 rendered the address the status named when it looked, which may be either:
			// freeing one could hand out an address a machine uses, as stock never does.
			logger.Info("Keeping both IPAddresses the IPAM allocated for a claim: its Metal3Data is rendered")
		}
		return ctrl.Result{}, err
	}
	for i := range addresses {
		if addresses[i].Name == claim.Status.Address.Name {
			continue
		}
		logger.Info("Releasing an IPAddress the IPAM allocated twice for a claim, which the claim's status does not name",
			"IPAddress", klog.KObj(&addresses[i]), "kept", claim.Status.Address.Name)
		if err := allocation.ReleaseAddress(ctx, s.Client, &addresses[i]); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// claimAddresses lists, from the cache, the IPAddresses made for the claim UID that are not
// being deleted, and when the youngest of them was created.
func (s *Surplus) claimAddresses(ctx context.Context, namespace string, uid types.UID) ([]metav1.PartialObjectMetadata, time.Time, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(allocation.Metal3AddressListGVK)
	if err := s.Client.List(ctx, list, client.InNamespace(namespace), client.MatchingFields{claimUIDIndex: string(uid)}); err != nil {
		return nil, time.Time{}, fmt.Errorf("listing the IPAddresses of namespace %s made for IPClaim UID %s: %w", namespace, uid, err)
	}
	var addresses []metav1.PartialObjectMetadata
	var youngest time.Time
	for _, a := range list.Items {
		if a.DeletionTimestamp.IsZero() {
			addresses = append(addresses, a)
			youngest = maxTime(youngest, a.CreationTimestamp.Time)
		}
	}
	return addresses, youngest, nil
}

// ownerName is the name of the owner the reference with this UID names.
func ownerName(o metav1.Object, uid types.UID) string {
	for _, ref := range o.GetOwnerReferences() {
		if ref.UID == uid {
			return ref.Name
		}
	}
	return ""
}

// rendered tells, from a live read, whether the Metal3Data that owns the claim is Ready.
func (s *Surplus) rendered(ctx context.Context, claim *ipamv1.IPClaim) (bool, error) {
	owner := allocation.Metal3DataOwner(claim)
	if owner == nil {
		return false, nil
	}
	data := &infrav1.Metal3Data{}
	err := s.APIReader.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}, data)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading Metal3Data %s/%s, owner of IPClaim %s: %w", claim.Namespace, owner.Name, claim.Name, err)
	}
	return data.UID == owner.UID && ptr.Deref(data.Status.Ready, false), nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
