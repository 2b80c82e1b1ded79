package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

// TestStoredInvalidTemplate: a Metal3DataTemplate stored before the validation existed (or before
// a rule changed) stays usable. Metadata updates, like CAPM3's finalizer, and its deletion pass,
// also while the webhook is down; a spec update is refused only for the errors it introduces.
func TestStoredInvalidTemplate(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "stored-invalid", false)
	kubectl := func(args ...string) (string, error) {
		_, stderr, err := cp.Kubectl(ctx, nil, append([]string{"-n", ns}, args...)...)
		return stderr, err
	}

	setTemplateValidation(t, ns, false)
	if _, _, err := cp.Apply(ctx, ns, "testdata/template-invalid.yaml", nil); err != nil {
		t.Fatal(err)
	}
	setTemplateValidation(t, ns, true)

	if _, err := kubectl("patch", "metal3datatemplate", "broken", "--type=merge", "-p",
		`{"metadata":{"finalizers":["test.ip-preallocator.metal3.io/hold"]}}`); err != nil {
		t.Fatalf("adding a finalizer: %v", err)
	}

	stderr, err := kubectl("patch", "metal3datatemplate", "broken", "--type=json", "-p",
		`[{"op":"replace","path":"/spec/networkData/networks/ipv4/0/id","value":"provisioning"}]`)
	if err != nil {
		t.Fatalf("a spec update that keeps the stored error was refused: %v", err)
	}
	if want := `Warning: spec.networkData.networks.ipv6[0].fromPoolRef: Invalid value: "shared": pool "shared" is referenced as ` +
		`ipam.cluster.x-k8s.io/InClusterIPPool here and as ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[0].ipAddressFromIPPool; ` +
		`CAPM3 fails on one name with two resource types (admitted: the stored Metal3DataTemplate has it already, but CAPM3 still fails on it)`; !strings.Contains(stderr, want) {
		t.Errorf("kubectl said:\n%s\nwant it to contain:\n%s", stderr, want)
	}

	stderr, err = kubectl("patch", "metal3datatemplate", "broken", "--type=json", "-p",
		`[{"op":"add","path":"/spec/networkData/networks/ipv4/0/fromPoolAnnotation","value":{"object":"cluster","annotation":"example.com/pool"}}]`)
	if err == nil {
		t.Fatal("a spec update that introduces an error was accepted")
	}
	if want := `The Metal3DataTemplate "broken" is invalid: spec.networkData.networks.ipv4[0].fromPoolAnnotation.object: ` +
		`Unsupported value: "cluster": supported values: "machine", "metal3machine", "baremetalhost"`; !strings.Contains(stderr, want) {
		t.Errorf("kubectl said:\n%s\nwant it to contain:\n%s", stderr, want)
	}
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "is invalid") && strings.Contains(line, "ipv6[0]") {
			t.Errorf("the stored error was rejected again:\n%s", line)
		}
	}

	cp.StopWebhook()
	defer func() {
		if err := cp.StartWebhook(ctx); err != nil {
			t.Fatal(err)
		}
	}()
	if _, err := kubectl("label", "metal3datatemplate", "broken", "example.com/touched=yes"); err != nil {
		t.Errorf("a metadata update needed the webhook: %v", err)
	}
	if stderr, err := kubectl("patch", "metal3datatemplate", "broken", "--type=merge", "-p", `{"spec":{"clusterName":"other"}}`); err == nil ||
		!strings.Contains(stderr, "failed calling webhook") {
		t.Errorf("a spec update passed without the webhook: %v", err)
	}
	if _, err := kubectl("delete", "metal3datatemplate", "broken", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	if _, err := kubectl("patch", "metal3datatemplate", "broken", "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`); err != nil {
		t.Fatalf("removing the finalizer needed the webhook: %v", err)
	}
	if _, err := kubectl("wait", "--for=delete", "metal3datatemplate/broken", "--timeout=10s"); err != nil {
		t.Error(err)
	}
}

// setTemplateValidation removes or installs config/default's validating webhook configurations,
// and waits until the API server acts on it: the webhook configuration reaches admission through
// an informer, a moment after it is written.
func setTemplateValidation(t *testing.T, ns string, on bool) {
	t.Helper()
	ctx := context.Background()
	for _, hook := range cp.Env.WebhookInstallOptions.ValidatingWebhooks {
		hook := hook.DeepCopy()
		var err error
		if on {
			hook.ResourceVersion = ""
			err = cp.Client.Create(ctx, hook)
		} else {
			err = cp.Client.Delete(ctx, hook)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}

	invalid, err := os.ReadFile("testdata/template-invalid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	probe := bytes.Replace(invalid, []byte("name: broken"), []byte("name: probe"), 1)
	harness.Eventually(t, 10*time.Second, func() error {
		_, _, err := cp.Kubectl(ctx, probe, "create", "-n", ns, "--dry-run=server", "-f", "-")
		if (err != nil) != on {
			return fmt.Errorf("template validation on=%v not in effect: %v", on, err)
		}
		return nil
	})
}
