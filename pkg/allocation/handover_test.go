package allocation

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metal3-community/ip-preallocator/pkg/clock"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

func storedData() *metav1.PartialObjectMetadata {
	data := Metadata(infrav1.GroupVersion.WithKind("Metal3Data"))
	data.Namespace, data.Name, data.UID = "ns", "tmpl-0", "data-uid"
	return data
}

// waitingClaim is a claim preallocated for tmpl-0 in admission token, with CAPM3's finalizer.
func waitingClaim(token string, extra map[string]string) *ipamv1.IPClaim {
	ann := map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: token}
	for k, v := range extra {
		ann[k] = v
	}
	return &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{
		Name: "tmpl-0-a", Namespace: "ns", UID: "claim-uid", Annotations: ann, Finalizers: []string{infrav1.DataFinalizer},
	}}
}

func getClaim(t *testing.T, c client.Reader) *ipamv1.IPClaim {
	t.Helper()
	claim := &ipamv1.IPClaim{}
	err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, claim)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

func claimMetadata(t *testing.T, c client.Reader) *metav1.PartialObjectMetadata {
	t.Helper()
	m := Metadata(IPClaimGVK)
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func patchFailing(err error) *interceptor.Funcs {
	return &interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
		return err
	}}
}

func TestHandOver(t *testing.T) {
	otherOwner := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Keeper", Name: "k", UID: "keeper-uid"}
	rejected := apierrors.NewInvalid(schema.GroupKind{Group: "ipam.metal3.io", Kind: "IPClaim"}, "tmpl-0-a",
		field.ErrorList{field.Forbidden(field.NewPath("metadata", "ownerReferences"), "a policy says no")})

	for _, tc := range []struct {
		name        string
		claim       *ipamv1.IPClaim
		token       string
		annotations map[string]string
		funcs       *interceptor.Funcs
		wantHanded  bool
		wantErr     bool
		// wantAnnotations are the claim's annotations afterwards.
		wantAnnotations map[string]string
	}{
		{
			name: "a claim with only our annotations loses them whole", claim: waitingClaim("t1", nil), token: "t1",
			annotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
			wantHanded:  true,
		},
		{
			name: "a wrong guess about the annotations removes only our keys", claim: waitingClaim("t1", map[string]string{"keep": "me"}), token: "t1",
			annotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
			wantHanded:  true, wantAnnotations: map[string]string{"keep": "me"},
		},
		{
			name: "not seen in a cache: only our keys go", claim: waitingClaim("t1", nil), token: "t1",
			wantHanded: true,
		},
		{
			name: "the Metal3DataClaim's name goes too", claim: waitingClaim("t1", map[string]string{DataClaimAnnotation: "m3m-0"}), token: "t1",
			annotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1", DataClaimAnnotation: "m3m-0"},
			wantHanded:  true,
		},
		{
			name: "the Metal3DataClaim's name goes with our keys when the guess is wrong", token: "t1",
			claim:       waitingClaim("t1", map[string]string{DataClaimAnnotation: "m3m-0", "keep": "me"}),
			annotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
			wantHanded:  true, wantAnnotations: map[string]string{"keep": "me"},
		},
		{
			name: "without a token, the caller read the Metal3Data live", claim: waitingClaim("t1", nil),
			wantHanded: true, wantAnnotations: map[string]string{AdmissionAnnotation: "t1"},
		},
		{
			name: "reclaimed by another admission", claim: waitingClaim("t2", nil), token: "t1",
			wantAnnotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t2"},
		},
		{
			name: "owner references someone else added are never replaced", token: "t1",
			claim: func() *ipamv1.IPClaim {
				c := waitingClaim("t1", nil)
				c.OwnerReferences = []metav1.OwnerReference{otherOwner}
				return c
			}(),
			wantAnnotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
		},
		{
			name: "a claim being deleted is never handed over (CAPM3 would render its address while the IPAM frees it)", token: "t1",
			claim: func() *ipamv1.IPClaim {
				c := waitingClaim("t1", nil)
				c.Finalizers = []string{"metal3data.infrastructure.cluster.x-k8s.io"}
				c.DeletionTimestamp = &metav1.Time{Time: time.Now()}
				return c
			}(),
			wantAnnotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
		},
		{name: "gone", token: "t1"},
		{
			name: "a rejected patch is an error, not 'not ours'", claim: waitingClaim("t1", nil), token: "t1",
			funcs: patchFailing(rejected), wantErr: true,
			wantAnnotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
		},
		{
			name: "a timeout is an error", claim: waitingClaim("t1", nil), token: "t1",
			funcs: patchFailing(apierrors.NewTimeoutError("etcd", 1)), wantErr: true,
			wantAnnotations: map[string]string{PreallocatedForAnnotation: "tmpl-0", AdmissionAnnotation: "t1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []client.Object
			if tc.claim != nil {
				objs = append(objs, tc.claim)
			}
			funcs := interceptor.Funcs{}
			if tc.funcs != nil {
				funcs = *tc.funcs
			}
			c := fixtures.NewClient(objs, ptrTo(fixtures.APIServerPatchErrors(funcs)))
			data := storedData()
			handed, err := HandOver(context.Background(), c, data, ClaimRef{Kind: KindIPClaim, Name: "tmpl-0-a"}, tc.token, tc.annotations)
			if handed != tc.wantHanded || (err != nil) != tc.wantErr {
				t.Fatalf("HandOver = %v, %v; want %v, error %v", handed, err, tc.wantHanded, tc.wantErr)
			}
			got := getClaim(t, c)
			if got == nil {
				return
			}
			if len(got.Annotations) != len(tc.wantAnnotations) {
				t.Errorf("annotations %v, want %v", got.Annotations, tc.wantAnnotations)
			}
			for k, v := range tc.wantAnnotations {
				if got.Annotations[k] != v {
					t.Errorf("annotations %v, want %v", got.Annotations, tc.wantAnnotations)
				}
			}
			owners := got.OwnerReferences
			switch {
			case tc.wantHanded && !equality.Semantic.DeepEqual(owners, []metav1.OwnerReference{OwnerReference(data)}):
				t.Errorf("owner references %v, want CAPM3's", owners)
			case !tc.wantHanded && len(owners) != len(tc.claim.OwnerReferences):
				t.Errorf("owner references changed to %v", owners)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

func TestRelease(t *testing.T) {
	ctx := context.Background()
	t.Run("a waiting claim is deleted; CAPM3's finalizer goes with Finish", func(t *testing.T) {
		c := fixtures.NewClient([]client.Object{waitingClaim("t1", nil)}, ptrTo(fixtures.APIServerPatchErrors(interceptor.Funcs{})))
		released, err := Release(ctx, c, claimMetadata(t, c))
		if !released || err != nil {
			t.Fatalf("Release = %v, %v", released, err)
		}
		got := getClaim(t, c)
		if got == nil || got.DeletionTimestamp.IsZero() || !slices.Contains(got.Finalizers, infrav1.DataFinalizer) {
			t.Fatalf("after Release: %v", got)
		}
		if finished, err := Finish(ctx, c, claimMetadata(t, c)); !finished || err != nil {
			t.Fatalf("Finish = %v, %v", finished, err)
		}
		if got := getClaim(t, c); got != nil {
			t.Errorf("claim still there: %v", got)
		}
	})
	t.Run("a claim changed since it was read is left alone", func(t *testing.T) {
		c := fixtures.NewClient([]client.Object{waitingClaim("t1", nil)}, ptrTo(fixtures.APIServerPatchErrors(interceptor.Funcs{})))
		read := claimMetadata(t, c)
		if err := Reclaim(ctx, c, getClaimAsObject(t, c), "t2", ""); err != nil {
			t.Fatal(err)
		}
		released, err := Release(ctx, c, read)
		if released || err != nil {
			t.Fatalf("Release = %v, %v", released, err)
		}
		if got := getClaim(t, c); got == nil || !got.DeletionTimestamp.IsZero() || len(got.Finalizers) != 1 {
			t.Errorf("claim was touched: %v", got)
		}
	})
	t.Run("no hand-over follows the delete", func(t *testing.T) {
		c := fixtures.NewClient([]client.Object{waitingClaim("t1", nil)}, ptrTo(fixtures.APIServerPatchErrors(interceptor.Funcs{})))
		if released, err := Release(ctx, c, claimMetadata(t, c)); !released || err != nil {
			t.Fatalf("Release = %v, %v", released, err)
		}
		handed, err := HandOver(ctx, c, storedData(), ClaimRef{Kind: KindIPClaim, Name: "tmpl-0-a"}, "t1", nil)
		if handed || err != nil {
			t.Fatalf("HandOver of a released claim = %v, %v", handed, err)
		}
		if got := getClaim(t, c); got == nil || len(got.OwnerReferences) != 0 {
			t.Fatalf("released claim owned: %v", got)
		}
	})
	t.Run("a delete that times out is an error", func(t *testing.T) {
		funcs := interceptor.Funcs{Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
			return apierrors.NewTimeoutError("etcd", 1)
		}}
		c := fixtures.NewClient([]client.Object{waitingClaim("t1", nil)}, &funcs)
		if _, err := Release(ctx, c, claimMetadata(t, c)); !apierrors.IsTimeout(err) {
			t.Fatalf("Release error %v", err)
		}
	})
}

// ownedMeanwhile gives the claim name CAPM3's owner reference and drops our annotations, as a
// hand-over that came before the claim's deletion and was seen late would have.
func ownedMeanwhile(ctx context.Context, c client.Client, name string) error {
	claim := &ipamv1.IPClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, claim); err != nil {
		return err
	}
	patch := client.MergeFrom(claim.DeepCopy())
	claim.OwnerReferences = []metav1.OwnerReference{OwnerReference(storedData())}
	claim.Annotations = nil
	return c.Patch(ctx, claim, patch)
}

func getClaimAsObject(t *testing.T, c client.Reader) client.Object {
	t.Helper()
	claim := getClaim(t, c)
	claim.SetGroupVersionKind(IPClaimGVK)
	return claim
}

func TestFinish(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		owned         bool
		wantFinalizer bool
	}{
		{name: "a waiting claim being deleted loses CAPM3's finalizer"},
		{name: "a claim handed over meanwhile keeps it", owned: true, wantFinalizer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := waitingClaim("t1", nil)
			claim.Finalizers = append(claim.Finalizers, "ipam.metal3.io")
			c := fixtures.NewClient([]client.Object{claim}, ptrTo(fixtures.APIServerPatchErrors(interceptor.Funcs{})))
			if err := c.Delete(ctx, claim); err != nil {
				t.Fatal(err)
			}
			read := claimMetadata(t, c)
			if tc.owned {
				if err := ownedMeanwhile(ctx, c, claim.Name); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := Finish(ctx, c, read); err != nil {
				t.Fatal(err)
			}
			got := getClaim(t, c)
			if has := strings.Contains(strings.Join(got.Finalizers, ","), infrav1.DataFinalizer); has != tc.wantFinalizer {
				t.Errorf("finalizers %v", got.Finalizers)
			}
		})
	}
}

func TestParseClaims(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat("IPClaim/a,", clock.MaxRecordedClaims+5), ",")
	tooMany := make([]string, clock.MaxRecordedClaims+1)
	for i := range tooMany {
		tooMany[i] = "IPClaim/c" + strings.Repeat("x", i)
	}
	for _, tc := range []struct {
		value   string
		want    []ClaimRef
		wantErr bool
	}{
		{value: ""},
		{value: "IPClaim/a,IPAddressClaim/b", want: []ClaimRef{{KindIPClaim, "a"}, {KindIPAddressClaim, "b"}}},
		{value: many, want: []ClaimRef{{KindIPClaim, "a"}}},
		{value: strings.Join(tooMany, ","), wantErr: true},
		{value: "IPClaim/other-namespace/a", wantErr: true},
		{value: "IPClaim/../a", wantErr: true},
		{value: "Secret/a", wantErr: true},
		{value: "IPClaim/", wantErr: true},
		{value: "IPClaim", wantErr: true},
	} {
		got, err := ParseClaims(tc.value)
		if (err != nil) != tc.wantErr || len(got) != len(tc.want) {
			t.Errorf("ParseClaims(%.40q) = %v, %v", tc.value, got, err)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ParseClaims(%q) = %v", tc.value, got)
			}
		}
		if err == nil && len(got) > 0 {
			if again, _ := ParseClaims(FormatClaims(got)); len(again) != len(got) {
				t.Errorf("FormatClaims does not round-trip %v", got)
			}
		}
	}
}

func TestIsTestFailure(t *testing.T) {
	gr := schema.GroupResource{}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewGenericServerResponse(422, "patch", gr, "", "testing value /x failed: test failed", 0, false), true},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "IPClaim"}, "a", field.ErrorList{field.Invalid(field.NewPath("metadata"), "", "no")}), false},
		{apierrors.NewConflict(gr, "a", errors.New("changed")), false},
		{errors.New("connection reset"), false},
		{nil, false},
	} {
		if got := IsTestFailure(tc.err); got != tc.want {
			t.Errorf("IsTestFailure(%v) = %v", tc.err, got)
		}
	}
}
