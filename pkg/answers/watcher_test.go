package answers

import (
	"slices"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/metal3-community/ip-preallocator/internal/controllertest"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
)

// TestClaimEventsForgetAnswersAndDeletions: a claim leaves the unanswered ones when the IPAM
// answers it, whatever its kind, when it is deleted (tombstones too), and when admission did not
// create it or its creation has no result; a claim in creation has no clock yet.
func TestClaimEventsForgetAnswersAndDeletions(t *testing.T) {
	a := NewWatcher(nil)
	handler := a.ClaimEvents()
	data := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: controllertest.DataKey.Namespace, Name: controllertest.DataKey.Name}}
	claims := allocation.Plan(data, []allocation.PoolRef{
		{Name: "a", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind},
		{Name: "b", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind},
		{Name: "c", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"},
		{Name: "d", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"},
	}, data.Name, false)
	a.Track(claims)
	if a.Behind(time.Now().Add(time.Hour)) {
		t.Fatal("claims in creation counted as behind")
	}
	// tmpl-0-b was reused, tmpl-0-d has no result (its creation failed midway): both forgotten.
	results := make([]allocation.Result, len(claims)-1)
	for i, c := range claims[:len(claims)-1] {
		results[i] = allocation.Result{Claim: c, Name: c.Object.GetName(), Outcome: allocation.Created}
	}
	results[1].Outcome = allocation.Reused
	a.Created(claims, results)
	unanswered := func() []string {
		var out []string
		a.inFlight.Range(func(k claimKey, _ time.Time) { out = append(out, k.kind+"/"+k.Name) })
		slices.Sort(out)
		return out
	}
	if got := unanswered(); !slices.Equal(got, []string{"IPAddressClaim/tmpl-0-c", "IPClaim/tmpl-0-a"}) {
		t.Fatalf("unanswered after the creates: %v", got)
	}
	address := &capipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: controllertest.DataKey.Namespace, Name: "tmpl-0-c"}}
	address.Status.AddressRef.Name = "tmpl-0-c"
	handler.OnUpdate(address, address)
	if got := unanswered(); !slices.Equal(got, []string{"IPClaim/tmpl-0-a"}) {
		t.Errorf("unanswered after an IPAddressClaim's answer: %v", got)
	}
	handler.OnDelete(toolscache.DeletedFinalStateUnknown{Obj: &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: controllertest.DataKey.Namespace, Name: "tmpl-0-a"}}})
	if got := unanswered(); len(got) != 0 {
		t.Errorf("unanswered after a deletion: %v", got)
	}
}

// TestIdle: the IPAM is idle until a claim is tracked, and again once it is answered, not when it
// merely changes.
func TestIdle(t *testing.T) {
	l := NewWatcher(nil)
	handler := l.ClaimEvents()
	if !l.Idle() {
		t.Fatal("nothing created, not idle")
	}
	claims := allocation.Plan(&infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: controllertest.DataKey.Namespace, Name: "tmpl-0"}},
		[]allocation.PoolRef{{Name: "a", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind}}, "tmpl-0", false)
	l.Track(claims)
	unanswered := claims[0].Object.(*ipamv1.IPClaim).DeepCopy()
	answered := unanswered.DeepCopy()
	answered.Status.Address = &corev1.ObjectReference{Name: unanswered.Name}
	handler.OnUpdate(unanswered, unanswered)
	if l.Idle() {
		t.Fatal("idle with a claim unanswered")
	}
	handler.OnUpdate(unanswered, answered)
	if !l.Idle() {
		t.Error("every claim answered, not idle")
	}
}
