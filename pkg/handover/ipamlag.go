package handover

import (
	"sync"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// ipamBehind is how long the IPAM may take to answer a claim before it counts as behind: well
// above its answer time when it keeps up (tens of milliseconds) and below the lag of a burst it
// is behind on (seconds).
const ipamBehind = 250 * time.Millisecond

// ipamGivenUp is how long an unanswered claim counts toward the IPAM being behind: a pool that
// fails or an IPAM that is down would otherwise make every admission wait for the answer.
const ipamGivenUp = 3 * time.Second

// IPAMLag tells whether the IPAM is behind: whether a claim this replica created has waited more
// than ipamBehind for its answer since its create returned. A nil IPAMLag is never behind.
type IPAMLag struct {
	mu sync.Mutex
	// inFlight are the claims this replica created that the IPAM has not answered yet, with
	// when their create returned (zero while it is in flight).
	inFlight map[claimKey]time.Time
	// silent is set when an idle admission gave up waiting for the IPAM's answers, and cleared by
	// the next answer: an IPAM that is down would otherwise cost every idle admission the wait.
	silent bool
}

// claimKey names a claim: its kind and its object key.
type claimKey struct {
	kind string
	types.NamespacedName
}

// claimKeyOf keys a claim as the planned claims and the informers of whole claims hold them.
func claimKeyOf(claim client.Object) (claimKey, bool) {
	switch claim.(type) {
	case *ipamv1.IPClaim:
		return claimKey{allocation.KindIPClaim, client.ObjectKeyFromObject(claim)}, true
	case *capipamv1.IPAddressClaim:
		return claimKey{allocation.KindIPAddressClaim, client.ObjectKeyFromObject(claim)}, true
	}
	return claimKey{}, false
}

// track notes the claims about to be created as unanswered before their creates, so that an
// answer that comes before the creates return is not missed.
func (l *IPAMLag) track(claims []allocation.Claim) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight == nil {
		l.inFlight = map[claimKey]time.Time{}
	}
	for _, c := range claims {
		if k, ok := claimKeyOf(c.Object); ok {
			l.inFlight[k] = time.Time{}
		}
	}
}

// created starts the clock of the tracked claims that were created and are still unanswered, and
// forgets the others: counted from the create's return, a client rate limiter or a slow API server
// is not taken for a lagging IPAM.
func (l *IPAMLag) created(claims []allocation.Claim, results []allocation.Result) {
	if l == nil {
		return
	}
	created := map[claimKey]bool{}
	for _, r := range results {
		if k, ok := claimKeyOf(r.Claim.Object); ok && r.Outcome == allocation.Created {
			created[k] = true
		}
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range claims {
		k, ok := claimKeyOf(c.Object)
		if !ok {
			continue
		}
		if _, waiting := l.inFlight[k]; waiting && created[k] {
			l.inFlight[k] = now
		} else {
			delete(l.inFlight, k)
		}
	}
}

// gaveUp records that an idle admission gave up waiting for the answers to claims: they do not
// count toward the IPAM being behind (the admission paid for its slowness already), and no idle
// admission waits until the IPAM answers a claim.
func (l *IPAMLag) gaveUp(claims []allocation.Claim) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.silent = true
	for _, c := range claims {
		if k, ok := claimKeyOf(c.Object); ok {
			delete(l.inFlight, k)
		}
	}
}

// answering tells whether an idle admission may wait for the IPAM's answers.
func (l *IPAMLag) answering() bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.silent
}

// behind tells whether the IPAM is behind at now.
func (l *IPAMLag) behind(now time.Time) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lagging := false
	for k, at := range l.inFlight {
		switch {
		case at.IsZero():
		case now.Sub(at) > ipamGivenUp:
			delete(l.inFlight, k)
		case now.Sub(at) > ipamBehind:
			lagging = true
		}
	}
	return lagging
}

// ClaimEvents is the event handler, for the informers of whole IPClaims and IPAddressClaims, that
// tells when the IPAM answers the claims this replica created, or they go.
func (l *IPAMLag) ClaimEvents() toolscache.ResourceEventHandler {
	forget := func(obj any) {
		if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		claim, ok := obj.(client.Object)
		if !ok {
			return
		}
		if k, ok := claimKeyOf(claim); ok {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.inFlight, k)
		}
	}
	seen := func(obj any) {
		if claim, ok := obj.(client.Object); ok && allocation.Answered(claim) {
			forget(claim)
		}
	}
	answered := func(old, obj any) {
		seen(obj)
		before, ok := old.(client.Object)
		if claim, isClaim := obj.(client.Object); ok && isClaim && !allocation.Answered(before) && allocation.Answered(claim) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.silent = false
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: answered,
		DeleteFunc: forget,
	}
}
