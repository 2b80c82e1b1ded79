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

// TestDecideWaiting lists every transition of a waiting claim; changing any fails it.
func TestDecideWaiting(t *testing.T) {
	tm := timings{grace: 120 * time.Second, hold: 600 * time.Second, handOverDelay: 5 * time.Second}
	yes, no := true, false
	for _, tc := range []struct {
		name string
		f    waitingFacts
		want decision
	}{
		// The take-over, on every replica: hands over only.
		{"take-over: stored, unrecorded", waitingFacts{takeOver: true, stored: true}, decision{action: handOverUnrecorded}},
		{"take-over: stored, recorded, admitted here", waitingFacts{takeOver: true, stored: true, recorded: true, admittedHere: true}, decision{action: keep, after: 5 * time.Second}},
		{"take-over: stored, recorded, within the delay", waitingFacts{takeOver: true, stored: true, recorded: true, age: 2 * time.Second}, decision{action: keep, after: 3 * time.Second}},
		{"take-over: stored, recorded, after the delay", waitingFacts{takeOver: true, stored: true, recorded: true, age: 5 * time.Second}, decision{action: handOverRecorded}},
		{"take-over: not stored", waitingFacts{takeOver: true, age: time.Hour}, decision{action: keep}},
		// The release, on the leader: releases only.
		{"release: stored", waitingFacts{stored: true, age: time.Hour}, decision{action: keep, after: 120 * time.Second}},
		{"release: within the grace period", waitingFacts{age: 20 * time.Second}, decision{action: keep, after: 100 * time.Second}},
		{"release: unanswered, within the hold", waitingFacts{age: 200 * time.Second}, decision{action: keep, after: 520 * time.Second, why: "Keeping a claim the IPAM has not answered yet"}},
		{"release: answered, Metal3DataClaim not read", waitingFacts{age: 200 * time.Second, ipamHandled: true}, decision{action: readDataClaim}},
		{"release: answered, Metal3DataClaim waits", waitingFacts{age: 200 * time.Second, ipamHandled: true, dataClaimWaits: &yes},
			decision{action: keep, after: 520 * time.Second, why: "Keeping a claim whose Metal3DataClaim still waits for data"}},
		{"release: answered, Metal3DataClaim does not wait", waitingFacts{age: 200 * time.Second, ipamHandled: true, dataClaimWaits: &no}, decision{action: release}},
		{"release: unanswered, past the hold", waitingFacts{age: 720 * time.Second}, decision{action: release}},
		{"release: Metal3DataClaim waits, past the hold", waitingFacts{age: 720 * time.Second, ipamHandled: true, dataClaimWaits: &yes}, decision{action: release}},
	} {
		if got := decideWaiting(tc.f, tm); got != tc.want {
			t.Errorf("%s: %+v (%v), want %+v (%v)", tc.name, got, got.action, tc.want, tc.want.action)
		}
	}
}
