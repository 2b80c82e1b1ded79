// Package e2e drives kubectl against a real control plane with the webhook installed from
// config/default and running as its own process with config/rbac's permissions.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	cp, err = harness.Start(ctx, harness.Options{GarbageCollector: true, Webhook: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "webhook log:", cp.WebhookLog())
		if log, err := os.ReadFile(cp.WebhookLog()); err == nil {
			_, _ = os.Stderr.Write(log[max(0, len(log)-8000):])
		}
	}
	cp.Stop()
	os.Exit(code)
}

// The claims CAPM3 would create for workers-0 (Metal3Data names).
var wantClaims = []string{
	"IPAddressClaim/workers-0-external",
	"IPClaim/workers-0-baremetal-v4",
	"IPClaim/workers-0-provisioning",
	"IPClaim/workers-0-storage-v6",
}

// namespace creates a namespace with the machine context of testdata applied.
func namespace(t *testing.T, name string, paused bool) string {
	t.Helper()
	ctx := context.Background()
	if _, _, err := cp.Kubectl(ctx, nil, "create", "namespace", name); err != nil {
		t.Fatal(err)
	}
	values := map[string]any{"Paused": paused}
	for _, file := range []string{"testdata/context.yaml", "testdata/machine.yaml"} {
		if _, _, err := cp.Apply(ctx, name, file, values); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name            string            `json:"name"`
		Labels          map[string]string `json:"labels"`
		Annotations     map[string]string `json:"annotations"`
		Finalizers      []string          `json:"finalizers"`
		OwnerReferences []json.RawMessage `json:"ownerReferences"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// get runs kubectl get -o json.
func get(t *testing.T, ns string, args ...string) []object {
	t.Helper()
	out, _, err := cp.Kubectl(context.Background(), nil, append([]string{"get", "-n", ns, "-o", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Items []object }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func claims(t *testing.T, ns string) []object {
	t.Helper()
	return get(t, ns, "ipclaims.ipam.metal3.io,ipaddressclaims.ipam.cluster.x-k8s.io")
}

func names(objs []object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Kind+"/"+o.Metadata.Name)
	}
	slices.Sort(out)
	return out
}

func TestApplyPreallocates(t *testing.T) {
	ns := namespace(t, "preallocate", false)
	_, warnings, err := cp.Apply(context.Background(), ns, "testdata/metal3data.yaml", map[string]any{"Template": "workers"})
	if err != nil {
		t.Fatal(err)
	}
	if warnings != "" {
		t.Errorf("kubectl printed warnings: %s", warnings)
	}

	// The webhook creates the claims as its answer leaves: by the time kubectl has printed, they
	// are there or about to be.
	var got []object
	harness.Eventually(t, 5*time.Second, func() error {
		if got = claims(t, ns); !slices.Equal(names(got), wantClaims) {
			return fmt.Errorf("claims %v, want %v", names(got), wantClaims)
		}
		return nil
	})
	for _, c := range got {
		// Pending, or already handed over by the time kubectl get ran.
		pending := c.Metadata.Annotations[allocation.PreallocatedForAnnotation] == "workers-0" && len(c.Metadata.OwnerReferences) == 0
		if !slices.Equal(c.Metadata.Finalizers, []string{"metal3data.infrastructure.cluster.x-k8s.io"}) ||
			c.Metadata.Labels["cluster.x-k8s.io/cluster-name"] != "cluster" ||
			!pending && len(c.Metadata.OwnerReferences) != 1 {
			t.Errorf("%s/%s: %+v", c.Kind, c.Metadata.Name, c.Metadata)
		}
	}
	spec := map[string]string{}
	for _, c := range got {
		var compact bytes.Buffer
		if err := json.Compact(&compact, c.Spec); err != nil {
			t.Fatal(err)
		}
		spec[c.Metadata.Name] = compact.String()
	}
	if want := `{"pool":{"name":"provisioning","namespace":"preallocate"}}`; spec["workers-0-provisioning"] != want {
		t.Errorf("provisioning claim spec %s, want %s", spec["workers-0-provisioning"], want)
	}
	if want := `{"poolRef":{"apiGroup":"ipam.cluster.x-k8s.io","kind":"InClusterIPPool","name":"external"}}`; spec["workers-0-external"] != want {
		t.Errorf("external claim spec %s, want %s", spec["workers-0-external"], want)
	}

	data := get(t, ns, "metal3datas.infrastructure.cluster.x-k8s.io")
	recorded := strings.Split(data[0].Metadata.Annotations[allocation.ClaimsAnnotation], ",")
	slices.Sort(recorded)
	if !slices.Equal(recorded, wantClaims) {
		t.Errorf("annotation %v, want %v", recorded, wantClaims)
	}

	// Handed over: owned by the Metal3Data as CAPM3 owns its claims, and no trace of us.
	uid, err := cp.UID(context.Background(), ns, "Metal3Data", "workers-0")
	if err != nil {
		t.Fatal(err)
	}
	wantOwner := `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta2","controller":true,"kind":"Metal3Data","name":"workers-0","uid":"` + uid + `"}`
	// Up to 10 s for every claim to have an owner; the checks below tell what is missing.
	var handed []object
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		handed = claims(t, ns)
		return !slices.ContainsFunc(handed, func(c object) bool { return len(c.Metadata.OwnerReferences) == 0 }), nil
	})
	for _, c := range handed {
		var owner bytes.Buffer
		if len(c.Metadata.OwnerReferences) == 1 {
			_ = json.Compact(&owner, c.Metadata.OwnerReferences[0])
		}
		if owner.String() != wantOwner || c.Metadata.Annotations != nil {
			t.Errorf("%s/%s not handed over: %s %v", c.Kind, c.Metadata.Name, c.Metadata.OwnerReferences, c.Metadata.Annotations)
		}
	}
}

func TestDryRunCreatesNothing(t *testing.T) {
	ns := namespace(t, "dry-run", false)
	out, _, err := cp.Apply(context.Background(), ns, "testdata/metal3data.yaml", map[string]any{"Template": "workers"}, "--dry-run=server")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "created (server dry run)") {
		t.Errorf("kubectl said %q", out)
	}
	if got := claims(t, ns); len(got) != 0 {
		t.Errorf("dry run created %v", names(got))
	}
	if got := get(t, ns, "metal3datas.infrastructure.cluster.x-k8s.io"); len(got) != 0 {
		t.Errorf("dry run stored %v", names(got))
	}
}

func TestNothingToPreallocate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		paused   bool
		template string
	}{
		{name: "missing-template", template: "missing"},
		{name: "paused-cluster", paused: true, template: "workers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, tc.name, tc.paused)
			if _, _, err := cp.Apply(context.Background(), ns, "testdata/metal3data.yaml", map[string]any{"Template": tc.template}); err != nil {
				t.Fatal(err)
			}
			data := get(t, ns, "metal3datas.infrastructure.cluster.x-k8s.io")
			if len(data) != 1 {
				t.Fatalf("Metal3Data not admitted: %v", names(data))
			}
			if _, ok := data[0].Metadata.Annotations[allocation.ClaimsAnnotation]; ok {
				t.Errorf("annotated: %v", data[0].Metadata.Annotations)
			}
			if got := claims(t, ns); len(got) != 0 {
				t.Errorf("created %v", names(got))
			}
		})
	}
}

// TestWebhookDown: failurePolicy Ignore admits a Metal3Data while the webhook is away, and the
// webhook preallocates again once it is back.
func TestWebhookDown(t *testing.T) {
	ctx := context.Background()
	down := namespace(t, "webhook-down", false)
	up := namespace(t, "webhook-back", false)

	cp.StopWebhook()
	if _, _, err := cp.Apply(ctx, down, "testdata/metal3data.yaml", map[string]any{"Template": "workers"}); err != nil {
		t.Fatalf("Metal3Data refused while the webhook is down: %v", err)
	}
	if got := claims(t, down); len(got) != 0 {
		t.Errorf("claims without webhook: %v", names(got))
	}
	if len(get(t, down, "metal3datas.infrastructure.cluster.x-k8s.io")) != 1 {
		t.Error("Metal3Data not stored")
	}

	if err := cp.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cp.Apply(ctx, up, "testdata/metal3data.yaml", map[string]any{"Template": "workers"}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 5*time.Second, func() error {
		if got := names(claims(t, up)); !slices.Equal(got, wantClaims) {
			return fmt.Errorf("claims after restart %v, want %v", got, wantClaims)
		}
		return nil
	})
}

// TestRenderedConfigInstalls: what a user applies, config/default, passes the API server's
// validation next to cert-manager's CRDs on a fresh cluster.
func TestRenderedConfigInstalls(t *testing.T) {
	ctx := context.Background()
	fresh, err := harness.Start(ctx, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Stop()
	manifest, _, err := fresh.Kubectl(ctx, nil, "kustomize", fresh.Root+"/config/default")
	if err != nil {
		t.Fatal(err)
	}
	// The namespace must exist for a server-side dry run of what lives in it.
	if _, _, err := fresh.Kubectl(ctx, nil, "create", "namespace", "ip-preallocator-system"); err != nil {
		t.Fatal(err)
	}
	out, _, err := fresh.Kubectl(ctx, []byte(manifest), "apply", "--dry-run=server", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"certificate.cert-manager.io/ip-preallocator-serving-cert created (server dry run)",
		"issuer.cert-manager.io/ip-preallocator-selfsigned-issuer created (server dry run)",
		"mutatingwebhookconfiguration.admissionregistration.k8s.io/ip-preallocator-mutating-webhook-configuration created (server dry run)",
		"validatingwebhookconfiguration.admissionregistration.k8s.io/ip-preallocator-validating-webhook-configuration created (server dry run)",
		"deployment.apps/ip-preallocator-controller-manager created (server dry run)",
		"clusterrole.rbac.authorization.k8s.io/ip-preallocator-manager-role created (server dry run)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// TestTemplateValidation shows what a user sees when applying a Metal3DataTemplate: the error,
// with its field, for a reference CAPM3 would fail on, and warnings for what is suspicious.
func TestTemplateValidation(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "templates", false)

	_, stderr, err := cp.Apply(ctx, ns, "testdata/template-invalid.yaml", nil)
	if err == nil {
		t.Fatal("the invalid template was accepted")
	}
	want := `The Metal3DataTemplate "broken" is invalid: spec.networkData.networks.ipv6[0].fromPoolRef: ` +
		`Invalid value: "shared": pool "shared" is referenced as ipam.cluster.x-k8s.io/InClusterIPPool here and as ipam.metal3.io/IPPool ` +
		`at spec.networkData.networks.ipv4[0].ipAddressFromIPPool; CAPM3 fails on one name with two resource types`
	if !strings.Contains(stderr, want) {
		t.Errorf("kubectl said:\n%s\nwant it to contain:\n%s", stderr, want)
	}

	_, stderr, err = cp.Apply(ctx, ns, "testdata/template-warning.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`Warning: spec.metaData.prefixesFromPool[0]: apiGroup "ipam.cluster.x-k8s.io" and kind "InClusterIPPool" are ignored by CAPM3 v1.13.2: pool "provisioning-v2" is read as an ipam.metal3.io IPPool`,
		`Warning: spec.metaData.prefixesFromPool[0].name: IPPool.ipam.metal3.io "provisioning-v2" does not exist in namespace "templates"`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("kubectl said:\n%s\nwant it to contain:\n%s", stderr, want)
		}
	}
	if strings.Contains(stderr, `"provisioning" does not exist`) {
		t.Errorf("warned about an existing pool:\n%s", stderr)
	}
}

// TestWebhookRunsWithTheManifestsEnvironment: the webhook process runs with every value
// config/manager sets in its container's environment (GOMEMLIMIT), as its pod would, so that the
// memory the suites and benchmarks measure is the manifest's.
func TestWebhookRunsWithTheManifestsEnvironment(t *testing.T) {
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cp.WebhookPid()))
	if err != nil {
		t.Fatal(err)
	}
	has, want := strings.Split(string(environ), "\x00"), cp.ManagerEnv()
	if !slices.ContainsFunc(want, func(v string) bool { return strings.HasPrefix(v, "GOMEMLIMIT=") }) {
		t.Errorf("config/manager sets no GOMEMLIMIT: %q", want)
	}
	for _, v := range want {
		if !slices.Contains(has, v) {
			t.Errorf("the webhook process runs without %s", v)
		}
	}
}
