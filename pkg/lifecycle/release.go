package lifecycle

import (
	"time"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// ReleaseStep is what the leader does with a waiting claim.
type ReleaseStep int

const (
	// Hold looks again after the decision's delay, or on the next event.
	Hold ReleaseStep = iota
	// ReadHolds reads what may hold an answered claim, which costs reads, for the next look.
	ReadHolds
	// Release deletes the claim: its Metal3Data was never stored.
	Release
)

// ReleaseFacts are what the release of a waiting claim depends on.
type ReleaseFacts struct {
	// Stored: the Metal3Data the claim waits for exists and is not being deleted.
	Stored bool
	// Age is how long this replica has seen the claim under its current admission.
	Age time.Duration
	// IPAMFinalized: the IPAM has put its finalizer on the claim.
	IPAMFinalized bool
	// Holds may keep an answered claim past its grace period; nil until read.
	Holds *Holds
}

// Holds are what keeps an answered claim that waits for a Metal3Data never stored.
type Holds struct {
	// PoolBusy: another claim of the claim's pool waits for the IPAM's answer.
	PoolBusy bool
	// DataClaimWaits: the Metal3DataClaim the claim was planned for waits for data; read only when
	// the pool is not busy, since it costs a live read.
	DataClaimWaits bool
}

// DecideRelease is the leader's decision on a waiting claim.
func DecideRelease(f ReleaseFacts, grace, hold time.Duration) Decision[ReleaseStep] {
	left := grace + hold - f.Age
	switch {
	case f.Stored:
		// The hand-over's; look again in case the Metal3Data goes first.
		return wait[ReleaseStep](grace, "")
	case f.Age < grace:
		// The Metal3Data may still be stored: a slow API server, a retried create.
		return wait[ReleaseStep](grace-f.Age, "")
	case left <= 0:
		// A Metal3Data rejected for good, or an IPAM that is down, must not keep it for ever.
		return Decision[ReleaseStep]{Step: Release}
	case !f.IPAMFinalized:
		// Deleted before the IPAM saved its finalizer, the claim can get an IPAddress nobody frees.
		return wait[ReleaseStep](left, "Keeping a claim the IPAM has not answered yet")
	case f.Holds == nil:
		return Decision[ReleaseStep]{Step: ReadHolds}
	case f.Holds.PoolBusy:
		// An address freed while the IPAM allocates in the pool can be allocated twice to one claim
		// by its two pool controllers, from lists taken on either side of the free.
		return wait[ReleaseStep](min(clock.PoolRecheck, left), "Keeping a claim while the IPAM allocates in its pool")
	case f.Holds.DataClaimWaits:
		// Released, it would be created again under its name moments after the IPAM freed it, and
		// the IPAM, keyed by claim name, can answer with an address it hands out twice.
		return wait[ReleaseStep](left, "Keeping a claim whose Metal3DataClaim still waits for data")
	}
	return Decision[ReleaseStep]{Step: Release}
}

// FinishStep is what the leader does with a claim being deleted that only it can finish.
type FinishStep int

const (
	// Linger looks again after the decision's delay, or on the next event.
	Linger FinishStep = iota
	// Finish removes CAPM3's finalizer.
	Finish
	// FinishForIPAM removes CAPM3's finalizer and the IPAM's.
	FinishForIPAM
)

// FinishFacts are what the finish of a waiting claim someone deleted depends on.
type FinishFacts struct {
	// IPClaim: a Metal3 IPAM claim, whose IPAddresses can stray.
	IPClaim bool
	// SinceDeleted is how long ago the deletion began, on the API server's clock.
	SinceDeleted time.Duration
	// Strays: IPAddresses the addresses' controller releases are left.
	Strays bool
	// PoolBusy: another claim of its pool waits for the IPAM's answer.
	PoolBusy bool
	// IPAMFinalized: the IPAM's finalizer is on it; PoolGone: its IPPool no longer exists.
	IPAMFinalized, PoolGone bool
}

// DecideFinish is the leader's decision on a waiting claim being deleted (release, namespace or person).
func DecideFinish(f FinishFacts, hold time.Duration) Decision[FinishStep] {
	switch {
	case f.IPClaim && f.Strays:
		// Gone before its strays, the claim would leave them held by the IPAM's finalizer.
		return wait[FinishStep](clock.StrayRecheck, "Keeping a deleted claim until its stray IPAddresses are released")
	case f.IPClaim && f.PoolGone:
		// The IPAM frees a claim only from its pool's reconcile: no pass will come, and the claim
		// would hold its namespace's deletion for ever.
		return Decision[FinishStep]{Step: FinishForIPAM}
	case f.IPClaim && f.SinceDeleted < clock.StrayWait:
		// An IPAM pass that listed the claim before the deletion may still create its IPAddress.
		return wait[FinishStep](min(clock.StrayWait, clock.StrayWait-f.SinceDeleted), "")
	case f.PoolBusy && f.SinceDeleted < hold:
		// As a release: an address freed while the pool allocates can be allocated twice.
		return wait[FinishStep](min(clock.PoolRecheck, hold-f.SinceDeleted),
			"Keeping CAPM3's finalizer on a deleted waiting claim while the IPAM allocates in its pool")
	case f.IPClaim && f.IPAMFinalized:
		// The IPAM frees it from its pool's reconcile; should the pool go first, which is no event
		// of the claim, a look later finds it.
		return Decision[FinishStep]{Step: Finish, After: clock.OrphanRecheck}
	}
	return Decision[FinishStep]{Step: Finish}
}

// DecideOrphan is the leader's decision on a claim being deleted with CAPM3's finalizer and a
// Metal3Data owner: CAPM3 releases nothing for a Metal3Data deleted before its first reconcile.
func DecideOrphan(ownerExists bool) Decision[FinishStep] {
	if ownerExists {
		// Its owner's deletion is no event of the claim.
		return wait[FinishStep](clock.OrphanRecheck, "")
	}
	return Decision[FinishStep]{Step: Finish}
}

// StrandedFacts are what the finish of a stranded IPClaim depends on.
type StrandedFacts struct {
	// PoolGone: its IPPool no longer exists; CreatedHere: the webhook created it (a live read);
	// Addresses: the IPAddresses made for it that still exist.
	PoolGone, CreatedHere bool
	Addresses             int
}

// DecideStranded is the leader's decision on a deleted IPClaim that only the IPAM's finalizer holds.
func DecideStranded(f StrandedFacts) Decision[FinishStep] {
	switch {
	case !f.PoolGone:
		// The IPAM frees it from its pool's reconcile; should the pool go first (the IPAM lets a
		// pool go once no IPAddress names it, and a failed IPAddress create still saves the
		// claim's finalizer), which is no event of the claim, a look later finds it.
		return wait[FinishStep](clock.OrphanRecheck, "")
	case !f.CreatedHere:
		// Stock CAPM3's claims are as without the webhook.
		return Decision[FinishStep]{}
	case f.Addresses > 0:
		// Gone first, the claim would leave them held by the IPAM's finalizer, which nobody removes
		// without their pool: docs/troubleshooting.md tells the operator how.
		return wait[FinishStep](clock.OrphanRecheck, "Keeping a deleted claim whose IPPool is gone until its IPAddresses are gone")
	}
	// No IPAM pass will come: the claim would hold its namespace's deletion for ever.
	return Decision[FinishStep]{Step: FinishForIPAM}
}

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
	// ClaimFound: the IPClaim of that UID exists; Deleting: it is a waiting claim being deleted;
	// PoolGone: its IPPool no longer exists.
	ClaimFound, Deleting, PoolGone bool
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
	case f.Deleting && Strays(f.Addresses, f.IPAMFinalized, f.PoolGone):
		// The IPAM frees one IPAddress per claim, by name, only from a claim it finalized, and only
		// from its pool's reconcile.
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
