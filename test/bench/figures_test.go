package main

import (
	"math"
	"reflect"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

func auditUser(name string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: name}
}

// The figures below need no control plane: they check how the report turns runs into ratios,
// noise and reconcile causes.

func TestModesAlternateEveryRepetition(t *testing.T) {
	got := modes(0, 3, false)
	want := []slot{{modeStock, 0}, {modePreallocated, 0}, {modePreallocated, 1}, {modeStock, 1}, {modeStock, 2}, {modePreallocated, 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modes(0, 3, false) = %v, want %v", got, want)
	}
	if got := modes(1, 1, false); !reflect.DeepEqual(got, []slot{{modePreallocated, 0}, {modeStock, 0}}) {
		t.Errorf("modes(1, 1, false) = %v", got)
	}
	got = modes(0, 3, true)
	want = []slot{{modeStock, 0}, {modePreallocated, 0}, {modeNoOp, 0}, {modePreallocated, 1}, {modeNoOp, 1}, {modeStock, 1},
		{modeNoOp, 2}, {modeStock, 2}, {modePreallocated, 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modes(0, 3, true) = %v, want %v", got, want)
	}
}

func TestSummarizeNearestRank(t *testing.T) {
	s := summarize([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	want := Summary{P50: 5, P95: 10, P99: 10, Max: 10, Mean: 5.5}
	if s != want {
		t.Errorf("summarize = %+v, want %+v", s, want)
	}
	if s := summarize(nil); s != (Summary{}) {
		t.Errorf("summarize(nil) = %+v", s)
	}
}

func TestCompareRatiosAndNoise(t *testing.T) {
	run := func(mode string, repeat int, total float64) *Run {
		return &Run{Setting: "raised-limits", Scenario: "burst", Mode: mode, Repeat: repeat, N: 10, Total: total,
			Ready: Summary{Mean: total / 2}, Requests: map[string]map[string]float64{"capm3": {"get secrets": 2}}}
	}
	stock := []*Run{run(modeStock, 0, 10), run(modeStock, 1, 12), run(modeStock, 2, 8)}
	pre := []*Run{run(modePreallocated, 0, 11), run(modePreallocated, 1, 12), run(modePreallocated, 2, 10)}
	q := compare(stock, pre)
	total := q.Ratio(ratioTotal)
	wantValues := []float64{1.1, 1, 1.25}
	for i, v := range wantValues {
		if math.Abs(total.Values[i]-v) > 1e-9 {
			t.Fatalf("total ratios %v, want %v", total.Values, wantValues)
		}
	}
	mean := (1.1 + 1 + 1.25) / 3
	sq := func(x float64) float64 { return x * x }
	sd := math.Sqrt((sq(1.1-mean) + sq(1-mean) + sq(1.25-mean)) / 2)
	if math.Abs(total.Mean-mean) > 1e-9 || math.Abs(total.StdDev-sd) > 1e-9 || total.Min != 1 || total.Max != 1.25 {
		t.Errorf("total ratio %+v, want mean %.4f sd %.4f min 1 max 1.25", total, mean, sd)
	}
	if q.Total != total.Mean || q.Repetitions != 3 {
		t.Errorf("comparison total %v repetitions %d", q.Total, q.Repetitions)
	}
	// Noise: stock's totals 8–12 around 10 (0.4), preallocated's 10–12 around 11 (0.18).
	if math.Abs(q.NoiseTotal-0.4) > 1e-9 {
		t.Errorf("noise %.4f, want 0.40", q.NoiseTotal)
	}
	if r := q.Ratio("CAPM3 Secret GETs per Metal3Data"); r.Mean != 1 || r.StdDev != 0 {
		t.Errorf("Secret GETs ratio %+v", r)
	}
	// A figure stock does not have (no kill) gives no ratio, not a division by zero.
	if r := q.Ratio("their max"); len(r.Values) != 0 {
		t.Errorf("after-kill ratio %+v", r)
	}
}

func TestWebhookCostsFromInterleavedNoOp(t *testing.T) {
	r := &Report{}
	for repeat, totals := range [][3]float64{{10, 12, 11}, {10, 11, 11}} {
		for i, mode := range []string{modeStock, modePreallocated, modeNoOp} {
			r.Runs = append(r.Runs, &Run{Setting: "raised-limits", Scenario: "burst", Mode: mode, Repeat: repeat, N: 1, Total: totals[i]})
		}
	}
	r.Runs = append(r.Runs, &Run{Setting: "raised-limits", Scenario: "burst-spread", Mode: modeStock, N: 1, Total: 1},
		&Run{Setting: "raised-limits", Scenario: "burst-spread", Mode: modePreallocated, N: 1, Total: 1})
	r.finish()
	if len(r.Comparisons) != 2 || len(r.WebhookCosts) != 2 {
		t.Fatalf("%d comparisons and %d webhook costs, want 2 and 2 (no-op in one scenario)", len(r.Comparisons), len(r.WebhookCosts))
	}
	webhook, preallocation := r.WebhookCosts[0], r.WebhookCosts[1]
	if webhook.Of != modeNoOp || webhook.Over != modeStock || math.Abs(webhook.Total-1.1) > 1e-9 {
		t.Errorf("no-op over stock: %s/%s total %.3f, want 1.10", webhook.Of, webhook.Over, webhook.Total)
	}
	want := (12.0/11 + 1) / 2
	if preallocation.Of != modePreallocated || preallocation.Over != modeNoOp || math.Abs(preallocation.Total-want) > 1e-9 {
		t.Errorf("preallocated over no-op: %s/%s total %.3f, want %.3f", preallocation.Of, preallocation.Over, preallocation.Total, want)
	}
	// The speed check judges the burst over the no-op webhook that ran beside it, the other over stock.
	if len(r.Paired) != 2 || r.Paired[0].Over != modeNoOp || r.Paired[1].Over != modeStock {
		t.Fatalf("verdicts %+v, want the burst over the no-op webhook and burst-spread over stock", r.Paired)
	}
	if p := r.Paired[0]; math.Abs(p.Ratios[0]-12.0/11) > 1e-9 || p.Ceiling != ceiling {
		t.Errorf("burst judged on %v with ceiling %.2f, want the ratios over the no-op webhook and %.2f", p.Ratios, p.Ceiling, ceiling)
	}
}

func auditWrite(at time.Time, verb, resource, sub, name, user, agent string) harness.AuditEvent {
	return harness.AuditEvent{
		Verb: verb, Stage: auditv1.StageResponseComplete, UserAgent: agent,
		ObjectRef:      &auditv1.ObjectReference{Resource: resource, Subresource: sub, Namespace: "ns", Name: name},
		ResponseStatus: &metav1.Status{Code: 200},
		StageTimestamp: metav1.NewMicroTime(at),
		User:           auditUser(user),
	}
}

func TestWakingWritesFollowOwnership(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const webhook = "system:serviceaccount:ip-preallocator-system:"
	claim := "d-0-" + "provisioning"
	events := []harness.AuditEvent{
		// Preallocated: the webhook creates the claim, the IPAM writes it before the hand-over.
		auditWrite(at(1), "create", "ipclaims", "", claim, webhook+"sa", "webhook"),
		auditWrite(at(2), "patch", "ipclaims", "status", claim, "admin", "ip-address-manager/v1"),
		auditWrite(at(3), "create", "metal3datas", "", "d-0", "admin", "cluster-api-provider-metal3-manager/v1"),
		auditWrite(at(5), "patch", "ipclaims", "", claim, webhook+"sa", "webhook"),
		auditWrite(at(6), "patch", "ipclaims", "status", claim, "admin", "ip-address-manager/v1"),
		auditWrite(at(7), "get", "ipclaims", "", claim, "admin", "ip-address-manager/v1"),
	}
	got := wakingWrites(events, webhook)["d-0"]
	var causes []string
	for _, w := range got {
		causes = append(causes, w.cause)
	}
	want := []string{"Metal3Data: created (template controller)", "IPClaim: webhook patch (hand-over)", "IPClaim: metal3-ipam patch status"}
	if !reflect.DeepEqual(causes, want) {
		t.Errorf("causes %q, want %q", causes, want)
	}
}

func TestRecordCausesByWindow(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const capm3 = "cluster-api-provider-metal3-manager/v1"
	events := []harness.AuditEvent{
		auditWrite(at(0), "create", "metal3datas", "", "d-0", "admin", capm3),
		auditWrite(at(12), "create", "ipclaims", "", "d-0-provisioning", "admin", capm3),
		auditWrite(at(13), "patch", "ipclaims", "", "d-0-provisioning", "admin", "ip-address-manager/v1"),
		auditWrite(at(14), "patch", "ipclaims", "status", "d-0-provisioning", "admin", "ip-address-manager/v1"),
		auditWrite(at(30), "patch", "metal3datas", "status", "d-0", "admin", capm3),
	}
	key := types.NamespacedName{Namespace: "ns", Name: "d-0"}
	// Reconciles at 10 (after the create), 20 (the claim create at 12 came first, the IPAM's
	// writes merged into it), 40 (the status write at 30), 5 s later (asked by the one at 40).
	st := stack.Stats{Starts: []time.Time{at(10), at(20), at(40), at(5040), at(6000)}, History: "WP,.."}
	run := &Run{N: 1}
	recordCauses(run, []types.NamespacedName{key}, func(types.NamespacedName) stack.Stats { return st }, events, "system:serviceaccount:x:")
	want := map[string]float64{
		"Metal3Data: created (template controller)": 1,
		"IPClaim: capm3 create":                     1,
		"Metal3Data: capm3 patch status":            1,
		causeRequeue:                                1,
		causeUnexplained:                            1,
	}
	if !reflect.DeepEqual(run.Causes, want) {
		t.Errorf("causes %v, want %v", run.Causes, want)
	}
}
