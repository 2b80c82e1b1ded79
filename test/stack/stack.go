// Package stack runs the real CAPM3 v1.13.2 Metal3Data controller (and, when asked, its
// Metal3DataTemplate controller in the same manager) and the real Metal3 IPAM v1.13.2 IPPool
// controllers in-process, each in its own manager set up as its main.go sets it up, and counts what
// CAPM3 does: reconciles per Metal3Data, requeues, claims it creates and when the template
// controller created each Metal3Data.
package stack

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1beta1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta1" //nolint:staticcheck // CAPM3 v1.13.2's main.go registers its v1beta1 API in the manager's scheme; capm3Scheme is that scheme
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"github.com/metal3-io/cluster-api-provider-metal3/baremetal"
	capm3controllers "github.com/metal3-io/cluster-api-provider-metal3/controllers"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	ipamcontrollers "github.com/metal3-io/ip-address-manager/controllers"
	"github.com/metal3-io/ip-address-manager/ipam"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capipamv1beta1 "sigs.k8s.io/cluster-api/api/ipam/v1beta1" //nolint:staticcheck // CAPM3 v1.13.2 watches IPAddressClaims in v1beta1 (its main.go's scheme, its Metal3Data controller's watch)
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// Defaults of CAPM3's and the IPAM's main.go.
const (
	DefaultConcurrency = 10
	DefaultQPS         = 20
	DefaultBurst       = 30
	// UserAgents name each controller's requests in the API server's audit log.
	CAPM3UserAgent = "cluster-api-provider-metal3-manager"
	IPAMUserAgent  = "ip-address-manager"
)

// Options configure one controller manager.
type Options struct {
	QPS         float32
	Burst       int
	Concurrency int
	// BMHNameBased is CAPM3's --enable-bmh-name-based-preallocation (a process-wide variable of
	// CAPM3's baremetal package).
	BMHNameBased bool
	// Namespaces are the only namespaces watched, as with the controllers' --namespace; empty
	// watches all but ExceptNamespaces.
	Namespaces []string
	// ExceptNamespaces are not watched when Namespaces is empty: those of another manager, so
	// that two never reconcile one namespace. Their objects are not even listed: every namespaced
	// kind is watched across all namespaces with a field selector that leaves them out.
	ExceptNamespaces []string
	// Templates runs CAPM3's Metal3DataTemplate controller next to the Metal3Data controller, in
	// the same manager as its main.go does (same client, same per-resource rate limits): Metal3Data
	// then arrive from Metal3DataClaims, through CAPM3's own loop. Without it the caller creates
	// the Metal3Data.
	Templates bool
	// HoldMetal3Data keeps the Metal3Data controller's reconciles waiting until
	// CAPM3.ReleaseMetal3Data, as when its queue is behind, while the template controller works.
	HoldMetal3Data bool
	// CorrectedIPAM runs the corrected IPAM test double with these corrections (correctedipam.go)
	// instead of the Metal3 IPAM as its main.go runs it.
	CorrectedIPAM Corrections
}

func (o Options) cache() (cache.Options, error) {
	syncPeriod := 10 * time.Minute
	c := cache.Options{SyncPeriod: &syncPeriod}
	switch {
	case len(o.Namespaces) > 0 && len(o.ExceptNamespaces) > 0:
		return c, errors.New("stack.Options: Namespaces and ExceptNamespaces both set")
	case len(o.Namespaces) > 0:
		c.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.Namespaces {
			c.DefaultNamespaces[ns] = cache.Config{}
		}
	case len(o.ExceptNamespaces) > 0:
		// An entry of its own for a namespace would watch it with that entry's settings: the
		// namespaces left out are left out of the one all-namespaces entry instead.
		var except []fields.Selector
		for _, ns := range o.ExceptNamespaces {
			except = append(except, fields.OneTermNotEqualSelector("metadata.namespace", ns))
		}
		c.DefaultNamespaces = map[string]cache.Config{cache.AllNamespaces: {FieldSelector: fields.AndSelectors(except...)}}
	}
	return c, nil
}

func (o Options) withDefaults() Options {
	if o.QPS == 0 {
		o.QPS, o.Burst = DefaultQPS, DefaultBurst
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	return o
}

// controllerOptions are main.go's; a test process starts the same controller more than once.
func (o Options) controllerOptions() controller.Options {
	return controller.Options{MaxConcurrentReconciles: o.Concurrency, SkipNameValidation: ptr.To(true)}
}

// Running is a manager running in-process.
type Running struct {
	cancel context.CancelFunc
	done   chan error
}

// Stop stops the manager and waits for it, at most shutdownTimeout; a reconcile still waiting on
// the client rate limiter then ends on its own once its context is cancelled.
func (r *Running) Stop() error {
	r.cancel()
	return <-r.done
}

var shutdownTimeout = 3 * time.Second

func start(ctx context.Context, mgr manager.Manager) *Running {
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- mgr.Start(ctx) }()
	return r
}

func capm3Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = ipamv1.AddToScheme(s)
	_ = capipamv1beta1.AddToScheme(s)
	_ = capipamv1.AddToScheme(s)
	_ = infrav1beta1.AddToScheme(s)
	_ = infrav1.AddToScheme(s)
	_ = clusterv1.AddToScheme(s)
	_ = bmov1alpha1.AddToScheme(s)
	_ = apiextensionsv1.AddToScheme(s)
	return s
}

// Stats is what CAPM3 did for one Metal3Data.
type Stats struct {
	Reconciles int
	// Requeues counts reconciles that ended asking to be run again (an error or a requeue).
	Requeues int
	// ClaimsCreated counts claims CAPM3 created for it.
	ClaimsCreated int
	// CreatedClaims names them, as kind/name.
	CreatedClaims []string
	// FirstReconcileRequeued: the first reconcile did not finish the Metal3Data.
	FirstReconcileRequeued bool
	// FirstReconcileSawWaitingClaim: the first reconcile read a claim preallocated for this
	// Metal3Data that was not handed over yet (for an IPClaim, CAPM3 then requeues).
	FirstReconcileSawWaitingClaim bool
	// FirstReconcileSawUnansweredClaim: the first reconcile read a claim of this Metal3Data
	// (waiting for it or owned by it) that its IPAM had not answered yet (CAPM3 then requeues).
	FirstReconcileSawUnansweredClaim bool
	// WorkReconciles counts reconciles that did CAPM3's work: created claims or rendered the
	// Secrets. Other reconciles at most patch the Metal3Data (CAPM3 re-patches a status it
	// already wrote when its cache lags) or do nothing.
	WorkReconciles int
	// History has a letter per reconcile, in order: W did work, P only patched, . wrote nothing;
	// lowercase when the reconcile ended in a requeue.
	History string
	// Starts is when the controller handed each reconcile to the reconciler (before a hold), in
	// order: what woke one was written between the previous start and its own.
	Starts []time.Time
}

// reconcileWrites lets the client tell the reconcile it serves what it wrote.
type reconcileWrites struct{ wrote, created atomic.Bool }

type reconcileKey struct{}

func markWrite(ctx context.Context, created bool) {
	if w, ok := ctx.Value(reconcileKey{}).(*reconcileWrites); ok {
		w.wrote.Store(true)
		if created {
			w.created.Store(true)
		}
	}
}

// Counter records Stats by Metal3Data.
type Counter struct {
	mu    sync.Mutex
	stats map[types.NamespacedName]*Stats
}

func (c *Counter) get(key types.NamespacedName) *Stats {
	if c.stats == nil {
		c.stats = map[types.NamespacedName]*Stats{}
	}
	if c.stats[key] == nil {
		c.stats[key] = &Stats{}
	}
	return c.stats[key]
}

// Of returns a copy of the Stats of one Metal3Data.
func (c *Counter) Of(key types.NamespacedName) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := *c.get(key)
	s.Starts = slices.Clone(s.Starts)
	return s
}

// All returns a copy of every Stats.
func (c *Counter) All() map[types.NamespacedName]Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[types.NamespacedName]Stats, len(c.stats))
	for k, v := range c.stats {
		s := *v
		s.Starts = slices.Clone(v.Starts)
		out[k] = s
	}
	return out
}

func (c *Counter) reconciled(key types.NamespacedName, started time.Time, res reconcile.Result, err error, writes *reconcileWrites) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(key)
	s.Reconciles++
	s.Starts = append(s.Starts, started)
	letter := "."
	switch {
	case writes.created.Load():
		s.WorkReconciles++
		letter = "W"
	case writes.wrote.Load():
		letter = "P"
	}
	requeue := err != nil || res.RequeueAfter > 0 || res.Requeue //nolint:staticcheck // CAPM3 sets Requeue.
	if requeue {
		s.Requeues++
	}
	if s.Reconciles == 1 {
		s.FirstReconcileRequeued = requeue
	}
	if requeue {
		letter = strings.ToLower(letter)
		if letter == "." {
			letter = ","
		}
	}
	s.History += letter
}

func (c *Counter) claimRead(obj client.Object) {
	dataName, waiting := obj.GetAnnotations()[allocation.PreallocatedForAnnotation]
	waiting = waiting && len(obj.GetOwnerReferences()) == 0
	if !waiting {
		dataName = ""
		if owner := allocation.Metal3DataOwner(obj); owner != nil {
			dataName = owner.Name
		}
	}
	if dataName == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.get(types.NamespacedName{Namespace: obj.GetNamespace(), Name: dataName}); s.Reconciles == 0 {
		s.FirstReconcileSawWaitingClaim = s.FirstReconcileSawWaitingClaim || waiting
		s.FirstReconcileSawUnansweredClaim = s.FirstReconcileSawUnansweredClaim || !allocation.Answered(obj)
	}
}

func claimKind(obj client.Object) string {
	if _, ok := obj.(*ipamv1.IPClaim); ok {
		return allocation.KindIPClaim
	}
	return allocation.KindIPAddressClaim
}

func (c *Counter) claimCreated(obj client.Object) {
	owner := allocation.Metal3DataOwner(obj)
	if owner == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(types.NamespacedName{Namespace: obj.GetNamespace(), Name: owner.Name})
	s.ClaimsCreated++
	s.CreatedClaims = append(s.CreatedClaims, claimKind(obj)+"/"+obj.GetName())
}

// CAPM3 is CAPM3's Metal3Data controller, and with Options.Templates its Metal3DataTemplate
// controller, running in-process.
type CAPM3 struct {
	*Running
	Counter *Counter
	// Arrivals are the Metal3Data the template controller created.
	Arrivals *Arrivals
	cache    cache.Cache
	hold     *hold
}

// ReleaseMetal3Data lets the Metal3Data controller reconcile, when Options.HoldMetal3Data held it.
func (c *CAPM3) ReleaseMetal3Data() { c.hold.release() }

// WarmUp starts the informers CAPM3's Metal3Data reconcile reads from and waits until they have
// synced, as they are in a CAPM3 that has been running. Otherwise its cached client starts each
// one on first use, and the first Metal3Data pays tens of milliseconds per kind.
func (c *CAPM3) WarmUp(ctx context.Context) error {
	for _, obj := range []client.Object{
		&clusterv1.Cluster{}, &clusterv1.Machine{}, &infrav1.Metal3DataTemplate{}, &infrav1.Metal3DataClaim{},
		&infrav1.Metal3Machine{}, &ipamv1.IPAddress{}, &capipamv1.IPAddress{}, &capipamv1.IPAddressClaim{},
	} {
		if _, err := c.cache.GetInformer(ctx, obj); err != nil {
			return err
		}
	}
	if !c.cache.WaitForCacheSync(ctx) {
		return errors.New("CAPM3's caches did not sync")
	}
	return nil
}

// StartCAPM3 runs CAPM3 v1.13.2's Metal3Data controller, and with opts.Templates its
// Metal3DataTemplate controller, with the manager options of its main.go: Secrets and
// BareMetalHosts read uncached, the given client rate limit and concurrency for each controller.
func StartCAPM3(ctx context.Context, cfg *rest.Config, opts Options) (*CAPM3, error) {
	opts = opts.withDefaults()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst, cfg.UserAgent = opts.QPS, opts.Burst, CAPM3UserAgent
	baremetal.EnableBMHNameBasedPreallocation = opts.BMHNameBased

	counter, arrivals := &Counter{}, &Arrivals{}
	req, _ := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Exists, nil)
	cacheOpts, err := opts.cache()
	if err != nil {
		return nil, err
	}
	cacheOpts.ByObject = map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.NewSelector().Add(*req)},
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  capm3Scheme(),
		GracefulShutdownTimeout: &shutdownTimeout,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Cache:                   cacheOpts,
		Client: client.Options{Cache: &client.CacheOptions{
			DisableFor: []client.Object{&bmov1alpha1.BareMetalHost{}, &corev1.ConfigMap{}, &corev1.Secret{}},
		}},
		// Counts the claims CAPM3 creates and the claims of a Metal3Data it reads; all else passes through.
		NewClient: func(cfg *rest.Config, o client.Options) (client.Client, error) {
			c, err := client.NewWithWatch(cfg, o)
			if err != nil {
				return nil, err
			}
			return interceptor.NewClient(c, interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					err := c.Get(ctx, key, obj, opts...)
					switch obj.(type) {
					case *ipamv1.IPClaim, *capipamv1.IPAddressClaim:
						if err == nil {
							counter.claimRead(obj)
						}
					}
					return err
				},
				Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
					markWrite(ctx, false)
					return c.Update(ctx, obj, opts...)
				},
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					markWrite(ctx, false)
					return c.Patch(ctx, obj, patch, opts...)
				},
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					markWrite(ctx, false)
					return c.Delete(ctx, obj, opts...)
				},
				SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
					markWrite(ctx, false)
					return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
				},
				SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
					markWrite(ctx, false)
					return c.SubResource(sub).Update(ctx, obj, opts...)
				},
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					markWrite(ctx, true)
					called := time.Now()
					err := c.Create(ctx, obj, opts...)
					switch o := obj.(type) {
					case *ipamv1.IPClaim, *capipamv1.IPAddressClaim:
						if err == nil {
							counter.claimCreated(obj)
						}
					case *infrav1.Metal3Data:
						arrivals.record(o, called, err)
					}
					return err
				},
			}), nil
		},
	})
	if err != nil {
		return nil, err
	}

	r := &capm3controllers.Metal3DataReconciler{
		Client:         mgr.GetClient(),
		ClientReader:   mgr.GetAPIReader(),
		ManagerFactory: baremetal.NewManagerFactory(mgr.GetClient()),
		Log:            ctrl.Log.WithName("controllers").WithName("Metal3Data"),
	}
	held := newHold(opts.HoldMetal3Data)
	counting := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		started := time.Now()
		if err := held.wait(ctx); err != nil {
			return reconcile.Result{}, err
		}
		writes := &reconcileWrites{}
		res, err := r.Reconcile(context.WithValue(ctx, reconcileKey{}, writes), req)
		counter.reconciled(req.NamespacedName, started, res, err, writes)
		return res, err
	})
	// CAPM3's Metal3DataReconciler.SetupWithManager, with the counting wrapper as the reconciler;
	// the CRD probes it makes first always succeed here.
	err = ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.Metal3Data{}).
		WithOptions(opts.controllerOptions()).
		Watches(&capipamv1beta1.IPAddressClaim{}, handler.EnqueueRequestsFromMapFunc(r.IPAddressClaimToMetal3Data)).
		Watches(&ipamv1.IPClaim{}, handler.EnqueueRequestsFromMapFunc(r.Metal3IPClaimToMetal3Data)).
		WithEventFilter(predicates.ResourceNotPausedAndHasFilterLabel(mgr.GetScheme(), ctrl.LoggerFrom(ctx), "")).
		Complete(counting)
	if err != nil {
		return nil, err
	}
	if opts.Templates {
		// main.go's setup; its ClusterCache is not used by the template reconcile.
		templates := &capm3controllers.Metal3DataTemplateReconciler{
			Client:         mgr.GetClient(),
			ManagerFactory: baremetal.NewManagerFactory(mgr.GetClient()),
			Log:            ctrl.Log.WithName("controllers").WithName("Metal3DataTemplate"),
		}
		if err := templates.SetupWithManager(ctx, mgr, opts.controllerOptions()); err != nil {
			return nil, err
		}
	}
	return &CAPM3{Running: start(ctx, mgr), Counter: counter, Arrivals: arrivals, cache: mgr.GetCache(), hold: held}, nil
}

// StartIPAM runs the Metal3 IPAM v1.13.2 IPPool controllers, for IPClaims and for IPAddressClaims
// that name a Metal3 IPPool, with the manager options of its main.go, or the corrected double.
func StartIPAM(ctx context.Context, cfg *rest.Config, opts Options) (*Running, error) {
	opts = opts.withDefaults()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst, cfg.UserAgent = opts.QPS, opts.Burst, IPAMUserAgent
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = ipamv1.AddToScheme(s)
	_ = clusterv1.AddToScheme(s)
	_ = capipamv1.AddToScheme(s)
	cacheOpts, err := opts.cache()
	if err != nil {
		return nil, err
	}
	newClient := client.New
	if len(opts.CorrectedIPAM) > 0 {
		newClient = correctedIPAMClient(opts.CorrectedIPAM)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  s,
		GracefulShutdownTimeout: &shutdownTimeout,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Cache:                   cacheOpts,
		Client:                  client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.ConfigMap{}}}},
		NewClient:               newClient,
	})
	if err != nil {
		return nil, err
	}
	forIPClaim := &ipamcontrollers.IPPoolReconciler{
		Client:         mgr.GetClient(),
		ManagerFactory: ipam.NewManagerFactory(mgr.GetClient()),
		Log:            ctrl.Log.WithName("controllers").WithName("IPPoolForIPClaim"),
	}
	if err := forIPClaim.SetupWithManagerForIPClaim(ctx, mgr, opts.controllerOptions()); err != nil {
		return nil, err
	}
	forAddressClaim := &ipamcontrollers.IPPoolReconciler{
		Client:         mgr.GetClient(),
		ManagerFactory: ipam.NewManagerFactory(mgr.GetClient()),
		Log:            ctrl.Log.WithName("controllers").WithName("IPPoolForIPAddressClaim"),
	}
	if !opts.CorrectedIPAM.Has(OnePoolController) {
		if err := forAddressClaim.SetupWithManagerForIPAddressClaim(ctx, mgr, opts.controllerOptions()); err != nil {
			return nil, err
		}
	}
	return start(ctx, mgr), nil
}
