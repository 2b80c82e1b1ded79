package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metal3-community/ip-preallocator/pkg/answers"
	"github.com/metal3-community/ip-preallocator/pkg/clock"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/metal3-community/ip-preallocator/internal/controllertest"
	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// planned is what admission records for dataKey: two IPClaims, tmpl-0-a and tmpl-0-b.
func planned() []allocation.Claim {
	data := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: dataKey.Namespace, Name: dataKey.Name}}
	pools := []allocation.PoolRef{
		{Name: "a", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind},
		{Name: "b", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind},
	}
	return allocation.Plan(data, pools, data.Name, false)
}

func newCreations(c client.Client) *Creations {
	return &Creations{Admissions: NewAdmissions(time.Minute), Timeout: 5 * time.Second, Wait: 100 * time.Millisecond,
		Creator: &allocation.Creator{Client: c, Cache: c, APIReader: c}}
}

// created waits for the end of the creation of dataKey's claims.
func created(t *testing.T, a *Creations) {
	t.Helper()
	select {
	case e := <-a.Created():
		if client.ObjectKeyFromObject(e.Object) != dataKey {
			t.Fatalf("created event for %s", client.ObjectKeyFromObject(e.Object))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no created event")
	}
}

// TestAdmittedCreatesAfterTheAnswer: Admitted returns at once; the claims are created afterwards,
// and only then does the hand-over see them (a Metal3Data stored meanwhile waits for them).
func TestAdmittedCreatesAfterTheAnswer(t *testing.T) {
	release := make(chan struct{})
	c := controllertest.IndexedClient(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		<-release
		return c.Create(ctx, obj, opts...)
	}}, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
	a := newCreations(c)
	recorder := events.NewFakeRecorder(10)
	h := &HandOver{Client: c, APIReader: c, Recorder: recorder, Admissions: a.Admissions, TakeOverDelay: time.Hour}

	returned := make(chan struct{})
	go func() {
		a.Admitted(context.Background(), dataKey, "t1", "t1", planned(), "")
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("Admitted waited for the creates")
	}
	if !a.Admissions.admittedHere(dataKey, "t1") {
		t.Fatal("the admission is not pending")
	}
	// The Metal3Data's create event before the claims exist: nothing to do yet.
	if _, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := a.Admissions.claims(dataKey, "t1"); ok {
		t.Fatal("claims reported before they were created")
	}
	close(release)
	created(t, a)
	refs, _, ok := a.Admissions.claims(dataKey, "t1")
	if !ok || allocation.FormatClaims(refs) != "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b" {
		t.Fatalf("claims %v ok=%v", refs, ok)
	}
	if _, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tmpl-0-a", "tmpl-0-b"} {
		if owners := controllertest.OwnersOf(t, c, name); len(owners) != 1 || owners[0].UID != "data-uid" {
			t.Errorf("%s owners %v", name, owners)
		}
	}
	if n := len(recorder.Events); n != 0 {
		t.Errorf("%d events for a hand-over that went well", n)
	}
}

// TestCreationFailureIsAWarningEvent: a claim that cannot be created is left to CAPM3, the
// others are handed over, and the Metal3Data gets a Warning Event naming it.
func TestCreationFailureIsAWarningEvent(t *testing.T) {
	c := controllertest.IndexedClient(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if obj.GetName() == "tmpl-0-b" {
			return apierrors.NewForbidden(allocation.IPClaimGVK.GroupVersion().WithResource("ipclaims").GroupResource(), obj.GetName(), errors.New("quota"))
		}
		return c.Create(ctx, obj, opts...)
	}}, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"))
	a := newCreations(c)
	recorder := events.NewFakeRecorder(10)
	h := &HandOver{Client: c, APIReader: c, Recorder: recorder, Admissions: a.Admissions, TakeOverDelay: time.Hour}
	a.Admitted(context.Background(), dataKey, "t1", "t1", planned(), "")
	created(t, a)
	if _, err := h.Reconcile(context.Background(), ctrl.Request{NamespacedName: dataKey}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(recorder.Events) > 0 {
		got = append(got, <-recorder.Events)
	}
	if !slices.ContainsFunc(got, func(e string) bool {
		return strings.HasPrefix(e, "Warning PreallocationIncomplete") && strings.Contains(e, "IPClaim tmpl-0-b left to CAPM3")
	}) {
		t.Errorf("events %q lack the warning", got)
	}
	if owners := controllertest.OwnersOf(t, c, "tmpl-0-a"); len(owners) != 1 {
		t.Errorf("tmpl-0-a not handed over: %v", owners)
	}
	if _, _, ok := a.Admissions.claims(dataKey, "t1"); ok {
		t.Error("the admission is still remembered after its hand-over")
	}
}

// TestClaimCAPM3CreatedFirstIsLeftAlone: CAPM3 may reconcile before a claim is created; its claim
// is never touched, and only ours are handed over.
func TestClaimCAPM3CreatedFirstIsLeftAlone(t *testing.T) {
	capm3s := controllertest.WaitingClaim("tmpl-0-b", "")
	capm3s.Annotations = nil
	capm3s.OwnerReferences = []metav1.OwnerReference{allocation.OwnerReference(controllertest.Metal3Data("", ""))}
	c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a,IPClaim/tmpl-0-b"), capm3s)
	a := newCreations(c)
	a.Admitted(context.Background(), dataKey, "t1", "t1", planned(), "")
	created(t, a)
	refs, _, _ := a.Admissions.claims(dataKey, "t1")
	if allocation.FormatClaims(refs) != "IPClaim/tmpl-0-a" {
		t.Errorf("claims to hand over %v", refs)
	}
	got := &metav1.PartialObjectMetadata{}
	got.SetGroupVersionKind(allocation.IPClaimGVK)
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(capm3s), got); err != nil || len(got.Annotations) != 0 {
		t.Errorf("CAPM3's claim changed: %v %v", got.Annotations, err)
	}
}

// TestShutdownWaitsForCreations: a replica that stops lets the creations in flight finish.
func TestShutdownWaitsForCreations(t *testing.T) {
	release := make(chan struct{})
	c := controllertest.IndexedClient(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		<-release
		return c.Create(ctx, obj, opts...)
	}})
	a := newCreations(c)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- a.Start(ctx) }()
	a.Admitted(context.Background(), dataKey, "t1", "t1", planned(), "")
	cancel()
	select {
	case err := <-stopped:
		t.Fatalf("stopped (%v) with a creation in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not stop once the creation finished")
	}
	for _, name := range []string{"tmpl-0-a", "tmpl-0-b"} {
		controllertest.OwnersOf(t, c, name) // exists
	}
}

// TestAdmissionWaitsUntilTheCreatesAreSent: against an API server that holds its answers, an
// admission, the first as every later one, returns once its claims' create requests are sent, not
// stored; and within Wait when they cannot be sent.
func TestAdmissionWaitsUntilTheCreatesAreSent(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	defer close(release)
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(allocation.IPClaimGVK, meta.RESTScopeNamespace)
	c, err := client.New(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}},
		client.Options{Scheme: fixtures.Scheme(), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	cache := controllertest.IndexedClient(interceptor.Funcs{})
	a := &Creations{Admissions: NewAdmissions(time.Minute), Timeout: 10 * time.Second, Wait: 5 * time.Second,
		Creator: &allocation.Creator{Client: c, Cache: cache, APIReader: cache}}
	for i, name := range []string{"tmpl-0", "tmpl-1"} {
		start := time.Now()
		a.Admitted(context.Background(), types.NamespacedName{Namespace: dataKey.Namespace, Name: name}, fmt.Sprint("t", i), fmt.Sprint("t", i), planned(), "")
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("admission %d waited %v for creates the API server holds", i, took)
		}
	}

	unsent := make(chan struct{})
	defer close(unsent)
	held := controllertest.IndexedClient(interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
		<-unsent
		return nil
	}})
	a = &Creations{Admissions: NewAdmissions(time.Minute), Timeout: 10 * time.Second, Wait: 200 * time.Millisecond,
		Creator: &allocation.Creator{Client: held, Cache: cache, APIReader: cache}}
	start := time.Now()
	a.Admitted(context.Background(), dataKey, "t2", "t2", planned(), "")
	if took := time.Since(start); took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("with creates that are never sent the admission waited %v, want Wait (200ms)", took)
	}
}

// TestHandOverWaitsOnlyWhileTheIPAMIsBehind: an admission's hand-over waits for the IPAM only
// while a claim this replica created has waited more than clock.IPAMBehind for its answer, and not for
// claims unanswered longer than clock.IPAMGivenUp (the IPAM is down or failed them), however long
// IPAMWait.
func TestHandOverWaitsOnlyWhileTheIPAMIsBehind(t *testing.T) {
	c := controllertest.IndexedClient(interceptor.Funcs{})
	a := newCreations(c)
	a.IPAMWait = 30 * time.Second
	a.Answers = answers.NewWatcher(c)
	claimEvents := a.Answers.ClaimEvents()
	behind := func() bool { return a.Answers.Behind(time.Now()) }
	admit := func(name string) time.Time {
		t.Helper()
		key := types.NamespacedName{Namespace: dataKey.Namespace, Name: name}
		data := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: name}}
		a.Admitted(context.Background(), key, "t-"+name, "t-"+name, allocation.Plan(data, []allocation.PoolRef{
			{Name: "a", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind},
		}, name, false), "")
		select {
		case <-a.Created():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: claims not created", name)
		}
		v, _ := a.Admissions.records.Get(key)
		return v.answerBy
	}
	if answerBy := admit("tmpl-0"); !answerBy.IsZero() {
		t.Errorf("first admission waits for the IPAM until %v", answerBy)
	}
	if answerBy := admit("tmpl-1"); !answerBy.IsZero() {
		t.Errorf("claims unanswered for less than %v: waits for the IPAM until %v", clock.IPAMBehind, answerBy)
	}
	time.Sleep(clock.IPAMBehind + 50*time.Millisecond)
	if wait := time.Until(admit("tmpl-2")); wait <= a.IPAMWait-time.Second || wait > a.IPAMWait {
		t.Errorf("claims unanswered for a second: waits for the IPAM for %v, want IPAMWait", wait)
	}
	for _, name := range []string{"tmpl-0-a", "tmpl-1-a", "tmpl-2-a"} {
		claim := &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Namespace: dataKey.Namespace, Name: name}}
		claimEvents.OnUpdate(claim, claim)
		if name == "tmpl-0-a" && !behind() {
			t.Fatalf("%s: a claim without an address counted as answered", name)
		}
		answered := claim.DeepCopy()
		answered.Status.Address = &corev1.ObjectReference{Name: name}
		claimEvents.OnUpdate(claim, answered)
	}
	if behind() {
		t.Error("every claim answered, still behind")
	}
	if answerBy := admit("tmpl-3"); !answerBy.IsZero() {
		t.Errorf("every earlier claim answered: waits for the IPAM until %v", answerBy)
	}
	time.Sleep(clock.IPAMGivenUp + 50*time.Millisecond)
	if answerBy := admit("tmpl-4"); !answerBy.IsZero() {
		t.Errorf("claims unanswered for longer than %v: waits for the IPAM until %v", clock.IPAMGivenUp, answerBy)
	}
}

// answerAfter answers, after delay, every IPClaim of dataKey's namespace that exists by then.
func answerAfter(t *testing.T, c client.Client, delay time.Duration) {
	t.Helper()
	time.Sleep(delay)
	list := &ipamv1.IPClaimList{}
	if err := c.List(context.Background(), list, client.InNamespace(dataKey.Namespace)); err != nil {
		t.Error(err)
		return
	}
	for i := range list.Items {
		list.Items[i].Status.Address = &corev1.ObjectReference{Name: list.Items[i].Name}
		if err := c.Update(context.Background(), &list.Items[i]); err != nil {
			t.Error(err)
		}
	}
}

// TestIdleAdmissionWaitsForTheAnswers: alone in its namespace, with every claim this replica
// created answered, an admission returns once the IPAM has answered its claims, within IdleWait;
// while another Metal3DataClaim waits for its Metal3Data, or a claim of this replica for its
// answer, at once. Once a wait gave up, the next admission does not wait.
func TestIdleAdmissionWaitsForTheAnswers(t *testing.T) {
	const answer = 300 * time.Millisecond
	for _, tc := range []struct {
		name            string
		other, behind   bool
		idleWait        time.Duration
		unanswered      bool
		atLeast, atMost time.Duration
	}{
		{name: "idle", idleWait: 5 * time.Second, atLeast: answer, atMost: 3 * time.Second},
		{name: "idle, the IPAM slower than the wait", idleWait: 100 * time.Millisecond, atLeast: 100 * time.Millisecond, atMost: answer},
		{name: "another Metal3DataClaim waits for data", other: true, idleWait: 5 * time.Second, atMost: answer},
		{name: "the IPAM behind", behind: true, idleWait: 5 * time.Second, atMost: answer},
		{name: "a claim of this replica unanswered", unanswered: true, idleWait: 5 * time.Second, atMost: answer},
		{name: "off", atMost: answer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A machine already Ready: its Metal3DataClaim has its Metal3Data.
			done := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: dataKey.Namespace, Name: "done", UID: "done-uid"}}
			objs := []client.Object{done, &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{
				Namespace: dataKey.Namespace, Name: "tmpl-7",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: infrav1.GroupVersion.String(), Kind: "Metal3DataClaim", Name: done.Name, UID: done.UID}},
			}}}
			if tc.other {
				objs = append(objs, &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: dataKey.Namespace, Name: "waiting"}})
			}
			c := controllertest.IndexedClient(interceptor.Funcs{}, objs...)
			a := newCreations(c)
			a.IdleWait, a.Cache, a.Answers = tc.idleWait, c, answers.NewWatcher(c)
			if tc.behind || tc.unanswered {
				lagging := allocation.Plan(&infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: dataKey.Namespace, Name: "tmpl-9"}},
					[]allocation.PoolRef{{Name: "a", APIGroup: allocation.Metal3PoolGroup, Kind: allocation.Metal3PoolKind}}, "tmpl-9", false)
				a.Answers.Track(lagging)
				a.Answers.Created(lagging, []allocation.Result{{Claim: lagging[0], Outcome: allocation.Created}})
			}
			if tc.behind {
				time.Sleep(clock.IPAMBehind + 50*time.Millisecond)
			}
			go answerAfter(t, c, answer)
			start := time.Now()
			a.Admitted(context.Background(), dataKey, "t1", "t1", planned(), "")
			took := time.Since(start)
			if took < tc.atLeast || took > tc.atMost {
				t.Errorf("Admitted took %v, want between %v and %v", took, tc.atLeast, tc.atMost)
			}
			created(t, a)
			// Once a wait gave up, the next idle admission does not wait.
			if gaveUp := tc.idleWait > 0 && tc.idleWait < answer; gaveUp {
				start = time.Now()
				a.Admitted(context.Background(), dataKey, "t2", "t2", planned(), "")
				if took := time.Since(start); took > tc.idleWait {
					t.Errorf("the admission after the wait gave up took %v", took)
				}
				created(t, a)
			}
		})
	}
}
