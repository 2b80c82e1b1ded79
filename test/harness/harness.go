// Package harness runs a real control plane on loopback for the kubectl suites, the demo and the
// benchmarks: etcd and kube-apiserver (through envtest, with the binaries `make tools` builds into
// bin/), optionally kube-controller-manager running the garbage collector, the CRDs of Cluster
// API, CAPM3, ip-address-manager, baremetal-operator and cert-manager from the Go module cache,
// the RBAC and webhook configurations rendered from config/default, and the real webhook binary
// as a separate process that authenticates as config/rbac's service account.
package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// Modules whose CRDs are installed but which the project does not import.
const (
	bareMetalOperator = "github.com/metal3-io/baremetal-operator@v0.13.2"
	ipAddressManager  = "github.com/metal3-io/ip-address-manager@v1.13.2"
	certManager       = "github.com/cert-manager/cert-manager@v1.20.2"
	// InClusterIPAM is the Cluster API IPAM provider whose binary `make tools` builds.
	InClusterIPAM = "sigs.k8s.io/cluster-api-ipam-provider-in-cluster@v1.1.0"
)

// Options says which parts to run.
type Options struct {
	// GarbageCollector starts kube-controller-manager with the garbage collector.
	GarbageCollector bool
	// Webhook installs the webhook configurations of config/default and runs bin/webhook.
	Webhook bool
	// WebhookArgs are extra flags for the webhook process.
	WebhookArgs []string
	// NoCAPM3 leaves out CAPM3's Deployment, which StartWebhook otherwise declares in the
	// webhook's naming mode, for a test of what the webhook does without it.
	NoCAPM3 bool
	// Dir holds kubeconfigs, certificates and process logs; a temporary directory when empty.
	Dir string
	// AuditLog makes kube-apiserver log every request's metadata to AuditLogPath, for counting
	// requests by client.
	AuditLog bool
	// ServiceRouting makes kube-apiserver call a webhook registered by Service at an endpoint of
	// the Service (--enable-aggregator-routing) rather than at its cluster IP, which nothing
	// routes here: RunDeployment publishes the webhook process as the Service's EndpointSlice.
	ServiceRouting bool
	// NamespaceController runs kube-controller-manager with the namespace controller next to the
	// garbage collector, so that a deleted namespace is emptied and removed as in a cluster.
	NamespaceController bool
	// WebhookReplicas, when above zero and Webhook is set, runs that many webhook processes
	// under leader election behind a loopback load balancer (ControlPlane.Replicas) instead of
	// the single webhook process.
	WebhookReplicas int
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	Root       string // repository root
	Dir        string
	Env        *envtest.Environment
	Config     *rest.Config // cluster admin
	Client     client.Client
	Kubeconfig string // cluster admin kubeconfig file
	// Rendered is config/default as kustomize renders it.
	Rendered []*unstructured.Unstructured

	opts              Options
	webhook           *Process
	webhookKubeconfig string
	healthAddr        string
	metricsAddr       string
	controllerManager *Process
	inClusterIPAM     *Process
	// Replicas are the webhook processes when Options.WebhookReplicas is set.
	Replicas *Replicas
	// capm3Args are added to the args of CAPM3's Deployment (SetCAPM3Args); bmhNameBased is the
	// naming mode of the last webhook started, which that Deployment declares too.
	capm3Args    []string
	bmhNameBased bool
}

// Start brings the control plane up; Stop tears it down.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	startReaper()
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir := opts.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "ip-preallocator-"); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cp := &ControlPlane{Root: root, Dir: dir, opts: opts}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()

	for _, bin := range []string{"etcd", "kube-apiserver", "kubectl", "kustomize"} {
		if _, err := os.Stat(filepath.Join(root, "bin", bin)); err != nil {
			return nil, fmt.Errorf("%s is not built: run make tools", bin)
		}
	}
	crdDirs, err := crdDirectories(root)
	if err != nil {
		return nil, err
	}
	if cp.Rendered, err = cp.render("config/default"); err != nil {
		return nil, err
	}

	cp.Env = &envtest.Environment{
		BinaryAssetsDirectory: filepath.Join(root, "bin"),
		CRDInstallOptions:     envtest.CRDInstallOptions{Paths: crdDirs, ErrorIfPathMissing: true},
	}
	if opts.Webhook {
		mutating, validating, err := webhookConfigurations(cp.Rendered)
		if err != nil {
			return nil, err
		}
		cp.Env.WebhookInstallOptions = envtest.WebhookInstallOptions{
			MutatingWebhooks:   mutating,
			ValidatingWebhooks: validating,
			LocalServingHost:   "127.0.0.1",
		}
	}
	if opts.AuditLog {
		if err := cp.configureAudit(); err != nil {
			return nil, err
		}
	}
	if opts.ServiceRouting {
		cp.Env.ControlPlane.GetAPIServer().Configure().Set("enable-aggregator-routing", "true")
	}
	if cp.Config, err = cp.Env.Start(); err != nil {
		return nil, fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	cp.Config.QPS, cp.Config.Burst = 1000, 2000
	if cp.Client, err = client.New(cp.Config, client.Options{Scheme: fixtures.Scheme()}); err != nil {
		return nil, err
	}
	if cp.Kubeconfig, err = cp.writeKubeconfig("admin.kubeconfig", cp.Env.KubeConfig); err != nil {
		return nil, err
	}

	if opts.GarbageCollector || opts.NamespaceController {
		if err := cp.startControllerManager(ctx); err != nil {
			return nil, err
		}
	}
	if opts.Webhook {
		if err := cp.installRBAC(ctx); err != nil {
			return nil, err
		}
		if opts.WebhookReplicas > 0 {
			if cp.Replicas, err = cp.StartReplicas(ctx, opts.WebhookReplicas); err != nil {
				return nil, err
			}
		} else if err := cp.StartWebhook(ctx); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// Stop ends every process the control plane started.
func (cp *ControlPlane) Stop() {
	cp.StopWebhook()
	if cp.Replicas != nil {
		cp.Replicas.Stop()
	}
	cp.StopInClusterIPAM()
	if cp.controllerManager != nil {
		cp.controllerManager.Stop()
	}
	if cp.Env != nil {
		_ = cp.Env.Stop()
	}
}

// RepoRoot finds the directory holding go.mod, upwards from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "config", "default")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found")
		}
		dir = parent
	}
}

// crdDirectories finds the CRD directories in the module cache, downloading a module if needed.
func crdDirectories(root string) ([]string, error) {
	var dirs []string
	for _, m := range []struct{ module, sub string }{
		{"sigs.k8s.io/cluster-api", "config/crd/bases"},
		// clusterctl's Provider, which records the version of each provider it installs.
		{"sigs.k8s.io/cluster-api", "cmd/clusterctl/config/manifest"},
		{"github.com/metal3-io/cluster-api-provider-metal3", "config/crd/bases"},
		{ipAddressManager, "config/crd/bases"},
		{bareMetalOperator, "config/base/crds/bases"},
		{certManager, "deploy/crds"},
		{InClusterIPAM, "config/crd/bases"},
	} {
		dir, err := ModuleDir(root, m.module)
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, filepath.Join(dir, m.sub))
	}
	return dirs, nil
}

// ModuleDir returns the module cache directory of a module: of the version go.mod requires, or of
// module@version, downloaded through the module proxy when needed.
func ModuleDir(root, module string) (string, error) {
	args := []string{"list", "-m", "-f", "{{.Dir}}", module}
	if strings.Contains(module, "@") {
		args = []string{"mod", "download", "-json", module}
	}
	cmd := exec.CommandContext(context.Background(), "go", args...)
	// The test module requires the controllers' modules; the product module does not.
	cmd.Dir = filepath.Join(root, "test")
	cmd.Env = append(os.Environ(), "GONOSUMDB=github.com/metal3-io", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	if !strings.Contains(module, "@") {
		return strings.TrimSpace(string(out)), nil
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", err
	}
	if info.Error != "" {
		return "", errors.New(info.Error)
	}
	return info.Dir, nil
}

// render runs kustomize on a directory of the repository.
func (cp *ControlPlane) render(path string) ([]*unstructured.Unstructured, error) {
	out, err := exec.CommandContext(context.Background(), filepath.Join(cp.Root, "bin", "kustomize"), "build", filepath.Join(cp.Root, path)).Output()
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", path, err)
	}
	return DecodeYAML(out)
}

// DecodeYAML splits a multi-document YAML stream into objects.
func DecodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func webhookConfigurations(objs []*unstructured.Unstructured) ([]*admissionv1.MutatingWebhookConfiguration, []*admissionv1.ValidatingWebhookConfiguration, error) {
	var mutating []*admissionv1.MutatingWebhookConfiguration
	var validating []*admissionv1.ValidatingWebhookConfiguration
	for _, u := range objs {
		switch u.GetKind() {
		case "MutatingWebhookConfiguration":
			w := &admissionv1.MutatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, w); err != nil {
				return nil, nil, err
			}
			mutating = append(mutating, w)
		case "ValidatingWebhookConfiguration":
			w := &admissionv1.ValidatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, w); err != nil {
				return nil, nil, err
			}
			validating = append(validating, w)
		}
	}
	return mutating, validating, nil
}

// installRBAC creates the namespace, service account and roles of config/default.
func (cp *ControlPlane) installRBAC(ctx context.Context) error {
	for _, u := range cp.Rendered {
		switch u.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := cp.Client.Create(ctx, u.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
	}
	return nil
}

// ManagerEnv is the environment config/manager sets as values on the webhook's container
// (GOMEMLIMIT): a process StartWebhook runs has it, as the pod would.
func (cp *ControlPlane) ManagerEnv() []string {
	var env []string
	for _, u := range cp.Rendered {
		if u.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			vars, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
			for _, v := range vars {
				name, _, _ := unstructured.NestedString(v.(map[string]any), "name")
				if value, ok, _ := unstructured.NestedString(v.(map[string]any), "value"); ok {
					env = append(env, name+"="+value)
				}
			}
		}
	}
	return env
}

func (cp *ControlPlane) serviceAccountNamespace() string {
	ns, _ := cp.ServiceAccount()
	return ns
}

// ServiceAccount is the namespace and name of config/rbac's service account.
func (cp *ControlPlane) ServiceAccount() (namespace, name string) {
	for _, u := range cp.Rendered {
		if u.GetKind() == "ServiceAccount" {
			return u.GetNamespace(), u.GetName()
		}
	}
	return "", ""
}

func (cp *ControlPlane) writeKubeconfig(name string, data []byte) (string, error) {
	path := filepath.Join(cp.Dir, name)
	return path, os.WriteFile(path, data, 0o600)
}

// FreeAddr returns a loopback address with a port nobody listens on.
func FreeAddr() (string, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (cp *ControlPlane) startControllerManager(ctx context.Context) error {
	addr, err := FreeAddr()
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	controllers := "garbagecollector"
	if cp.opts.NamespaceController {
		controllers = "garbage-collector-controller,namespace-controller"
	}
	cp.controllerManager, err = StartProcess(ctx, filepath.Join(cp.Dir, "kube-controller-manager.log"),
		filepath.Join(cp.Root, "bin", "kube-controller-manager"), nil,
		"--kubeconfig="+cp.Kubeconfig,
		"--authentication-kubeconfig="+cp.Kubeconfig,
		"--authorization-kubeconfig="+cp.Kubeconfig,
		"--controllers="+controllers,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port="+port,
		"--concurrent-gc-syncs=20",
	)
	if err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, func() error {
		if !cp.controllerManager.Running() {
			return errors.New("kube-controller-manager exited; see " + cp.controllerManager.LogPath)
		}
		return httpsOK("https://" + addr + "/healthz")
	})
}

// StartInClusterIPAM runs the Cluster API in-cluster IPAM provider built by `make tools`, as
// cluster admin, and waits until it is healthy.
func (cp *ControlPlane) StartInClusterIPAM(ctx context.Context) error {
	health, err := FreeAddr()
	if err != nil {
		return err
	}
	metrics, err := FreeAddr()
	if err != nil {
		return err
	}
	cp.inClusterIPAM, err = StartProcess(ctx, filepath.Join(cp.Dir, "in-cluster-ipam.log"),
		filepath.Join(cp.Root, "bin", "cluster-api-ipam-provider-in-cluster"),
		[]string{"KUBECONFIG=" + cp.Kubeconfig},
		"--webhook-port=0",
		"--health-probe-bind-address="+health,
		"--diagnostics-address="+metrics,
		"--insecure-diagnostics",
	)
	if err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, func() error {
		if !cp.inClusterIPAM.Running() {
			return errors.New("in-cluster IPAM exited; see " + cp.inClusterIPAM.LogPath)
		}
		return httpOK("http://" + health + "/readyz")
	})
}

// StopInClusterIPAM ends the in-cluster IPAM provider.
func (cp *ControlPlane) StopInClusterIPAM() {
	if cp.inClusterIPAM != nil {
		cp.inClusterIPAM.Stop()
		cp.inClusterIPAM = nil
	}
}

// WebhookBinary builds cmd/webhook into bin/ with make build, as CI and the Dockerfile build
// it, and returns its path.
func WebhookBinary(root string) (string, error) {
	if path, ok := webhookBuilt.Load(root); ok {
		return path.(string), nil
	}
	path := filepath.Join(root, "bin", "webhook")
	cmd := exec.CommandContext(context.Background(), "make", "--no-print-directory", "build", "WEBHOOK_BIN="+path)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the webhook: %w\n%s", err, out)
	}
	webhookBuilt.Store(root, path)
	return path, nil
}

// webhookBuilt holds, per repository root, the binary WebhookBinary built: once per test program,
// not at every start of a webhook process (the benchmark starts one before every run).
var webhookBuilt sync.Map

// StartWebhook runs bin/webhook on the port the webhook configurations point at, as the service
// account of config/rbac, and waits until it is ready.
func (cp *ControlPlane) StartWebhook(ctx context.Context, extraArgs ...string) error {
	if _, err := cp.WebhookKubeconfig(); err != nil {
		return err
	}
	bin, err := WebhookBinary(cp.Root)
	if err != nil {
		return err
	}
	if cp.healthAddr, err = FreeAddr(); err != nil {
		return err
	}
	if cp.metricsAddr, err = FreeAddr(); err != nil {
		return err
	}
	opts := cp.Env.WebhookInstallOptions
	args := append([]string{
		"--webhook-host=" + opts.LocalServingHost,
		"--webhook-port=" + strconv.Itoa(opts.LocalServingPort),
		"--webhook-cert-dir=" + opts.LocalServingCertDir,
		"--health-addr=" + cp.healthAddr,
		"--diagnostics-address=" + cp.metricsAddr,
		"--insecure-diagnostics",
		"--leader-elect",
		"--leader-election-namespace=" + cp.serviceAccountNamespace(),
	}, cp.opts.WebhookArgs...)
	args = append(args, extraArgs...)
	if !cp.opts.NoCAPM3 {
		cp.bmhNameBased = bmhNameBasedIn(args)
		if err := cp.DeclareCAPM3(ctx, CAPM3Image, cp.bmhNameBased, cp.capm3Args...); err != nil {
			return err
		}
	}
	cp.webhook, err = StartProcess(ctx, filepath.Join(cp.Dir, "webhook.log"), bin,
		append(cp.ManagerEnv(), "KUBECONFIG="+cp.webhookKubeconfig, "POD_NAMESPACE="+cp.serviceAccountNamespace(), "POD_NAME="+WebhookPod), args...)
	if err != nil {
		return err
	}
	// Its caches sync before it is ready: with thousands of machines stored that takes tens of
	// seconds on a loaded machine.
	return waitFor(ctx, 3*time.Minute, func() error {
		if !cp.webhook.Running() {
			return errors.New("webhook exited; see " + cp.webhook.LogPath)
		}
		return httpOK("http://" + cp.healthAddr + "/readyz")
	})
}

// StopWebhook ends the webhook process.
func (cp *ControlPlane) StopWebhook() {
	if cp.webhook != nil {
		cp.webhook.Stop()
		cp.webhook = nil
	}
}

// WebhookLog is the path of the webhook process's log.
func (cp *ControlPlane) WebhookLog() string { return filepath.Join(cp.Dir, "webhook.log") }

// Metrics returns the webhook's Prometheus metrics text.
func (cp *ControlPlane) Metrics() (string, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+cp.metricsAddr+"/metrics", http.NoBody)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// Kubectl runs bin/kubectl as cluster admin with stdin as its input.
func (cp *ControlPlane) Kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, filepath.Join(cp.Root, "bin", "kubectl"), append([]string{"--kubeconfig=" + cp.Kubeconfig}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), errOut.String(), err
}

func httpOK(url string) error { return healthy(http.DefaultClient, url) }

// healthy tells whether a health endpoint of a process we started answers 200.
func healthy(c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, http.NoBody)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// WebhookPid is the process id of the running webhook.
func (cp *ControlPlane) WebhookPid() int { return cp.webhook.Pid() }

// LogControllersTo sends the logs of in-process controllers (klog and controller-runtime) to a
// file, so that a test's or a command's own output stays readable.
func LogControllersTo(path string) (io.Closer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	klog.SetOutput(f)
	klog.LogToStderr(false)
	quiet := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(quiet)
	_ = quiet.Set("legacy_stderr_threshold_behavior", "false")
	_ = quiet.Set("stderrthreshold", "FATAL")
	ctrl.SetLogger(klog.Background())
	return f, nil
}
