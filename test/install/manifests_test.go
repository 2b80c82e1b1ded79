package install

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

const (
	capm3Module = "github.com/metal3-io/cluster-api-provider-metal3"
	bmhVariable = "ENABLE_BMH_NAME_BASED_PREALLOCATION"
)

// manifests are decoded objects of one rendering.
type manifests []*unstructured.Unstructured

func decode(t *testing.T, data []byte) manifests {
	t.Helper()
	objs, err := harness.DecodeYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// all returns the objects of a kind, converted to T.
func all[T any](t *testing.T, m manifests, kind string) []*T {
	t.Helper()
	var out []*T
	for _, u := range m {
		if u.GetKind() != kind {
			continue
		}
		obj := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
			t.Fatalf("%s %s: %v", kind, u.GetName(), err)
		}
		out = append(out, obj)
	}
	return out
}

// one returns the only object of a kind.
func one[T any](t *testing.T, m manifests, kind string) *T {
	t.Helper()
	objs := all[T](t, m, kind)
	if len(objs) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(objs), kind)
	}
	return objs[0]
}

func capm3File(t *testing.T, path string) manifests {
	t.Helper()
	dir, err := harness.ModuleDir(cp.Root, capm3Module)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, data)
}

// withOptional renders config/default with its optional components enabled, as an operator does
// by uncommenting them, on a copy of config/.
func withOptional(t *testing.T) manifests {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.CommandContext(context.Background(), "cp", "-r", filepath.Join(cp.Root, "config"), dir).CombinedOutput(); err != nil {
		t.Fatalf("copying config/: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "config", "default", "kustomization.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, component := range []string{"../prometheus", "../network-policy"} {
		if !strings.Contains(text, "#- "+component+"\n") {
			t.Fatalf("config/default does not offer %s as a commented-out resource", component)
		}
		text = strings.Replace(text, "#- "+component+"\n", "- "+component+"\n", 1)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(context.Background(), filepath.Join(cp.Root, "bin", "kustomize"), "build", filepath.Join(dir, "config", "default")).Output()
	if err != nil {
		t.Fatalf("kustomize build with the optional components: %v", err)
	}
	return decode(t, out)
}

// portOfFlag is the port a flag's value sets: "9443" or ":8443".
func portOfFlag(args []string, flag string) string {
	for _, a := range args {
		if name, value, ok := strings.Cut(a, "="); ok && name == flag {
			return value[strings.LastIndex(value, ":")+1:]
		}
	}
	return ""
}

func containerPort(c corev1.Container, port intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if port.Type == intstr.String && p.Name == port.StrVal || port.Type == intstr.Int && p.ContainerPort == port.IntVal {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

// TestRenderedManifests checks that the objects of the release refer to each other correctly:
// what kubectl apply accepts but a cluster would not run as intended.
func TestRenderedManifests(t *testing.T) {
	const img, version = "registry.example.com/metal3/ip-preallocator:v9.8.7", "v9.8.7"
	raw, err := os.ReadFile(release(t, img, version))
	if err != nil {
		t.Fatal(err)
	}

	// kubectl applies it as it is: no variable for clusterctl to substitute.
	if bytes.Contains(raw, []byte("${")) {
		t.Errorf("the release has a variable to substitute:\n%s", grep(string(raw), `\$\{`))
	}
	// The BMH-name mode matches CAPM3's flag of the same name, chosen at make release.
	const bmhFlag = "--enable-bmh-name-based-preallocation"
	capm3 := one[appsv1.Deployment](t, capm3File(t, "config/manager/manager.yaml"), "Deployment")
	if !slices.Contains(capm3.Spec.Template.Spec.Containers[0].Args, bmhFlag+"=${"+bmhVariable+":=false}") {
		t.Errorf("CAPM3's manager does not take %s from %s; args %v", bmhFlag, bmhVariable, capm3.Spec.Template.Spec.Containers[0].Args)
	}
	for value, path := range map[string]string{"false": release(t, img, version), "true": release(t, img, version, bmhVariable+"=true")} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dep := one[appsv1.Deployment](t, decode(t, data), "Deployment")
		if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, bmhFlag+"="+value) {
			t.Errorf("make release %s=%s: args %v, want %s=%s", bmhVariable, value, args, bmhFlag, value)
		}
	}

	// The template validation is on by default and can be left out; the preallocation stays.
	withoutValidation, err := os.ReadFile(release(t, img, version, "TEMPLATE_VALIDATION=false"))
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]manifests{"default": decode(t, raw), "TEMPLATE_VALIDATION=false": decode(t, withoutValidation)} {
		validating, mutating := len(all[admissionv1.ValidatingWebhookConfiguration](t, m, "ValidatingWebhookConfiguration")),
			len(all[admissionv1.MutatingWebhookConfiguration](t, m, "MutatingWebhookConfiguration"))
		if want := name == "default"; (validating == 1) != want || mutating != 1 {
			t.Errorf("%s: %d validating and %d mutating webhook configurations", name, validating, mutating)
		}
	}

	// Scoped as CAPM3: the webhooks select the namespace and the watch-filter label, the flags
	// restrict the caches and controllers.
	scoped, err := os.ReadFile(release(t, img, version, "WATCH_NAMESPACE=plane-a", "WATCH_FILTER=a"))
	if err != nil {
		t.Fatal(err)
	}
	scopedObjs := decode(t, scoped)
	if args := one[appsv1.Deployment](t, scopedObjs, "Deployment").Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--namespace=plane-a") || !slices.Contains(args, "--watch-filter=a") {
		t.Errorf("scoped release: args %v", args)
	}
	mutatingScoped := one[admissionv1.MutatingWebhookConfiguration](t, scopedObjs, "MutatingWebhookConfiguration").Webhooks[0]
	validatingScoped := one[admissionv1.ValidatingWebhookConfiguration](t, scopedObjs, "ValidatingWebhookConfiguration").Webhooks[0]
	for name, sel := range map[string][2]*metav1.LabelSelector{"mutating": {mutatingScoped.NamespaceSelector, mutatingScoped.ObjectSelector},
		"validating": {validatingScoped.NamespaceSelector, validatingScoped.ObjectSelector}} {
		if sel[0] == nil || sel[0].MatchLabels["kubernetes.io/metadata.name"] != "plane-a" || sel[1] == nil || sel[1].MatchLabels["cluster.x-k8s.io/watch-filter"] != "a" {
			t.Errorf("scoped release: %s webhook selectors %v, %v", name, sel[0], sel[1])
		}
	}

	objs := decode(t, raw)
	ns := one[corev1.Namespace](t, objs, "Namespace")
	for _, u := range objs {
		if u.GetNamespace() != "" && u.GetNamespace() != ns.Name {
			t.Errorf("%s %s is in namespace %s, not %s", u.GetKind(), u.GetName(), u.GetNamespace(), ns.Name)
		}
		if got := u.GetLabels()["app.kubernetes.io/version"]; got != version {
			t.Errorf("%s %s: version label %q, want %q", u.GetKind(), u.GetName(), got, version)
		}
	}
	for _, mode := range []string{"enforce", "audit", "warn"} {
		if got := ns.Labels["pod-security.kubernetes.io/"+mode]; got != "restricted" {
			t.Errorf("namespace label pod-security.kubernetes.io/%s=%q, want restricted", mode, got)
		}
	}

	// The Deployment: selector, image, version, hardening, placement.
	dep := one[appsv1.Deployment](t, objs, "Deployment")
	pod := dep.Spec.Template
	podLabels := labels.Set(pod.Labels)
	selects := func(what string, sel map[string]string) {
		t.Helper()
		if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(podLabels) {
			t.Errorf("%s selector %v does not select the pods (%v)", what, sel, pod.Labels)
		}
	}
	selects("deployment", dep.Spec.Selector.MatchLabels)
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.Image != img || pod.Labels["app.kubernetes.io/version"] != version {
		t.Errorf("image %s, pod version label %q; want %s, %s", c.Image, pod.Labels["app.kubernetes.io/version"], img, version)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2: the template validation fails closed", dep.Spec.Replicas)
	}
	sc, psc := c.SecurityContext, pod.Spec.SecurityContext
	if sc == nil || psc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context %+v, pod %+v: want a read-only root, no privilege escalation, no capabilities, non-root, RuntimeDefault seccomp", sc, psc)
	}
	for _, want := range capm3.Spec.Template.Spec.Tolerations {
		if !slices.Contains(pod.Spec.Tolerations, want) {
			t.Errorf("toleration %+v of CAPM3's manager is missing: %+v", want, pod.Spec.Tolerations)
		}
	}
	spread := false
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		if tsc.TopologyKey == corev1.LabelHostname && tsc.LabelSelector != nil {
			selects("topology spread", tsc.LabelSelector.MatchLabels)
			spread = true
		}
	}
	if !spread {
		t.Errorf("no topology spread across nodes: %+v", pod.Spec.TopologySpreadConstraints)
	}
	pdb := one[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget")
	selects("pod disruption budget", pdb.Spec.Selector.MatchLabels)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("pod disruption budget minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}

	// Ports: each named container port is the one its flag sets, each Service targets one, the
	// probes use the health port.
	flags := map[string]string{"webhook-server": "--webhook-port", "metrics": "--diagnostics-address", "healthz": "--health-addr"}
	for name, flag := range flags {
		p, ok := containerPort(c, intstr.FromString(name))
		if !ok {
			t.Errorf("no container port %s", name)
			continue
		}
		if got := portOfFlag(c.Args, flag); got != strconv.Itoa(int(p.ContainerPort)) {
			t.Errorf("container port %s is %d but %s sets %q", name, p.ContainerPort, flag, got)
		}
	}
	for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.String() != "healthz" {
			t.Errorf("probe %+v does not ask the health port", probe)
		}
	}
	services := map[string]*corev1.Service{}
	for _, svc := range all[corev1.Service](t, objs, "Service") {
		services[svc.Name] = svc
		selects("service "+svc.Name, svc.Spec.Selector)
		for _, sp := range svc.Spec.Ports {
			if _, ok := containerPort(c, sp.TargetPort); !ok {
				t.Errorf("service %s port %d targets %s, no container port", svc.Name, sp.Port, sp.TargetPort.String())
			}
		}
	}

	// The webhook configurations call the webhook Service on the port that targets the webhook
	// server, and cert-manager injects the CA of the Certificate whose Secret the pods mount and
	// whose names are the Service's.
	var certSecret string
	for _, v := range pod.Spec.Volumes {
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name && v.Secret != nil && m.MountPath == argValue(c.Args, "--webhook-cert-dir") {
				certSecret = v.Secret.SecretName
			}
		}
	}
	if certSecret == "" {
		t.Errorf("no Secret volume is mounted at --webhook-cert-dir=%s", argValue(c.Args, "--webhook-cert-dir"))
	}
	certs := map[string]*cmapi.Certificate{}
	for _, crt := range all[cmapi.Certificate](t, objs, "Certificate") {
		certs[crt.Namespace+"/"+crt.Name] = crt
	}
	issuers := map[string]*cmapi.Issuer{}
	for _, iss := range all[cmapi.Issuer](t, objs, "Issuer") {
		issuers[iss.Name] = iss
	}
	type clientConfig struct {
		name        string
		annotations map[string]string
		configs     []admissionv1.WebhookClientConfig
	}
	var hooks []clientConfig
	for _, h := range all[admissionv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration") {
		cc := clientConfig{name: h.Name, annotations: h.Annotations}
		for _, w := range h.Webhooks {
			cc.configs = append(cc.configs, w.ClientConfig)
		}
		hooks = append(hooks, cc)
	}
	for _, h := range all[admissionv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration") {
		cc := clientConfig{name: h.Name, annotations: h.Annotations}
		for _, w := range h.Webhooks {
			cc.configs = append(cc.configs, w.ClientConfig)
		}
		hooks = append(hooks, cc)
	}
	if len(hooks) != 2 {
		t.Errorf("%d webhook configurations, want a mutating and a validating one", len(hooks))
	}
	for _, h := range hooks {
		crt := certs[h.annotations["cert-manager.io/inject-ca-from"]]
		if crt == nil {
			t.Errorf("%s: cert-manager.io/inject-ca-from=%q names no Certificate of the release", h.name, h.annotations["cert-manager.io/inject-ca-from"])
			continue
		}
		if crt.Spec.SecretName != certSecret {
			t.Errorf("%s: the CA comes from Certificate %s whose Secret is %s, but the pods serve %s", h.name, crt.Name, crt.Spec.SecretName, certSecret)
		}
		for _, cfg := range h.configs {
			svc := services[cfg.Service.Name]
			if svc == nil || cfg.Service.Namespace != ns.Name {
				t.Errorf("%s calls service %s/%s, not one of the release", h.name, cfg.Service.Namespace, cfg.Service.Name)
				continue
			}
			port := int32(443)
			if cfg.Service.Port != nil {
				port = *cfg.Service.Port
			}
			served := false
			for _, sp := range svc.Spec.Ports {
				if p, _ := containerPort(c, sp.TargetPort); sp.Port == port && p.Name == "webhook-server" {
					served = true
				}
			}
			if !served {
				t.Errorf("%s calls %s port %d, which does not target the webhook server", h.name, svc.Name, port)
			}
			if dns := svc.Name + "." + svc.Namespace + ".svc"; !slices.Contains(crt.Spec.DNSNames, dns) {
				t.Errorf("Certificate %s names %v, not %s, which the API server verifies", crt.Name, crt.Spec.DNSNames, dns)
			}
		}
	}

	// The serving certificate comes from a CA Issuer whose CA is a Certificate of the release
	// that keeps its key: renewals of the serving certificate leave the injected CA as it is.
	if serving := certs[ns.Name+"/ip-preallocator-serving-cert"]; serving == nil {
		t.Error("no serving Certificate")
	} else {
		ca := issuers[serving.Spec.IssuerRef.Name]
		if serving.Spec.IsCA || ca == nil || ca.Spec.CA == nil {
			t.Errorf("serving Certificate isCA=%v, issued by %q: want a leaf issued by a CA Issuer", serving.Spec.IsCA, serving.Spec.IssuerRef.Name)
		} else {
			var caCert *cmapi.Certificate
			for _, crt := range certs {
				if crt.Spec.SecretName == ca.Spec.CA.SecretName {
					caCert = crt
				}
			}
			if caCert == nil || !caCert.Spec.IsCA || caCert.Spec.PrivateKey == nil || caCert.Spec.PrivateKey.RotationPolicy != cmapi.RotationPolicyNever {
				t.Errorf("the CA Issuer's Secret %s is not from a CA Certificate that keeps its key: %+v", ca.Spec.CA.SecretName, caCert)
			} else if root := issuers[caCert.Spec.IssuerRef.Name]; root == nil || root.Spec.SelfSigned == nil {
				t.Errorf("the CA Certificate is issued by %q, not a self-signed Issuer of the release", caCert.Spec.IssuerRef.Name)
			}
		}
	}
	// Apart from CAPM3's certificate, which lives in its own namespace next to ours.
	for _, theirs := range all[cmapi.Certificate](t, capm3File(t, "config/certmanager/certificate.yaml"), "Certificate") {
		for _, ours := range certs {
			if ours.Spec.SecretName == theirs.Spec.SecretName {
				t.Errorf("Secret %s is CAPM3's too", ours.Spec.SecretName)
			}
		}
	}

	// Metrics: a Service and a role to read them.
	metrics := services["ip-preallocator-controller-manager-metrics-service"]
	if metrics == nil || len(metrics.Spec.Ports) != 1 {
		t.Fatalf("metrics service %+v", metrics)
	}
	if p, _ := containerPort(c, metrics.Spec.Ports[0].TargetPort); p.Name != "metrics" {
		t.Errorf("metrics service targets %s, not the metrics port", metrics.Spec.Ports[0].TargetPort.String())
	}
	reader := false
	for _, role := range all[rbacv1.ClusterRole](t, objs, "ClusterRole") {
		for _, rule := range role.Rules {
			if role.Name == "ip-preallocator-metrics-reader" && slices.Contains(rule.NonResourceURLs, "/metrics") && slices.Contains(rule.Verbs, "get") {
				reader = true
			}
		}
	}
	if !reader {
		t.Error("no ip-preallocator-metrics-reader ClusterRole granting GET /metrics")
	}

	// The optional components: the ServiceMonitor scrapes exactly the metrics Service, the
	// NetworkPolicies admit the webhook port from anywhere and the metrics port from labelled
	// namespaces, for the webhook's pods.
	optional := withOptional(t)
	if len(optional) != len(objs)+3 {
		t.Errorf("the optional components add %d objects, want 3", len(optional)-len(objs))
	}
	var monitor *unstructured.Unstructured
	for _, u := range optional {
		if u.GetKind() == "ServiceMonitor" {
			monitor = u
		}
	}
	if monitor == nil {
		t.Fatal("no ServiceMonitor")
	}
	sel, _, _ := unstructured.NestedStringMap(monitor.Object, "spec", "selector", "matchLabels")
	var scraped []string
	for _, svc := range services {
		if labels.SelectorFromSet(sel).Matches(labels.Set(svc.Labels)) {
			scraped = append(scraped, svc.Name)
		}
	}
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	if !slices.Equal(scraped, []string{metrics.Name}) || len(endpoints) != 1 ||
		endpoints[0].(map[string]any)["port"] != metrics.Spec.Ports[0].Name || endpoints[0].(map[string]any)["scheme"] != "https" {
		t.Errorf("ServiceMonitor selects %v with endpoints %v; want %s port %s over https", scraped, endpoints, metrics.Name, metrics.Spec.Ports[0].Name)
	}
	policies := all[networkingv1.NetworkPolicy](t, optional, "NetworkPolicy")
	open := map[string]bool{} // port name -> admitted from anywhere
	for _, np := range policies {
		selects("network policy "+np.Name, np.Spec.PodSelector.MatchLabels)
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				cport, ok := containerPort(c, *p.Port)
				if !ok {
					t.Errorf("network policy %s admits port %s, no container port", np.Name, p.Port.String())
				}
				open[cport.Name] = open[cport.Name] || len(rule.From) == 0
			}
		}
	}
	if v, ok := open["webhook-server"]; !ok || !v {
		t.Errorf("the network policies do not admit the API server (any source) to the webhook port: %v", open)
	}
	if v, ok := open["metrics"]; !ok || v {
		t.Errorf("the network policies admit the metrics port from anywhere or not at all: %v", open)
	}
}

func argValue(args []string, flag string) string {
	for _, a := range args {
		if name, value, ok := strings.Cut(a, "="); ok && name == flag {
			return value
		}
	}
	return ""
}
