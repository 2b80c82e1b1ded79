package handover

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metal3-community/ip-preallocator/pkg/clock"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/answers"
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
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/metal3-community/ip-preallocator/internal/controllertest"
)

var dataKey = controllertest.DataKey

// setAnswerBy makes the hand-over of dataKey's admission wait for the IPAM until answerBy.
func setAnswerBy(a *Admissions, answerBy time.Time) {
	a.records.Update(dataKey, func(v admitted, found bool) (admitted, bool) {
		v.answerBy = answerBy
		return v, found
	})
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
			c := controllertest.IndexedClient(tc.funcs, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.WaitingClaim("tmpl-0-b", "t1"))
			recorder := events.NewFakeRecorder(10)
			h := &HandOver{Client: c, APIReader: c, Recorder: recorder, Admissions: NewAdmissions(time.Minute), TakeOverDelay: time.Hour}
			if tc.admittedBy != "" {
				createdHere(h.Admissions, tc.admittedBy, "tmpl-0-a", "tmpl-0-b")
			}
			_, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey})
			if (err != nil) != tc.wantErr {
				t.Fatalf("Reconcile error %v", err)
			}
			for _, name := range []string{"tmpl-0-a", "tmpl-0-b"} {
				owned := len(controllertest.OwnersOf(t, c, name)) == 1
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
			if len(controllertest.OwnersOf(t, c, name)) == 1 {
				out = append(out, name)
			}
		}
		return out
	}

	c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.WaitingClaim("tmpl-0-b", "t1"))
	h = &HandOver{Client: c, Recorder: events.NewFakeRecorder(10), Admissions: NewAdmissions(time.Minute), Answers: answers.NewWatcher(c)}
	createdHere(h.Admissions, "t1", "tmpl-0-a", "tmpl-0-b")
	setAnswerBy(h.Admissions, time.Now().Add(time.Minute))
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
		c = controllertest.IndexedClient(interceptor.Funcs{}, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.WaitingClaim("tmpl-0-b", "t1"))
		h = &HandOver{Client: c, Recorder: events.NewFakeRecorder(10), Admissions: NewAdmissions(time.Minute), Answers: answers.NewWatcher(c)}
		createdHere(h.Admissions, "t1", "tmpl-0-a", "tmpl-0-b")
		setAnswerBy(h.Admissions, answerBy)
		if res, err := h.Reconcile(context.Background(), req); err != nil || res.RequeueAfter != 0 {
			t.Fatalf("%s: %v, %v", name, res, err)
		}
		if got := owned(t, c); len(got) != 2 {
			t.Errorf("%s: owned %v, want both", name, got)
		}
	}
}

// TestAnswerWakesTheHandOver: the events of a waiting claim, the IPAM's answer to it among them,
// wake the hand-over of the Metal3Data it waits for; the events of a claim handed over do not.
func TestAnswerWakesTheHandOver(t *testing.T) {
	waiting := controllertest.WaitingClaim("tmpl-0-a", "t1")
	if got := dataWaitedFor(context.Background(), waiting); len(got) != 1 || got[0].NamespacedName != dataKey {
		t.Errorf("waiting claim mapped to %v", got)
	}
	handed := controllertest.WaitingClaim("tmpl-0-a", "t1")
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
	if !stillWaiting.Update(event.UpdateEvent{ObjectOld: finalized, ObjectNew: withAddress}) || !stillWaiting.Update(event.UpdateEvent{ObjectOld: finalized, ObjectNew: failed}) {
		t.Error("the IPAM's address or error did not pass")
	}
	handedAnswered := withAddress.DeepCopy()
	handedAnswered.OwnerReferences = handed.OwnerReferences
	if stillWaiting.Update(event.UpdateEvent{ObjectOld: finalized, ObjectNew: handedAnswered}) {
		t.Error("a claim handed over passed")
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
	c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.Metal3Data("", ""))
	recorder := events.NewFakeRecorder(10)
	h := &HandOver{Client: c, Recorder: recorder, Admissions: NewAdmissions(time.Minute)}
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
			c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.Metal3Data("t2", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
			recorder := events.NewFakeRecorder(10)
			h := &HandOver{Client: c, Recorder: recorder, Admissions: NewAdmissions(time.Minute)}
			h.Admissions.admit(dataKey, admitted{token: token, dataToken: token, warning: "ip-preallocator: IPClaim tmpl-0-a left to CAPM3: timeout"})
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
	c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.Metal3Data("earlier-token", "IPClaim/tmpl-0-a"))
	recorder := events.NewFakeRecorder(10)
	h := &HandOver{Client: c, Recorder: recorder, Admissions: NewAdmissions(time.Minute)}
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
	v := admitted{token: token, dataToken: token}
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

func TestTakeOver(t *testing.T) {
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: dataKey}
	newHandOver := func(c client.Client, delay time.Duration) *HandOver {
		return &HandOver{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(10), Admissions: NewAdmissions(time.Minute), TakeOverDelay: delay, Answers: answers.NewWatcher(c)}
	}
	t.Run("a lost admission response: handed over at once", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("", ""))
		if _, err := newHandOver(c, time.Hour).Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		if owners := controllertest.OwnersOf(t, c, "tmpl-0-a"); len(owners) != 1 || owners[0].UID != "data-uid" {
			t.Fatalf("owners %v", owners)
		}
		got := &ipamv1.IPClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, got); err != nil || len(got.Annotations) != 0 {
			t.Fatalf("annotations left on the claim handed over: %v %v", got.Annotations, err)
		}
	})
	t.Run("a claim reclaimed by a later admission: handed over at once, the recorded ones after the delay", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t2"), controllertest.WaitingClaim("tmpl-0-b", "t1"), controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
		h := newHandOver(c, time.Hour)
		res, err := h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 1 || len(controllertest.OwnersOf(t, c, "tmpl-0-b")) != 0 {
			t.Fatalf("unrecorded at once, recorded within the delay: %v %v", res, err)
		}
	})
	t.Run("recorded and unanswered: the take-over waits for the IPAM to answer every claim, within IPAMWait", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.WaitingClaim("tmpl-0-b", "t1"),
			controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
		h := newHandOver(c, 0)
		h.IPAMWait = time.Hour
		res, err := h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > h.IPAMWait || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("unanswered: %v %v owners=%v", res, err, controllertest.OwnersOf(t, c, "tmpl-0-a"))
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
		if res, err := h.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("finalizer only: %v %v", res, err)
		}
		// Handed over alone, it would wake CAPM3 to find its sibling unusable.
		answer("tmpl-0-a", true)
		if res, err := h.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("one of two answered: %v %v", res, err)
		}
		answer("tmpl-0-b", true)
		// Answered after a wait: the admitting replica, woken by the same answer, goes first.
		res, err = h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > clock.AnswerGrace || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("all answered, within the grace: %v %v", res, err)
		}
		time.Sleep(res.RequeueAfter)
		if _, err := h.Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 1 || len(controllertest.OwnersOf(t, c, "tmpl-0-b")) != 1 {
			t.Fatalf("all answered: %v owners=%v %v", err, controllertest.OwnersOf(t, c, "tmpl-0-a"), controllertest.OwnersOf(t, c, "tmpl-0-b"))
		}

		// A recorded claim never created, and one answered before the take-over delay ended: no
		// wait.
		c = controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-c"))
		answer("tmpl-0-a", true)
		h = newHandOver(c, 0)
		h.IPAMWait = time.Hour
		if _, err := h.Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 1 {
			t.Fatalf("a recorded claim missing: %v owners=%v", err, controllertest.OwnersOf(t, c, "tmpl-0-a"))
		}

		// An IPAM that never answers delays the take-over by IPAMWait at most.
		c = controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a"))
		h = newHandOver(c, 0)
		h.IPAMWait = 200 * time.Millisecond
		res, err = h.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter <= 0 || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("unanswered, short wait: %v %v", res, err)
		}
		time.Sleep(res.RequeueAfter)
		if _, err := h.Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 1 {
			t.Fatalf("after IPAMWait: %v owners=%v", err, controllertest.OwnersOf(t, c, "tmpl-0-a"))
		}
	})
	t.Run("recorded by an admission of this replica still being created: left to it", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a"))
		h := newHandOver(c, 0)
		createdHere(h.Admissions, "t1", "tmpl-0-a")
		h.Admissions.records.Update(dataKey, func(v admitted, found bool) (admitted, bool) {
			v.creating = true
			return v, found
		})
		if res, err := h.Reconcile(ctx, req); err != nil || res.RequeueAfter != 0 || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("admitted here, creating: %v %v owners=%v", res, err, controllertest.OwnersOf(t, c, "tmpl-0-a"))
		}
		h.Admissions.done(dataKey, "t1")
		if _, err := h.Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 1 {
			t.Fatalf("no longer pending here: %v owners=%v", err, controllertest.OwnersOf(t, c, "tmpl-0-a"))
		}
	})
	t.Run("recorded: left to the admitting replica, then taken over, unanswered, when IPAMWait is within the delay", func(t *testing.T) {
		for _, ipamWait := range []time.Duration{0, 200 * time.Millisecond} {
			c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a"))
			h := newHandOver(c, 200*time.Millisecond)
			h.IPAMWait = ipamWait
			res, err := h.Reconcile(ctx, req)
			if err != nil || res.RequeueAfter <= 0 || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
				t.Fatalf("IPAMWait %v, first look: %v %v", ipamWait, res, err)
			}
			time.Sleep(res.RequeueAfter)
			if _, err := h.Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 1 {
				t.Fatalf("IPAMWait %v, take-over: %v owners=%v", ipamWait, err, controllertest.OwnersOf(t, c, "tmpl-0-a"))
			}
		}
	})
	t.Run("nothing handed over for a Metal3Data never stored, nor a claim being deleted", func(t *testing.T) {
		never := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"))
		if _, err := newHandOver(never, 0).Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, never, "tmpl-0-a")) != 0 {
			t.Fatalf("a Metal3Data never stored: %v", err)
		}
		deleted := controllertest.WaitingClaim("tmpl-0-a", "")
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		c := controllertest.IndexedClient(interceptor.Funcs{}, deleted, controllertest.Metal3Data("", ""))
		if _, err := newHandOver(c, 0).Reconcile(ctx, req); err != nil || len(controllertest.OwnersOf(t, c, "tmpl-0-a")) != 0 {
			t.Fatalf("a waiting claim being deleted: %v", err)
		}
	})
}

// finalizersOf are the finalizers of the claim tmpl-0-a.
