package allocation

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

func fakeClient(funcs *interceptor.Funcs, objs ...client.Object) client.WithWatch {
	b := fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func plannedClaims() []Claim {
	data := testData()
	data.UID = ""
	data.Spec.Claim = &infrav1.Metal3ObjectRef{Name: "m3m-0", Namespace: "ns"}
	return Plan(data, []PoolRef{metal3("a"), metal3("b"), {Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}}, "host", false)
}

func existingIPClaim(name string, annotations map[string]string, owners ...metav1.OwnerReference) *ipamv1.IPClaim {
	return &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Annotations: annotations, OwnerReferences: owners}}
}

// waitingIPClaim is a claim an earlier admission preallocated for dataName in pool.
func waitingIPClaim(name, pool, dataName string) *ipamv1.IPClaim {
	c := existingIPClaim(name, map[string]string{PreallocatedForAnnotation: dataName, AdmissionAnnotation: "earlier", DataClaimAnnotation: "m3m-earlier"})
	c.Spec.Pool = corev1.ObjectReference{Name: pool, Namespace: "ns"}
	return c
}

func outcomes(results []Result) map[string]Outcome {
	out := map[string]Outcome{}
	for _, r := range results {
		out[r.Name] = r.Outcome
	}
	return out
}

func TestCreate(t *testing.T) {
	oldOwner := metav1.OwnerReference{APIVersion: "infrastructure.cluster.x-k8s.io/v1beta2", Kind: "Metal3Data", Name: "tmpl-0", UID: "old"}
	failB := &interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if obj.GetName() == "tmpl-0-b" {
			return apierrors.NewServiceUnavailable("etcd is sad")
		}
		return c.Create(ctx, obj, opts...)
	}}

	for _, tc := range []struct {
		name     string
		existing []client.Object
		funcs    *interceptor.Funcs
		want     map[string]Outcome
	}{
		{
			name: "all created",
			want: map[string]Outcome{"tmpl-0-a": Created, "tmpl-0-b": Created, "tmpl-0-capi": Created},
		},
		{
			name:     "an earlier preallocation for this name is reused",
			existing: []client.Object{waitingIPClaim("tmpl-0-a", "a", "tmpl-0")},
			want:     map[string]Outcome{"tmpl-0-a": Reused, "tmpl-0-b": Created, "tmpl-0-capi": Created},
		},
		{
			name:     "an earlier preallocation for this name with another spec is not adopted",
			existing: []client.Object{waitingIPClaim("tmpl-0-a", "other-pool", "tmpl-0")},
			want:     map[string]Outcome{"tmpl-0-a": Foreign, "tmpl-0-b": Created, "tmpl-0-capi": Created},
		},
		{
			name: "claims of an earlier Metal3Data or of another one are foreign",
			existing: []client.Object{
				existingIPClaim("tmpl-0-a", nil, oldOwner),
				existingIPClaim("tmpl-0-b", map[string]string{PreallocatedForAnnotation: "tmpl-9"}),
			},
			want: map[string]Outcome{"tmpl-0-a": Foreign, "tmpl-0-b": Foreign, "tmpl-0-capi": Created},
		},
		{
			name:     "a claim named after the host is used by CAPM3, so none is created",
			existing: []client.Object{existingIPClaim("host-a", nil, oldOwner)},
			want:     map[string]Outcome{"host-a": Foreign, "tmpl-0-b": Created, "tmpl-0-capi": Created},
		},
		{
			name:  "one create failing among several",
			funcs: failB,
			want:  map[string]Outcome{"tmpl-0-a": Created, "tmpl-0-b": Failed, "tmpl-0-capi": Created},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeClient(tc.funcs, tc.existing...)
			before := map[string]string{}
			for _, obj := range tc.existing {
				before[obj.GetName()] = obj.GetResourceVersion()
			}
			results := (&Creator{Client: c, Cache: c, APIReader: c}).Create(context.Background(), "tmpl-0", "this-admission", plannedClaims(), nil)
			got := outcomes(results)
			if len(got) != len(tc.want) {
				t.Fatalf("outcomes = %v, want %v", got, tc.want)
			}
			for name, want := range tc.want {
				if got[name] != want {
					t.Errorf("%s: %s, want %s", name, got[name], want)
				}
			}
			for _, r := range results {
				if (r.Err != nil) != (r.Outcome == Foreign || r.Outcome == Failed) {
					t.Errorf("%s: outcome %s with error %v", r.Name, r.Outcome, r.Err)
				}
				if r.Outcome != Created && r.Outcome != Reused {
					continue
				}
				obj, _ := r.Claim.Object.DeepCopyObject().(client.Object)
				if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: r.Name}, obj); err != nil {
					t.Fatal(err)
				}
				// A reused claim names the Metal3DataClaim of this admission, not the earlier one's.
				ann := obj.GetAnnotations()
				if ann[PreallocatedForAnnotation] != "tmpl-0" || ann[AdmissionAnnotation] != "this-admission" || ann[DataClaimAnnotation] != "m3m-0" ||
					len(obj.GetOwnerReferences()) != 0 {
					t.Errorf("%s %s as %v", r.Name, r.Outcome, obj)
				}
			}
			for _, obj := range tc.existing {
				current := &ipamv1.IPClaim{}
				if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), current); err != nil {
					t.Fatal(err)
				}
				if current.ResourceVersion != before[obj.GetName()] && got[obj.GetName()] != Reused {
					t.Errorf("existing claim %s was modified", obj.GetName())
				}
			}
		})
	}
}

// TestCreateRaceWithStaleCache: the cache has not seen a claim that exists; the create fails with
// AlreadyExists and a live read decides.
func TestCreateRaceWithStaleCache(t *testing.T) {
	live := fakeClient(nil,
		waitingIPClaim("tmpl-0-a", "a", "tmpl-0"),
		existingIPClaim("tmpl-0-b", nil, metav1.OwnerReference{Kind: "Metal3Data", Name: "tmpl-0", UID: "old"}))
	staleCache := fakeClient(nil)
	results := (&Creator{Client: live, Cache: staleCache, APIReader: live}).Create(context.Background(), "tmpl-0", "this-admission", plannedClaims()[:2], nil)
	got := outcomes(results)
	if got["tmpl-0-a"] != Reused || got["tmpl-0-b"] != Foreign {
		t.Fatalf("outcomes = %v", got)
	}
}

// TestCreateIsConcurrent: every create waits until all have started; done one after another they
// would all run into the deadline.
func TestCreateIsConcurrent(t *testing.T) {
	claims := plannedClaims()
	var started sync.WaitGroup
	started.Add(len(claims))
	c := fakeClient(&interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		started.Done()
		started.Wait()
		return c.Create(ctx, obj, opts...)
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, r := range (&Creator{Client: c, Cache: c, APIReader: c}).Create(ctx, "tmpl-0", "this-admission", claims, nil) {
		if r.Outcome != Created {
			t.Errorf("%s: %s %v", r.Name, r.Outcome, r.Err)
		}
	}
}

// TestCreateStopsAtDeadline: an API server that does not answer costs the admission its deadline,
// not more, and the claim is reported failed.
func TestCreateStopsAtDeadline(t *testing.T) {
	c := fakeClient(&interceptor.Funcs{Create: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ ...client.CreateOption) error {
		<-ctx.Done()
		return ctx.Err()
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	results := (&Creator{Client: c, Cache: c, APIReader: c}).Create(ctx, "tmpl-0", "this-admission", plannedClaims(), nil)
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Create took %v", elapsed)
	}
	for _, r := range results {
		if r.Outcome != Failed || !errors.Is(r.Err, context.DeadlineExceeded) {
			t.Errorf("%s: %s %v", r.Name, r.Outcome, r.Err)
		}
	}
}

func TestForeignErrorNamesTheClaim(t *testing.T) {
	c := fakeClient(nil, existingIPClaim("tmpl-0-a", nil))
	r := (&Creator{Client: c, Cache: c, APIReader: c}).Create(context.Background(), "tmpl-0", "this-admission", plannedClaims()[:1], nil)[0]
	if r.Outcome != Foreign || !strings.Contains(r.Err.Error(), "IPClaim ns/tmpl-0-a exists") {
		t.Fatalf("%s: %v", r.Outcome, r.Err)
	}
}

// TestCreateRetriesTransientErrors: a throttled or reset create is tried again within the
// deadline instead of leaving the claim to CAPM3; a rejection is not.
func TestCreateRetriesTransientErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want Outcome
	}{
		{name: "throttled", err: apierrors.NewTooManyRequests("slow down", 1), want: Created},
		{name: "internal error", err: apierrors.NewInternalError(errors.New("injected")), want: Created},
		{name: "connection reset", err: errors.New("read tcp: connection reset by peer"), want: Created},
		{name: "forbidden", err: apierrors.NewForbidden(ipamv1.GroupVersion.WithResource("ipclaims").GroupResource(), "x", errors.New("no")), want: Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failures := map[string]int{}
			c := fakeClient(&interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				failures[obj.GetName()]++
				if failures[obj.GetName()] <= 2 {
					return tc.err
				}
				return c.Create(ctx, obj, opts...)
			}})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r := (&Creator{Client: c, Cache: c, APIReader: c}).Create(ctx, "tmpl-0", "this-admission", plannedClaims()[:1], nil)[0]
			if r.Outcome != tc.want {
				t.Fatalf("%s: %v", r.Outcome, r.Err)
			}
		})
	}
}

// TestReclaimOvertaken: a reclaim whose patch is rejected reads the claim again. Handed over
// meanwhile to the Metal3Data this admission made (a take-over that went first once it was
// stored), it is reused: no warning that CAPM3 will decide. Handed over to an older Metal3Data of
// the name, which CAPM3 will not take it for, or to another Metal3Data, it is foreign.
func TestReclaimOvertaken(t *testing.T) {
	stored := testData()
	stored.UID = "stored"
	stored.Annotations = map[string]string{AdmissionAnnotation: "this-admission"}
	for _, tc := range []struct {
		name  string
		owner metav1.OwnerReference
		want  Outcome
	}{
		{name: "to the stored Metal3Data of this admission", owner: OwnerReference(stored), want: Reused},
		{name: "to an older Metal3Data of the name", owner: metav1.OwnerReference{Kind: "Metal3Data", Name: "tmpl-0", UID: "older"}, want: Foreign},
		{name: "to another Metal3Data", owner: metav1.OwnerReference{Kind: "Metal3Data", Name: "tmpl-9", UID: "stored"}, want: Foreign},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var patches int
			c := fakeClient(ptrTo(fixtures.APIServerPatchErrors(interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
				patches++
				if patches == 1 {
					// The hand-over lands just before this reclaim's patch.
					claim := &ipamv1.IPClaim{}
					if err := c.Get(ctx, client.ObjectKeyFromObject(obj), claim); err != nil {
						return err
					}
					claim.Annotations = nil
					claim.OwnerReferences = []metav1.OwnerReference{tc.owner}
					if err := c.Update(ctx, claim); err != nil {
						return err
					}
				}
				return c.Patch(ctx, obj, p, opts...)
			}})), waitingIPClaim("tmpl-0-a", "a", "tmpl-0"), stored)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r := (&Creator{Client: c, Cache: c, APIReader: c}).Create(ctx, "tmpl-0", "this-admission", plannedClaims()[:1], nil)[0]
			if r.Outcome != tc.want || (r.Err != nil) != (tc.want == Foreign) {
				t.Fatalf("%s: %v", r.Outcome, r.Err)
			}
			if patches != 1 {
				t.Errorf("%d patches, want the one the hand-over overtook", patches)
			}
		})
	}
}
