// Package install installs ip-preallocator as an operator does, from the release `make release`
// writes, next to cert-manager v1.20.2's own controllers and CA injector, and checks what the
// README promises: the rendered manifests hang together; the certificate is issued from a CA,
// injected into both webhook configurations and served; a renewal under a stream of admissions
// costs none of them; an upgrade and `make undeploy` strand no waiting claim.
//
// The control plane has no kubelet, scheduler or kube-proxy: harness.RunDeployment runs the
// Deployment's container as a process, projects the certificate Secret into its cert directory as
// the kubelet does, and publishes the process as the webhook Service's EndpointSlice, which the
// API server calls (harness.Options.ServiceRouting).
package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/harness/certmanager"
)

var (
	cp          *harness.ControlPlane
	certManager *certmanager.CertManager
)

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	cp, err = harness.Start(ctx, harness.Options{ServiceRouting: true, GarbageCollector: true, NamespaceController: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		os.Exit(1)
	}
	logs, err := harness.LogControllersTo(filepath.Join(cp.Dir, "cert-manager.log"))
	if err == nil {
		certManager, err = certmanager.Start(ctx, cp)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting cert-manager:", err)
		cp.Stop()
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "logs (cert-manager, webhook pods):", cp.Dir)
	}
	certManager.Stop()
	cp.Stop()
	logs.Close()
	if code == 0 {
		os.RemoveAll(cp.Dir)
	}
	os.Exit(code)
}

// makeTarget runs a target of the repository's Makefile, as an operator would, against the test
// control plane.
func makeTarget(t *testing.T, target string, vars ...string) string {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), "make", append([]string{"--no-print-directory", "-C", cp.Root, target}, vars...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s %s: %v\n%s", target, strings.Join(vars, " "), err, out)
	}
	return string(out)
}

// release writes the release of a version into a directory of its own and returns the path of
// its install.yaml.
func release(t *testing.T, img, version string, vars ...string) string {
	t.Helper()
	dir := t.TempDir()
	makeTarget(t, "release", append([]string{"RELEASE_DIR=" + dir, "IMG=" + img, "VERSION=" + version}, vars...)...)
	return filepath.Join(dir, "install.yaml")
}

// build builds the webhook binary of a version with make build, as the Dockerfile builds the
// image of that version: without the VCS stamp, as the image's build context has no .git.
func build(t *testing.T, version string) string {
	t.Helper()
	t.Setenv("GOFLAGS", "-buildvcs=false")
	path := filepath.Join(t.TempDir(), "webhook-"+version)
	makeTarget(t, "build", "WEBHOOK_BIN="+path, "VERSION="+version)
	return path
}

func kubectl(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	out, _, err := cp.Kubectl(context.Background(), stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// headRevision is the revision of the checkout the suite builds from.
func headRevision(t *testing.T) string {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), "git", "-C", cp.Root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// appendFile appends text to the file at path.
func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}
