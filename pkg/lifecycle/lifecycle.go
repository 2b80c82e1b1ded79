// Package lifecycle decides what happens to a claim the webhook preallocated: every decision of
// the hand-over, the release, the finishes and the IPAddresses' cleanup is a pure function of
// facts the controllers gather, and each of its cases names the race or promise it is for. The
// controllers act on the decision once; allocation.PhaseOf tells the phase it applies to.
package lifecycle

import "time"

// Decision is what a controller does next, and when it looks again if nothing happens first.
type Decision[S ~int] struct {
	Step S
	// After is when to look again (waiting steps only); zero: on the next event.
	After time.Duration
	// Why is logged when a claim is kept past its grace period.
	Why string
}

func wait[S ~int](after time.Duration, why string) Decision[S] {
	return Decision[S]{After: after, Why: why}
}

// Strays tells whether the IPAddresses of a waiting IPClaim someone deleted are the webhook's to
// release: the IPAM frees one IPAddress per claim, by name, and only from a claim it finalized.
func Strays(addresses int, ipamFinalized bool) bool {
	return addresses > 1 || addresses == 1 && !ipamFinalized
}
