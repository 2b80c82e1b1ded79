// Package certmanager runs cert-manager's own controllers in the test process against a
// harness control plane. It is apart from package harness so that only the tests that need
// cert-manager compile and link it.
package certmanager

import (
	"context"
	"fmt"
	"sync"
	"time"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	cmcontroller "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// The issuer types config/certmanager uses, registered for the issuers controller.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

// certManagerControllers are the controllers of cert-manager's controller binary that issue and
// renew a Certificate from a self-signed or CA Issuer: what config/certmanager needs. ACME,
// Vault, Venafi, ClusterIssuers, the ingress and Gateway shims are left out.
var certManagerControllers = []string{
	issuers.ControllerName,
	trigger.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	readiness.ControllerName,
	issuing.ControllerName,
	revisionmanager.ControllerName,
	approver.ControllerName,
	crselfsigned.CRControllerName,
	crca.CRControllerName,
}

// CertManager is cert-manager running in the test process, from the Go module of the version
// whose CRDs the control plane serves (test/go.mod pins both).
type CertManager struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// Start runs cert-manager's own controllers against the control plane, as cluster
// admin, as its controller and cainjector binaries set them up (cmd/controller/app and
// cmd/cainjector/app, whose modules the proxy does not serve): the certificate and issuer
// controllers listed in certManagerControllers, and the CA injector for mutating and validating
// webhook configurations with Certificates as a data source. Its logs go wherever klog's do (see
// harness.LogControllersTo). Stop ends it.
func Start(ctx context.Context, cp *harness.ControlPlane) (*CertManager, error) {
	ctx, cancel := context.WithCancel(ctx)
	cm := &CertManager{cancel: cancel}

	factory, err := cmcontroller.NewContextFactory(ctx, cmcontroller.ContextOptions{
		Kubeconfig:         cp.Kubeconfig,
		KubernetesAPIQPS:   100,
		KubernetesAPIBurst: 200,
		IssuerOptions:      cmcontroller.IssuerOptions{ClusterResourceNamespace: "cert-manager"},
		// cert-manager's default.
		CertificateOptions: cmcontroller.CertificateOptions{CertificateRequestMinimumBackoffDuration: time.Hour},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("cert-manager context: %w", err)
	}
	base, err := factory.Build()
	if err != nil {
		cancel()
		return nil, err
	}
	for _, name := range certManagerControllers {
		construct, ok := cmcontroller.Known()[name]
		if !ok {
			cancel()
			return nil, fmt.Errorf("cert-manager has no controller %q", name)
		}
		c, err := construct(factory)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("cert-manager controller %s: %w", name, err)
		}
		cm.goRun(func() error { return c.Run(5, ctx) })
	}
	// As cmd/controller/app does, once every controller has registered its informers.
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	injector, err := newCAInjector(ctx, rest.CopyConfig(cp.Config))
	if err != nil {
		cancel()
		cm.wg.Wait()
		return nil, err
	}
	cm.goRun(func() error { return injector.Start(ctx) })
	return cm, nil
}

// newCAInjector is cmd/cainjector/app's manager: Secrets read live (not cached), injection into
// webhook configurations from Certificates and Secrets.
func newCAInjector(ctx context.Context, cfg *rest.Config) (ctrl.Manager, error) {
	cfg.UserAgent = "cert-manager-cainjector"
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cache.Options{ReaderFailOnMissingInformer: true},
		Client:                 client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Controller names are unique per process; a second control plane in the same test
		// binary starts its own injector.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("cainjector manager: %w", err)
	}
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("cainjector: %w", err)
	}
	return mgr, nil
}

func (cm *CertManager) goRun(run func() error) {
	cm.wg.Add(1)
	go func() {
		defer cm.wg.Done()
		if err := run(); err != nil {
			cm.mu.Lock()
			cm.err = err
			cm.mu.Unlock()
		}
	}()
}

// Err is the first error a controller stopped with, if any.
func (cm *CertManager) Err() error {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	return cm.err
}

// Stop ends every controller and waits for them.
func (cm *CertManager) Stop() {
	cm.cancel()
	cm.wg.Wait()
}
