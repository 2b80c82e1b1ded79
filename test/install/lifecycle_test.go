package install

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

const (
	namespace   = "ip-preallocator-system"
	deployment  = "ip-preallocator-controller-manager"
	servingCert = "ip-preallocator-serving-cert"
	certSecret  = "ip-preallocator-webhook-service-cert"
	// serviceDNS is the name the API server verifies the webhook's certificate against.
	serviceDNS  = "ip-preallocator-webhook-service." + namespace + ".svc"
	mutating    = "ip-preallocator-mutating-webhook-configuration"
	validating  = "ip-preallocator-validating-webhook-configuration"
	rejectLabel = "test.ip-preallocator.metal3.io/reject"
	// gracePeriod is the webhook's --release-grace-period here (but for the first version's).
	gracePeriod = 15 * time.Second
	// secretSyncDelay is how late a changed Secret reaches the webhook's files.
	secretSyncDelay = 3 * time.Second
)

func image(version string) string { return "registry.example.com/metal3/ip-preallocator:" + version }

// TestLifecycle installs a release as the README says, renews the serving certificate under a
// stream of admissions, upgrades to a new version while claims wait and uninstalls with make
// undeploy while claims wait. Each step needs the one before.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	v1, v2 := "v0.1.0-test", "v0.2.0-test"
	binaries := map[string]string{image(v1): build(t, v1), image(v2): build(t, v2)}
	releases := t.TempDir()
	// CAPM3's Deployment as clusterctl installs it; the webhook preallocates only beside it.
	if err := cp.DeclareCAPM3(ctx, harness.CAPM3Image, false); err != nil {
		t.Fatal(err)
	}
	dep := cp.RunDeployment(ctx, namespace, deployment, harness.RunOptions{
		Binaries: binaries,
		ExtraArgs: []string{
			"--webhook-host=127.0.0.1",
			"--leader-election-namespace=" + namespace,
			"--release-grace-period=" + gracePeriod.String(),
			// No IPAM runs here, so no claim is ever answered: released after this limit.
			"--release-hold-limit=5s",
		},
		// The first version keeps waiting claims for longer than the test runs, so that the
		// claims its admissions leave certainly still wait when the second one takes over,
		// however long the rollout takes on a loaded machine.
		ImageArgs: map[string][]string{image(v1): {"--release-grace-period=1h"}},
		// A renewed certificate reaches the webhook's files this late, as with the kubelet
		// (there up to about a minute): with a self-signed serving certificate, whose renewal
		// changes the caBundle at once, the stream's admissions fail meanwhile.
		SecretSyncDelay: secretSyncDelay,
	})
	defer func() {
		dep.Stop()
		if t.Failed() {
			t.Logf("pods:\n%s", strings.Join(dep.Events(), "\n"))
		}
	}()
	w := newWorld(t, "machines")

	var caBundle []byte
	var pod *harness.Pod
	if !t.Run("install", func(t *testing.T) { caBundle, pod = testInstall(t, dep, w, filepath.Join(releases, v1), v1) }) {
		return
	}
	if !t.Run("make verify-install", func(t *testing.T) { testVerifyInstall(t, w, filepath.Join(releases, v1), caBundle) }) {
		return
	}
	t.Run("alerts", func(t *testing.T) { testAlerts(t, pod) })
	if !t.Run("renewal under a stream of admissions", func(t *testing.T) { testRenewal(t, dep, pod, w, caBundle) }) {
		return
	}
	if !t.Run("upgrade while claims wait", func(t *testing.T) { testUpgrade(t, dep, w, filepath.Join(releases, v2), v2) }) {
		return
	}
	t.Run("uninstall while claims wait", func(t *testing.T) { testUninstall(t, dep, w, filepath.Join(releases, v2), v2) })
}

// apply installs a release as the README says: `make release`, then
// `kubectl apply -f out/install.yaml`.
func apply(t *testing.T, dir, version string) {
	t.Helper()
	makeTarget(t, "release", "RELEASE_DIR="+dir, "IMG="+image(version), "VERSION="+version)
	kubectl(t, nil, "apply", "-f", filepath.Join(dir, "install.yaml"))
}

func testInstall(t *testing.T, dep *harness.Deployment, w *world, dir, version string) ([]byte, *harness.Pod) { //nolint:thelper // the body of a TestLifecycle subtest, not a helper: failures should name its own lines
	ctx := context.Background()
	apply(t, dir, version)

	// cert-manager issues the CA, then the serving certificate from it.
	kubectl(t, nil, "wait", "-n", namespace, "--for=condition=Ready", "issuers.cert-manager.io,certificates.cert-manager.io", "--all", "--timeout=60s")
	ca, leaf := secretCerts(t)
	if !ca.IsCA || leaf.IsCA || leaf.CheckSignatureFrom(ca) != nil || !slices.Contains(leaf.DNSNames, serviceDNS) {
		t.Fatalf("the serving certificate (%s, names %v) is not a leaf for %s signed by the CA (%s)", leaf.Subject, leaf.DNSNames, serviceDNS, ca.Subject)
	}

	// The CA injector fills caBundle of both configurations with the CA.
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	harness.Eventually(t, 60*time.Second, func() error {
		for _, kind := range []string{"mutatingwebhookconfiguration/" + mutating, "validatingwebhookconfiguration/" + validating} {
			if got := injected(t, kind); !bytes.Equal(got, caBundle) {
				return fmt.Errorf("%s caBundle %q, want the CA", kind, got)
			}
		}
		return nil
	})

	pod, err := dep.WaitReady(ctx, 90*time.Second)
	if err != nil {
		t.Fatalf("the webhook's pod: %v", err)
	}
	if served, err := servedCert(pod, caBundle); err != nil || !served.Equal(leaf) {
		t.Fatalf("the webhook does not serve cert-manager's certificate %s: %v", leaf.SerialNumber, err)
	}
	// It found CAPM3 with its RBAC, and says so on its pod (named by the downward API).
	harness.Eventually(t, 30*time.Second, func() error {
		out := kubectl(t, nil, "events", "-n", namespace, "--for", "pod/"+pod.Name)
		if !strings.Contains(out, "CAPM3Compatible") {
			return fmt.Errorf("no CAPM3Compatible Event on pod %s: %q", pod.Name, out)
		}
		return nil
	})

	// The namespace enforces the restricted Pod Security Standard (the pod above passed it).
	bad := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "escalating", Namespace: namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: image(version), SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)},
		}}},
	}
	if err := cp.Client.Create(ctx, bad, client.DryRunAll); err == nil || !strings.Contains(err.Error(), `violates PodSecurity "restricted`) {
		t.Errorf("a pod that allows privilege escalation: %v, want a restricted Pod Security violation", err)
	}

	// The API server calls both webhooks over that chain: the validating one rejects a broken
	// template, the mutating one preallocates the claims of a Metal3Data.
	_, stderr, err := cp.Kubectl(ctx, nil, "apply", "-n", w.ns, "-f", "testdata/template-invalid.yaml")
	if err == nil || !strings.Contains(stderr, "CAPM3 fails on one name with two resource types") {
		t.Errorf("a broken template: %v %s, want the validating webhook's rejection", err, stderr)
	}
	data, err := w.admit(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	out := kubectl(t, nil, "get", "-n", w.ns, "metal3datas.infrastructure.cluster.x-k8s.io", data.Name,
		"-o", `jsonpath={.metadata.annotations.ip-preallocator\.metal3\.io/claims}`)
	if strings.Count(out, "/") != 3 {
		t.Errorf("Metal3Data %s records claims %q, want three", data.Name, out)
	}

	// A claim under a name CAPM3 would use, not preallocated, is left to CAPM3: the admission
	// is partial and the Metal3Data gets a Warning Event once it is stored.
	foreign := w.nextData() + "-" + fixtures.BaremetalPool
	claim := &unstructured.Unstructured{}
	claim.SetGroupVersionKind(allocation.IPClaimGVK)
	claim.SetNamespace(w.ns)
	claim.SetName(foreign)
	claim.Object["spec"] = map[string]any{"pool": map[string]any{"name": fixtures.BaremetalPool, "namespace": w.ns}}
	if err := cp.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	partial, err := w.admit(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, func() error {
		out := kubectl(t, nil, "events", "-n", w.ns, "--for", "metal3data/"+partial.Name, "--types=Warning")
		if !strings.Contains(out, "PreallocationIncomplete") || !strings.Contains(out, foreign) {
			return fmt.Errorf("no Warning Event naming %s on Metal3Data %s: %q", foreign, partial.Name, out)
		}
		return nil
	})

	// A claim whose create fails after the answer is left to CAPM3 too: here a quota forbids
	// IPAddressClaims (its status set by hand, as no quota controller runs here). The Metal3Data
	// gets a Warning Event, and claims_total counts the failure.
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-ipaddressclaims", Namespace: w.ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/ipaddressclaims.ipam.cluster.x-k8s.io": resource.MustParse("0")}},
	}
	if err := cp.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: quota.Spec.Hard}
	if err := cp.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	failed, err := w.admit(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := failed.Name + "-" + fixtures.ExternalPool
	harness.Eventually(t, 30*time.Second, func() error {
		out := kubectl(t, nil, "events", "-n", w.ns, "--for", "metal3data/"+failed.Name, "--types=Warning")
		if !strings.Contains(out, "PreallocationIncomplete") || !strings.Contains(out, "IPAddressClaim "+forbidden+" left to CAPM3") {
			return fmt.Errorf("no Warning Event naming %s on Metal3Data %s: %q", forbidden, failed.Name, out)
		}
		return nil
	})
	if err := cp.Client.Delete(ctx, quota); err != nil {
		t.Fatal(err)
	}

	// The version, as the binary and the metrics (read with the metrics-reader role) tell it.
	if out, err := exec.CommandContext(ctx, pod.Binary, "--version").Output(); err != nil || !strings.HasPrefix(string(out), "ip-preallocator "+version+" ") {
		t.Errorf("--version: %q %v", out, err)
	}
	kubectl(t, nil, "create", "namespace", "monitoring")
	kubectl(t, nil, "create", "serviceaccount", "-n", "monitoring", "prometheus")
	kubectl(t, nil, "create", "serviceaccount", "-n", "monitoring", "stranger")
	kubectl(t, nil, "create", "clusterrolebinding", "prometheus-ip-preallocator-metrics",
		"--clusterrole=ip-preallocator-metrics-reader", "--serviceaccount=monitoring:prometheus")
	if status, _ := scrape(t, pod, "stranger"); status != http.StatusForbidden {
		t.Errorf("metrics without the metrics-reader role: %d, want 403", status)
	}
	metrics := scrapeOK(t, pod)
	for _, want := range []string{
		`ip_preallocator_build_info{goversion=`, `version="` + version + `"} 1`,
		`ip_preallocator_admissions_total{outcome="preallocated"`, `ip_preallocator_admissions_total{outcome="partial"`,
		`ip_preallocator_claims_total{kind="IPAddressClaim",outcome="failed"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// The queries and alerts docs/metrics.md gives operators select series this install exposes; releases
	// come with the upgrade.
	checkPageQueries(t, metrics, func(metric string) bool { return metric != "ip_preallocator_releases_total" })
	return caBundle, pod
}

// testRenewal renews the serving certificate while Metal3Data are admitted one after another:
// the webhook serves the new key without a restart, the caBundle stays, every admission is
// preallocated.
func testRenewal(t *testing.T, dep *harness.Deployment, pod *harness.Pod, w *world, caBundle []byte) { //nolint:thelper // the body of a TestLifecycle subtest, not a helper: failures should name its own lines
	ctx := context.Background()
	_, before := secretCerts(t)
	revision := kubectl(t, nil, "get", "-n", namespace, "certificate", servingCert, "-o", "jsonpath={.status.revision}")

	stream := w.stream(ctx)
	time.Sleep(time.Second)
	// What `cmctl renew` does: set the Issuing condition.
	generation := kubectl(t, nil, "get", "-n", namespace, "certificate", servingCert, "-o", "jsonpath={.metadata.generation}")
	kubectl(t, nil, "patch", "-n", namespace, "certificate", servingCert, "--subresource=status", "--type=json", "-p",
		fmt.Sprintf(`[{"op":"add","path":"/status/conditions/-","value":{"type":"Issuing","status":"True","reason":"ManuallyTriggered",`+
			`"message":"Certificate re-issuance manually triggered","lastTransitionTime":%q,"observedGeneration":%s}}]`,
			time.Now().UTC().Format(time.RFC3339), generation))
	renewed := time.Now()

	var after *x509.Certificate
	harness.Eventually(t, 60*time.Second, func() error {
		_, after = secretCerts(t)
		if after.Equal(before) {
			return errors.New("the Secret holds the old certificate")
		}
		return nil
	})
	harness.Eventually(t, 30*time.Second, func() error {
		served, err := servedCert(pod, caBundle)
		if err != nil {
			return err
		}
		if !served.Equal(after) {
			return fmt.Errorf("the webhook serves %s, not the renewed %s", served.SerialNumber, after.SerialNumber)
		}
		return nil
	})
	t.Logf("renewed certificate served %v after the renewal was triggered", time.Since(renewed).Round(time.Millisecond))
	time.Sleep(2 * time.Second) // admissions over the new certificate
	admitted := stream.stop()

	kubectl(t, nil, "wait", "--for=condition=Ready", "--timeout=30s", "-n", namespace, "certificate", servingCert)
	if got := kubectl(t, nil, "get", "-n", namespace, "certificate", servingCert, "-o", "jsonpath={.status.revision}"); got == revision {
		t.Errorf("certificate revision still %s", got)
	}
	if bytes.Equal(after.RawSubjectPublicKeyInfo, before.RawSubjectPublicKeyInfo) {
		t.Error("the renewed certificate has the old key")
	}
	for _, kind := range []string{"mutatingwebhookconfiguration/" + mutating, "validatingwebhookconfiguration/" + validating} {
		if got := injected(t, kind); !bytes.Equal(got, caBundle) {
			t.Errorf("%s: caBundle changed with the renewal", kind)
		}
	}
	if current := dep.Current(); current != pod || !pod.Running() {
		t.Errorf("the webhook was restarted: %v", dep.Events())
	}

	if len(admitted) < 10 {
		t.Errorf("only %d admissions in the stream", len(admitted))
	}
	failed := 0
	for _, a := range admitted {
		if a.err != nil || !a.preallocated {
			failed++
			if failed <= 10 {
				t.Errorf("Metal3Data %s at %s: preallocated=%v, err=%v", a.name, a.at.Format("15:04:05.000"), a.preallocated, a.err)
			}
		}
	}
	t.Logf("%d Metal3Data admitted across the renewal, %d of them not preallocated", len(admitted), failed)
}

// testUpgrade applies a new version while claims wait for Metal3Data that were never stored; the
// new version's release controller finishes them.
func testUpgrade(t *testing.T, dep *harness.Deployment, w *world, dir, version string) { //nolint:thelper // the body of a TestLifecycle subtest, not a helper: failures should name its own lines
	ctx := context.Background()
	old := dep.Current()
	rejectLabelled(t)
	waiting := w.rejectSome(t, 3)

	// This time with make deploy.
	makeTarget(t, "deploy", "RELEASE_DIR="+dir, "IMG="+image(version), "VERSION="+version,
		"KUBECTL="+filepath.Join(cp.Root, "bin", "kubectl"))
	var pod *harness.Pod
	harness.Eventually(t, 90*time.Second, func() error {
		if pod = dep.Current(); pod == nil || pod.Image != image(version) {
			return fmt.Errorf("the new version does not serve: %v", dep.Err())
		}
		return nil
	})
	// The rollout stops the old pod once the new one is ready, not in the same instant.
	harness.Eventually(t, 10*time.Second, func() error {
		if old.Running() {
			return errors.New("the old version still runs")
		}
		return nil
	})
	if got := w.waiting(t); len(got) < len(waiting) {
		t.Fatalf("claims waiting when the new version took over: %v, want %v", got, waiting)
	}
	// The new version finishes them: released, as their Metal3Data were never stored.
	harness.Eventually(t, gracePeriod+30*time.Second, func() error {
		if got := w.waiting(t); len(got) > 0 {
			return fmt.Errorf("claims still wait: %v", got)
		}
		return nil
	})
	for _, name := range waiting {
		if w.exists(t, name) {
			t.Errorf("claim %s of a rejected Metal3Data was not released", name)
		}
	}
	metrics := scrapeOK(t, pod)
	if !strings.Contains(metrics, `version="`+version+`"} 1`) || !strings.Contains(metrics, `revision="`+headRevision(t)+`"`) {
		t.Errorf("the new version's metrics lack its build info (version %s, revision %s):\n%s", version, headRevision(t), grep(metrics, "ip_preallocator_build_info"))
	}
	checkPageQueries(t, metrics, func(metric string) bool { return metric == "ip_preallocator_releases_total" })
	if data, err := w.admit(ctx, false); err != nil || data.Annotations[allocation.ClaimsAnnotation] == "" {
		t.Errorf("a Metal3Data after the upgrade was not preallocated: %v", err)
	}
}

// testUninstall runs make undeploy while claims wait: it removes the mutating webhook, waits for
// the release controller and only then removes the rest. No claim is left waiting.
func testUninstall(t *testing.T, dep *harness.Deployment, w *world, dir, version string) { //nolint:thelper // the body of a TestLifecycle subtest, not a helper: failures should name its own lines
	ctx := context.Background()
	stored, err := w.admit(ctx, false)
	if err != nil || stored.Annotations[allocation.ClaimsAnnotation] == "" {
		t.Fatalf("a stored Metal3Data was not preallocated: %v", err)
	}
	released := w.rejectSome(t, 2)

	// What was applied is what goes: make undeploy must not render the release again.
	applied := filepath.Join(dir, "install.yaml")
	marker := "# applied by the test, before make undeploy\n"
	appendFile(t, applied, marker)
	out := makeTarget(t, "undeploy", "RELEASE_DIR="+dir, "IMG="+image(version), "VERSION="+version, "KUBECTL="+filepath.Join(cp.Root, "bin", "kubectl"))
	t.Logf("make undeploy:\n%s", out)
	if content, err := os.ReadFile(applied); err != nil || !strings.HasSuffix(string(content), marker) {
		t.Errorf("make undeploy rendered %s again: %v", applied, err)
	}
	steps := []string{"Removing the mutating webhook", "Waiting for the replicas", "Removing the rest"}
	last := -1
	for _, step := range steps {
		i := strings.Index(out, step)
		if i < last {
			t.Errorf("make undeploy did not say %q after the step before", step)
		}
		last = i
	}

	if got := w.waiting(t); len(got) > 0 {
		t.Errorf("claims stranded: %v", got)
	}
	for _, name := range released {
		if w.exists(t, name) {
			t.Errorf("claim %s of a rejected Metal3Data was not released", name)
		}
	}
	claims := w.claimsOf(t, stored.Name)
	if len(claims) != 3 {
		t.Errorf("Metal3Data %s has %d claims, want 3", stored.Name, len(claims))
	}
	for _, c := range claims {
		if refs := c.GetOwnerReferences(); len(refs) != 1 || refs[0].Name != stored.Name {
			t.Errorf("claim %s is not owned by its Metal3Data: %+v", c.GetName(), refs)
		}
	}
	if dep.Current() != nil {
		t.Error("the webhook still runs after its Deployment was deleted")
	}
	if out, _, err := cp.Kubectl(ctx, nil, "get", "namespace", namespace, "--ignore-not-found", "-o", "name"); err != nil || out != "" {
		t.Errorf("namespace %s: %q %v", namespace, out, err)
	}
	// Without the webhook, a Metal3Data is admitted unchanged and CAPM3 creates its claims.
	if data, err := w.admit(ctx, false); err != nil {
		t.Error(err)
	} else if data.Annotations[allocation.ClaimsAnnotation] != "" {
		t.Errorf("a Metal3Data after the uninstall was preallocated: %v", data.Annotations)
	}
}

// secretCerts reads the CA and the serving certificate cert-manager wrote into the Secret.
func secretCerts(t *testing.T) (ca, leaf *x509.Certificate) {
	t.Helper()
	secret := &corev1.Secret{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: certSecret}, secret); err != nil {
		t.Fatal(err)
	}
	return parseCert(t, secret.Data["ca.crt"]), parseCert(t, secret.Data["tls.crt"])
}

func parseCert(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM certificate in %q", data)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// injected reads, with kubectl, the caBundle of a webhook configuration's first webhook.
func injected(t *testing.T, object string) []byte {
	t.Helper()
	out := kubectl(t, nil, "get", object, "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}")
	data, err := base64.StdEncoding.DecodeString(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// servedCert connects to the webhook as the API server does: the Service's DNS name, verified
// against the caBundle.
func servedCert(pod *harness.Pod, caBundle []byte) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caBundle)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dialer := &tls.Dialer{Config: &tls.Config{ServerName: serviceDNS, RootCAs: roots, MinVersion: tls.VersionTLS12}}
	conn, err := dialer.DialContext(ctx, "tcp", pod.Addrs["webhook-server"])
	if err != nil {
		return nil, fmt.Errorf("TLS to the webhook as %s: %w", serviceDNS, err)
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// scrape reads the metrics endpoint with a token of a service account of the monitoring
// namespace; the endpoint's certificate is generated by the webhook, so it is not verified.
func scrape(t *testing.T, pod *harness.Pod, serviceAccount string) (int, string) {
	t.Helper()
	token := strings.TrimSpace(kubectl(t, nil, "create", "token", "-n", "monitoring", serviceAccount))
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+pod.Addrs["metrics"]+"/metrics", http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func scrapeOK(t *testing.T, pod *harness.Pod) string {
	t.Helper()
	status, body := scrape(t, pod, "prometheus")
	if status != http.StatusOK {
		t.Fatalf("metrics with the metrics-reader role: %d %s", status, body)
	}
	return body
}

func grep(text, pattern string) string {
	re := regexp.MustCompile(pattern)
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if re.MatchString(line) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// rejectLabelled installs a validating admission policy that rejects Metal3Data labelled
// rejectLabel, as a later admission step would: the mutating webhook has run and preallocated,
// and the object is never stored, so its claims wait until the release controller releases them.
func rejectLabelled(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "test-reject-metal3data"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule: admissionv1.Rule{
						APIGroups: []string{infrav1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"metal3datas"},
					},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("!has(object.metadata.labels) || !(%q in object.metadata.labels)", rejectLabel),
				Message:    "rejected by the test's admission policy",
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: policy.Name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
}

// world is a namespace of machines whose Metal3Data the tests create.
type world struct {
	ns string
	mu sync.Mutex
	n  int
}

func newWorld(t *testing.T, ns string) *world {
	t.Helper()
	kubectl(t, nil, "create", "namespace", ns)
	return &world{ns: ns}
}

// nextData is the name of the Metal3Data admit creates next.
func (w *world) nextData() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("workers-%d", w.n+1)
}

// admit creates the next machine and its Metal3Data, which references three pools; the returned
// object is what the API server stored.
func (w *world) admit(ctx context.Context, reject bool) (*infrav1.Metal3Data, error) {
	w.mu.Lock()
	w.n++
	m := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), w.n).InNamespace(w.ns)
	w.mu.Unlock()
	if err := harness.CreateMachine(ctx, cp.Client, m); err != nil {
		return nil, err
	}
	m.Data.Labels = maps.Clone(m.Data.Labels)
	if reject {
		m.Data.Labels[rejectLabel] = ""
	}
	return m.Data, cp.Client.Create(ctx, m.Data)
}

// rejectSome admits n Metal3Data that the admission policy rejects, deletes their
// Metal3DataClaims (their machines are gone: nothing retries them, so their claims are not kept
// for them; with no IPAM here, they are kept until the hold limit), and returns the claims
// preallocated for them, which now wait.
func (w *world) rejectSome(t *testing.T, n int) []string {
	t.Helper()
	var names []string
	for range n {
		var data *infrav1.Metal3Data
		harness.Eventually(t, 30*time.Second, func() error {
			var err error
			data, err = w.admit(context.Background(), true)
			if err == nil {
				return fmt.Errorf("Metal3Data %s was stored: the admission policy is not in force yet", data.Name)
			}
			if !strings.Contains(err.Error(), "rejected by the test's admission policy") {
				t.Fatal(err)
			}
			return nil
		})
		// The webhook answers once an admission's claim creates are sent, not stored.
		var claims []metav1.PartialObjectMetadata
		harness.Eventually(t, 10*time.Second, func() error {
			if claims = w.claimsOf(t, data.Name); len(claims) != 3 {
				return fmt.Errorf("rejected Metal3Data %s left %d claims, want 3", data.Name, len(claims))
			}
			return nil
		})
		for _, c := range claims {
			names = append(names, c.Kind+"/"+c.Name)
		}
		dataClaim := &infrav1.Metal3DataClaim{ObjectMeta: metav1.ObjectMeta{Namespace: data.Namespace, Name: data.Spec.Claim.Name}}
		if err := cp.Client.Delete(context.Background(), dataClaim); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.waiting(t); len(got) < len(names) {
		t.Fatalf("claims waiting %v, want at least %v", got, names)
	}
	return names
}

// claims lists every claim of the namespace, of both kinds, by metadata.
func (w *world) claims(t *testing.T) []metav1.PartialObjectMetadata {
	t.Helper()
	var out []metav1.PartialObjectMetadata
	for _, gvk := range []schema.GroupVersionKind{allocation.IPClaimGVK, allocation.IPAddressClaimGVK} {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := cp.Client.List(context.Background(), list, client.InNamespace(w.ns)); err != nil {
			t.Fatal(err)
		}
		for _, item := range list.Items {
			item.Kind = gvk.Kind
			out = append(out, item)
		}
	}
	return out
}

// waiting names the claims that still wait for their Metal3Data.
func (w *world) waiting(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, c := range w.claims(t) {
		if _, ok := c.Annotations[allocation.PreallocatedForAnnotation]; ok {
			out = append(out, c.Kind+"/"+c.Name)
		}
	}
	return out
}

// claimsOf returns the claims preallocated for a Metal3Data name: waiting for it or owned by it.
func (w *world) claimsOf(t *testing.T, data string) []metav1.PartialObjectMetadata {
	t.Helper()
	var out []metav1.PartialObjectMetadata
	for _, c := range w.claims(t) {
		owned := slices.ContainsFunc(c.OwnerReferences, func(r metav1.OwnerReference) bool { return r.Name == data })
		if c.Annotations[allocation.PreallocatedForAnnotation] == data || owned {
			out = append(out, c)
		}
	}
	return out
}

func (w *world) exists(t *testing.T, kindName string) bool {
	t.Helper()
	return slices.ContainsFunc(w.claims(t), func(c metav1.PartialObjectMetadata) bool { return c.Kind+"/"+c.Name == kindName })
}

// admission is one Metal3Data of a stream.
type admission struct {
	name         string
	at           time.Time
	preallocated bool
	err          error
}

type stream struct {
	stopCh chan struct{}
	done   chan []admission
}

// stream admits Metal3Data one after another until stopped.
func (w *world) stream(ctx context.Context) *stream {
	s := &stream{stopCh: make(chan struct{}), done: make(chan []admission, 1)}
	go func() {
		var out []admission
		for {
			select {
			case <-s.stopCh:
				s.done <- out
				return
			default:
			}
			at := time.Now()
			data, err := w.admit(ctx, false)
			a := admission{at: at, err: err}
			if data != nil {
				a.name, a.preallocated = data.Name, data.Annotations[allocation.ClaimsAnnotation] != ""
			}
			out = append(out, a)
		}
	}()
	return s
}

func (s *stream) stop() []admission {
	close(s.stopCh)
	return <-s.done
}
