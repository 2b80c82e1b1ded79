package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// TestSlowNamespaceCommands runs the commands docs/troubleshooting.md gives for a namespace that
// takes long to delete, on a namespace held by a waiting claim: they must run and name the claim,
// its finalizer and the Metal3Data it waits for.
func TestSlowNamespaceCommands(t *testing.T) {
	ctx := context.Background()
	doc, err := os.ReadFile(filepath.Join(cp.Root, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## A namespace that takes long to delete\n.*?```sh\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/troubleshooting.md: no sh block in \"A namespace that takes long to delete\"")
	}
	ns := "slow-deletion"
	if _, _, err := cp.Kubectl(ctx, nil, "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	claim := `apiVersion: ipam.metal3.io/v1alpha1
kind: IPClaim
metadata:
  name: workers-0-provisioning
  annotations:
    ` + allocation.PreallocatedForAnnotation + `: workers-0
  finalizers: [metal3data.infrastructure.cluster.x-k8s.io]
spec:
  pool: {name: provisioning}
`
	if _, _, err := cp.Kubectl(ctx, []byte(claim), "apply", "-n", ns, "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cp.Kubectl(ctx, nil, "delete", "namespace", ns, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _, _ = cp.Kubectl(ctx, nil, "patch", "-n", ns, "ipclaim", "workers-0-provisioning", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
	})

	script := strings.ReplaceAll(string(m[1]), "<ns>", ns)
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(cp.Root, "bin")+":"+os.Getenv("PATH"), "KUBECONFIG="+cp.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the documented commands failed: %v\n%s", err, out)
	}
	for _, want := range []string{"IPClaim", "workers-0-provisioning", "[metal3data.infrastructure.cluster.x-k8s.io]", "PREALLOCATED-FOR", "workers-0\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the documented commands' output lacks %q:\n%s", want, out)
		}
	}
}
