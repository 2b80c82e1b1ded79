package release

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/metal3-community/ip-preallocator/internal/controllertest"
	addressctl "github.com/metal3-community/ip-preallocator/pkg/addresses"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/index"
)

// settle reconciles until the release looks again later or on an event: a look that reads a
// claim's holds decides on the next.
func settle(r *Release, req ctrl.Request) (ctrl.Result, error) {
	for {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil || res.RequeueAfter != clock.Next {
			return res, err
		}
	}
}

// releaseStrays runs the addresses' controller on each IPAddress, as the leader does beside the release.
// releaseStrays runs the addresses controller on addrs and returns the reasons of its Events.
func releaseStrays(t *testing.T, c client.Client, addrs ...client.Object) []string {
	t.Helper()
	recorder := events.NewFakeRecorder(10)
	for _, a := range addrs {
		req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(a)}
		if _, err := (&addressctl.Addresses{Client: c, APIReader: c, Recorder: recorder}).Reconcile(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	return reasons(recorder)
}

// reasons drains the Events recorded so far and returns their reasons.
func reasons(r *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, strings.Fields(e)[1])
		default:
			return out
		}
	}
}

func TestRelease(t *testing.T) {
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}}
	newRelease := func(c, live client.Client, grace time.Duration) *Release {
		return &Release{Client: c, APIReader: live, GracePeriod: grace, ClaimGVK: allocation.IPClaimGVK, Recorder: events.NewFakeRecorder(10)}
	}
	exists := func(c client.Reader) bool {
		err := c.Get(ctx, req.NamespacedName, &ipamv1.IPClaim{})
		return err == nil
	}

	t.Run("waits for the grace period, then releases", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"))
		r := newRelease(c, c, 300*time.Millisecond)
		res, err := settle(r, req)
		if err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("first look: %v %v exists=%v", res, err, exists(c))
		}
		time.Sleep(res.RequeueAfter)
		if _, err := settle(r, req); err != nil || !exists(c) {
			t.Fatalf("after the grace period: %v exists=%v", err, exists(c))
		}
		// Deleted, never answered by the IPAM: its deletion is the next event, and the claim is
		// kept while an IPAM pass that listed it earlier may still make its IPAddress.
		if res, err := settle(r, req); err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > clock.StrayWait || !exists(c) {
			t.Fatalf("once deleted: %v %v exists=%v", res, err, exists(c))
		}
	})
	t.Run("kept while its Metal3DataClaim waits for data, within the hold limit", func(t *testing.T) {
		planned := controllertest.WaitingClaim("tmpl-0-a", "t1")
		planned.Annotations[allocation.DataClaimAnnotation] = "m3m-0"
		planned.Finalizers = append(planned.Finalizers, "ipclaim.ipam.metal3.io")
		dataClaim := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3m-0"}}
		c := controllertest.IndexedClient(interceptor.Funcs{}, planned, dataClaim)
		r := newRelease(c, c, 0)
		r.HoldLimit = time.Hour
		if res, err := settle(r, req); err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("while its Metal3DataClaim waits: %v %v exists=%v", res, err, exists(c))
		}
		// CAPM3 created its Metal3Data under another name: the claim is nobody's.
		dataClaim.Status.RenderedData = &infrav1.Metal3ObjectRef{Name: "tmpl-1", Namespace: "ns"}
		if err := c.Update(ctx, dataClaim); err != nil {
			t.Fatal(err)
		}
		if _, err := settle(r, req); err != nil || !controllertest.IsDeleting(t, c) {
			t.Fatalf("once its Metal3DataClaim has data: %v", err)
		}

		gone := controllertest.IndexedClient(interceptor.Funcs{}, planned)
		r = newRelease(gone, gone, 0)
		r.HoldLimit = time.Hour
		if _, err := settle(r, req); err != nil || !controllertest.IsDeleting(t, gone) {
			t.Fatalf("without its Metal3DataClaim: %v", err)
		}

		waiting := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3m-0"}}
		limited := controllertest.IndexedClient(interceptor.Funcs{}, planned, waiting)
		r = newRelease(limited, limited, 0)
		r.HoldLimit = 200 * time.Millisecond
		res, err := settle(r, req)
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > r.HoldLimit {
			t.Fatalf("within the hold limit: %v %v", res, err)
		}
		time.Sleep(res.RequeueAfter)
		if _, err := settle(r, req); err != nil || !controllertest.IsDeleting(t, limited) {
			t.Fatalf("after the hold limit: %v", err)
		}
	})
	t.Run("kept until the IPAM answered it, within the hold limit", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"))
		r := newRelease(c, c, 0)
		r.HoldLimit = time.Hour
		if res, err := settle(r, req); err != nil || res.RequeueAfter <= 0 || controllertest.IsDeleting(t, c) {
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
		if _, err := settle(r, req); err != nil || !controllertest.IsDeleting(t, c) {
			t.Fatalf("answered: %v", err)
		}
	})
	t.Run("kept while another claim of its pool waits for the IPAM, within the hold limit", func(t *testing.T) {
		answered := controllertest.WaitingClaim("tmpl-0-a", "t1")
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
		quiet := controllertest.IndexedClient(interceptor.Funcs{}, answered.DeepCopy(), otherPool, given, failed, leaving)
		r := newRelease(quiet, quiet, 0)
		r.HoldLimit = time.Hour
		if _, err := settle(r, req); err != nil || !controllertest.IsDeleting(t, quiet) {
			t.Fatalf("unanswered claims only in other pools, or being deleted: %v", err)
		}

		pending := other("tmpl-5-a", "provisioning")
		busy := controllertest.IndexedClient(interceptor.Funcs{}, answered.DeepCopy(), pending)
		r = newRelease(busy, busy, 0)
		r.HoldLimit = time.Hour
		if res, err := settle(r, req); err != nil || res.RequeueAfter != clock.PoolRecheck || controllertest.IsDeleting(t, busy) {
			t.Fatalf("while another claim of its pool waits: %v %v", res, err)
		}
		pending.Status.Address = &corev1.ObjectReference{Name: "provisioning-10-0-0-5"}
		if err := busy.Update(ctx, pending); err != nil {
			t.Fatal(err)
		}
		if _, err := settle(r, req); err != nil || !controllertest.IsDeleting(t, busy) {
			t.Fatalf("once it is answered: %v", err)
		}

		// Deleted by someone else: CAPM3's finalizer, whose removal lets the IPAM free the
		// address, stays while the pool is busy, within the hold limit.
		deleted := answered.DeepCopy()
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-time.Minute)}
		deletedBusy := controllertest.IndexedClient(interceptor.Funcs{}, deleted, other("tmpl-5-a", "provisioning"), ipPool("provisioning"))
		r = newRelease(deletedBusy, deletedBusy, 0)
		r.HoldLimit = time.Hour
		if res, err := settle(r, req); err != nil || res.RequeueAfter != clock.PoolRecheck || !slices.Contains(finalizersOf(t, deletedBusy), infrav1.DataFinalizer) {
			t.Fatalf("deleted while its pool is busy: %v %v", res, err)
		}
		r.HoldLimit = time.Minute
		if _, err := settle(r, req); err != nil || slices.Contains(finalizersOf(t, deletedBusy), infrav1.DataFinalizer) {
			t.Fatalf("deleted, past the hold limit: %v", err)
		}
		if got := reasons(r.Recorder.(*events.FakeRecorder)); !slices.Equal(got, []string{"CAPM3FinalizerRemoved"}) {
			t.Errorf("Events %v, want one CAPM3FinalizerRemoved", got)
		}
	})
	t.Run("a reclaimed claim starts its grace period again", func(t *testing.T) {
		c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"))
		r := newRelease(c, c, 300*time.Millisecond)
		if _, err := settle(r, req); err != nil {
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
		res, err := settle(r, req)
		if err != nil || res.RequeueAfter < 200*time.Millisecond || !exists(c) {
			t.Fatalf("after a reclaim: %v %v exists=%v", res, err, exists(c))
		}
	})
	t.Run("a Metal3Data the cache has not seen yet keeps its claim", func(t *testing.T) {
		live := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a"))
		behind := controllertest.IndexedClient(interceptor.Funcs{Get: func(ctx context.Context, _ client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if key.Name == "tmpl-0" {
				return apierrors.NewNotFound(infrav1.GroupVersion.WithResource("metal3datas").GroupResource(), key.Name)
			}
			return live.Get(ctx, key, obj, opts...)
		}})
		if _, err := newRelease(behind, live, 0).Reconcile(ctx, req); err != nil || !exists(live) || len(controllertest.OwnersOf(t, live, "tmpl-0-a")) != 0 {
			t.Fatalf("err=%v exists=%v", err, exists(live))
		}
	})
	t.Run("the leader hands nothing over", func(t *testing.T) {
		stored := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.Metal3Data("", ""))
		if res, err := newRelease(stored, stored, time.Hour).Reconcile(ctx, req); err != nil || res.RequeueAfter != time.Hour ||
			len(controllertest.OwnersOf(t, stored, "tmpl-0-a")) != 0 {
			t.Fatalf("leader on a stored Metal3Data: %v %v owners=%v", res, err, controllertest.OwnersOf(t, stored, "tmpl-0-a"))
		}
	})
	t.Run("with the IPAM's finalizer on it, once no pass may allocate for it: the IPAM frees the address only after", func(t *testing.T) {
		withIPAM := controllertest.WaitingClaim("tmpl-0-a", "t1")
		withIPAM.Finalizers = append(withIPAM.Finalizers, "ipclaim.ipam.metal3.io")
		withIPAM.Spec.Pool.Name = "provisioning"
		withIPAM.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-clock.StrayWait)}
		c := controllertest.IndexedClient(interceptor.Funcs{}, withIPAM.DeepCopy(), ipPool("provisioning"))
		r := newRelease(c, c, time.Hour)
		if _, err := settle(r, req); err != nil {
			t.Fatal(err)
		}
		got := &ipamv1.IPClaim{}
		if err := c.Get(ctx, req.NamespacedName, got); err != nil || !slices.Equal(got.Finalizers, []string{"ipclaim.ipam.metal3.io"}) {
			t.Fatalf("finalizers %v, %v", got.Finalizers, err)
		}

		// Its pool gone, no IPAM pass will free it: both finalizers go, at once.
		withIPAM.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		c = controllertest.IndexedClient(interceptor.Funcs{}, withIPAM.DeepCopy())
		r = newRelease(c, c, time.Hour)
		if _, err := settle(r, req); err != nil || exists(c) {
			t.Fatalf("pool gone: err=%v exists=%v", err, exists(c))
		}
		if got := reasons(r.Recorder.(*events.FakeRecorder)); !slices.Equal(got, []string{"CAPM3FinalizerRemoved"}) {
			t.Errorf("Events %v, want one CAPM3FinalizerRemoved", got)
		}
	})
	t.Run("a waiting claim being deleted loses CAPM3's finalizer", func(t *testing.T) {
		deleted := controllertest.WaitingClaim("tmpl-0-a", "t1")
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-clock.StrayWait)}
		c := controllertest.IndexedClient(interceptor.Funcs{}, deleted, controllertest.Metal3Data("t1", "IPClaim/tmpl-0-a"))
		if _, err := newRelease(c, c, time.Hour).Reconcile(ctx, req); err != nil || exists(c) {
			t.Fatalf("err=%v exists=%v", err, exists(c))
		}
	})
	t.Run("a waiting claim being deleted with two IPAddresses: both released, the IPAM would free one", func(t *testing.T) {
		deleted := controllertest.WaitingClaim("tmpl-0-a", "t1")
		deleted.UID = "claim-uid"
		deleted.Finalizers = append(deleted.Finalizers, "ipclaim.ipam.metal3.io")
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-clock.StrayWait)}
		var addresses []client.Object
		for _, name := range []string{"pool-10-0-0-1", "pool-10-0-0-2"} {
			addresses = append(addresses, &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{
				Namespace: "ns", Name: name, UID: types.UID(name), Finalizers: []string{ipamv1.IPAddressFinalizer},
				OwnerReferences: []metav1.OwnerReference{{Kind: "IPClaim", Name: "tmpl-0-a", UID: "claim-uid"}},
			}})
		}
		c := controllertest.IndexedClient(interceptor.Funcs{}, append(addresses, deleted)...)
		r := newRelease(c, c, time.Hour)
		if res, err := settle(r, req); err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("first look: %v %v exists=%v", res, err, exists(c))
		}
		if got := releaseStrays(t, c, addresses...); !slices.Equal(got, []string{"IPAddressReleased", "IPAddressReleased"}) {
			t.Errorf("Events %v, want an IPAddressReleased per IPAddress", got)
		}
		for _, a := range addresses {
			if err := c.Get(ctx, client.ObjectKeyFromObject(a), &ipamv1.IPAddress{}); !apierrors.IsNotFound(err) {
				t.Errorf("IPAddress %s is still there: %v", a.GetName(), err)
			}
		}
	})
	t.Run("a waiting claim being deleted, never answered, is kept, and its stray IPAddress released", func(t *testing.T) {
		deleted := controllertest.WaitingClaim("tmpl-0-a", "t1")
		deleted.UID = "claim-uid"
		deleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		stray := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "pool-10-0-0-1", UID: "address-uid", Finalizers: []string{ipamv1.IPAddressFinalizer},
			OwnerReferences: []metav1.OwnerReference{{Kind: "IPClaim", Name: "tmpl-0-a", UID: "claim-uid"}},
		}}
		c := controllertest.IndexedClient(interceptor.Funcs{}, deleted, stray)
		r := newRelease(c, c, time.Hour)
		if res, err := settle(r, req); err != nil || res.RequeueAfter <= 0 || !exists(c) {
			t.Fatalf("first look: %v %v exists=%v", res, err, exists(c))
		}
		releaseStrays(t, c, stray)
		if err := c.Get(ctx, client.ObjectKeyFromObject(stray), &ipamv1.IPAddress{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the stray IPAddress is still there: %v", err)
		}
	})
}

// TestTakeOver: every replica hands over what the admitting replica did not: at once when the
// Metal3Data does not record the claim, after the take-over delay when it does.

func finalizersOf(t *testing.T, c client.Reader) []string {
	t.Helper()
	got := &ipamv1.IPClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, got); err != nil {
		t.Fatal(err)
	}
	return got.Finalizers
}

func TestClaimsHeldFor(t *testing.T) {
	held := controllertest.WaitingClaim("tmpl-0-a", "t1")
	held.Annotations[allocation.DataClaimAnnotation] = "m3m-0"
	handed := controllertest.WaitingClaim("tmpl-0-c", "t1")
	handed.Annotations[allocation.DataClaimAnnotation] = "m3m-0"
	handed.OwnerReferences = []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
	c := controllertest.IndexedClient(interceptor.Funcs{}, held, handed, controllertest.WaitingClaim("tmpl-0-b", "t1"))
	r := &Release{Client: c, ClaimGVK: allocation.IPClaimGVK}
	dataClaim := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3m-0"}}
	if reqs := r.claimsIn(context.Background(), dataClaim, index.HeldFor); len(reqs) != 1 || reqs[0].Name != "tmpl-0-a" {
		t.Fatalf("requests %v", reqs)
	}
}

func TestClaimsWaitingFor(t *testing.T) {
	handed := controllertest.WaitingClaim("tmpl-0-c", "t1")
	handed.OwnerReferences = []metav1.OwnerReference{{Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
	other := controllertest.WaitingClaim("tmpl-1-a", "t9")
	other.Annotations[allocation.PreallocatedForAnnotation] = "tmpl-1"
	c := controllertest.IndexedClient(interceptor.Funcs{}, controllertest.WaitingClaim("tmpl-0-a", "t1"), controllertest.WaitingClaim("tmpl-0-b", "t1"), handed, other)
	r := &Release{Client: c, ClaimGVK: allocation.IPClaimGVK}
	reqs := r.claimsIn(context.Background(), controllertest.Metal3Data("", ""), index.WaitingFor)
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
			owned := controllertest.WaitingClaim("tmpl-0-a", "t1")
			owned.Annotations = nil
			owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
			objs := []client.Object{owned}
			if !tc.wantGone {
				objs = append(objs, controllertest.Metal3Data("", ""))
			}
			c := controllertest.IndexedClient(interceptor.Funcs{}, objs...)
			if err := c.Delete(ctx, owned); err != nil {
				t.Fatal(err)
			}
			gone, res, recorder := settleLeader(t, c, req)
			if gone != tc.wantGone || !tc.wantGone && res.RequeueAfter <= 0 {
				t.Errorf("gone=%v requeue=%v", gone, res.RequeueAfter)
			}
			if got := reasons(recorder); tc.wantGone != slices.Equal(got, []string{"CAPM3FinalizerRemoved"}) || !tc.wantGone && len(got) > 0 {
				t.Errorf("Events %v", got)
			}
		})
	}
}

// TestStrandedFinished: a claim the webhook created, handed over and released by CAPM3, that only
// the IPAM's finalizer holds after its pool is gone loses that finalizer; while the pool exists, or
// when CAPM3 created the claim, it is left to the IPAM.
func TestStrandedFinished(t *testing.T) {
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}}
	for _, tc := range []struct {
		name              string
		pool, createdHere bool
		wantGone          bool
	}{
		{name: "ours, pool gone", createdHere: true, wantGone: true},
		{name: "ours, pool there", createdHere: true, pool: true},
		{name: "CAPM3's, pool gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stranded := controllertest.WaitingClaim("tmpl-0-a", "t1")
			stranded.Annotations = nil
			stranded.Spec.Pool.Name = "provisioning"
			stranded.Finalizers = []string{ipamv1.IPClaimFinalizer}
			stranded.OwnerReferences = []metav1.OwnerReference{{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: "tmpl-0", UID: "data-uid"}}
			if tc.createdHere {
				stranded.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: allocation.FieldManager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "ipam.metal3.io/v1alpha1", FieldsType: "FieldsV1",
					FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:pool":{}}}`)}}}
			}
			objs := []client.Object{stranded}
			if tc.pool {
				objs = append(objs, ipPool("provisioning"))
			}
			c := controllertest.IndexedClient(interceptor.Funcs{}, objs...)
			if err := c.Delete(ctx, stranded); err != nil {
				t.Fatal(err)
			}
			claim := allocation.Metadata(allocation.IPClaimGVK)
			if err := c.Get(ctx, req.NamespacedName, claim); err != nil || allocation.PhaseOf(claim) != allocation.Stranded {
				t.Fatalf("phase %v, %v: want stranded", allocation.PhaseOf(claim), err)
			}
			gone, res, recorder := settleLeader(t, c, req)
			if gone != tc.wantGone || tc.pool && res.RequeueAfter <= 0 {
				t.Errorf("gone=%v requeue=%v", gone, res.RequeueAfter)
			}
			if got := reasons(recorder); tc.wantGone != slices.Equal(got, []string{"IPAMFinalizerRemoved"}) || !tc.wantGone && len(got) > 0 {
				t.Errorf("Events %v", got)
			}
		})
	}
}

// settleLeader settles the leader's look at req's IPClaim and tells whether the claim is gone.
func settleLeader(t *testing.T, c client.Client, req ctrl.Request) (bool, ctrl.Result, *events.FakeRecorder) {
	t.Helper()
	recorder := events.NewFakeRecorder(10)
	r := &Release{Client: c, APIReader: c, GracePeriod: time.Hour, ClaimGVK: allocation.IPClaimGVK, Recorder: recorder}
	res, err := settle(r, req)
	if err != nil {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(c.Get(context.Background(), req.NamespacedName, &ipamv1.IPClaim{})), res, recorder
}

// ipPool is the Metal3 IPPool of that name in the claims' namespace.
func ipPool(name string) *ipamv1.IPPool {
	return &ipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
}
