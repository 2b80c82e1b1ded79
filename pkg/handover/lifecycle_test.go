package handover

import (
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

func TestPhaseOf(t *testing.T) {
	now := metav1.Now()
	waitingFor := map[string]string{allocation.PreallocatedForAnnotation: "d"}
	byData := []metav1.OwnerReference{{Kind: "Metal3Data", Name: "d", UID: "u"}}
	for _, tc := range []struct {
		name string
		meta metav1.ObjectMeta
		want phase
	}{
		{"preallocated, no owner", metav1.ObjectMeta{Annotations: waitingFor}, waiting},
		{"preallocated, no owner, being deleted", metav1.ObjectMeta{Annotations: waitingFor, DeletionTimestamp: &now, Finalizers: []string{infrav1.DataFinalizer}}, deleting},
		{"preallocated, owned", metav1.ObjectMeta{Annotations: waitingFor, OwnerReferences: byData}, owned},
		{"CAPM3's", metav1.ObjectMeta{OwnerReferences: byData, Finalizers: []string{infrav1.DataFinalizer}}, owned},
		{"CAPM3's, being deleted", metav1.ObjectMeta{OwnerReferences: byData, DeletionTimestamp: &now, Finalizers: []string{infrav1.DataFinalizer}}, orphaned},
		{"being deleted without CAPM3's finalizer", metav1.ObjectMeta{OwnerReferences: byData, DeletionTimestamp: &now, Finalizers: []string{"ipclaim.ipam.metal3.io"}}, owned},
	} {
		meta := tc.meta
		if got := phaseOf(&meta); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDecideHandOver lists every transition of the hand-over of a stored Metal3Data; changing
// any fails it.
func TestDecideHandOver(t *testing.T) {
	const delay = 5 * time.Second
	for _, tc := range []struct {
		name string
		f    handOverFacts
		want decision
	}{
		{"a claim it does not record", handOverFacts{unrecorded: true, admitted: true, created: true, recordedWaiting: true}, decision{action: handOverUnrecorded}},
		{"admitted here, claims created", handOverFacts{admitted: true, created: true, recordedWaiting: true}, decision{action: handOverAdmitted}},
		{"admitted here, claims being created", handOverFacts{admitted: true, recordedWaiting: true, age: time.Hour}, decision{action: keep}},
		{"nothing waits", handOverFacts{age: time.Hour}, decision{action: keep}},
		{"admitted elsewhere, within the delay", handOverFacts{recordedWaiting: true, age: 2 * time.Second}, decision{action: keep, after: 3 * time.Second}},
		{"admitted elsewhere, after the delay", handOverFacts{recordedWaiting: true, age: 5 * time.Second}, decision{action: handOverRecorded}},
	} {
		if got := decideHandOver(tc.f, delay); got != tc.want {
			t.Errorf("%s: %+v (%v), want %+v (%v)", tc.name, got, got.action, tc.want, tc.want.action)
		}
	}
}

// TestDecideRelease lists every transition of a waiting claim on the leader; changing any fails it.
func TestDecideRelease(t *testing.T) {
	const grace, hold = 120 * time.Second, 600 * time.Second
	for _, tc := range []struct {
		name string
		f    releaseFacts
		want decision
	}{
		{"stored", releaseFacts{stored: true, age: time.Hour}, decision{action: keep, after: 120 * time.Second}},
		{"within the grace period", releaseFacts{age: 20 * time.Second}, decision{action: keep, after: 100 * time.Second}},
		{"unanswered, within the hold", releaseFacts{age: 200 * time.Second}, decision{action: keep, after: 520 * time.Second, why: "Keeping a claim the IPAM has not answered yet"}},
		{"answered, holds not read", releaseFacts{age: 200 * time.Second, ipamFinalized: true}, decision{action: readHolds}},
		{"answered, Metal3DataClaim waits", releaseFacts{age: 200 * time.Second, ipamFinalized: true, holds: &holds{dataClaimWaits: true}},
			decision{action: keep, after: 520 * time.Second, why: "Keeping a claim whose Metal3DataClaim still waits for data"}},
		{"answered, pool busy", releaseFacts{age: 200 * time.Second, ipamFinalized: true, holds: &holds{poolBusy: true}},
			decision{action: keep, after: time.Second, why: "Keeping a claim while the IPAM allocates in its pool"}},
		{"answered, pool busy, the hold nearly over", releaseFacts{age: 719900 * time.Millisecond, ipamFinalized: true, holds: &holds{poolBusy: true}},
			decision{action: keep, after: 100 * time.Millisecond, why: "Keeping a claim while the IPAM allocates in its pool"}},
		{"answered, no hold", releaseFacts{age: 200 * time.Second, ipamFinalized: true, holds: &holds{}}, decision{action: release}},
		{"unanswered, past the hold", releaseFacts{age: 720 * time.Second}, decision{action: release}},
		{"held, past the hold", releaseFacts{age: 720 * time.Second, ipamFinalized: true, holds: &holds{dataClaimWaits: true, poolBusy: true}}, decision{action: release}},
	} {
		if got := decideRelease(tc.f, grace, hold); got != tc.want {
			t.Errorf("%s: %+v (%v), want %+v (%v)", tc.name, got, got.action, tc.want, tc.want.action)
		}
	}
}
