package handover

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// phase is where a claim is in the life the webhook gives it. An admission creates it waiting for
// the Metal3Data it planned it for; the hand-over makes it owned (CAPM3's from then on) or the
// release deletes it. Someone else may delete it while it waits (deleting), and a claim CAPM3
// owns can lose its Metal3Data before CAPM3 ever finalized that one (orphaned).
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

// action is what the release or take-over does next with a waiting claim.
type action int

const (
	// keep looks again after the decision's delay, or on the next event when there is none.
	keep action = iota
	// handOverUnrecorded hands the claim over to its stored Metal3Data, whose record does not
	// name it (the admission response was lost, or a later admission of the name reclaimed it).
	handOverUnrecorded
	// handOverRecorded hands over every claim the stored Metal3Data records, as its admitting
	// replica would have.
	handOverRecorded
	// readDataClaim: the decision depends on whether the claim's Metal3DataClaim waits for data.
	readDataClaim
	// release deletes the claim: its Metal3Data was never stored.
	release
)

func (a action) String() string {
	return [...]string{"keep", "hand over unrecorded", "hand over recorded", "read Metal3DataClaim", "release"}[a]
}

// waitingFacts are what the decision about a waiting claim depends on.
type waitingFacts struct {
	// takeOver: decided by the instance on every replica, which only hands over.
	takeOver bool
	// stored: the Metal3Data the claim waits for exists and is not being deleted.
	stored bool
	// recorded: the stored Metal3Data's record names the claim, from the admission that claimed it.
	recorded bool
	// admittedHere: this replica admitted the stored Metal3Data and still remembers it.
	admittedHere bool
	// age is how long this replica has seen the claim under its current admission.
	age time.Duration
	// ipamHandled: the IPAM has put its finalizer on the claim.
	ipamHandled bool
	// dataClaimWaits: the Metal3DataClaim the claim was planned for waits for data; nil until read.
	dataClaimWaits *bool
}

// timings are the release's and the take-over's delays.
type timings struct {
	grace, hold, handOverDelay time.Duration
}

type decision struct {
	action action
	// after is when to look again if nothing happens first (keep only).
	after time.Duration
	// why is logged when a claim is kept past its grace period.
	why string
}

// decideWaiting is the lifecycle of a waiting claim: each case names the race or the promise it
// is for.
func decideWaiting(f waitingFacts, t timings) decision {
	switch {
	case f.stored && !f.takeOver:
		// Handed over by the take-over; look again in case the Metal3Data goes first.
		return decision{action: keep, after: t.grace}
	case f.stored && !f.recorded:
		// A lost response must not wait: CAPM3 reconciles the stored Metal3Data now.
		return decision{action: handOverUnrecorded}
	case f.stored && f.admittedHere:
		// Its own HandOver hands the claims over together once the IPAM has answered them all;
		// once the admission is forgotten (after the grace period), this instance does.
		return decision{action: keep, after: max(t.handOverDelay, time.Second)}
	case f.stored && f.age < t.handOverDelay:
		// Another replica admitted it, and may still be alive to hand it over.
		return decision{action: keep, after: t.handOverDelay - f.age}
	case f.stored:
		return decision{action: handOverRecorded}
	case f.takeOver:
		return decision{action: keep}
	case f.age < t.grace:
		// The Metal3Data may still be stored: a slow API server, a retried create.
		return decision{action: keep, after: t.grace - f.age}
	case f.age >= t.grace+t.hold:
		// A Metal3Data rejected for good, or an IPAM that is down, must not keep it for ever.
		return decision{action: release}
	case !f.ipamHandled:
		// Deleted before the IPAM saved its finalizer, the claim can get an IPAddress nobody
		// frees; the IPAM's answer is an event of the claim, the hold limit the bound.
		return decision{action: keep, after: t.grace + t.hold - f.age, why: "Keeping a claim the IPAM has not answered yet"}
	case f.dataClaimWaits == nil:
		return decision{action: readDataClaim}
	case *f.dataClaimWaits:
		// CAPM3 retries the Metal3Data's create under the same name, and the retry reclaims the
		// claim; released, it would be created again under its name moments after the IPAM freed
		// it, which the IPAM, keyed by claim name, can answer with an address it hands out twice.
		return decision{action: keep, after: t.grace + t.hold - f.age, why: "Keeping a claim whose Metal3DataClaim still waits for data"}
	}
	return decision{action: release}
}
