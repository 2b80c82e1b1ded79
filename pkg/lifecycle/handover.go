// Package lifecycle decides what happens to a claim the webhook preallocated: every decision of
// the hand-over, the release, the finishes and the IPAddresses' cleanup is a pure function of
// facts the controllers gather, and each of its cases names the race or promise it is for. The
// controllers act on the decision once; allocation.PhaseOf tells the phase it applies to.
package lifecycle

import (
	"time"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// HandOverStep is what the hand-over of a stored Metal3Data does.
type HandOverStep int

const (
	// Wait looks again after the decision's delay, or on the next event.
	Wait HandOverStep = iota
	// HandOverUnrecorded hands over the claims that wait for the Metal3Data although its record
	// does not name them (the admission's response was lost, or a later admission reclaimed them).
	HandOverUnrecorded
	// HandOverAdmitted hands over the claims this replica's admission created.
	HandOverAdmitted
	// HandOverRecorded hands over every claim the Metal3Data records, as its admitting replica would.
	HandOverRecorded
)

// Note is what the take-over remembers of the IPAM's answers between two looks.
type Note int

const (
	// NoNote is nothing noted.
	NoNote Note = iota
	// NoteWaited notes that a recorded claim was found unanswered.
	NoteWaited
	// NoteAnswered notes that, after that, every recorded claim was found answered.
	NoteAnswered
)

// HandOverFacts are what the hand-over of a stored Metal3Data depends on.
type HandOverFacts struct {
	// Unrecorded: a claim waits for the Metal3Data that its record does not name.
	Unrecorded bool
	// Admitted: this replica's admission of the Metal3Data is remembered; Created: its claims are.
	Admitted, Created bool
	// AnswerLeft is how much longer this replica's admission waits for the IPAM; zero: it does not.
	AnswerLeft time.Duration
	// AdmittedUnanswered: a claim this replica created waits unanswered, or is not cached yet.
	AdmittedUnanswered bool
	// RecordedWaiting: a claim the record names still waits.
	RecordedWaiting bool
	// Age is how long this replica has seen the Metal3Data stored under its current admission.
	Age time.Duration
	// RecordedUnanswered: a recorded claim waits unanswered by the IPAM.
	RecordedUnanswered bool
	// Noted is what the take-over noted; SinceAnswered counts from NoteAnswered.
	Noted         Note
	SinceAnswered time.Duration
}

// HandOverDecision is a hand-over's decision and what it notes.
type HandOverDecision struct {
	Decision[HandOverStep]
	Note Note
}

// DecideHandOver is the hand-over of a stored Metal3Data, on every replica. ipamWait bounds how
// long a take-over waits for the IPAM's answers, as the admitting replica would.
func DecideHandOver(f HandOverFacts, takeOverDelay, ipamWait time.Duration) HandOverDecision {
	ipamLeft := ipamWait - f.Age
	switch {
	case f.Unrecorded:
		// A lost response must not wait: CAPM3 reconciles the stored Metal3Data now.
		return handOver(HandOverUnrecorded)
	case f.Admitted && f.Created && f.AnswerLeft > 0 && f.AdmittedUnanswered:
		// The IPAM is behind: a claim handed over unanswered wakes CAPM3 for each of its writes.
		return HandOverDecision{Decision: wait[HandOverStep](f.AnswerLeft, "Waiting for the IPAM's answer before handing over")}
	case f.Admitted && f.Created:
		return handOver(HandOverAdmitted)
	case f.Admitted, !f.RecordedWaiting:
		// The end of the claims' creation, or a claim's event, comes back here.
		return HandOverDecision{}
	case f.Age < takeOverDelay:
		// Another replica admitted it, and may still be alive to hand it over.
		return HandOverDecision{Decision: wait[HandOverStep](takeOverDelay-f.Age, "")}
	case ipamLeft > 0 && f.RecordedUnanswered:
		// The admitting replica would wait for the answers too.
		return HandOverDecision{Decision: wait[HandOverStep](ipamLeft, "Leaving claims the IPAM has not all answered to their admitting replica"), Note: NoteWaited}
	case ipamLeft > 0 && f.Noted == NoteWaited:
		// The answers wake the admitting replica too: leave it the hand-over.
		return HandOverDecision{Decision: wait[HandOverStep](min(ipamLeft, clock.AnswerGrace), ""), Note: NoteAnswered}
	case ipamLeft > 0 && f.Noted == NoteAnswered && f.SinceAnswered < clock.AnswerGrace:
		return HandOverDecision{Decision: wait[HandOverStep](min(ipamLeft, clock.AnswerGrace-f.SinceAnswered), "")}
	}
	return handOver(HandOverRecorded)
}

func handOver(step HandOverStep) HandOverDecision {
	return HandOverDecision{Decision: Decision[HandOverStep]{Step: step}}
}

// Decision is what a controller does next, and when it looks again if nothing happens first.
type Decision[S ~int] struct {
	Step S
	// After is when to look again; zero: on the next event.
	After time.Duration
	// Why is logged when a claim is kept past its grace period.
	Why string
}

func wait[S ~int](after time.Duration, why string) Decision[S] {
	return Decision[S]{After: after, Why: why}
}

// Strays tells whether the IPAddresses of a waiting IPClaim someone deleted are the webhook's to
// release: the IPAM frees one IPAddress per claim, by name, only from a claim it finalized, and only
// from its pool's reconcile, which a gone pool no longer has.
func Strays(addresses int, ipamFinalized, poolGone bool) bool {
	return addresses > 1 || addresses == 1 && (!ipamFinalized || poolGone)
}
