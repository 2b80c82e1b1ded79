package lifecycle

import (
	"time"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// AddressStep is what the leader does with the Metal3 IPAddresses made for one IPClaim.
type AddressStep int

const (
	// Leave leaves them to the IPAM, or looks again after the decision's delay.
	Leave AddressStep = iota
	// ReleaseStrays releases them all: the IPAM will free none of them.
	ReleaseStrays
	// ReleaseSurplus releases all but the one the claim's status names.
	ReleaseSurplus
)

// AddressFacts are what the cleanup of one IPClaim's IPAddresses depends on.
type AddressFacts struct {
	// Addresses counts those not being deleted; Youngest is the age of the youngest.
	Addresses int
	Youngest  time.Duration
	// ClaimFound: the IPClaim of that UID exists; Deleting: it is a waiting claim being deleted.
	ClaimFound, Deleting bool
	// IPAMFinalized: the IPAM has put its finalizer on the claim.
	IPAMFinalized bool
	// The rest is read live, for a claim not being deleted with two IPAddresses or more:
	// CreatedHere: the webhook created the claim; Answered: its status names an IPAddress;
	// Rendered: its Metal3Data is Ready.
	CreatedHere, Answered, Rendered bool
}

// DecideAddresses is the leader's decision on the IPAddresses made for one IPClaim.
func DecideAddresses(f AddressFacts) Decision[AddressStep] {
	switch {
	case !f.ClaimFound:
		return Decision[AddressStep]{}
	case f.Deleting && Strays(f.Addresses, f.IPAMFinalized):
		// The IPAM frees one IPAddress per claim, by name, and only from a claim it finalized.
		return Decision[AddressStep]{Step: ReleaseStrays}
	case f.Deleting, f.Addresses < 2:
		return Decision[AddressStep]{}
	case f.Youngest < clock.SurplusAge:
		// A pass that allocated for the claim may not have written its status yet.
		return wait[AddressStep](min(clock.SurplusAge, clock.SurplusAge-f.Youngest), "")
	case !f.CreatedHere:
		// Stock CAPM3's claims are as without the webhook.
		return Decision[AddressStep]{}
	case !f.Answered:
		// The IPAM's status write is no event of an IPAddress.
		return wait[AddressStep](clock.SurplusAge, "")
	case f.Rendered:
		// CAPM3 rendered whichever the status named when it looked: freeing one could hand out an
		// address a machine uses, as stock never does.
		return Decision[AddressStep]{Why: "Keeping both IPAddresses the IPAM allocated for a claim: its Metal3Data is rendered"}
	}
	// The IPAM's two IPPool controllers both allocated for the claim, from their own lists of
	// claims; the IPAM frees only one, by claim name.
	return Decision[AddressStep]{Step: ReleaseSurplus}
}
