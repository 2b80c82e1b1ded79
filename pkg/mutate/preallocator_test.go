package mutate

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// TestSkips: each case breaks one thing CAPM3 needs before it creates claims; the Metal3Data is
// admitted unchanged and nothing is written.
func TestSkips(t *testing.T) {
	for _, tc := range []struct {
		name        string
		reason      string
		mutate      func(m *fixtures.Machine)
		without     func(m *fixtures.Machine) client.Object
		dryRun      bool
		requesters  []string
		namespace   string
		watchFilter string
		existing    func(m *fixtures.Machine) client.Object
		deleted     bool
		capm3Args   []string
		wantWarning string
	}{
		{name: "CAPM3 with its client limits raised", reason: ReasonLimitsRaised, capm3Args: []string{"--webhook-port=9443", "--kube-api-qps", "100"}},
		{name: "name still in use by a deleted predecessor", reason: ReasonNameInUse, existing: func(m *fixtures.Machine) client.Object {
			old := m.Data.DeepCopy()
			old.UID = "predecessor"
			return old
		}, wantWarning: "IPClaim tmpl-3-pool-v4 left to CAPM3: a Metal3Data of this name is still known (uid predecessor)"},
		{name: "name of a Metal3Data deleted lately", reason: ReasonNameInUse, deleted: true,
			wantWarning: "IPClaim tmpl-3-pool-v4 left to CAPM3: a Metal3Data of this name was deleted"},
		{name: "requester not served", reason: ReasonRequester, requesters: []string{"system:serviceaccount:capm3-system:capm3-manager"}},
		{name: "another namespace than --namespace", reason: ReasonOutOfScope, namespace: "other"},
		{name: "without the --watch-filter label", reason: ReasonOutOfScope, watchFilter: "plane-b"},
		{name: "another --watch-filter label", reason: ReasonOutOfScope, watchFilter: "plane-b", mutate: func(m *fixtures.Machine) {
			m.Data.Labels["cluster.x-k8s.io/watch-filter"] = "plane-a"
		}},
		{name: "record would not fit the annotations", reason: ReasonRecordTooLarge, mutate: func(m *fixtures.Machine) {
			m.Data.Annotations = map[string]string{"big": strings.Repeat("x", 256*1024-10)}
		}},
		{name: "dry run", reason: ReasonDryRun, dryRun: true},
		{name: "moved Metal3Data with metaData", reason: ReasonAlreadyRendered, mutate: func(m *fixtures.Machine) {
			m.Data.Spec.MetaData = &corev1.SecretReference{Name: "m3m-3-metadata"}
		}},
		{name: "restored Metal3Data with networkData", reason: ReasonAlreadyRendered, mutate: func(m *fixtures.Machine) {
			m.Data.Spec.NetworkData = &corev1.SecretReference{Name: "m3m-3-networkdata"}
		}},
		{name: "paused Metal3Data", reason: ReasonPaused, mutate: func(m *fixtures.Machine) {
			m.Data.Annotations = map[string]string{"cluster.x-k8s.io/paused": ""}
		}},
		{name: "paused Cluster", reason: ReasonPaused, mutate: func(m *fixtures.Machine) {
			m.Cluster.Spec.Paused = ptr.To(true)
		}},
		{name: "no cluster label", reason: ReasonClusterNotFound, mutate: func(m *fixtures.Machine) {
			m.Data.Labels = nil
		}},
		{name: "no Cluster", reason: ReasonClusterNotFound, without: func(m *fixtures.Machine) client.Object { return m.Cluster }},
		{name: "generated name", reason: ReasonNoName, mutate: func(m *fixtures.Machine) {
			m.Data.GenerateName, m.Data.Name = m.Data.Name, ""
		}},
		{name: "no template reference", reason: ReasonNoTemplate, mutate: func(m *fixtures.Machine) { m.Data.Spec.Template = nil }},
		{name: "no template", reason: ReasonTemplateNotFound, without: func(m *fixtures.Machine) client.Object { return m.Template }},
		{name: "template of another cluster", reason: ReasonTemplateMismatch, mutate: func(m *fixtures.Machine) {
			m.Template.Spec.ClusterName = "other"
		}},
		{name: "template without pools", reason: ReasonNoPools, mutate: func(m *fixtures.Machine) {
			m.Template.Spec.MetaData, m.Template.Spec.NetworkData = nil, nil
		}},
		{name: "name CAPM3's webhook rejects", reason: ReasonInvalidName, mutate: func(m *fixtures.Machine) {
			m.Data.Spec.Index = ptr.To(int32(7))
		}},
		{name: "no claim reference", reason: ReasonObjectMissing, mutate: func(m *fixtures.Machine) { m.Data.Spec.Claim = nil }},
		{name: "no Metal3DataClaim", reason: ReasonObjectMissing, without: func(m *fixtures.Machine) client.Object { return m.DataClaim }},
		{name: "Metal3DataClaim without owner", reason: ReasonObjectMissing, mutate: func(m *fixtures.Machine) {
			m.DataClaim.OwnerReferences = nil
		}},
		{name: "no Metal3Machine", reason: ReasonObjectMissing, without: func(m *fixtures.Machine) client.Object { return m.Metal3Machine }},
		{name: "Metal3Machine of another template", reason: ReasonObjectMissing, mutate: func(m *fixtures.Machine) {
			m.Metal3Machine.Spec.DataTemplate = &infrav1.Metal3ObjectRef{Name: "other"}
		}},
		{name: "Metal3Machine without Machine owner", reason: ReasonObjectMissing, mutate: func(m *fixtures.Machine) {
			m.Metal3Machine.OwnerReferences = nil
		}},
		{name: "no Machine", reason: ReasonObjectMissing, without: func(m *fixtures.Machine) client.Object { return m.Machine }},
		{name: "no host annotation", reason: ReasonObjectMissing, mutate: func(m *fixtures.Machine) {
			delete(m.Metal3Machine.Annotations, hostAnnotation)
		}},
		{name: "no BareMetalHost", reason: ReasonObjectMissing, without: func(m *fixtures.Machine) client.Object { return m.Host }},
		{
			name: "pool annotation missing", reason: ReasonInvalidReferences,
			mutate:      func(m *fixtures.Machine) { m.Host.Annotations = nil },
			wantWarning: "spec.networkData.networks.ipv4[5].fromPoolAnnotation: annotation example.com/provisioning-pool not found or empty on baremetalhost",
		},
		{
			name: "conflicting pool kinds", reason: ReasonInvalidReferences,
			mutate: func(m *fixtures.Machine) {
				m.Template.Spec.NetworkData.Networks.IPv4[2].IPAddressFromIPPool = "pool-capi"
			},
			wantWarning: "multiple references with the same name but different resource types",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
			if tc.mutate != nil {
				tc.mutate(m)
			}
			var objs []client.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing(m))
			}
			for _, obj := range m.Objects() {
				if tc.without == nil || obj != tc.without(m) {
					objs = append(objs, obj)
				}
			}
			writes := 0
			c := fixtures.NewClient(objs, &interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				writes++
				return c.Create(ctx, obj, opts...)
			}})
			skipped := admissionsTotal.WithLabelValues("skipped", tc.reason)
			before := testutil.ToFloat64(skipped)
			p := newPreallocator(c, false)
			p.Requesters = tc.requesters
			p.Namespace, p.WatchFilter = tc.namespace, tc.watchFilter
			if tc.capm3Args != nil {
				p.Compat = guardBeside(t, tc.capm3Args...)
			}
			if tc.deleted {
				p.Deletions = NewDeletions(time.Minute)
				p.Deletions.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "x", Obj: m.Data.DeepCopy()})
			}

			resp := p.Handle(context.Background(), fixtures.CreateRequest(t, m.Data, tc.dryRun))

			if !resp.Allowed || len(resp.Patches) != 0 {
				t.Fatalf("allowed=%v patches=%v result=%v", resp.Allowed, resp.Patches, resp.Result)
			}
			if writes != 0 || len(fixtures.Claims(t, c)) != 0 {
				t.Errorf("%d writes, claims %v", writes, fixtures.Claims(t, c))
			}
			if got := testutil.ToFloat64(skipped) - before; got != 1 {
				t.Errorf("skip metric for %s rose by %v", tc.reason, got)
			}
			warnings := strings.Join(resp.Warnings, "\n")
			if tc.wantWarning == "" && warnings != "" || !strings.Contains(warnings, tc.wantWarning) {
				t.Errorf("warnings %q, want %q", warnings, tc.wantWarning)
			}
		})
	}
}

func TestPreallocates(t *testing.T) {
	for _, tc := range []struct {
		name       string
		bmh        bool
		annotated  bool
		scoped     bool
		wantClaims []string
	}{
		{name: "Metal3Data names", wantClaims: []string{"tmpl-3-pool-v4", "tmpl-3-pool-capi"}},
		{name: "in the --namespace and --watch-filter served", scoped: true, wantClaims: []string{"tmpl-3-pool-v4", "tmpl-3-pool-capi"}},
		{name: "BMH names, existing annotations kept", bmh: true, annotated: true, wantClaims: []string{"host-3-pool-v4", "tmpl-3-pool-capi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
			if tc.annotated {
				m.Data.Annotations = map[string]string{"keep": "me"}
			}
			p := newPreallocator(fixtures.NewClient(m.Objects(), nil), tc.bmh)
			if tc.scoped {
				m.Data.Labels["cluster.x-k8s.io/watch-filter"] = "plane-a"
				p.Namespace, p.WatchFilter = m.Data.Namespace, "plane-a"
			}
			c := p.Reader.(client.Client)
			req := fixtures.CreateRequest(t, m.Data, false)
			resp := p.Handle(context.Background(), req)
			if !resp.Allowed || len(resp.Warnings) != 0 {
				t.Fatalf("allowed=%v warnings=%v", resp.Allowed, resp.Warnings)
			}
			if len(fixtures.Claims(t, c)) != len(fixtures.AllPools) {
				t.Fatalf("%d claims", len(fixtures.Claims(t, c)))
			}
			got := applyPatch(t, req, resp)
			recorded := strings.Split(got.Annotations[allocation.ClaimsAnnotation], ",")
			if len(recorded) != len(fixtures.AllPools) {
				t.Errorf("annotation lists %d claims: %v", len(recorded), recorded)
			}
			for _, want := range tc.wantClaims {
				kind := allocation.KindIPClaim
				if strings.HasSuffix(want, "pool-capi") {
					kind = allocation.KindIPAddressClaim
				}
				if !strings.Contains(got.Annotations[allocation.ClaimsAnnotation], kind+"/"+want) {
					t.Errorf("annotation %q lacks %s/%s", got.Annotations[allocation.ClaimsAnnotation], kind, want)
				}
			}
			if got.Annotations[allocation.AdmissionAnnotation] != string(req.UID) {
				t.Errorf("record carries admission %q, want %q", got.Annotations[allocation.AdmissionAnnotation], req.UID)
			}
			for name, claim := range fixtures.Claims(t, c) {
				if claim.GetAnnotations()[allocation.AdmissionAnnotation] != string(req.UID) {
					t.Errorf("claim %s carries admission %q", name, claim.GetAnnotations()[allocation.AdmissionAnnotation])
				}
			}
			if tc.annotated && got.Annotations["keep"] != "me" {
				t.Errorf("annotations: %v", got.Annotations)
			}
			got.Annotations = m.Data.Annotations
			if diff := cmpData(m.Data, got); diff != "" {
				t.Errorf("the patch changed more than the annotation:\n%s", diff)
			}
		})
	}
}

// foreignClaim is a claim CAPM3 would use for pool of m, created by someone else.
func foreignClaim(t *testing.T, m *fixtures.Machine, pool string) client.Object {
	t.Helper()
	c := fixtures.NewClient(m.Objects(), nil)
	newPreallocator(c, false).Handle(context.Background(), fixtures.CreateRequest(t, m.Data, false))
	claim := fixtures.Claims(t, c)[m.Data.Name+"-"+pool]
	claim.SetAnnotations(nil)
	claim.SetResourceVersion("")
	return claim
}

// TestForeignClaimIsLeftToCAPM3: a claim the cache shows under a name CAPM3 looks for, not
// waiting for this Metal3Data, is neither recorded nor touched; the answer warns.
func TestForeignClaimIsLeftToCAPM3(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	c := fixtures.NewClient(append(m.Objects(), foreignClaim(t, m, "pool-capi")), nil)
	var admitted []allocation.Claim
	p := newPreallocator(c, false)
	p.OnAdmitted = func(_ context.Context, _ types.NamespacedName, _, _ string, claims []allocation.Claim, _ string) {
		admitted = claims
	}
	req := fixtures.CreateRequest(t, m.Data, false)
	resp := p.Handle(context.Background(), req)
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "IPAddressClaim tmpl-3-pool-capi left to CAPM3") {
		t.Fatalf("allowed=%v warnings=%v", resp.Allowed, resp.Warnings)
	}
	got := applyPatch(t, req, resp)
	if strings.Contains(got.Annotations[allocation.ClaimsAnnotation], "pool-capi") ||
		len(strings.Split(got.Annotations[allocation.ClaimsAnnotation], ",")) != len(fixtures.AllPools)-1 {
		t.Errorf("annotation %q", got.Annotations[allocation.ClaimsAnnotation])
	}
	if len(admitted) != len(fixtures.AllPools)-1 || slices.ContainsFunc(admitted, func(c allocation.Claim) bool {
		return strings.HasSuffix(c.Object.GetName(), "pool-capi")
	}) {
		t.Errorf("%d claims to create", len(admitted))
	}
}

// TestAdmissionWritesNothing: the answer waits for no API write; the claims are created after it.
func TestAdmissionWritesNothing(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	writes := 0
	count := func() { writes++ }
	c := fixtures.NewClient(m.Objects(), &interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			count()
			return nil
		},
		Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			count()
			return nil
		},
		Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error {
			count()
			return nil
		},
	})
	p := newPreallocator(c, false)
	var admitted []allocation.Claim
	p.OnAdmitted = func(_ context.Context, _ types.NamespacedName, _, _ string, claims []allocation.Claim, _ string) {
		admitted = claims
	}
	resp := p.Handle(context.Background(), fixtures.CreateRequest(t, m.Data, false))
	if !resp.Allowed || len(resp.Patches) == 0 || writes != 0 || len(admitted) != len(fixtures.AllPools) {
		t.Fatalf("allowed=%v patches=%d writes=%d claims to create=%d", resp.Allowed, len(resp.Patches), writes, len(admitted))
	}
}

func TestAllForeignIsAdmittedUnchanged(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	objs := m.Objects()
	for _, pool := range fixtures.AllPools {
		objs = append(objs, foreignClaim(t, m, pool))
	}
	resp := newPreallocator(fixtures.NewClient(objs, nil), false).Handle(context.Background(), fixtures.CreateRequest(t, m.Data, false))
	if !resp.Allowed || len(resp.Patches) != 0 || len(resp.Warnings) != len(fixtures.AllPools) {
		t.Fatalf("allowed=%v patches=%v warnings=%d", resp.Allowed, resp.Patches, len(resp.Warnings))
	}
}

func TestUndecodableRequest(t *testing.T) {
	for _, raw := range []string{"", "{", `{"spec": {"index": "three"}}`} {
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Namespace: "ns", Object: runtime.RawExtension{Raw: []byte(raw)},
		}}
		resp := newPreallocator(fixtures.NewClient(nil, nil), false).Handle(context.Background(), req)
		if resp.Allowed || resp.Result == nil || resp.Result.Code != 400 || !strings.Contains(resp.Result.Message, "decoding Metal3Data") {
			t.Errorf("%q: %+v", raw, resp.Result)
		}
	}
}

func TestOtherOperationsPassThrough(t *testing.T) {
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Update}}
	if resp := newPreallocator(fixtures.NewClient(nil, nil), false).Handle(context.Background(), req); !resp.Allowed || len(resp.Patches) != 0 {
		t.Fatalf("%+v", resp)
	}
}

// TestCacheMissFallsBackToLiveRead: a Metal3DataClaim created a moment before its Metal3Data may
// not be in the cache yet.
func TestCacheMissFallsBackToLiveRead(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	var objs []client.Object
	for _, obj := range m.Objects() {
		if obj != m.DataClaim {
			objs = append(objs, obj)
		}
	}
	cache := fixtures.NewClient(objs, nil)
	live := fixtures.NewClient(m.Objects(), nil)
	p := newPreallocator(cache, false)
	p.APIReader = live
	if resp := p.Handle(context.Background(), fixtures.CreateRequest(t, m.Data, false)); len(resp.Patches) != 1 {
		t.Fatalf("not preallocated: %+v", resp)
	}
	if len(fixtures.Claims(t, cache)) != len(fixtures.AllPools) {
		t.Fatal("claims missing")
	}
}

// TestDeadlineFromRequestStart: the API server's timeout, counted from when its call arrived,
// bounds the whole admission; a read that does not answer in time skips the preallocation.
func TestDeadlineFromRequestStart(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	c := fixtures.NewClient(m.Objects(), &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if key.Name == m.Template.Name {
			<-ctx.Done()
			return ctx.Err()
		}
		return c.Get(ctx, key, obj, opts...)
	}})
	p := newPreallocator(c, false)
	p.Timeout = time.Minute
	call := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/mutate?timeout=1s", http.NoBody)
	ctx := WithRequestTiming(context.Background(), call)
	time.Sleep(300 * time.Millisecond) // time spent before the handler runs counts too

	start := time.Now()
	resp := p.Handle(ctx, fixtures.CreateRequest(t, m.Data, false))
	if elapsed := time.Since(start); elapsed > 700*time.Millisecond {
		t.Errorf("admission took %v after 300ms of a 1s budget", elapsed)
	}
	if !resp.Allowed || len(resp.Patches) != 0 || len(resp.Warnings) == 0 {
		t.Errorf("allowed=%v patches=%v warnings=%v", resp.Allowed, resp.Patches, resp.Warnings)
	}
}

// TestOnAdmitted: the replica learns of each admission that recorded claims, with its token and
// the claims to create, and of each with a warning for the operator; dry runs and silent skips are
// not reported.
func TestOnAdmitted(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	p := newPreallocator(fixtures.NewClient(append(m.Objects(), foreignClaim(t, m, "pool-capi")), nil), false)
	var got []string
	p.OnAdmitted = func(_ context.Context, key types.NamespacedName, token, _ string, claims []allocation.Claim, warning string) {
		got = append(got, fmt.Sprintf("%s token=%s claims=%d warned=%v", key, token, len(claims), strings.Contains(warning, "left to CAPM3")))
	}
	p.Handle(context.Background(), fixtures.CreateRequest(t, m.Data, false))
	p.Handle(context.Background(), fixtures.CreateRequest(t, m.Data, true))
	paused := m.Data.DeepCopy()
	paused.Annotations = map[string]string{"cluster.x-k8s.io/paused": ""}
	p.Handle(context.Background(), fixtures.CreateRequest(t, paused, false))
	want := []string{fmt.Sprintf("%s/%s token=request-uid claims=%d warned=true", fixtures.Namespace, m.Data.Name, len(fixtures.AllPools)-1)}
	if !slices.Equal(got, want) {
		t.Errorf("OnAdmitted calls %v, want %v", got, want)
	}
}

// TestOnAdmittedStoredToken: an admission that records no claims, only a warning, reports the
// admission token the object came with, which its stored Metal3Data carries; one that records
// claims, its own.
func TestOnAdmittedStoredToken(t *testing.T) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	copied := m.Data.DeepCopy()
	copied.Annotations = map[string]string{allocation.AdmissionAnnotation: "earlier-token"}
	var got []string
	record := func(_ context.Context, _ types.NamespacedName, token, stored string, _ []allocation.Claim, _ string) {
		got = append(got, token+"/"+stored)
	}
	// The name is still known, so every claim is left to CAPM3 with a warning.
	p := newPreallocator(fixtures.NewClient(append(m.Objects(), m.Data.DeepCopy()), nil), false)
	p.OnAdmitted = record
	p.Handle(context.Background(), fixtures.CreateRequest(t, copied, false))
	p = newPreallocator(fixtures.NewClient(m.Objects(), nil), false)
	p.OnAdmitted = record
	p.Handle(context.Background(), fixtures.CreateRequest(t, copied, false))
	if want := []string{"/earlier-token", "request-uid/request-uid"}; !slices.Equal(got, want) {
		t.Errorf("OnAdmitted token/stored %v, want %v", got, want)
	}
}
