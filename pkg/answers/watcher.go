// Package answers watches the IPAM's answers to the claims: the one place that tells whether the
// IPAM is behind, which claims of an admission it has not answered, and when it answers one.
package answers

import (
	"context"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/memory"
)

// Watcher follows the IPAM's answers through the informers of whole claims. A nil Watcher knows
// nothing: the IPAM is never behind, and no admission waits for it.
type Watcher struct {
	// Cache holds whole IPClaims and IPAddressClaims.
	Cache client.Reader

	// inFlight are the claims this replica created that the IPAM has not answered, with when
	// their create returned (zero while it is in flight).
	inFlight memory.Expiring[claimKey, time.Time]
}

// NewWatcher returns a Watcher that reads whole claims from cache.
func NewWatcher(cache client.Reader) *Watcher {
	w := &Watcher{Cache: cache}
	w.inFlight.TTL = clock.ClaimCreation + clock.IPAMGivenUp
	return w
}

type claimKey struct {
	kind string
	types.NamespacedName
}

func keyOf(claim client.Object) (claimKey, bool) {
	switch claim.(type) {
	case *ipamv1.IPClaim:
		return claimKey{allocation.KindIPClaim, client.ObjectKeyFromObject(claim)}, true
	case *capipamv1.IPAddressClaim:
		return claimKey{allocation.KindIPAddressClaim, client.ObjectKeyFromObject(claim)}, true
	}
	return claimKey{}, false
}

// Claim is an empty whole claim of the kind; nil for an unknown kind.
func Claim(kind string) client.Object {
	switch kind {
	case allocation.KindIPClaim:
		return &ipamv1.IPClaim{}
	case allocation.KindIPAddressClaim:
		return &capipamv1.IPAddressClaim{}
	}
	return nil
}

// Track notes the claims about to be created as unanswered before their creates, so that an
// answer that comes before the creates return is not missed.
func (w *Watcher) Track(claims []allocation.Claim) {
	if w == nil {
		return
	}
	for _, c := range claims {
		if k, ok := keyOf(c.Object); ok {
			w.inFlight.Set(k, time.Time{})
		}
	}
}

// Created starts the clock of the tracked claims that were created and are still unanswered, and
// forgets the others: counted from the create's return, a client rate limiter or a slow API server
// is not taken for a lagging IPAM.
func (w *Watcher) Created(claims []allocation.Claim, results []allocation.Result) {
	if w == nil {
		return
	}
	created := map[claimKey]bool{}
	for _, r := range results {
		if k, ok := keyOf(r.Claim.Object); ok && r.Outcome == allocation.Created {
			created[k] = true
		}
	}
	now := time.Now()
	for _, c := range claims {
		if k, ok := keyOf(c.Object); ok {
			w.inFlight.Update(k, func(_ time.Time, tracked bool) (time.Time, bool) { return now, tracked && created[k] })
		}
	}
}

// Idle tells whether the IPAM has answered every claim this replica created, or given up on it
// (clock.ClaimCreation and clock.IPAMGivenUp after its create): a down IPAM costs one idle
// admission its wait, not every one.
func (w *Watcher) Idle() bool {
	if w == nil {
		return false
	}
	idle := true
	w.inFlight.Range(func(claimKey, time.Time) { idle = false })
	return idle
}

// Behind tells whether a claim this replica created has waited between clock.IPAMBehind and
// clock.IPAMGivenUp for its answer since its create returned.
func (w *Watcher) Behind(now time.Time) bool {
	if w == nil {
		return false
	}
	lagging := false
	w.inFlight.Range(func(_ claimKey, at time.Time) {
		waited := now.Sub(at)
		lagging = lagging || !at.IsZero() && waited > clock.IPAMBehind && waited <= clock.IPAMGivenUp
	})
	return lagging
}

// Unanswered counts, in the cache of whole claims, the claims that wait unanswered by the IPAM,
// and those it does not hold yet; what the IPAM writes to any other cannot change a hand-over.
func (w *Watcher) Unanswered(ctx context.Context, namespace string, refs []allocation.ClaimRef) (waiting, absent int) {
	if w == nil {
		return 0, 0
	}
	for _, ref := range refs {
		claim := Claim(ref.Kind)
		if claim == nil {
			continue
		}
		switch err := w.Cache.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, claim); {
		case apierrors.IsNotFound(err):
			absent++
		case err == nil && allocation.PhaseOf(claim) == allocation.Waiting && !allocation.Answered(claim):
			waiting++
		}
	}
	return waiting, absent
}

// ClaimEvents is the event handler, for the informers of whole claims, that forgets the claims
// the IPAM answered or that went.
func (w *Watcher) ClaimEvents() toolscache.ResourceEventHandler {
	forget := func(obj any) {
		if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		if claim, ok := obj.(client.Object); ok {
			if k, ok := keyOf(claim); ok {
				w.inFlight.Delete(k)
			}
		}
	}
	answered := func(obj any) {
		if claim, ok := obj.(client.Object); ok && allocation.Answered(claim) {
			forget(claim)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    answered,
		UpdateFunc: func(_, obj any) { answered(obj) },
		DeleteFunc: forget,
	}
}
