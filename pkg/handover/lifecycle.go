package handover

import (
	"slices"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// phase is where a claim is in the life the webhook gives it (docs/design.md draws it):
//
//	waiting ──hand-over──▶ owned
//	waiting ──release, namespace or person deletes it──▶ deleting ──finish──▶ gone
//	owned ──deleted, its Metal3Data gone──▶ orphaned ──finish──▶ gone
type phase int

const (
	// owned: handed over, or never the webhook's; CAPM3's business.
	owned phase = iota
	// waiting: preallocated for a Metal3Data, owned by nothing yet.
	waiting
	// deleting: waiting, and being deleted.
	deleting
	// orphaned: being deleted with CAPM3's finalizer, owned by a Metal3Data.
	orphaned
)

func (p phase) String() string {
	return [...]string{"owned", "waiting", "deleting", "orphaned"}[p]
}

func phaseOf(claim metav1.Object) phase {
	if _, ok := waitingFor(claim); ok {
		if claim.GetDeletionTimestamp() != nil {
			return deleting
		}
		return waiting
	}
	if orphanOwner(claim) != nil {
		return orphaned
	}
	return owned
}

// waitingFor returns the Metal3Data a claim waits for, if it waits.
func waitingFor(o metav1.Object) (string, bool) {
	name, ok := o.GetAnnotations()[allocation.PreallocatedForAnnotation]
	return name, ok && len(o.GetOwnerReferences()) == 0
}

// orphanOwner is the Metal3Data owner of a claim that is being deleted with CAPM3's finalizer: if
// that Metal3Data is gone, nobody else will remove the finalizer.
func orphanOwner(o metav1.Object) *metav1.OwnerReference {
	if o.GetDeletionTimestamp() == nil || !slices.Contains(o.GetFinalizers(), infrav1.DataFinalizer) {
		return nil
	}
	return allocation.Metal3DataOwner(o)
}

// ipamFinalized tells whether the IPAM has put its finalizer on the claim, the first of the two
// writes that answer it.
func ipamFinalized(claim metav1.Object) bool {
	return slices.ContainsFunc(claim.GetFinalizers(), func(f string) bool { return f != infrav1.DataFinalizer })
}

// action is what the hand-over or the release does next.
type action int

const (
	// keep looks again after the decision's delay, or on the next event when there is none.
	keep action = iota
	// handOverUnrecorded hands over the claims that wait for the stored Metal3Data although its
	// record does not name them (the admission response was lost, or a later admission of the
	// name reclaimed them).
	handOverUnrecorded
	// handOverAdmitted hands over the claims this replica's admission created.
	handOverAdmitted
	// handOverRecorded hands over every claim the stored Metal3Data records, as its admitting
	// replica would have.
	handOverRecorded
	// readHolds: the decision depends on the holds, which take reads to know.
	readHolds
	// release deletes the claim: its Metal3Data was never stored.
	release
)

func (a action) String() string {
	return [...]string{"keep", "hand over unrecorded", "hand over admitted", "hand over recorded", "read holds", "release"}[a]
}

type decision struct {
	action action
	// after is when to look again if nothing happens first (keep only).
	after time.Duration
	// why is logged when a claim is kept past its grace period.
	why string
}

// handOverFacts are what the hand-over of a stored Metal3Data depends on.
type handOverFacts struct {
	// unrecorded: a claim waits for the Metal3Data that its record does not name.
	unrecorded bool
	// admitted: this replica's admission of the Metal3Data is remembered; created: its claims
	// have been created.
	admitted, created bool
	// recordedWaiting: a claim the record names still waits.
	recordedWaiting bool
	// age is how long this replica has seen the Metal3Data stored under its current admission.
	age time.Duration
}

// decideHandOver is the hand-over's lifecycle of a stored Metal3Data, on every replica.
func decideHandOver(f handOverFacts, takeOverDelay time.Duration) decision {
	switch {
	case f.unrecorded:
		// A lost response must not wait: CAPM3 reconciles the stored Metal3Data now.
		return decision{action: handOverUnrecorded}
	case f.admitted && f.created:
		return decision{action: handOverAdmitted}
	case f.admitted:
		// The end of the claims' creation comes back here.
		return decision{action: keep}
	case !f.recordedWaiting:
		return decision{action: keep}
	case f.age < takeOverDelay:
		// Another replica admitted it, and may still be alive to hand it over.
		return decision{action: keep, after: takeOverDelay - f.age}
	}
	return decision{action: handOverRecorded}
}

// releaseFacts are what the release of a waiting claim depends on.
type releaseFacts struct {
	// stored: the Metal3Data the claim waits for exists and is not being deleted.
	stored bool
	// age is how long this replica has seen the claim under its current admission.
	age time.Duration
	// ipamFinalized: the IPAM has put its finalizer on the claim.
	ipamFinalized bool
	// holds may keep an answered claim past its grace period; nil until read.
	holds *holds
}

// holds are what keeps an answered claim that waits for a Metal3Data never stored.
type holds struct {
	// poolBusy: another claim of the claim's pool waits for the IPAM's answer.
	poolBusy bool
	// dataClaimWaits: the Metal3DataClaim the claim was planned for waits for data; a live read,
	// made only when the pool is not busy.
	dataClaimWaits bool
}

// poolRecheck is how often a claim held for its busy pool is looked at again.
const poolRecheck = time.Second

// decideRelease is the leader's lifecycle of a waiting claim: each case names the race or the
// promise it is for.
func decideRelease(f releaseFacts, grace, hold time.Duration) decision {
	switch {
	case f.stored:
		// Handed over by the hand-over; look again in case the Metal3Data goes first.
		return decision{action: keep, after: grace}
	case f.age < grace:
		// The Metal3Data may still be stored: a slow API server, a retried create.
		return decision{action: keep, after: grace - f.age}
	case f.age >= grace+hold:
		// A Metal3Data rejected for good, or an IPAM that is down, must not keep it for ever.
		return decision{action: release}
	case !f.ipamFinalized:
		// Deleted before the IPAM saved its finalizer, the claim can get an IPAddress nobody frees.
		return decision{action: keep, after: grace + hold - f.age, why: "Keeping a claim the IPAM has not answered yet"}
	case f.holds == nil:
		return decision{action: readHolds}
	case f.holds.poolBusy:
		// An address freed while the IPAM allocates in the pool can be allocated twice to one claim
		// by its two pool controllers, from lists taken on either side of the free.
		return decision{action: keep, after: min(poolRecheck, grace+hold-f.age), why: "Keeping a claim while the IPAM allocates in its pool"}
	case f.holds.dataClaimWaits:
		// Released, it would be created again under its name moments after the IPAM freed it, and
		// the IPAM, keyed by claim name, can answer with an address it hands out twice.
		return decision{action: keep, after: grace + hold - f.age, why: "Keeping a claim whose Metal3DataClaim still waits for data"}
	}
	return decision{action: release}
}

// sightings remember when this replica first saw an object under its current admission: on this
// replica's clock, so that clock skew cannot shorten a delay.
type sightings struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]sighting
}

type sighting struct {
	uid   types.UID
	token string
	at    time.Time
	// waited: the take-over found a recorded claim unanswered by the IPAM; answered: when it then
	// found them all answered.
	waited   bool
	answered time.Time
}

// age is how long this replica has seen key as uid under the admission token.
func (s *sightings) age(key types.NamespacedName, uid types.UID, token string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.seen == nil {
		s.seen = map[types.NamespacedName]sighting{}
	}
	v, ok := s.seen[key]
	if !ok || v.uid != uid || v.token != token {
		v = sighting{uid: uid, token: token, at: now}
		s.seen[key] = v
	}
	return now.Sub(v.at)
}

// update changes the sighting of key, if there is one.
func (s *sightings) update(key types.NamespacedName, change func(*sighting)) (sighting, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.seen[key]
	if ok {
		change(&v)
		s.seen[key] = v
	}
	return v, ok
}

func (s *sightings) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}
