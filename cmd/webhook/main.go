// Command webhook serves the ip-preallocator admission webhooks.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"

	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
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

func main() {
	var o options
	fs := pflag.NewFlagSet("webhook", pflag.ExitOnError)
	o.addFlags(fs)
	showVersion := addVersionFlag(fs)
	_ = fs.Parse(os.Args[1:])
	printVersionAndExit(*showVersion)
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

// informerOf names the informer of obj in errors: the metadata or the whole objects of a kind.
func informerOf(obj client.Object) string {
	if _, ok := obj.(*metav1.PartialObjectMetadata); ok {
		return "the metadata informer of " + obj.GetObjectKind().GroupVersionKind().Kind
	}
	return "the informer of " + reflect.TypeOf(obj).Elem().Name()
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, infrav1.AddToScheme, ipamv1.AddToScheme, capipamv1.AddToScheme,
		clusterv1.AddToScheme, bmov1alpha1.AddToScheme, clusterctlv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

func run(ctx context.Context, o options) error {
	scheme := newScheme()
	mgr, err := newManager(o, scheme)
	if err != nil {
		return err
	}
	if err := refuseSecondInstall(ctx, mgr.GetAPIReader(), os.Getenv("POD_NAMESPACE")); err != nil {
		return err
	}
	// Informers registered before the start are part of the readiness cache sync.
	for _, obj := range cached(o.ipamWait > 0) {
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("getting %s: %w", informerOf(obj), err)
		}
	}
	if err := registerCacheSizes(mgr.GetCache(), scheme, cached(o.ipamWait > 0)); err != nil {
		return err
	}
	admissions := handover.NewAdmissions(o.releaseGrace)
	creations, err := setupCreations(ctx, mgr, o, admissions)
	if err != nil {
		return err
	}
	guard, err := setupGuard(mgr, o)
	if err != nil {
		return err
	}
	if err := setupWebhooks(ctx, mgr, o, scheme, creations, guard); err != nil {
		return err
	}
	if err := setupControllers(ctx, mgr, o, admissions, creations); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the ping health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return fmt.Errorf("adding the webhook readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("cache", cacheSynced(mgr.GetCache())); err != nil {
		return fmt.Errorf("adding the cache readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("capm3", guard.Checked); err != nil {
		return fmt.Errorf("adding the CAPM3 readiness check: %w", err)
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

func newManager(o options, scheme *runtime.Scheme) (ctrl.Manager, error) {
	tlsOpts, metricsOpts, err := flags.GetManagerOptions(o.manager)
	if err != nil {
		return nil, fmt.Errorf("reading the manager's TLS and metrics options: %w", err)
	}
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
		metricsOpts.TLSOpts = append(metricsOpts.TLSOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
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

func setupCreations(ctx context.Context, mgr ctrl.Manager, o options, admissions *handover.Admissions) (*handover.Creations, error) {
	creations := &handover.Creations{
		Admissions: admissions,
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
			return nil, fmt.Errorf("getting %s: %w", informerOf(claim), err)
		}
		if _, err := informer.AddEventHandler(creations.Answers.ClaimEvents()); err != nil {
			return nil, fmt.Errorf("adding the IPAM answers handler to %s: %w", informerOf(claim), err)
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

func setupWebhooks(ctx context.Context, mgr ctrl.Manager, o options, scheme *runtime.Scheme, creations *handover.Creations, guard *compat.Guard) error {
	deletions := mutate.NewDeletions(clock.ReusedNameHoldoff)
	dataMetadata := allocation.Metadata(allocation.Metal3DataGVK)
	dataInformer, err := mgr.GetCache().GetInformer(ctx, dataMetadata)
	if err != nil {
		return fmt.Errorf("getting %s: %w", informerOf(dataMetadata), err)
	}
	if _, err := dataInformer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: deletions.OnDelete}); err != nil {
		return fmt.Errorf("adding the deletions handler to %s: %w", informerOf(dataMetadata), err)
	}
	mgr.GetWebhookServer().Register("/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate",
		&webhook.Admission{WithContextFunc: mutate.WithRequestTiming, Handler: &mutate.Preallocator{
			Reader:       mgr.GetClient(),
			APIReader:    mgr.GetAPIReader(),
			Decoder:      admission.NewDecoder(scheme),
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

func setupControllers(ctx context.Context, mgr ctrl.Manager, o options, admissions *handover.Admissions, creations *handover.Creations) error {
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
		Admissions: admissions, Created: creations.Created(), Answers: creations.Answers,
		TakeOverDelay: o.handOverDelay, IPAMWait: o.ipamWait,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&addresses.Addresses{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: recorder}).SetupWithManager(mgr)
}

// cacheSynced keeps the webhook unready until the informers sync, lest admissions find nothing.
func cacheSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), clock.ReadyPoll)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced yet")
		}
		return nil
	}
}
