package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metal3-community/ip-preallocator/pkg/mutate"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// TestSecondInstallRefused: with two installs' preallocating webhooks registered, the webhook of
// the one registered second exits with an error naming the first, and the first's starts.
func TestSecondInstallRefused(t *testing.T) {
	ctx := context.Background()
	first, _ := cp.ServiceAccount()
	register := func(name, namespace string) {
		t.Helper()
		none := admissionregistrationv1.NamespacedScope
		c := &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name:                    mutate.WebhookName,
				ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: "webhook-service"}},
				AdmissionReviewVersions: []string{"v1"},
				SideEffects:             new(admissionregistrationv1.SideEffectClassNoneOnDryRun),
				FailurePolicy:           new(admissionregistrationv1.Ignore),
				// Nothing the tests create: the API server never calls it.
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}, Scope: &none},
				}},
			}},
		}
		if err := cp.Client.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cp.Client.Delete(ctx, c) })
	}
	register("first-mutating-webhook-configuration", first)
	register("second-mutating-webhook-configuration", "second")

	bin, err := harness.WebhookBinary(cp.Root)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cp.WebhookKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "second.log")
	second, err := harness.StartProcess(ctx, log, bin, []string{"KUBECONFIG=" + kubeconfig, "POD_NAMESPACE=second", "POD_NAME=second-0"},
		"--health-addr=127.0.0.1:0", "--diagnostics-address=127.0.0.1:0", "--insecure-diagnostics")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	harness.Eventually(t, 30*time.Second, func() error {
		out, _ := os.ReadFile(log)
		if second.Running() || !strings.Contains(string(out), "another ip-preallocator install serves this cluster: MutatingWebhookConfiguration first-mutating-webhook-configuration") {
			return fmt.Errorf("the second install's webhook runs (%t) or says otherwise:\n%s", second.Running(), out)
		}
		return nil
	})
	// The first install's webhook starts as before.
	cp.StopWebhook()
	if err := cp.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
}
