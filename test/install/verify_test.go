package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

const (
	// verifyLabel marks everything make verify-install creates, and the claims it is given.
	verifyLabel = "ip-preallocator.metal3.io/verify"
	// verifyPrefix begins the name of the namespace make verify-install creates.
	verifyPrefix = "ip-preallocator-verify-"
)

var verifyNamespace = regexp.MustCompile(`\b` + verifyPrefix + `[0-9a-f]{8}\b`)

// testVerifyInstall runs make verify-install as an operator does after the install: it passes,
// shows the claim preallocated and handed over, and leaves nothing. Without the mutating webhook
// configuration it fails, saying that nothing was preallocated and why, and leaves nothing either;
// the configuration is then applied again, and the webhook preallocates as before.
func testVerifyInstall(t *testing.T, w *world, dir string, caBundle []byte) { //nolint:thelper // the body of a TestLifecycle subtest, not a helper: failures should name its own lines
	start := time.Now()
	out, err := verifyInstall()
	t.Logf("make verify-install (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("make verify-install: %v", err)
	}
	if last := lastLine(out); !strings.HasPrefix(last, "PASS: ") {
		t.Errorf("make verify-install ends with %q, want PASS", last)
	}
	// The claim of the template's one pool, as CAPM3 names it, owned by the Metal3Data and with
	// CAPM3's finalizer, no longer waiting.
	handedOver := regexp.MustCompile(`(?m)^verify-0-verify +verify +Metal3Data +verify-0 +[0-9a-f-]{36} +metal3data\.infrastructure\.cluster\.x-k8s\.io +<none>$`)
	if !handedOver.MatchString(out) {
		t.Errorf("make verify-install does not show IPClaim verify-0-verify handed over to Metal3Data verify-0")
	}
	checkNothingLeft(t, out)

	// The API server calls no webhook: the Metal3Data is admitted unchanged, and the verify fails.
	kubectl(t, nil, "delete", "mutatingwebhookconfiguration", mutating)
	start = time.Now()
	out, err = verifyInstall()
	t.Logf("make verify-install without %s (%v):\n%s", mutating, time.Since(start).Round(time.Millisecond), out)
	if err == nil {
		t.Error("make verify-install passed without the mutating webhook configuration")
	}
	if last := lastLine(out); !strings.HasPrefix(last, "FAIL: nothing was preallocated") {
		t.Errorf("make verify-install ends with %q, want FAIL: nothing was preallocated", last)
	}
	if !strings.Contains(out, "no MutatingWebhookConfiguration labelled app.kubernetes.io/part-of=ip-preallocator exists") {
		t.Error("make verify-install does not say the mutating webhook configuration is missing")
	}
	checkNothingLeft(t, out)

	// Applied again, as the README installs; cert-manager injects the CA again.
	kubectl(t, nil, "apply", "-f", filepath.Join(dir, "install.yaml"))
	harness.Eventually(t, 60*time.Second, func() error {
		if got := injected(t, "mutatingwebhookconfiguration/"+mutating); !bytes.Equal(got, caBundle) {
			return fmt.Errorf("caBundle %q, want the CA", got)
		}
		return nil
	})
	// The API server calls the webhook again once its configuration has reached it.
	harness.Eventually(t, 30*time.Second, func() error {
		data, err := w.admit(context.Background(), false)
		if err != nil {
			t.Fatal(err)
		}
		if data.Annotations[allocation.ClaimsAnnotation] == "" {
			return fmt.Errorf("Metal3Data %s was not preallocated", data.Name)
		}
		return nil
	})
}

// verifyInstall runs make verify-install against the test control plane with the harness's kubectl.
func verifyInstall() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", cp.Root, "verify-install",
		"KUBECTL="+filepath.Join(cp.Root, "bin", "kubectl"))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// lastLine is the script's last line: make's own error line follows it on failure.
// makeError is make's own line about a failed recipe, "make[1]: ..." under another make.
var makeError = regexp.MustCompile(`^make(\[\d+\])?: `)

func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i > 0 && makeError.MatchString(lines[i]); i-- {
		lines = lines[:i]
	}
	return lines[len(lines)-1]
}

// checkNothingLeft checks that the namespace the verify's output names is gone, and that no claim
// or IPAddress of either IPAM carries its label or is in a namespace of its, anywhere.
func checkNothingLeft(t *testing.T, out string) {
	t.Helper()
	ns := verifyNamespace.FindString(out)
	if ns == "" {
		t.Fatal("make verify-install does not name its namespace")
	}
	if got := kubectl(t, nil, "get", "namespace", ns, "--ignore-not-found", "-o", "name"); got != "" {
		t.Errorf("namespace %s is left: %q", ns, got)
	}
	for _, gvk := range []schema.GroupVersionKind{
		allocation.IPClaimGVK, allocation.IPAddressClaimGVK,
		{Group: "ipam.metal3.io", Version: "v1alpha1", Kind: "IPAddress"},
		{Group: "ipam.cluster.x-k8s.io", Version: "v1beta2", Kind: "IPAddress"},
	} {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := cp.Client.List(context.Background(), list); err != nil {
			t.Fatal(err)
		}
		for _, item := range list.Items {
			if _, labelled := item.Labels[verifyLabel]; labelled || strings.HasPrefix(item.Namespace, verifyPrefix) {
				t.Errorf("%s %s/%s is left", gvk.Kind, item.Namespace, item.Name)
			}
		}
	}
}
