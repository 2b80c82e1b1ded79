package lifecycle

import (
	"testing"
	"time"
)

const s = time.Second

// Every table lists each case of its decision, named by the race or promise it is for; changing
// any case fails it.

func TestDecideHandOver(t *testing.T) {
	const delay, ipamWait = 5 * s, 30 * s
	handOver := func(step HandOverStep) HandOverDecision {
		return HandOverDecision{Decision: Decision[HandOverStep]{Step: step}}
	}
	waitFor := func(after time.Duration, why string, note Note) HandOverDecision {
		return HandOverDecision{Decision: Decision[HandOverStep]{After: after, Why: why}, Note: note}
	}
	for _, tc := range []struct {
		name string
		f    HandOverFacts
		want HandOverDecision
	}{
		{"lost response: a claim it does not record, at once", HandOverFacts{Unrecorded: true, Admitted: true, Created: true, RecordedWaiting: true}, handOver(HandOverUnrecorded)},
		{"own admission, claims created", HandOverFacts{Admitted: true, Created: true, RecordedWaiting: true}, handOver(HandOverAdmitted)},
		{"own admission, IPAM behind: waits for the answers", HandOverFacts{Admitted: true, Created: true, AnswerLeft: 20 * s, AdmittedUnanswered: true},
			waitFor(20*s, "Waiting for the IPAM's answer before handing over", NoNote)},
		{"own admission, IPAM behind, all answered", HandOverFacts{Admitted: true, Created: true, AnswerLeft: 20 * s}, handOver(HandOverAdmitted)},
		{"own admission, claims being created: their end comes back", HandOverFacts{Admitted: true, RecordedWaiting: true, Age: time.Hour}, HandOverDecision{}},
		{"nothing waits", HandOverFacts{Age: time.Hour}, HandOverDecision{}},
		{"another replica's, within the take-over delay", HandOverFacts{RecordedWaiting: true, Age: 2 * s}, waitFor(3*s, "", NoNote)},
		{"another replica's, after the delay", HandOverFacts{RecordedWaiting: true, Age: 5 * s}, handOver(HandOverRecorded)},
		{"take-over, a claim unanswered: waits as the admitting replica would", HandOverFacts{RecordedWaiting: true, Age: 10 * s, RecordedUnanswered: true},
			waitFor(20*s, "Leaving claims the IPAM has not all answered to their admitting replica", NoteWaited)},
		{"take-over, unanswered past the IPAM wait", HandOverFacts{RecordedWaiting: true, Age: 30 * s, RecordedUnanswered: true}, handOver(HandOverRecorded)},
		{"take-over, answered after a wait: the answers wake the admitting replica", HandOverFacts{RecordedWaiting: true, Age: 10 * s, Noted: NoteWaited},
			waitFor(s, "", NoteAnswered)},
		{"take-over, answered a moment ago", HandOverFacts{RecordedWaiting: true, Age: 10 * s, Noted: NoteAnswered, SinceAnswered: 400 * time.Millisecond},
			waitFor(600*time.Millisecond, "", NoNote)},
		{"take-over, answered a second ago", HandOverFacts{RecordedWaiting: true, Age: 10 * s, Noted: NoteAnswered, SinceAnswered: s}, handOver(HandOverRecorded)},
		{"take-over, answer grace cut by the IPAM wait", HandOverFacts{RecordedWaiting: true, Age: 29800 * time.Millisecond, Noted: NoteWaited},
			waitFor(200*time.Millisecond, "", NoteAnswered)},
	} {
		if got := DecideHandOver(tc.f, delay, ipamWait); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := DecideHandOver(HandOverFacts{RecordedWaiting: true, Age: 10 * s, RecordedUnanswered: true}, delay, 0); got.Step != HandOverRecorded {
		t.Errorf("a take-over without the IPAM wait: %+v, want a hand-over", got)
	}
}

func TestDecideRelease(t *testing.T) {
	const grace, hold = 120 * s, 600 * s
	keep := func(after time.Duration, why string) Decision[ReleaseStep] {
		return Decision[ReleaseStep]{After: after, Why: why}
	}
	for _, tc := range []struct {
		name string
		f    ReleaseFacts
		want Decision[ReleaseStep]
	}{
		{"stored: the hand-over's", ReleaseFacts{Stored: true, Age: time.Hour}, keep(120*s, "")},
		{"within the grace period: a slow API server, a retried create", ReleaseFacts{Age: 20 * s}, keep(100*s, "")},
		{"unanswered: deleted before the IPAM's finalizer, its IPAddress would stray", ReleaseFacts{Age: 200 * s},
			keep(520*s, "Keeping a claim the IPAM has not answered yet")},
		{"answered, holds not read: they cost reads", ReleaseFacts{Age: 200 * s, IPAMFinalized: true}, Decision[ReleaseStep]{Step: ReadHolds}},
		{"Metal3DataClaim waits: a retried create would reuse the name", ReleaseFacts{Age: 200 * s, IPAMFinalized: true, Holds: &Holds{DataClaimWaits: true}},
			keep(520*s, "Keeping a claim whose Metal3DataClaim still waits for data")},
		{"pool busy: a freed address allocated twice", ReleaseFacts{Age: 200 * s, IPAMFinalized: true, Holds: &Holds{PoolBusy: true}},
			keep(s, "Keeping a claim while the IPAM allocates in its pool")},
		{"pool busy, the hold nearly over", ReleaseFacts{Age: 719900 * time.Millisecond, IPAMFinalized: true, Holds: &Holds{PoolBusy: true}},
			keep(100*time.Millisecond, "Keeping a claim while the IPAM allocates in its pool")},
		{"answered, nothing holds it", ReleaseFacts{Age: 200 * s, IPAMFinalized: true, Holds: &Holds{}}, Decision[ReleaseStep]{Step: Release}},
		{"unanswered past the hold: an IPAM that is down keeps nothing for ever", ReleaseFacts{Age: 720 * s}, Decision[ReleaseStep]{Step: Release}},
		{"held past the hold", ReleaseFacts{Age: 720 * s, IPAMFinalized: true, Holds: &Holds{DataClaimWaits: true, PoolBusy: true}}, Decision[ReleaseStep]{Step: Release}},
	} {
		if got := DecideRelease(tc.f, grace, hold); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestDecideFinish(t *testing.T) {
	const hold = 600 * s
	finish := Decision[FinishStep]{Step: Finish}
	for _, tc := range []struct {
		name string
		f    FinishFacts
		want Decision[FinishStep]
	}{
		{"strays left: gone first, the claim would strand them", FinishFacts{IPClaim: true, SinceDeleted: time.Hour, Strays: true},
			Decision[FinishStep]{After: s, Why: "Keeping a deleted claim until its stray IPAddresses are released"}},
		{"an IPAM pass may still create its IPAddress", FinishFacts{IPClaim: true, SinceDeleted: 4 * s}, Decision[FinishStep]{After: 6 * s}},
		{"deletion stamped ahead of this clock", FinishFacts{IPClaim: true, SinceDeleted: -5 * s}, Decision[FinishStep]{After: 10 * s}},
		{"an IPAddressClaim has no strays", FinishFacts{SinceDeleted: 4 * s, Strays: true}, finish},
		{"pool busy: a freed address allocated twice", FinishFacts{IPClaim: true, SinceDeleted: 20 * s, PoolBusy: true},
			Decision[FinishStep]{After: s, Why: "Keeping CAPM3's finalizer on a deleted waiting claim while the IPAM allocates in its pool"}},
		{"pool busy past the hold", FinishFacts{IPClaim: true, SinceDeleted: hold, PoolBusy: true}, finish},
		{"nothing left: nobody else removes CAPM3's finalizer", FinishFacts{IPClaim: true, SinceDeleted: 20 * s}, finish},
		{"the IPAM's finalizer on it: a look later, should its pool go first", FinishFacts{IPClaim: true, SinceDeleted: 20 * s, IPAMFinalized: true},
			Decision[FinishStep]{Step: Finish, After: 30 * s}},
		{"pool gone: no IPAM pass will free it", FinishFacts{IPClaim: true, SinceDeleted: 0, PoolGone: true, PoolBusy: true}, Decision[FinishStep]{Step: FinishForIPAM}},
		{"pool gone, strays left", FinishFacts{IPClaim: true, SinceDeleted: 20 * s, PoolGone: true, Strays: true},
			Decision[FinishStep]{After: s, Why: "Keeping a deleted claim until its stray IPAddresses are released"}},
	} {
		if got := DecideFinish(tc.f, hold); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		f    StrandedFacts
		want Decision[FinishStep]
	}{
		{"pool there: the IPAM frees it, a look later should the pool go first", StrandedFacts{CreatedHere: true}, Decision[FinishStep]{After: 30 * s}},
		{"pool gone, stock CAPM3's claim: as without the webhook", StrandedFacts{PoolGone: true}, Decision[FinishStep]{}},
		{"pool gone, its IPAddresses left: gone first, the claim would strand them", StrandedFacts{PoolGone: true, CreatedHere: true, Addresses: 1},
			Decision[FinishStep]{After: 30 * s, Why: "Keeping a deleted claim whose IPPool is gone until its IPAddresses are gone"}},
		{"pool gone: no IPAM pass will free it", StrandedFacts{PoolGone: true, CreatedHere: true}, Decision[FinishStep]{Step: FinishForIPAM}},
	} {
		if got := DecideStranded(tc.f); got != tc.want {
			t.Errorf("stranded, %s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := DecideOrphan(true); got != (Decision[FinishStep]{After: 30 * s}) {
		t.Errorf("owner exists: %+v, want a look in 30s", got)
	}
	if got := DecideOrphan(false); got != finish {
		t.Errorf("owner gone: CAPM3 will not finish it: %+v, want finish", got)
	}
}

func TestDecideAddresses(t *testing.T) {
	leave := Decision[AddressStep]{}
	for _, tc := range []struct {
		name string
		f    AddressFacts
		want Decision[AddressStep]
	}{
		{"claim gone", AddressFacts{Addresses: 2, Youngest: time.Hour}, leave},
		{"deleted waiting claim, two: the IPAM frees one", AddressFacts{ClaimFound: true, Deleting: true, Addresses: 2, IPAMFinalized: true}, Decision[AddressStep]{Step: ReleaseStrays}},
		{"deleted waiting claim, one, never finalized: the IPAM frees none", AddressFacts{ClaimFound: true, Deleting: true, Addresses: 1}, Decision[AddressStep]{Step: ReleaseStrays}},
		{"deleted waiting claim, one, finalized: the IPAM's", AddressFacts{ClaimFound: true, Deleting: true, Addresses: 1, IPAMFinalized: true}, leave},
		{"deleted waiting claim, one, finalized, pool gone: the IPAM frees none", AddressFacts{ClaimFound: true, Deleting: true, Addresses: 1, IPAMFinalized: true, PoolGone: true}, Decision[AddressStep]{Step: ReleaseStrays}},
		{"one address", AddressFacts{ClaimFound: true, Addresses: 1, CreatedHere: true, Answered: true}, leave},
		{"two, the youngest may be unwritten in the status", AddressFacts{ClaimFound: true, Addresses: 2, Youngest: 4 * s}, Decision[AddressStep]{After: 6 * s}},
		{"two, of stock CAPM3's claim", AddressFacts{ClaimFound: true, Addresses: 2, Youngest: time.Hour}, leave},
		{"two, the status unwritten", AddressFacts{ClaimFound: true, Addresses: 2, Youngest: time.Hour, CreatedHere: true}, Decision[AddressStep]{After: 10 * s}},
		{"two, rendered: either may be in use", AddressFacts{ClaimFound: true, Addresses: 2, Youngest: time.Hour, CreatedHere: true, Answered: true, Rendered: true},
			Decision[AddressStep]{Why: "Keeping both IPAddresses the IPAM allocated for a claim: its Metal3Data is rendered"}},
		{"two, not rendered: the IPAM frees one", AddressFacts{ClaimFound: true, Addresses: 2, Youngest: time.Hour, CreatedHere: true, Answered: true},
			Decision[AddressStep]{Step: ReleaseSurplus}},
	} {
		if got := DecideAddresses(tc.f); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
