package compat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=clusterctl.cluster.x-k8s.io,resources=providers,verbs=get;list;watch

// Guard checks, at start and whenever CAPM3's Deployments or clusterctl Providers change, whether
// the webhook may preallocate. It runs on every replica: each decides for its own admissions.
type Guard struct {
	// Client reads CAPM3's Deployments, and clusterctl's Providers where Providers is set, from
	// the cache.
	Client    client.Reader
	Providers bool
	// Recorder records, when Pod is set, the Events of a changed verdict on the webhook's Pod.
	Recorder events.EventRecorder
	Pod      *corev1.ObjectReference
	// Version is --capm3-version; BMHNameBased the webhook's own naming mode.
	Version      string
	BMHNameBased bool

	refusal atomic.Pointer[Refusal]
	raised  atomic.Pointer[string]
}

// Refusal is why admissions must not preallocate, or "" when they may. A nil Guard never refuses.
func (g *Guard) Refusal() string {
	if g == nil {
		return ""
	}
	if r := g.refusal.Load(); r != nil {
		return r.Message
	}
	return "the CAPM3 beside it is not checked yet"
}

// LimitsRaised is why admissions are left to CAPM3 although its claims are mirrored (see
// LimitsRaised), or "". A nil Guard never leaves them.
func (g *Guard) LimitsRaised() string {
	if g == nil {
		return ""
	}
	if r := g.raised.Load(); r != nil {
		return *r
	}
	return ""
}

// Checked is a readiness check: the webhook admits once it knows whether it may preallocate.
func (g *Guard) Checked(*http.Request) error {
	if g.refusal.Load() == nil {
		return errors.New("the CAPM3 beside the webhook is not checked yet")
	}
	return nil
}

// SetupWithManager registers the guard on every replica.
func (g *Guard) SetupWithManager(mgr ctrl.Manager) error {
	recheck := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{}}
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("capm3-compatibility").Watches(&appsv1.Deployment{}, recheck)
	if g.Providers {
		b = b.Watches(&clusterctlv1.Provider{}, recheck)
	}
	if err := b.WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).Complete(g); err != nil {
		return fmt.Errorf("setting up controller capm3-compatibility: %w", err)
	}
	return nil
}

// Reconcile checks what the cache holds of CAPM3 and tells a changed verdict.
func (g *Guard) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	var f Found
	// The cache holds only CAPM3's Deployments, selected by the API server: it drops labels.
	deployments := &appsv1.DeploymentList{}
	if err := g.Client.List(ctx, deployments); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing CAPM3's Deployments: %w", err)
	}
	f.Deployments = deployments.Items
	if g.Providers {
		providers := &clusterctlv1.ProviderList{}
		if err := g.Client.List(ctx, providers); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing clusterctl's Providers: %w", err)
		}
		f.Providers = slices.DeleteFunc(providers.Items, func(p clusterctlv1.Provider) bool {
			return p.ProviderName != ProviderName || p.Type != string(clusterctlv1.InfrastructureProviderType)
		})
	}
	// Before the refusal, which makes the replica ready: its first admissions see both.
	raised := LimitsRaised(f.Deployments)
	if old := g.raised.Swap(&raised); old == nil || *old != raised {
		g.tellLimits(ctx, raised)
	}
	refusal := Check(f, g.Version, g.BMHNameBased)
	if old := g.refusal.Swap(&refusal); old != nil && old.Reason == refusal.Reason && old.Message == refusal.Message {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx)
	if refusal.Reason == "" {
		compatible.Set(1)
		logger.Info("Preallocating: CAPM3 creates the claims ip-preallocator mirrors", "mirrored", MirroredVersions())
		if g.Pod != nil {
			g.Recorder.Eventf(g.Pod, nil, corev1.EventTypeNormal, "CAPM3Compatible", "CheckCAPM3",
				"Preallocating IP claims: CAPM3 is %s, naming claims the same way", MirroredVersions())
		}
		return ctrl.Result{}, nil
	}
	compatible.Set(0)
	logger.Error(errors.New(refusal.Message), "Not preallocating: every Metal3Data is left to CAPM3")
	if g.Pod != nil {
		var related runtime.Object
		if refusal.Subject != nil {
			related = refusal.Subject
		}
		g.Recorder.Eventf(g.Pod, related, corev1.EventTypeWarning, refusal.Reason, "CheckCAPM3", "Not preallocating IP claims: %s", refusal.Message)
	}
	return ctrl.Result{}, nil
}

// tellLimits tells whether CAPM3's client limits leave every admission to it.
func (g *Guard) tellLimits(ctx context.Context, raised string) {
	logger := log.FromContext(ctx)
	if raised == "" {
		limitsRaised.Set(0)
		logger.Info("CAPM3 runs at its default client rate limit: admissions may preallocate")
		return
	}
	limitsRaised.Set(1)
	logger.Info("Not preallocating: every Metal3Data is left to CAPM3", "reason", raised)
	if g.Pod != nil {
		g.Recorder.Eventf(g.Pod, nil, corev1.EventTypeNormal, ReasonLimitsRaised, "CheckCAPM3", "Not preallocating IP claims: %s", raised)
	}
}

var limitsRaised = promauto.With(metrics.Registry).NewGauge(prometheus.GaugeOpts{
	Name: "ip_preallocator_capm3_limits_raised",
	Help: "1 while CAPM3 runs its client above its default rate limit and every admission is left to it, 0 otherwise.",
})

var compatible = promauto.With(metrics.Registry).NewGauge(prometheus.GaugeOpts{
	Name: "ip_preallocator_capm3_compatible",
	Help: "1 while the CAPM3 found beside the webhook creates the claims it mirrors (version and claim naming), 0 while every admission is left to CAPM3.",
})
