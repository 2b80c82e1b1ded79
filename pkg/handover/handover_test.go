package handover

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

var dataKey = types.NamespacedName{Namespace: "ns", Name: "tmpl-0"}

func metal3Data(token, record string) *infrav1.Metal3Data {
	d := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tmpl-0", UID: "data-uid"}}
	if token != "" {
		d.Annotations = map[string]string{allocation.AdmissionAnnotation: token, allocation.ClaimsAnnotation: record}
	}
	return d
}

func claim(name, token string) *ipamv1.IPClaim {
	return &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "ns", UID: types.UID(name + "-uid"),
		Annotations: map[string]string{allocation.PreallocatedForAnnotation: "tmpl-0", allocation.AdmissionAnnotation: token},
		Finalizers:  []string{infrav1.DataFinalizer},
	}}
}

func newClient(funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	return fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objs...).
		WithIndex(allocation.Metadata(allocation.IPClaimGVK), waitingForIndex, waitingForValue).
		WithIndex(allocation.Metadata(allocation.IPClaimGVK), heldForIndex, heldForValue).
		WithIndex(allocation.Metadata(allocation.IPAddressClaimGVK), waitingForIndex, waitingForValue).
		WithInterceptorFuncs(fixtures.APIServerPatchErrors(funcs)).Build()
}

func ownedBy(t *testing.T, c client.Reader, name string) []metav1.OwnerReference {
	t.Helper()
	got := &ipamv1.IPClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, got); err != nil {
		t.Fatal(err)
	}
	return got.OwnerReferences
}

func TestHandOverController(t *testing.T) {
	failB := interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if obj.GetName() == "tmpl-0-b" {
			return apierrors.NewInternalError(errors.New("etcd is sad"))
		}
		return c.Patch(ctx, obj, patch, opts...)
	}}
	// A replica whose cache still shows the claim as handed over to nobody and without our
	// annotation (another replica's write it has not seen): the patch's test decides, not the cache.
	staleCache := interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		if key.Name == "tmpl-0-a" {
			obj.SetAnnotations(nil)
		}
		return nil
	}}
	for _, tc := range []struct {
		name       string
		admittedBy string
		funcs      interceptor.Funcs
		wantOwned  []string
		wantErr    bool
		wantEvents int
	}{
		{name: "admitted here: every claim at once", admittedBy: "t1", wantOwned: []string{"tmpl-0-a", "tmpl-0-b"}},
		{name: "admitted by another replica: left to it", admittedBy: ""},
		{name: "another admission of the same name: not ours", admittedBy: "t0"},
		{name: "a failing patch is retried, the others are done", admittedBy: "t1", funcs: failB, wantOwned: []string{"tmpl-0-a"}, wantErr: true, wantEvents: 1},
		{name: "a stale cache skips nothing", admittedBy: "t1", funcs: staleCache, wantOwned: []string{"tmpl-0-a", "tmpl-0-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(tc.funcs, metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), claim("tmpl-0-a", "t1"), claim("tmpl-0-b", "t1"))
			recorder := events.NewFakeRecorder(10)
			h := &HandOver{Client: c, APIReader: c, Recorder: recorder, Admissions: &Admissions{TTL: time.Minute}, TakeOverDelay: time.Hour}
			if tc.admittedBy != "" {
				createdHere(h.Admissions, tc.admittedBy, "tmpl-0-a", "tmpl-0-b")
			}
			_, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey})
			if (err != nil) != tc.wantErr {
				t.Fatalf("Reconcile error %v", err)
			}
			for _, name := range []string{"tmpl-0-a", "tmpl-0-b"} {
				owned := len(ownedBy(t, c, name)) == 1
				if want := contains(tc.wantOwned, name); owned != want {
					t.Errorf("%s owned=%v, want %v", name, owned, want)
				}
			}
			if got := len(recorder.Events); got != tc.wantEvents {
				t.Errorf("%d events, want %d", got, tc.wantEvents)
			}
			if _, _, remembered := h.Admissions.claims(dataKey, "t1"); remembered != (tc.admittedBy == "t1" && tc.wantErr) {
				t.Errorf("admission still remembered: %v", remembered)
			}
		})
	}
}

// TestHandOverWaitsForTheIPAM: for an admission made while the IPAM is behind, the claims are
// handed over together once the IPAM has answered every one (the address in its status), or once
// IPAMWait has passed.
func TestHandOverWaitsForTheIPAM(t *testing.T) {
	var h *HandOver
	req := ctrl.Request{NamespacedName: dataKey}
	answer := func(t *testing.T, c client.Client, name string) {
		t.Helper()
		got := &ipamv1.IPClaim{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, got); err != nil {
			t.Fatal(err)
		}
		// The IPAM's finalizer alone is not the answer: its status write follows.
		got.Finalizers = append(got.Finalizers, ipamv1.IPClaimFinalizer)
		if err := c.Update(context.Background(), got); err != nil {
			t.Fatal(err)
		}
		if res, err := h.Reconcile(context.Background(), req); err != nil || res.RequeueAfter == 0 {
			t.Fatalf("%s with the IPAM's finalizer only: %v, %v", name, res, err)
		}
		got.Status.Address = &corev1.ObjectReference{Name: name + "-address"}
		if err := c.Update(context.Background(), got); err != nil {
			t.Fatal(err)
		}
	}
	owned := func(t *testing.T, c client.Reader) []string {
		t.Helper()
		var out []string
		for _, name := range []string{"tmpl-0-a", "tmpl-0-b"} {
			if len(ownedBy(t, c, name)) == 1 {
				out = append(out, name)
			}
		}
		return out
	}

	c := newClient(interceptor.Funcs{}, metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), claim("tmpl-0-a", "t1"), claim("tmpl-0-b", "t1"))
	h = &HandOver{Client: c, Recorder: events.NewFakeRecorder(10), Admissions: &Admissions{TTL: time.Minute}}
	createdHere(h.Admissions, "t1", "tmpl-0-a", "tmpl-0-b")
	h.Admissions.pending[dataKey].answerBy = time.Now().Add(time.Minute)
	for _, step := range []struct {
		answered  string
		wantOwned []string
	}{
		{answered: "", wantOwned: nil},
		{answered: "tmpl-0-a", wantOwned: nil},
		{answered: "tmpl-0-b", wantOwned: []string{"tmpl-0-a", "tmpl-0-b"}},
	} {
		if step.answered != "" {
			answer(t, c, step.answered)
		}
		res, err := h.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got := owned(t, c); !slices.Equal(got, step.wantOwned) {
			t.Errorf("after %q answered: owned %v, want %v", step.answered, got, step.wantOwned)
		}
		if waiting := step.wantOwned == nil; waiting != (res.RequeueAfter > 0 && res.RequeueAfter <= time.Minute) {
			t.Errorf("after %q answered: requeue after %v", step.answered, res.RequeueAfter)
		}
	}

	// The IPAM never answers: handed over once IPAMWait has passed; and at once when the admission
	// came while the IPAM kept up.
	for name, answerBy := range map[string]time.Time{"past IPAMWait": time.Now().Add(-time.Second), "IPAM not behind": {}} {
		c = newClient(interceptor.Funcs{}, metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), claim("tmpl-0-a", "t1"), claim("tmpl-0-b", "t1"))
		h = &HandOver{Client: c, Recorder: events.NewFakeRecorder(10), Admissions: &Admissions{TTL: time.Minute}}
		createdHere(h.Admissions, "t1", "tmpl-0-a", "tmpl-0-b")
		h.Admissions.pending[dataKey].answerBy = answerBy
		if res, err := h.Reconcile(context.Background(), req); err != nil || res.RequeueAfter != 0 {
			t.Fatalf("%s: %v, %v", name, res, err)
		}
		if got := owned(t, c); len(got) != 2 {
			t.Errorf("%s: owned %v, want both", name, got)
		}
	}
}

// TestAnswerWakesTheHandOver: the events of a waiting claim, and the IPAM's answer to it, wake
// the hand-over of the Metal3Data it waits for; the events of a claim handed over, and writes
// other than the answer, do not.
func TestAnswerWakesTheHandOver(t *testing.T) {
	waiting := claim("tmpl-0-a", "t1")
	if got := dataWaitedFor(context.Background(), waiting); len(got) != 1 || got[0].NamespacedName != dataKey {
		t.Errorf("waiting claim mapped to %v", got)
	}
	handed := claim("tmpl-0-a", "t1")
	handed.OwnerReferences = []metav1.OwnerReference{{Name: "tmpl-0", UID: "data-uid"}}
	if got := dataWaitedFor(context.Background(), handed); len(got) != 0 {
		t.Errorf("claim handed over mapped to %v", got)
	}
	if stillWaiting.Generic(event.GenericEvent{Object: handed}) || !stillWaiting.Generic(event.GenericEvent{Object: waiting}) {
		t.Error("stillWaiting passes a claim handed over, or not a waiting one")
	}
	finalized := waiting.DeepCopy()
	finalized.Finalizers = append(finalized.Finalizers, ipamv1.IPClaimFinalizer)
	withAddress := finalized.DeepCopy()
	withAddress.Status.Address = &corev1.ObjectReference{Name: "tmpl-0-a-address"}
	failed := finalized.DeepCopy()
	failed.Status.ErrorMessage = ptr.To("pool exhausted")
	if !answeredNow.Update(event.UpdateEvent{ObjectOld: finalized, ObjectNew: withAddress}) || !answeredNow.Update(event.UpdateEvent{ObjectOld: finalized, ObjectNew: failed}) {
		t.Error("the IPAM's address or error did not pass")
	}
	handedAnswered := withAddress.DeepCopy()
	handedAnswered.OwnerReferences = handed.OwnerReferences
	if answeredNow.Update(event.UpdateEvent{ObjectOld: waiting, ObjectNew: finalized}) || answeredNow.Update(event.UpdateEvent{ObjectOld: withAddress, ObjectNew: withAddress}) ||
		answeredNow.Update(event.UpdateEvent{ObjectOld: finalized, ObjectNew: handedAnswered}) {
		t.Error("a write other than the answer passed")
	}
	if !answeredNow.Create(event.CreateEvent{Object: withAddress}) || answeredNow.Create(event.CreateEvent{Object: waiting}) {
		t.Error("a claim first seen answered must pass, one not answered must not")
	}
	addressClaim := &capipamv1.IPAddressClaim{}
	if allocation.Answered(addressClaim) {
		t.Error("an IPAddressClaim without address passed")
	}
	addressClaim.Status.AddressRef.Name = "tmpl-0-c"
	if !allocation.Answered(addressClaim) {
		t.Error("an IPAddressClaim with its address did not pass")
	}
}

// TestWarningEvent: a warning admission gave is recorded on the Metal3Data once it exists, once.
func TestWarningEvent(t *testing.T) {
	c := newClient(interceptor.Funcs{}, metal3Data("", ""))
	recorder := events.NewFakeRecorder(10)
	h := &HandOver{Client: c, Recorder: recorder, Admissions: &Admissions{TTL: time.Minute}}
	(&Creations{Admissions: h.Admissions}).Admitted(context.Background(), dataKey, "", "", nil, "ip-preallocator: IPClaim tmpl-0-a left to CAPM3: timeout")
	if !h.Admissions.admittedHere(dataKey, "") {
		t.Fatal("a warning is not pending")
	}
	for range 2 {
		if _, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey}); err != nil {
			t.Fatal(err)
		}
	}
	if len(recorder.Events) != 1 {
		t.Fatalf("%d events, want 1", len(recorder.Events))
	}
	if e := <-recorder.Events; !strings.HasPrefix(e, "Warning PreallocationIncomplete") || !strings.Contains(e, "left to CAPM3") {
		t.Errorf("event %q", e)
	}
	if h.Admissions.admittedHere(dataKey, "") {
		t.Error("the admission is still remembered")
	}
}

// TestWarningOfAnotherAdmission: a warning this replica's admission of a name gave, when that
// admission was never stored, is neither pending for nor recorded on the Metal3Data of that name
// another replica admitted.
func TestWarningOfAnotherAdmission(t *testing.T) {
	for name, token := range map[string]string{"admission without claims": "", "admission with claims": "t1"} {
		t.Run(name, func(t *testing.T) {
			c := newClient(interceptor.Funcs{}, metal3Data("t2", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
			recorder := events.NewFakeRecorder(10)
			h := &HandOver{Client: c, Recorder: recorder, Admissions: &Admissions{TTL: time.Minute}}
			h.Admissions.admit(dataKey, &admitted{token: token, dataToken: token, warning: "ip-preallocator: IPClaim tmpl-0-a left to CAPM3: timeout", at: time.Now()})
			if h.Admissions.admittedHere(dataKey, "t2") {
				t.Error("pending for the Metal3Data another replica admitted")
			}
			if _, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey}); err != nil {
				t.Fatal(err)
			}
			if n := len(recorder.Events); n != 0 {
				t.Errorf("%d events on the Metal3Data another replica admitted: %q", n, <-recorder.Events)
			}
		})
	}
}

// TestWarningOnACopiedMetal3Data: a Metal3Data created with the admission token of another
// object (a copy, a restore) and admitted with only a warning gets the warning as an Event.
func TestWarningOnACopiedMetal3Data(t *testing.T) {
	c := newClient(interceptor.Funcs{}, metal3Data("earlier-token", "IPClaim/tmpl-0-a"))
	recorder := events.NewFakeRecorder(10)
	h := &HandOver{Client: c, Recorder: recorder, Admissions: &Admissions{TTL: time.Minute}}
	(&Creations{Admissions: h.Admissions}).Admitted(context.Background(), dataKey, "", "earlier-token", nil, "ip-preallocator: IPClaim tmpl-0-a left to CAPM3: exists and does not belong")
	if !h.Admissions.admittedHere(dataKey, "earlier-token") {
		t.Error("the warning is not pending")
	}
	if _, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey}); err != nil {
		t.Fatal(err)
	}
	if n := len(recorder.Events); n != 1 {
		t.Errorf("%d events, want the warning", n)
	}
}

// createdHere records that this replica's admission token created the IPClaims names for dataKey.
func createdHere(a *Admissions, token string, names ...string) {
	v := &admitted{token: token, dataToken: token, at: time.Now()}
	for _, name := range names {
		v.claims = append(v.claims, allocation.ClaimRef{Kind: allocation.KindIPClaim, Name: name})
	}
	a.admit(dataKey, v)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestRelease(t *testing.T) {
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}}
	newRelease := func(c, live client.Client, grace time.Duration) *Release {
		return &Release{Client: c, APIReader: live, GracePeriod: grace, ClaimGVK: allocation.IPClaimGVK}
	}
	exists := func(c client.Reader) bool {
		err := c.Get(ctx, req.NamespacedName, &ipamv1.IPClaim{})
		return err == nil
	}

	t.Run("waits for the grace period, then releases", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"))
		r := newRelease(c, c, 300*time.Millisecond)
		res, err := r.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("first look: %v %v exists=%v", res, err, exists(c))
		}
		time.Sleep(res.RequeueAfter)
		if _, err := r.Reconcile(ctx, req); err != nil || !exists(c) {
			t.Fatalf("after the grace period: %v exists=%v", err, exists(c))
		}
		// Deleted, never answered by the IPAM: its deletion is the next event, and the claim is
		// kept while an IPAM pass that listed it earlier may still make its IPAddress.
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > strayWait || !exists(c) {
			t.Fatalf("once deleted: %v %v exists=%v", res, err, exists(c))
		}
	})
	t.Run("kept while its Metal3DataClaim waits for data, within the hold limit", func(t *testing.T) {
		planned := claim("tmpl-0-a", "t1")
		planned.Annotations[allocation.DataClaimAnnotation] = "m3m-0"
		planned.Finalizers = append(planned.Finalizers, "ipclaim.ipam.metal3.io")
		dataClaim := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3m-0"}}
		c := newClient(interceptor.Funcs{}, planned, dataClaim)
		r := newRelease(c, c, 0)
		r.HoldLimit = time.Hour
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("while its Metal3DataClaim waits: %v %v exists=%v", res, err, exists(c))
		}
		// CAPM3 created its Metal3Data under another name: the claim is nobody's.
		dataClaim.Status.RenderedData = &infrav1.Metal3ObjectRef{Name: "tmpl-1", Namespace: "ns"}
		if err := c.Update(ctx, dataClaim); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(ctx, req); err != nil || !isDeleting(t, c) {
			t.Fatalf("once its Metal3DataClaim has data: %v", err)
		}

		gone := newClient(interceptor.Funcs{}, planned)
		r = newRelease(gone, gone, 0)
		r.HoldLimit = time.Hour
		if _, err := r.Reconcile(ctx, req); err != nil || !isDeleting(t, gone) {
			t.Fatalf("without its Metal3DataClaim: %v", err)
		}

		waiting := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3m-0"}}
		limited := newClient(interceptor.Funcs{}, planned, waiting)
		r = newRelease(limited, limited, 0)
		r.HoldLimit = 200 * time.Millisecond
		res, err := r.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > r.HoldLimit {
			t.Fatalf("within the hold limit: %v %v", res, err)
		}
		time.Sleep(res.RequeueAfter)
		if _, err := r.Reconcile(ctx, req); err != nil || !isDeleting(t, limited) {
			t.Fatalf("after the hold limit: %v", err)
		}
	})
	t.Run("kept until the IPAM answered it, within the hold limit", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"))
		r := newRelease(c, c, 0)
		r.HoldLimit = time.Hour
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || isDeleting(t, c) {
			t.Fatalf("unanswered: %v %v", res, err)
		}
		answered := &ipamv1.IPClaim{}
		if err := c.Get(ctx, req.NamespacedName, answered); err != nil {
			t.Fatal(err)
		}
		answered.Finalizers = append(answered.Finalizers, "ipclaim.ipam.metal3.io")
		if err := c.Update(ctx, answered); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(ctx, req); err != nil || !isDeleting(t, c) {
			t.Fatalf("answered: %v", err)
		}
	})
	t.Run("kept while another claim of its pool waits for the IPAM, within the hold limit", func(t *testing.T) {
		answered := claim("tmpl-0-a", "t1")
		answered.Finalizers = append(answered.Finalizers, "ipclaim.ipam.metal3.io")
		answered.Spec.Pool.Name = "provisioning"
		other := func(name, pool string) *ipamv1.IPClaim {
			c := &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
			c.Spec.Pool.Name = pool
			return c
		}
		otherPool := other("tmpl-1-b", "baremetal")
		given := other("tmpl-2-a", "provisioning")
		given.Status.Address = &corev1.ObjectReference{Name: "provisioning-10-0-0-2"}
		failed := other("tmpl-3-a", "provisioning")
		failed.Status.ErrorMessage = ptr.To("Exhausted IP Pools")
		leaving := other("tmpl-4-a", "provisioning")
		leaving.Finalizers = []string{"ipclaim.ipam.metal3.io"}
		leaving.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		quiet := newClient(interceptor.Funcs{}, answered.DeepCopy(), otherPool, given, failed, leaving)
		r := newRelease(quiet, quiet, 0)
		r.HoldLimit = time.Hour
		if _, err := r.Reconcile(ctx, req); err != nil || !isDeleting(t, quiet) {
			t.Fatalf("unanswered claims only in other pools, or being deleted: %v", err)
		}

		pending := other("tmpl-5-a", "provisioning")
		busy := newClient(interceptor.Funcs{}, answered.DeepCopy(), pending)
		r = newRelease(busy, busy, 0)
		r.HoldLimit = time.Hour
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter != poolRecheck || isDeleting(t, busy) {
			t.Fatalf("while another claim of its pool waits: %v %v", res, err)
		}
		pending.Status.Address = &corev1.ObjectReference{Name: "provisioning-10-0-0-5"}
		if err := busy.Update(ctx, pending); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(ctx, req); err != nil || !isDeleting(t, busy) {
			t.Fatalf("once it is answered: %v", err)
		}

		// Deleted by someone else: CAPM3's finalizer, whose removal lets the IPAM free the
		// address, stays while the pool is busy, within the hold limit.
		deleted := answered.DeepCopy()
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-time.Minute)}
		deletedBusy := newClient(interceptor.Funcs{}, deleted, other("tmpl-5-a", "provisioning"))
		r = newRelease(deletedBusy, deletedBusy, 0)
		r.HoldLimit = time.Hour
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter != poolRecheck || !slices.Contains(finalizersOf(t, deletedBusy), infrav1.DataFinalizer) {
			t.Fatalf("deleted while its pool is busy: %v %v", res, err)
		}
		r.HoldLimit = time.Minute
		if _, err := r.Reconcile(ctx, req); err != nil || slices.Contains(finalizersOf(t, deletedBusy), infrav1.DataFinalizer) {
			t.Fatalf("deleted, past the hold limit: %v", err)
		}
	})
	t.Run("a reclaimed claim starts its grace period again", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"))
		r := newRelease(c, c, 300*time.Millisecond)
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		obj := &ipamv1.IPClaim{}
		if err := c.Get(ctx, req.NamespacedName, obj); err != nil {
			t.Fatal(err)
		}
		obj.SetGroupVersionKind(allocation.IPClaimGVK)
		if err := allocation.Reclaim(ctx, c, obj, "t2", ""); err != nil {
			t.Fatal(err)
		}
		res, err := r.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter < 200*time.Millisecond || !exists(c) {
			t.Fatalf("after a reclaim: %v %v exists=%v", res, err, exists(c))
		}
	})
	t.Run("a Metal3Data the cache has not seen yet keeps its claim", func(t *testing.T) {
		live := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("t1", "IPClaim/tmpl-0-a"))
		behind := newClient(interceptor.Funcs{Get: func(ctx context.Context, _ client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if key.Name == "tmpl-0" {
				return apierrors.NewNotFound(infrav1.GroupVersion.WithResource("metal3datas").GroupResource(), key.Name)
			}
			return live.Get(ctx, key, obj, opts...)
		}})
		if _, err := newRelease(behind, live, 0).Reconcile(ctx, req); err != nil || !exists(live) || len(ownedBy(t, live, "tmpl-0-a")) != 0 {
			t.Fatalf("err=%v exists=%v", err, exists(live))
		}
	})
	t.Run("the leader hands nothing over", func(t *testing.T) {
		stored := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("", ""))
		if res, err := newRelease(stored, stored, time.Hour).Reconcile(ctx, req); err != nil || res.RequeueAfter != time.Hour ||
			len(ownedBy(t, stored, "tmpl-0-a")) != 0 {
			t.Fatalf("leader on a stored Metal3Data: %v %v owners=%v", res, err, ownedBy(t, stored, "tmpl-0-a"))
		}
	})
	t.Run("with the IPAM's finalizer on it, once no pass may allocate for it: the IPAM frees the address only after", func(t *testing.T) {
		withIPAM := claim("tmpl-0-a", "t1")
		withIPAM.Finalizers = append(withIPAM.Finalizers, "ipclaim.ipam.metal3.io")
		withIPAM.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-strayWait)}
		c := newClient(interceptor.Funcs{}, withIPAM)
		r := newRelease(c, c, time.Hour)
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		got := &ipamv1.IPClaim{}
		if err := c.Get(ctx, req.NamespacedName, got); err != nil || !slices.Equal(got.Finalizers, []string{"ipclaim.ipam.metal3.io"}) {
			t.Fatalf("finalizers %v, %v", got.Finalizers, err)
		}
	})
	t.Run("a waiting claim being deleted loses CAPM3's finalizer", func(t *testing.T) {
		deleted := claim("tmpl-0-a", "t1")
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-strayWait)}
		c := newClient(interceptor.Funcs{}, deleted, metal3Data("t1", "IPClaim/tmpl-0-a"))
		if _, err := newRelease(c, c, time.Hour).Reconcile(ctx, req); err != nil || exists(c) {
			t.Fatalf("err=%v exists=%v", err, exists(c))
		}
	})
	t.Run("a waiting claim being deleted with two IPAddresses: both released, the IPAM would free one", func(t *testing.T) {
		deleted := claim("tmpl-0-a", "t1")
		deleted.UID = "claim-uid"
		deleted.Finalizers = append(deleted.Finalizers, "ipclaim.ipam.metal3.io")
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-strayWait)}
		var addresses []client.Object
		for _, name := range []string{"pool-10-0-0-1", "pool-10-0-0-2"} {
			addresses = append(addresses, &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{
				Namespace: "ns", Name: name, UID: types.UID(name), Finalizers: []string{ipamv1.IPAddressFinalizer},
				OwnerReferences: []metav1.OwnerReference{{Kind: "IPClaim", Name: "tmpl-0-a", UID: "claim-uid"}},
			}})
		}
		c := newClient(interceptor.Funcs{}, append(addresses, deleted)...)
		if res, err := newRelease(c, c, time.Hour).Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("first look: %v %v exists=%v", res, err, exists(c))
		}
		for _, a := range addresses {
			if err := c.Get(ctx, client.ObjectKeyFromObject(a), &ipamv1.IPAddress{}); !apierrors.IsNotFound(err) {
				t.Errorf("IPAddress %s is still there: %v", a.GetName(), err)
			}
		}
	})
	t.Run("a waiting claim being deleted, never answered, is kept, and its stray IPAddress released", func(t *testing.T) {
		deleted := claim("tmpl-0-a", "t1")
		deleted.UID = "claim-uid"
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		stray := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "pool-10-0-0-1", UID: "address-uid", Finalizers: []string{ipamv1.IPAddressFinalizer},
			OwnerReferences: []metav1.OwnerReference{{Kind: "IPClaim", Name: "tmpl-0-a", UID: "claim-uid"}},
		}}
		c := newClient(interceptor.Funcs{}, deleted, stray)
		r := newRelease(c, c, time.Hour)
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("first look: %v %v exists=%v", res, err, exists(c))
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(stray), &ipamv1.IPAddress{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the stray IPAddress is still there: %v", err)
		}
	})
}

// TestTakeOver: every replica hands over what the admitting replica did not: at once when the
// Metal3Data does not record the claim, after the take-over delay when it does.
func TestTakeOver(t *testing.T) {
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: dataKey}
	newHandOver := func(c client.Client, delay time.Duration) *HandOver {
		return &HandOver{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(10), Admissions: &Admissions{TTL: time.Minute}, TakeOverDelay: delay}
	}
	t.Run("a lost admission response: handed over at once", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("", ""))
		if _, err := newHandOver(c, time.Hour).Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		if owners := ownedBy(t, c, "tmpl-0-a"); len(owners) != 1 || owners[0].UID != "data-uid" {
			t.Fatalf("owners %v", owners)
		}
		got := &ipamv1.IPClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, got); err != nil || len(got.Annotations) != 0 {
			t.Fatalf("annotations left on the claim handed over: %v %v", got.Annotations, err)
		}
	})
	t.Run("a claim reclaimed by a later admission: handed over at once, the recorded ones after the delay", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t2"), claim("tmpl-0-b", "t1"), metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
		h := newHandOver(c, time.Hour)
		res, err := h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || len(ownedBy(t, c, "tmpl-0-a")) != 1 || len(ownedBy(t, c, "tmpl-0-b")) != 0 {
			t.Fatalf("unrecorded at once, recorded within the delay: %v %v", res, err)
		}
	})
	t.Run("recorded and unanswered: the take-over waits for the IPAM to answer every claim, within IPAMWait", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), claim("tmpl-0-b", "t1"),
			metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
		h := newHandOver(c, 0)
		h.IPAMWait = time.Hour
		res, err := h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > h.IPAMWait || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("unanswered: %v %v owners=%v", res, err, ownedBy(t, c, "tmpl-0-a"))
		}
		answer := func(name string, address bool) {
			t.Helper()
			answering := &ipamv1.IPClaim{}
			if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, answering); err != nil {
				t.Fatal(err)
			}
			answering.Finalizers = append(answering.Finalizers, "ipclaim.ipam.metal3.io")
			if address {
				answering.Status.Address = &corev1.ObjectReference{Name: name + "-address"}
			}
			if err := c.Update(ctx, answering); err != nil {
				t.Fatal(err)
			}
		}
		// The IPAM's finalizer is not its answer: CAPM3 reads the status.
		answer("tmpl-0-a", false)
		if res, err := h.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("finalizer only: %v %v", res, err)
		}
		// Handed over alone, it would wake CAPM3 to find its sibling unusable.
		answer("tmpl-0-a", true)
		if res, err := h.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("one of two answered: %v %v", res, err)
		}
		answer("tmpl-0-b", true)
		// Answered after a wait: the admitting replica, woken by the same answer, goes first.
		res, err = h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > answerGrace || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("all answered, within the grace: %v %v", res, err)
		}
		time.Sleep(res.RequeueAfter)
		if _, err := h.Reconcile(ctx, req); err != nil || len(ownedBy(t, c, "tmpl-0-a")) != 1 || len(ownedBy(t, c, "tmpl-0-b")) != 1 {
			t.Fatalf("all answered: %v owners=%v %v", err, ownedBy(t, c, "tmpl-0-a"), ownedBy(t, c, "tmpl-0-b"))
		}

		// A recorded claim never created, and one answered before the take-over delay ended: no
		// wait.
		c = newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-c"))
		answer("tmpl-0-a", true)
		h = newHandOver(c, 0)
		h.IPAMWait = time.Hour
		if _, err := h.Reconcile(ctx, req); err != nil || len(ownedBy(t, c, "tmpl-0-a")) != 1 {
			t.Fatalf("a recorded claim missing: %v owners=%v", err, ownedBy(t, c, "tmpl-0-a"))
		}

		// An IPAM that never answers delays the take-over by IPAMWait at most.
		c = newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("t1", "IPClaim/tmpl-0-a"))
		h = newHandOver(c, 0)
		h.IPAMWait = 200 * time.Millisecond
		res, err = h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("unanswered, short wait: %v %v", res, err)
		}
		time.Sleep(res.RequeueAfter)
		if _, err := h.Reconcile(ctx, req); err != nil || len(ownedBy(t, c, "tmpl-0-a")) != 1 {
			t.Fatalf("after IPAMWait: %v owners=%v", err, ownedBy(t, c, "tmpl-0-a"))
		}
	})
	t.Run("recorded by an admission of this replica still being created: left to it", func(t *testing.T) {
		c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("t1", "IPClaim/tmpl-0-a"))
		h := newHandOver(c, 0)
		createdHere(h.Admissions, "t1", "tmpl-0-a")
		h.Admissions.pending[dataKey].creating = true
		if res, err := h.Reconcile(ctx, req); err != nil || res.RequeueAfter != 0 || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("admitted here, creating: %v %v owners=%v", res, err, ownedBy(t, c, "tmpl-0-a"))
		}
		h.Admissions.done(dataKey, "t1")
		if _, err := h.Reconcile(ctx, req); err != nil || len(ownedBy(t, c, "tmpl-0-a")) != 1 {
			t.Fatalf("no longer pending here: %v owners=%v", err, ownedBy(t, c, "tmpl-0-a"))
		}
	})
	t.Run("recorded: left to the admitting replica, then taken over, unanswered, when IPAMWait is within the delay", func(t *testing.T) {
		for _, ipamWait := range []time.Duration{0, 200 * time.Millisecond} {
			c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), metal3Data("t1", "IPClaim/tmpl-0-a"))
			h := newHandOver(c, 200*time.Millisecond)
			h.IPAMWait = ipamWait
			res, err := h.Reconcile(ctx, req)
			if err != nil || res.RequeueAfter <= 0 || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
				t.Fatalf("IPAMWait %v, first look: %v %v", ipamWait, res, err)
			}
			time.Sleep(res.RequeueAfter)
			if _, err := h.Reconcile(ctx, req); err != nil || len(ownedBy(t, c, "tmpl-0-a")) != 1 {
				t.Fatalf("IPAMWait %v, take-over: %v owners=%v", ipamWait, err, ownedBy(t, c, "tmpl-0-a"))
			}
		}
	})
	t.Run("nothing handed over for a Metal3Data never stored, nor a claim being deleted", func(t *testing.T) {
		never := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"))
		if _, err := newHandOver(never, 0).Reconcile(ctx, req); err != nil || len(ownedBy(t, never, "tmpl-0-a")) != 0 {
			t.Fatalf("a Metal3Data never stored: %v", err)
		}
		deleted := claim("tmpl-0-a", "")
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		c := newClient(interceptor.Funcs{}, deleted, metal3Data("", ""))
		if _, err := newHandOver(c, 0).Reconcile(ctx, req); err != nil || len(ownedBy(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("a waiting claim being deleted: %v", err)
		}
	})
}

// finalizersOf are the finalizers of the claim tmpl-0-a.
func finalizersOf(t *testing.T, c client.Reader) []string {
	t.Helper()
	got := &ipamv1.IPClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, got); err != nil {
		t.Fatal(err)
	}
	return got.Finalizers
}

// isDeleting tells whether the claim tmpl-0-a was released: deleted, kept by CAPM3's finalizer.
func isDeleting(t *testing.T, c client.Reader) bool {
	t.Helper()
	got := &ipamv1.IPClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, got); err != nil {
		return apierrors.IsNotFound(err)
	}
	return !got.DeletionTimestamp.IsZero()
}

func TestClaimsHeldFor(t *testing.T) {
	held := claim("tmpl-0-a", "t1")
	held.Annotations[allocation.DataClaimAnnotation] = "m3m-0"
	handed := claim("tmpl-0-c", "t1")
	handed.Annotations[allocation.DataClaimAnnotation] = "m3m-0"
	handed.OwnerReferences = []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
	c := newClient(interceptor.Funcs{}, held, handed, claim("tmpl-0-b", "t1"))
	r := &Release{Client: c, ClaimGVK: allocation.IPClaimGVK}
	dataClaim := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3m-0"}}
	if reqs := r.claimsHeldFor(context.Background(), dataClaim); len(reqs) != 1 || reqs[0].Name != "tmpl-0-a" {
		t.Fatalf("requests %v", reqs)
	}
}

func TestClaimsWaitingFor(t *testing.T) {
	handed := claim("tmpl-0-c", "t1")
	handed.OwnerReferences = []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
	other := claim("tmpl-1-a", "t9")
	other.Annotations[allocation.PreallocatedForAnnotation] = "tmpl-1"
	c := newClient(interceptor.Funcs{}, claim("tmpl-0-a", "t1"), claim("tmpl-0-b", "t1"), handed, other)
	r := &Release{Client: c, ClaimGVK: allocation.IPClaimGVK}
	reqs := r.claimsWaitingFor(context.Background(), metal3Data("", ""))
	if len(reqs) != 2 || reqs[0].Name == "tmpl-0-c" || reqs[1].Name == "tmpl-0-c" {
		t.Fatalf("requests %v", reqs)
	}
}

// TestOrphanFinished: a handed-over claim being deleted after its Metal3Data is gone (deleted
// before CAPM3 ever reconciled it) loses CAPM3's finalizer; while the Metal3Data exists it is
// left to CAPM3.
func TestOrphanFinished(t *testing.T) {
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}}
	for _, tc := range []struct {
		name     string
		wantGone bool
	}{
		{name: "Metal3Data gone", wantGone: true},
		{name: "Metal3Data still there"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owned := claim("tmpl-0-a", "t1")
			owned.Annotations = nil
			owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
			objs := []client.Object{owned}
			if !tc.wantGone {
				objs = append(objs, metal3Data("", ""))
			}
			c := newClient(interceptor.Funcs{}, objs...)
			if err := c.Delete(ctx, owned); err != nil {
				t.Fatal(err)
			}
			r := &Release{Client: c, APIReader: c, GracePeriod: time.Hour, ClaimGVK: allocation.IPClaimGVK}
			res, err := r.Reconcile(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			gone := apierrors.IsNotFound(c.Get(ctx, req.NamespacedName, &ipamv1.IPClaim{}))
			if gone != tc.wantGone || !tc.wantGone && res.RequeueAfter <= 0 {
				t.Errorf("gone=%v requeue=%v", gone, res.RequeueAfter)
			}
		})
	}
}

func TestAnsweredNow(t *testing.T) {
	unanswered := claim("tmpl-0-a", "t1")
	answered := unanswered.DeepCopy()
	answered.Status.Address = &corev1.ObjectReference{Name: "tmpl-0-a-address"}
	owned := answered.DeepCopy()
	delete(owned.Annotations, allocation.PreallocatedForAnnotation)
	owned.OwnerReferences = []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
	ownedBefore := unanswered.DeepCopy()
	ownedBefore.Annotations, ownedBefore.OwnerReferences = owned.Annotations, owned.OwnerReferences
	for _, tc := range []struct {
		name     string
		old, new *ipamv1.IPClaim
		want     bool
	}{
		{name: "a waiting claim answered", old: unanswered, new: answered, want: true},
		{name: "a waiting claim's other write", old: unanswered, new: unanswered, want: false},
		{name: "an answered claim's later write", old: answered, new: answered, want: false},
		{name: "an owned claim answered", old: ownedBefore, new: owned, want: false},
	} {
		if got := answeredNow.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
