// Command webhook serves the ip-preallocator admission webhooks.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	goruntime "runtime"
	"runtime/debug"

	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	logsv1 "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/cluster-api/util/flags"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/pkg/addresses"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/answers"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
	"github.com/metal3-community/ip-preallocator/pkg/handover"
	"github.com/metal3-community/ip-preallocator/pkg/index"
	"github.com/metal3-community/ip-preallocator/pkg/mutate"
	"github.com/metal3-community/ip-preallocator/pkg/release"
	"github.com/metal3-community/ip-preallocator/pkg/validate"
)

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// version and revision are set by the Makefile with -ldflags "-X main.version=$(VERSION) -X
// main.revision=$(REVISION)": an image is built without .git, so go build stamps no revision.
var version, revision string

// build is the version and revision make stamped, or else those go build stamped from a checkout.
func build() (string, string) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = &debug.BuildInfo{}
	}
	vcs := map[string]string{}
	for _, s := range info.Settings {
		vcs[s.Key] = s.Value
	}
	rev := cmp.Or(vcs["vcs.revision"], "unknown")
	if vcs["vcs.modified"] == "true" {
		rev += "-dirty"
	}
	return cmp.Or(version, info.Main.Version, "(devel)"), cmp.Or(revision, rev)
}

// The build info tells a dashboard which version each replica runs during an upgrade.
func init() {
	v, rev := build()
	metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "ip_preallocator_build_info",
		Help:        "The version of the running binary, its source revision and the Go version it was built with; always 1.",
		ConstLabels: prometheus.Labels{"version": v, "revision": rev, "goversion": goruntime.Version()},
	}, func() float64 { return 1 }))
}

func main() {
	var o options
	fs := pflag.NewFlagSet("webhook", pflag.ExitOnError)
	o.addFlags(fs)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		v, rev := build()
		fmt.Printf("ip-preallocator %s (revision %s, %s %s/%s)\n", v, rev, goruntime.Version(), goruntime.GOOS, goruntime.GOARCH)
		os.Exit(0)
	}
	if err := logsv1.ValidateAndApply(o.logs, nil); err != nil {
		fmt.Fprintln(os.Stderr, "Invalid logging flags:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(klog.Background())
	if err := o.checkFlags(); err != nil {
		klog.Background().Error(err, "Invalid flags")
		os.Exit(2)
	}

	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		klog.Background().Error(err, "Webhook failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	mgr, err := newManager(o)
	if err != nil {
		return err
	}
	if err := refuseSecondInstall(ctx, mgr.GetAPIReader(), os.Getenv("POD_NAMESPACE")); err != nil {
		return err
	}
	if err := watchCached(ctx, mgr, cached()); err != nil {
		return err
	}
	creations, err := setupCreations(ctx, mgr, o)
	if err != nil {
		return err
	}
	guard, err := setupGuard(mgr, o)
	if err != nil {
		return err
	}
	if err := setupWebhooks(ctx, mgr, o, creations, guard); err != nil {
		return err
	}
	if err := setupControllers(ctx, mgr, o, creations); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the ping health check: %w", err)
	}
	for name, check := range map[string]healthz.Checker{
		"webhook": mgr.GetWebhookServer().StartedChecker(), "cache": cacheSynced(mgr.GetCache()), "capm3": guard.Checked,
	} {
		if err := mgr.AddReadyzCheck(name, check); err != nil {
			return fmt.Errorf("adding the %s readiness check: %w", name, err)
		}
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

func newManager(o options) (ctrl.Manager, error) {
	tlsOpts, metricsOpts, err := flags.GetManagerOptions(o.manager)
	if err != nil {
		return nil, fmt.Errorf("reading the manager's TLS and metrics options: %w", err)
	}
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
		metricsOpts.TLSOpts = append(metricsOpts.TLSOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	scheme := runtime.NewScheme()
	utilruntime.Must((&runtime.SchemeBuilder{
		clientgoscheme.AddToScheme, infrav1.AddToScheme, ipamv1.AddToScheme, capipamv1.AddToScheme,
		clusterv1.AddToScheme, bmov1alpha1.AddToScheme, clusterctlv1.AddToScheme,
	}).AddToScheme(scheme))
	cfg := ctrl.GetConfigOrDie()
	cfg.QPS, cfg.Burst = o.qps, o.burst
	// Every claim carries CAPM3's finalizer, which the API server warns about on each create.
	cfg.WarningHandlerWithContext = log.NewKubeAPIWarningLogger(log.KubeAPIWarningLoggerOptions{Deduplicate: true})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 *metricsOpts,
		HealthProbeBindAddress:  o.healthAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "ip-preallocator.metal3.io",
		LeaderElectionNamespace: o.leaderElectionNS,
		LeaseDuration:           &o.leaseDuration,
		RenewDeadline:           &o.renewDeadline,
		RetryPeriod:             &o.retryPeriod,
		// A replaced or restarted leader hands the lease on at once instead of letting it expire.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         cacheOptions(o),
		NewCache:                      newCache,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    o.webhookHost,
			Port:    o.webhookPort,
			CertDir: o.certDir,
			TLSOpts: tlsOpts,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, nil
}

func setupCreations(ctx context.Context, mgr ctrl.Manager, o options) (*handover.Creations, error) {
	creations := &handover.Creations{
		Admissions: handover.NewAdmissions(o.releaseGrace),
		Creator:    &allocation.Creator{Client: mgr.GetClient(), Cache: mgr.GetClient(), APIReader: mgr.GetAPIReader()},
		Timeout:    clock.ClaimCreation,
		Wait:       clock.CreatesOnWire,
		IPAMWait:   o.ipamWait,
	}
	if err := mgr.Add(creations); err != nil {
		return nil, fmt.Errorf("adding the claim creations to the manager: %w", err)
	}
	if o.ipamWait <= 0 {
		return creations, nil
	}
	creations.Answers = answers.NewWatcher(mgr.GetClient())
	creations.IdleWait, creations.Cache = clock.IdleAnswerWait, mgr.GetClient()
	for _, claim := range []client.Object{&ipamv1.IPClaim{}, &capipamv1.IPAddressClaim{}} {
		informer, err := mgr.GetCache().GetInformer(ctx, claim)
		if err != nil {
			return nil, fmt.Errorf("getting the informer of %T: %w", claim, err)
		}
		if _, err := informer.AddEventHandler(creations.Answers.ClaimEvents()); err != nil {
			return nil, fmt.Errorf("adding the IPAM answers handler to the informer of %T: %w", claim, err)
		}
	}
	return creations, nil
}

// setupGuard watches clusterctl's Providers only where their kind is served: its informer would
// otherwise never sync.
func setupGuard(mgr ctrl.Manager, o options) (*compat.Guard, error) {
	guard := &compat.Guard{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("ip-preallocator"),
		Version: o.capm3Version, BMHNameBased: o.bmhNameBased,
	}
	if ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"); ns != "" && name != "" {
		guard.Pod = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: name}
	}
	_, err := mgr.GetRESTMapper().RESTMapping(clusterctlv1.GroupVersion.WithKind("Provider").GroupKind(), clusterctlv1.GroupVersion.Version)
	switch {
	case err == nil:
		guard.Providers = true
	case !meta.IsNoMatchError(err):
		return nil, fmt.Errorf("finding whether clusterctl's Provider kind is served: %w", err)
	}
	return guard, guard.SetupWithManager(mgr)
}

func setupWebhooks(ctx context.Context, mgr ctrl.Manager, o options, creations *handover.Creations, guard *compat.Guard) error {
	deletions := mutate.NewDeletions(clock.ReusedNameHoldoff)
	dataInformer, err := mgr.GetCache().GetInformer(ctx, allocation.Metadata(allocation.Metal3DataGVK))
	if err != nil {
		return fmt.Errorf("getting the metadata informer of Metal3Data: %w", err)
	}
	if _, err := dataInformer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: deletions.OnDelete}); err != nil {
		return fmt.Errorf("adding the deletions handler to the metadata informer of Metal3Data: %w", err)
	}
	mgr.GetWebhookServer().Register("/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate",
		&webhook.Admission{WithContextFunc: mutate.WithRequestTiming, Handler: &mutate.Preallocator{
			Reader:       mgr.GetClient(),
			APIReader:    mgr.GetAPIReader(),
			Decoder:      admission.NewDecoder(mgr.GetScheme()),
			BMHNameBased: o.bmhNameBased,
			Timeout:      o.admissionTimeout,
			Requesters:   o.requesters,
			Namespace:    o.namespace,
			WatchFilter:  o.watchFilter,
			Deletions:    deletions,
			Compat:       guard,
			OnAdmitted:   creations.Admitted,
		}})
	return (&validate.Metal3DataTemplate{Reader: mgr.GetAPIReader(), RESTMapper: mgr.GetRESTMapper()}).SetupWebhookWithManager(mgr)
}

func setupControllers(ctx context.Context, mgr ctrl.Manager, o options, creations *handover.Creations) error {
	if err := index.Setup(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	recorder := mgr.GetEventRecorder("ip-preallocator")
	for _, gvk := range index.ClaimGVKs {
		if err := (&release.Release{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder,
			GracePeriod: o.releaseGrace, HoldLimit: o.releaseHold, ClaimGVK: gvk,
		}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if err := (&handover.HandOver{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder,
		Admissions: creations.Admissions, Created: creations.Created(), Answers: creations.Answers,
		TakeOverDelay: o.handOverDelay, IPAMWait: o.ipamWait,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&addresses.Addresses{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder}).SetupWithManager(mgr)
}
