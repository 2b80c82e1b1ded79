package harness

import (
	"context"
	"strings"
	"testing"
)

// TestStart brings the whole control plane up and checks that each part answers: kubectl, the
// garbage collector's controller manager, the CRDs and the webhook's readiness.
func TestStart(t *testing.T) {
	ctx := context.Background()
	cp, err := Start(ctx, Options{GarbageCollector: true, Webhook: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	out, _, err := cp.Kubectl(ctx, nil, "api-resources", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"metal3datas.infrastructure.cluster.x-k8s.io", "ipclaims.ipam.metal3.io",
		"ipaddressclaims.ipam.cluster.x-k8s.io", "baremetalhosts.metal3.io", "certificates.cert-manager.io"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s is not served", want)
		}
	}
	if !cp.controllerManager.Running() {
		t.Error("kube-controller-manager is not running")
	}
	metrics, err := cp.Metrics()
	if err != nil || !strings.Contains(metrics, "controller_runtime_webhook") {
		t.Errorf("webhook metrics: %v", err)
	}
}
