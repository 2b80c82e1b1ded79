package faults

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// The TestCheck tests run without a control plane (see needsControlPlane): the fault suite's
// checks, each on a namespace that breaks only it, and on one that breaks none.

func testClaim(name string, uid types.UID, address string) ipamv1.IPClaim {
	c := ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid,
		OwnerReferences: []metav1.OwnerReference{{Kind: "Metal3Data", Name: "d", UID: "data-" + uid}}}}
	c.Spec.Pool.Name = "provisioning"
	if address != "" {
		c.Status.Address = &corev1.ObjectReference{Name: "provisioning-" + strings.ReplaceAll(address, ".", "-")}
	}
	return c
}

func testAddress(address, claimName string, claimUID types.UID) ipamv1.IPAddress {
	a := ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "provisioning-" + strings.ReplaceAll(address, ".", "-")}}
	a.Spec.Address = ipamv1.IPAddressStr(address)
	a.Spec.Pool.Name = "provisioning"
	a.Spec.Claim.Name = claimName
	if claimUID != "" {
		a.OwnerReferences = []metav1.OwnerReference{{Kind: "IPPool", Name: "provisioning", UID: "pool"}, {Kind: "IPClaim", Name: claimName, UID: claimUID}}
	}
	return a
}

func testData(name, dataClaim string) infrav1.Metal3Data {
	return infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("data-" + name)},
		Spec: infrav1.Metal3DataSpec{Claim: &infrav1.Metal3ObjectRef{Name: dataClaim}}}
}

func rendered(ips ...string) corev1.Secret {
	return corev1.Secret{Data: map[string][]byte{"networkData": []byte(
		"links: []\nnetworks:\n- ip_address: " + strings.Join(ips, "\n- ip_address: ") + "\n  netmask: 255.255.0.0\n  routes:\n  - gateway: 172.16.0.1\n")}}
}

func TestCheckAddressViolations(t *testing.T) {
	for _, tc := range []struct {
		name                            string
		state                           namespaceState
		wantOrphans, wantLeaked, wantDo int64
		// wantOurs: of those, on claims the webhook created (ua and old).
		wantOurs     int64
		wantEvidence string
	}{{
		name: "each claim its own address, rendered once",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "ua", "172.16.0.10"), testClaim("b-provisioning", "ub", "172.16.0.100")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "ua"), testAddress("172.16.0.100", "b-provisioning", "ub")},
			datas:       []infrav1.Metal3Data{testData("a", "ma"), testData("b", "mb")},
			secrets:     map[string]corev1.Secret{"ma-networkdata": rendered("172.16.0.10"), "mb-networkdata": rendered("172.16.0.100")},
		},
	}, {
		name: "an IPAddress of a claim re-created under its name is an orphan",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "new", "")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "old")},
		},
		wantOrphans: 1, wantOurs: 1, wantEvidence: `of IPClaim a-provisioning (uid …old)`,
	}, {
		name: "an IPAddress whose claim reference the garbage collector removed is an orphan",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "ua", "")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "")},
		},
		wantOrphans: 1,
	}, {
		name: "one claim UID held by two IPAddresses",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "ua", "172.16.0.10")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "ua"), testAddress("172.16.0.11", "a-provisioning", "ua")},
		},
		wantLeaked: 1, wantOurs: 1, wantEvidence: "is held by IPAddresses",
	}, {
		name: "one address in the status of two claims",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "ua", "172.16.0.10"), testClaim("b-provisioning", "ub", "172.16.0.10")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "ua")},
		},
		// b's status points at a's IPAddress: the value is held for two UIDs, counted once.
		wantDo: 1, wantOurs: 1, wantEvidence: "which is held for a-provisioning",
	}, {
		name: "one address in the status of two claims, rendered for both",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "ua", "172.16.0.10"), testClaim("b-provisioning", "ub", "172.16.0.10")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "ua")},
			datas:       []infrav1.Metal3Data{testData("a", "ma"), testData("b", "mb")},
			secrets:     map[string]corev1.Secret{"ma-networkdata": rendered("172.16.0.10"), "mb-networkdata": rendered("172.16.0.10")},
		},
		wantDo: 1, wantOurs: 1, wantEvidence: "which is held for a-provisioning",
	}, {
		name: "one address rendered for two Metal3Data",
		state: namespaceState{
			ipClaims:    []ipamv1.IPClaim{testClaim("a-provisioning", "ua", "172.16.0.10")},
			m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "ua")},
			datas:       []infrav1.Metal3Data{testData("a", "ma"), testData("b", "mb")},
			secrets:     map[string]corev1.Secret{"ma-networkdata": rendered("172.16.0.10"), "mb-networkdata": rendered("172.16.0.10")},
		},
		wantDo: 1, wantEvidence: "is rendered for Metal3Data [a b]",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			orphans, leaked, double := namedCount{name: invOrphanAddress}, namedCount{name: invLeakedAddress}, namedCount{name: invDoubleAllocation}
			ours := namedCount{name: invOursAddresses}
			webhooks := func(uid types.UID) bool { return uid == "ua" || uid == "old" }
			addressViolations("ns", &tc.state, tc.state.claims(), webhooks, &ours, &orphans, &leaked, &double)
			if ours.n != tc.wantOurs {
				t.Errorf("on the webhook's claims: %d, want %d: %v", ours.n, tc.wantOurs, ours.evidence)
			}
			if orphans.n != tc.wantOrphans || leaked.n != tc.wantLeaked || double.n != tc.wantDo {
				t.Errorf("orphans %d, leaked %d, twice %d; want %d, %d and %d\norphans: %v\nleaked: %v\ntwice: %v", orphans.n, leaked.n, double.n,
					tc.wantOrphans, tc.wantLeaked, tc.wantDo, orphans.evidence, leaked.evidence, double.evidence)
			}
			all := strings.Join(slices.Concat(orphans.evidence, leaked.evidence, double.evidence), "\n")
			if !strings.Contains(all, tc.wantEvidence) {
				t.Errorf("evidence does not say %q:\n%s", tc.wantEvidence, all)
			}
		})
	}
}

// TestCheckRenderedAddressesAreParsed: an address is rendered when that very IP is, not a longer one
// it is a prefix of.
func TestCheckRenderedAddressesAreParsed(t *testing.T) {
	claim := testClaim("a-provisioning", "ua", "172.16.0.10")
	data := testData("a", "ma")
	data.UID = "data-ua"
	data.Status.Ready = ptr.To(true)
	data.Spec.Template = &infrav1.Metal3ObjectRef{Name: mastersTemplate}
	base := namespaceState{
		ipClaims:    []ipamv1.IPClaim{claim, testClaim("a-baremetal", "ub", "")},
		m3Addresses: []ipamv1.IPAddress{testAddress("172.16.0.10", "a-provisioning", "ua")},
	}
	for _, tc := range []struct {
		rendered string
		want     bool
	}{{"172.16.0.10", true}, {"172.16.0.100", false}, {"172.16.0.1", false}} {
		s := base
		s.secrets = map[string]corev1.Secret{"ma-networkdata": rendered(tc.rendered)}
		problem := renderedProblem(&data, &s, s.claims())
		if got := !strings.Contains(problem, "172.16.0.10 of claim a-provisioning is not rendered"); got != tc.want {
			t.Errorf("rendered %s: problem %q", tc.rendered, problem)
		}
	}
}

// TestCheckLeftToCAPM3ByAdmission: a claim CAPM3 created is excused only by what the webhook said
// of the admission that stored its Metal3Data, not of another with the same claim name.
func TestCheckLeftToCAPM3ByAdmission(t *testing.T) {
	rec := claimRecord{kind: "IPClaim", namespace: "ns", name: "d-provisioning", owner: "uid-now"}
	now := admission{uid: "uid-now", token: "token-now"}
	for _, tc := range []struct {
		name           string
		a              admission
		events, logged map[string]bool
		want           bool
	}{
		{name: "nothing said", a: now},
		{name: "its admission warned", a: admission{uid: "uid-now", warnings: []string{"ip-preallocator: IPClaim d-provisioning left to CAPM3: exists"}}, want: true},
		{name: "an Event about it", a: now, events: map[string]bool{"uid-now/IPClaim/d-provisioning": true}, want: true},
		{name: "an Event about an earlier Metal3Data of the name", a: now, events: map[string]bool{"uid-before/IPClaim/d-provisioning": true}},
		{name: "its admission's log line", a: now, logged: map[string]bool{"token-now/ns/IPClaim/d-provisioning": true}, want: true},
		{name: "another admission's log line", a: now, logged: map[string]bool{"token-before/ns/IPClaim/d-provisioning": true}},
		{name: "a warning about another claim", a: admission{uid: "uid-now", warnings: []string{"ip-preallocator: IPClaim d-provisioning-2 left to CAPM3: exists"}}},
	} {
		if got := leftBy(tc.a, rec, tc.events, tc.logged); got != tc.want {
			t.Errorf("%s: excused %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCheckKilledBeforeCreating: a claim CAPM3 created is put down to a SIGKILL only when the
// webhook recorded it, never created it, and a replica was killed between the admission and
// CAPM3's create.
func TestCheckKilledBeforeCreating(t *testing.T) {
	start := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	a := admission{start: start, recorded: []string{"IPClaim/d-provisioning", "IPClaim/d-baremetal"}}
	rec := claimRecord{kind: "IPClaim", namespace: "ns", name: "d-provisioning", seen: start.Add(50 * time.Millisecond)}
	killedAt := func(at time.Time) func(from, to time.Time) bool {
		return func(from, to time.Time) bool { return !at.Before(from) && !at.After(to) }
	}
	for _, tc := range []struct {
		name           string
		a              admission
		webhookCreated bool
		killed         func(from, to time.Time) bool
		want           bool
	}{
		{name: "killed in between", a: a, killed: killedAt(start.Add(20 * time.Millisecond)), want: true},
		{name: "killed before the admission", a: a, killed: killedAt(start.Add(-time.Millisecond))},
		{name: "killed after CAPM3's create", a: a, killed: killedAt(start.Add(time.Second))},
		{name: "the webhook created it", a: a, webhookCreated: true, killed: killedAt(start.Add(20 * time.Millisecond))},
		{name: "not recorded", a: admission{start: start, recorded: []string{"IPClaim/d-baremetal"}}, killed: killedAt(start.Add(20 * time.Millisecond))},
	} {
		if got := killedBeforeCreating(tc.a, rec, tc.webhookCreated, tc.killed); got != tc.want {
			t.Errorf("%s: put down to a kill %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCheckPreallocatedShareByClaimUID: the share counts the claims each stored Metal3Data came to
// own, by who created them, and nothing of other Metal3Data.
func TestCheckPreallocatedShareByClaimUID(t *testing.T) {
	recs := []claimRecord{
		{uid: "1", owner: "d1", preallocatedFor: "d", creator: "webhook"},
		{uid: "2", owner: "d1", creator: stack.CAPM3UserAgent},
		{uid: "3", owner: "d2", creator: stack.CAPM3UserAgent},
		{uid: "4", owner: "gone", preallocatedFor: "d", creator: "webhook"},
		{uid: "5", preallocatedFor: "d", creator: "webhook"},
	}
	if pre, all := preallocatedShare(recs, map[types.UID]bool{"d1": true, "d2": true}); pre != 1 || all != 3 {
		t.Errorf("preallocated %d of %d, want 1 of 3", pre, all)
	}
}

// TestCheckTrialLoads: the page gives each trial's load on one line.
func TestCheckTrialLoads(t *testing.T) {
	res := &scenarioResult{perTrial: []trialCounts{{load: "1.0→2.0"}, {load: "0.5→1.5"}}}
	if got, want := trialLoads(res), "- load (1 min) of each trial, at its start → after its stream: 1.0→2.0, 0.5→1.5"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// withTrials gives a result its trials: stored Metal3Data each, and the count's events per trial.
func withTrials(res *scenarioResult, stored int, name string, events ...int64) *scenarioResult {
	for _, k := range events {
		res.perTrial = append(res.perTrial, trialCounts{stored: stored, counts: map[string]int64{name: k}})
		res.admitted += stored
		res.trials++
	}
	sumInto(&res.counts, []namedCount{{name: name, n: sumOf(events)}})
	return res
}

func sumOf(events []int64) int64 {
	var n int64
	for _, k := range events {
		n += k
	}
	return n
}

// TestCheckAgainstBaselines: each count held to stock's gets the criterion's verdict from the
// per-trial counts, and scenarios without a baseline are left out.
func TestCheckAgainstBaselines(t *testing.T) {
	results := []*scenarioResult{
		withTrials(&scenarioResult{name: "namespaces", compared: []string{invOrphanAddress}}, 100, invOrphanAddress, 4, 5, 3, 4, 4),
		withTrials(&scenarioResult{name: "namespaces-stock", control: true}, 100, invOrphanAddress, 1, 1, 0, 2, 1),
		withTrials(&scenarioResult{name: "recreate", compared: []string{invOrphanAddress}}, 100, invOrphanAddress, 0, 1, 0, 0, 1),
		withTrials(&scenarioResult{name: "recreate-stock", control: true}, 100, invOrphanAddress, 1, 0, 0, 1, 0),
		withTrials(&scenarioResult{name: "leader-loss"}, 100, invOrphanAddress, 9),
		withTrials(&scenarioResult{name: "rejected-after-mutation", compared: []string{invNamespaces}}, 100, invNamespaces, 1),
		withTrials(&scenarioResult{name: "rejected-after-mutation-stock", control: true}, 100, invNamespaces, 1),
	}
	got := strings.Join(againstBaselines(results), "\n")
	for _, want := range []string{"| namespaces | " + invOrphanAddress + " | 20 of 500 | 5 of 500 | 40.0 / 10.0 | **worse than stock** |",
		"| recreate | " + invOrphanAddress + " | 2 of 500 | 2 of 500 | 4.0 / 4.0 | too few trials (about "} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "leader-loss") {
		t.Errorf("a scenario without a baseline is compared:\n%s", got)
	}
	if !strings.Contains(got, "| rejected-after-mutation | "+invNamespaces+" | 1 of 100 |") || strings.Contains(got, "| rejected-after-mutation | "+invOrphanAddress) {
		t.Errorf("rejected-after-mutation compares more or less than its namespaces' deletion time:\n%s", got)
	}
	if open := undecided(results); len(open) != 2 {
		t.Errorf("undecided: %q, want recreate's and rejected-after-mutation's", open)
	}
}

func TestCheckUnfaultedDeletion(t *testing.T) {
	if c := unfaultedDeletion(0); c.n != 1 {
		t.Errorf("a namespace deletion without injected faults counted %d, want 1", c.n)
	}
	if c := unfaultedDeletion(7); c.n != 0 {
		t.Errorf("a namespace deletion with faults counted %d, want 0", c.n)
	}
}

// TestCheckLateNamespaceSaysWhatIsLeft: a late namespace's evidence names the finalizers still held
// and the claims the webhook preallocated and never handed over.
func TestCheckLateNamespaceSaysWhatIsLeft(t *testing.T) {
	now := metav1.Now()
	items := []metav1.PartialObjectMetadata{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", DeletionTimestamp: &now, Finalizers: []string{infrav1.DataFinalizer, ipamv1.IPClaimFinalizer},
			Annotations: map[string]string{allocation.PreallocatedForAnnotation: "d"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Finalizers: []string{ipamv1.IPClaimFinalizer},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Metal3Data", Name: "e", UID: "e", Controller: ptr.To(true)}}}},
		// Handed over: owned, whatever annotation is left.
		{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{allocation.PreallocatedForAnnotation: "f"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Metal3Data", Name: "f", UID: "f", Controller: ptr.To(true)}}}},
	}
	got := describeLeft(ipamv1.GroupVersion.WithKind("IPClaim").GroupKind(), items)
	want := "3 IPClaim.ipam.metal3.io (1 being deleted, 1 preallocated and not handed over, 2 with " +
		ipamv1.IPClaimFinalizer + ", 1 with " + infrav1.DataFinalizer + ")"
	if got != want {
		t.Errorf("describeLeft = %q, want %q", got, want)
	}
	if got := describeLeft(ipamv1.GroupVersion.WithKind("IPClaim").GroupKind(), nil); got != "" {
		t.Errorf("describeLeft of nothing = %q, want empty", got)
	}
}

// TestCheckStuckNamespaceHeldByTheIPAM: a namespace held only by the Metal3 IPAM's IPAddresses
// and IPPools, with only its own finalizers, is the IPAM's; one claim, Metal3Data or foreign
// finalizer left with them makes it a stuck namespace like any other.
func TestCheckStuckNamespaceHeldByTheIPAM(t *testing.T) {
	now := metav1.Now()
	obj := func(name string, finalizers ...string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, DeletionTimestamp: &now, Finalizers: finalizers}}
	}
	addresses, pools := allocation.Metal3AddressGVK.GroupKind(), ipamv1.GroupVersion.WithKind("IPPool").GroupKind()
	ipamOnly := map[schema.GroupKind][]metav1.PartialObjectMetadata{
		addresses: {obj("pool-10-0-0-10", ipamv1.IPAddressFinalizer), obj("pool-10-0-0-11", ipamv1.IPAddressFinalizer)},
		pools:     {obj("pool", ipamv1.IPPoolFinalizer)},
		// Left without a finalizer, it holds nothing.
		allocation.Metal3DataGVK.GroupKind(): {obj("d")},
	}
	if !heldOnlyByIPAM(ipamOnly) {
		t.Error("held by the IPAM's IPAddresses and IPPools: not the IPAM's")
	}
	for name, more := range map[string]map[schema.GroupKind][]metav1.PartialObjectMetadata{
		"a claim":                   {allocation.IPClaimGVK.GroupKind(): {obj("c", ipamv1.IPClaimFinalizer)}},
		"a Metal3Data":              {allocation.Metal3DataGVK.GroupKind(): {obj("d", infrav1.DataFinalizer)}},
		"an IPAddress with CAPM3's": {addresses: {obj("pool-10-0-0-12", ipamv1.IPAddressFinalizer, infrav1.DataFinalizer)}},
		"a pool with an address's":  {pools: {obj("pool", ipamv1.IPAddressFinalizer)}},
		"an IPAddressClaim":         {allocation.IPAddressClaimGVK.GroupKind(): {obj("c", "ipam.cluster.x-k8s.io/ReleaseAddress")}},
	} {
		left := maps.Clone(ipamOnly)
		for kind, items := range more {
			left[kind] = append(slices.Clone(left[kind]), items...)
		}
		if heldOnlyByIPAM(left) {
			t.Errorf("held by %s too: the IPAM's", name)
		}
	}
	if heldOnlyByIPAM(map[schema.GroupKind][]metav1.PartialObjectMetadata{addresses: {obj("a")}}) {
		t.Error("held by no finalizer: the IPAM's")
	}
}

// TestCheckFailuresAgainstStock: a scenario with a baseline fails for a count the criterion finds
// worse than stock's, not for the others, and fails when its baseline is missing.
func TestCheckFailuresAgainstStock(t *testing.T) {
	r := &suiteReport{results: []*scenarioResult{
		withTrials(&scenarioResult{name: "namespaces", compared: comparedToStock}, 100, invOrphanAddress, 2, 1, 2, 1, 1),
		withTrials(&scenarioResult{name: "namespaces-stock", control: true}, 100, invOrphanAddress, 0, 0, 0, 0, 0),
		{name: "kills", admitted: 100, compared: comparedToStock},
	}}
	got := r.failuresAgainstStock("namespaces")
	if len(got) != 1 || !strings.Contains(got[0], invOrphanAddress) {
		t.Errorf("namespaces: got %q, want one failure for %s", got, invOrphanAddress)
	}
	if got := r.failuresAgainstStock("kills"); len(got) != 1 || !strings.Contains(got[0], "no baseline") {
		t.Errorf("kills without its baseline: got %q", got)
	}
}

// TestCheckReportOpensWithWhatItMeans: the page opens with the verdict and the webhook's counts
// beside stock's, then the known problems, then the method.
func TestCheckReportOpensWithWhatItMeans(t *testing.T) {
	r := &suiteReport{started: time.Now(), results: []*scenarioResult{
		{name: "namespaces", trials: 1, admitted: 100, compared: comparedToStock, counts: []namedCount{{name: invOrphanAddress, n: 1}},
			perTrial: []trialCounts{{stored: 100, counts: map[string]int64{invOrphanAddress: 1}}}},
		{name: "namespaces-stock", control: true, trials: 1, admitted: 90, counts: []namedCount{{name: invOrphanAddress, n: 4}},
			perTrial: []trialCounts{{stored: 90, counts: map[string]int64{invOrphanAddress: 4}}}},
	}}
	// The known problems are the released IPAM's: a run against the corrected double omits them.
	page, path := writtenPage(t, r, sizes{name: "quick"}, true, nil)
	var e evidence
	if data, err := os.ReadFile(strings.TrimSuffix(path, ".md") + ".json"); err != nil || json.Unmarshal(data, &e) != nil ||
		e.Seed != runSeed || len(e.Scenarios) != 2 || !e.Scenarios[1].Stock || e.Scenarios[1].Trials[0].Counts[invOrphanAddress] != 4 {
		t.Errorf("the evidence beside the page: %+v, %v", e, err)
	}
	for _, n := range invariants {
		if !slices.ContainsFunc(failureModes, func(m failureMode) bool { return m.count == n }) {
			t.Errorf("no failure mode tells an operator of %q", n)
		}
	}
	order := []string{"## What it means", "| with the webhook (every scenario) | 100 | 0 | 0 | 1 | 0 | 0 |",
		"| stock CAPM3 and IPAM alone (the baselines) | 90 | 0 | 0 | 4 | 0 | 0 |", "## Failure modes",
		"| " + invOrphanAddress + " | an address stays taken with no claim | 10.0 / 44.4 |", "## Known problems", "## How it was measured", "## namespaces"}
	at := 0
	for _, want := range order {
		i := strings.Index(page[at:], want)
		if i < 0 {
			t.Fatalf("%q missing, or not after %q:\n%s", want, page[:at], page)
		}
		at += i
	}
}

// TestCheckReportListsTheIPAMCorrections: against the corrected double, the page lists every change
// it makes, and no other.
func TestCheckReportListsTheIPAMCorrections(t *testing.T) {
	r := &suiteReport{started: time.Now(), results: []*scenarioResult{
		{name: "kills", trials: 1, admitted: 10, perTrial: []trialCounts{{stored: 10, counts: map[string]int64{}}}},
	}}
	page, _ := writtenPage(t, r, sizes{name: "quick"}, true, stack.NamedRaces)
	for c, text := range stack.Describe {
		if listed := strings.Contains(page, "- `"+string(c)+"`: "+text); listed != stack.NamedRaces.Has(c) {
			t.Errorf("%s listed: %v, made: %v", c, listed, stack.NamedRaces.Has(c))
		}
	}
}

// TestCheckPageSize: the page of a full run, every scenario with its baseline and the trials the
// criterion may need, stays within 25 KB; what grows with the trials goes to the JSON.
func TestCheckPageSize(t *testing.T) {
	const trials = 20
	r := &suiteReport{started: time.Now()}
	for _, s := range scenarios {
		arms := []bool{false}
		if s.compared != nil {
			arms = append(arms, true)
		}
		for _, stock := range arms {
			res := &scenarioResult{name: s.name, title: s.title, control: stock, compared: s.compared, trials: trials, admitted: 100 * trials}
			if stock {
				res.name += "-stock"
			}
			res.faults = []namedCount{{name: "SIGKILL of the leader", n: 90}, {name: "SIGKILL of the other replica (or of one while none led)", n: 230}}
			res.info = []namedCount{{name: infoRecorded}, {name: infoWarned, n: 3}, {name: infoCAPM3Down, n: 70}, {name: infoUnanswered, n: 35}}
			for range trials {
				// Stock's own problems under churn, in every trial.
				counts := map[string]int64{invOrphanAddress: 2, invNamespaces: 1, invNotReady: 1}
				res.perTrial = append(res.perTrial, trialCounts{load: "2.7→3.6", stored: 100, counts: counts,
					figures: []string{strings.Repeat("a figure of the trial ", 10)}, evidence: map[string][]string{invOrphanAddress: {strings.Repeat("evidence ", 20)}}})
			}
			for n, k := range res.perTrial[0].counts {
				res.counts = append(res.counts, namedCount{name: n, n: k * trials})
			}
			r.results = append(r.results, res)
		}
	}
	page, _ := writtenPage(t, r, sizes{name: "full", trials: trials}, false, nil)
	if len(page) > 25000 {
		t.Errorf("the page is %d bytes, want at most 25000", len(page))
	}
	t.Logf("page: %d bytes", len(page))
}

// writtenPage writes r's page, and the evidence beside it, as a run against the IPAM with
// corrections would, and returns the page and its path.
func writtenPage(t *testing.T, r *suiteReport, s sizes, passed bool, corrections stack.Corrections) (page, path string) {
	t.Helper()
	saved, savedCorrections := cp, ipamCorrections
	t.Cleanup(func() { cp, ipamCorrections = saved, savedCorrections })
	cp, ipamCorrections = &harness.ControlPlane{Root: t.TempDir()}, corrections
	return writtenPageAt(t, r, s, passed, filepath.Join(t.TempDir(), "reliability.md"))
}

// writtenPageAt writes r's page to path, with the control plane as it is.
func writtenPageAt(t *testing.T, r *suiteReport, s sizes, passed bool, path string) (page, _ string) {
	t.Helper()
	if cp == nil {
		saved := cp
		t.Cleanup(func() { cp = saved })
		cp = &harness.ControlPlane{Root: t.TempDir()}
	}
	if err := r.write(path, s, passed); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data), path
}

// TestCheckPartsMerge: a run split by scenario is one page: the second part takes the first's seed
// and keeps its scenarios it did not run again; parts of other product code are never merged.
func TestCheckPartsMerge(t *testing.T) {
	savedSeed := runSeed
	t.Cleanup(func() { runSeed = savedSeed })
	first := &suiteReport{started: time.Now(), results: []*scenarioResult{
		withTrials(&scenarioResult{name: "namespaces", title: "t", compared: comparedToStock}, 100, invOrphanAddress, 20, 22),
		withTrials(&scenarioResult{name: "namespaces-stock", control: true}, 100, invOrphanAddress, 21, 23),
		withTrials(&scenarioResult{name: "kills", failed: true}, 100, invOrphanAddress, 0),
	}}
	_, path := writtenPage(t, first, sizes{name: "full", trials: 2, maxTrials: 4}, true, nil)
	product := "unknown" // writtenPage's control plane is no git checkout

	if said, err := (&suiteReport{}).resume(jsonBeside(path), sizes{name: "full"}, "other", false); err != nil || !strings.Contains(said, "other product code") {
		t.Errorf("parts of other product code: %q, %v", said, err)
	}
	runSeed = savedSeed + 1
	second := &suiteReport{started: time.Now()}
	if said, err := second.resume(jsonBeside(path), sizes{name: "full"}, product, false); err != nil || !strings.Contains(said, "resuming") {
		t.Fatalf("resuming: %q, %v", said, err)
	}
	if runSeed != savedSeed {
		t.Errorf("seed %d, want the first part's %d", runSeed, savedSeed)
	}
	second.results = []*scenarioResult{withTrials(&scenarioResult{name: "kills"}, 50, invOrphanAddress, 0)}
	page, _ := writtenPageAt(t, second, sizes{name: "full", trials: 2, maxTrials: 4}, true, path)
	for _, want := range []string{"2 parts", "| namespaces | " + invOrphanAddress + " | 42 of 200 | 44 of 200 |", "| kills | 1 | 0 | 50 |", "**Every invariant held**"} {
		if !strings.Contains(page, want) {
			t.Errorf("the merged page lacks %q:\n%s", want, page)
		}
	}
	if !strings.Contains(page, ": namespaces\n") || !strings.Contains(page, ": kills\n") {
		t.Errorf("the merged page does not say which part ran which scenario:\n%s", page)
	}
	if !strings.Contains(page, "Incomplete: not run yet: leader-loss") {
		t.Errorf("the merged page does not say which scenarios are missing:\n%s", page)
	}

	// More trials of a scenario add to the earlier parts' instead of replacing them.
	third := &suiteReport{started: time.Now()}
	if _, err := third.resume(jsonBeside(path), sizes{name: "full"}, product, true); err != nil {
		t.Fatal(err)
	}
	if got := third.trialsDone("namespaces"); got != 2 {
		t.Errorf("namespaces: %d trials done, want the earlier parts' 2", got)
	}
	for _, res := range third.results {
		if baseName(res.name) == "namespaces" {
			withTrials(res, 100, invOrphanAddress, 21)
		}
	}
	third.ran = map[string]bool{"namespaces": true}
	page, _ = writtenPageAt(t, third, sizes{name: "full", trials: 2, maxTrials: 4}, true, path)
	if want := "| namespaces | " + invOrphanAddress + " | 63 of 300 | 65 of 300 |"; !strings.Contains(page, want) {
		t.Errorf("the page after more trials lacks %q:\n%s", want, page)
	}
	if strings.Count(page, "\n## kills\n") != 1 {
		t.Errorf("kills not once on the page:\n%s", page)
	}
	if ranNamespaces := regexp.MustCompile(`(?m)^- .* UTC, .*: namespaces$`); !strings.Contains(page, "3 parts") || len(ranNamespaces.FindAllString(page, -1)) != 2 {
		t.Errorf("the page after more trials does not list both parts that ran namespaces:\n%s", page)
	}
}

// TestCheckLostTrialsNamed: a trial that failed before its counts were recorded is named on the
// page, for either arm, and survives the JSON a later part resumes from.
func TestCheckLostTrialsNamed(t *testing.T) {
	r := &suiteReport{started: time.Now()}
	webhook := withTrials(&scenarioResult{name: "by-hand", title: "t", compared: comparedToStock}, 10, invOrphanAddress, 0, 0, 0, 0)
	stock := withTrials(&scenarioResult{name: "by-hand-stock", control: true}, 10, invOrphanAddress, 0, 0, 0, 0, 0)
	r.results = []*scenarioResult{webhook, stock}
	r.lose(&scenario{name: "by-hand", trial: 1}, "t")
	r.lose(&scenario{name: "by-hand-stock", trial: 3, control: true}, "t")
	page, path := writtenPage(t, r, sizes{name: "full", trials: 5, maxTrials: 5}, false, nil)
	for _, want := range []string{
		"- trials lost, not counted (they failed before their counts were recorded; the run's log says why): 1\n",
		"5 trials, 50 Metal3Data stored; trials lost, not counted (they failed before their counts were recorded; the run's log says why): 3\n",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	resumed := &suiteReport{}
	if _, err := resumed.resume(jsonBeside(path), sizes{name: "full"}, "unknown", true); err != nil {
		t.Fatal(err)
	}
	if len(resumed.results) != 2 || !slices.Equal(resumed.results[0].lost, []int{1}) || !slices.Equal(resumed.results[1].lost, []int{3}) {
		t.Errorf("lost trials after the JSON: %+v", resumed.results)
	}
}

// TestCheckWantsTrial: trials are added while a comparison lacks the power and a few more
// trials would give it; not past maxTrials, nor where no number of trials within it would.
func TestCheckWantsTrial(t *testing.T) {
	saved := size
	t.Cleanup(func() { size = saved })
	size = sizes{trials: 2, maxTrials: 12}
	for _, tc := range []struct {
		name           string
		webhook, stock []int64
		done           int
		want           bool
	}{
		{name: "underpowered, more trials would tell", webhook: []int64{5, 4}, stock: []int64{6, 5}, done: 2, want: true},
		{name: "at the most trials", webhook: []int64{5, 4}, stock: []int64{6, 5}, done: 12, want: false},
		{name: "more trials than the most would tell", webhook: []int64{1, 0}, stock: []int64{2, 1}, done: 2, want: false},
		{name: "no events", webhook: []int64{0, 0}, stock: []int64{0, 0}, done: 2, want: false},
		{name: "powered", webhook: []int64{20, 22, 19}, stock: []int64{21, 20, 23}, done: 3, want: false},
	} {
		r := &suiteReport{results: []*scenarioResult{
			withTrials(&scenarioResult{name: "recreate", compared: []string{invOrphanAddress}}, 100, invOrphanAddress, tc.webhook...),
			withTrials(&scenarioResult{name: "recreate-stock", control: true}, 100, invOrphanAddress, tc.stock...),
		}}
		if got := r.wantsTrial("recreate", tc.done); got != tc.want {
			t.Errorf("%s: wantsTrial %v, want %v (%v)", tc.name, got, tc.want,
				compareArms(armOf(r.results[0], invOrphanAddress), armOf(r.results[1], invOrphanAddress)))
		}
		if r.wantsTrial("kills", tc.done) {
			t.Errorf("%s: another scenario's comparison asked kills for a trial", tc.name)
		}
	}
}
