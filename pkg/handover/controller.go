// Package handover holds the controllers that finish what admission started: they hand claims
// preallocated for a Metal3Data over to it once it is stored, and release the claims of a
// Metal3Data that never was.
package handover

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

var (
	handOversTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_handovers_total",
		Help: "Preallocated claims handed over to their Metal3Data, by claim kind and by path (create: on the Metal3Data's create event; resync: found later from the claim).",
	}, []string{"kind", "path"})
	releasesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_releases_total",
		Help: "Preallocated claims released because their Metal3Data was never stored, by claim kind.",
	}, []string{"kind"})
	handOverSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_handover_duration_seconds",
		Help:    "Time to patch all claims of one Metal3Data once its create event is seen.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
)

func init() {
	metrics.Registry.MustRegister(handOversTotal, releasesTotal, handOverSeconds)
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3datas,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Metal3DataGVK is the version the controllers watch Metal3Data in.
var Metal3DataGVK = infrav1.GroupVersion.WithKind("Metal3Data")

// HandOver hands the claims listed in a new Metal3Data's allocation.ClaimsAnnotation over to it.
// It reacts to the create event of the Metal3Data from its own metadata cache and patches all
// claims at once, without reading from the API server: CAPM3's first reconcile races it.
type HandOver struct {
	Client   client.Client
	Recorder events.EventRecorder
}

// SetupWithManager registers the controller; it runs under leader election.
func (h *HandOver) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	preallocated := predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := o.GetAnnotations()[allocation.ClaimsAnnotation]
		return ok
	})
	// Only the create event matters; it also replays every Metal3Data after a restart or a
	// leader change, which finds already handed-over claims in the cache and writes nothing.
	createOnly := predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("preallocation-handover").
		For(allocation.Metadata(Metal3DataGVK), builder.WithPredicates(preallocated, createOnly)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(h)
}

// Reconcile implements reconcile.Reconciler.
func (h *HandOver) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	data := allocation.Metadata(Metal3DataGVK)
	if err := h.Client.Get(ctx, req.NamespacedName, data); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !data.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	refs, err := allocation.ParseClaims(data.Annotations[allocation.ClaimsAnnotation])
	if err != nil {
		log.FromContext(ctx).Error(err, "Ignoring unreadable preallocation record")
		return ctrl.Result{}, nil
	}
	start := time.Now()
	handed, err := handOverAll(ctx, h.Client, data, refs, "create")
	handOverSeconds.Observe(time.Since(start).Seconds())
	if len(handed) > 0 {
		h.Recorder.Eventf(data, nil, corev1.EventTypeNormal, "PreallocatedClaimsHandedOver", "HandOver",
			"Handed over preallocated claims %s", allocation.FormatClaims(handed))
	}
	return ctrl.Result{}, err
}

// handOverAll patches, concurrently, every listed claim that the cache does not show as handed
// over already.
func handOverAll(ctx context.Context, c client.Client, data metav1.Object, refs []allocation.ClaimRef, path string) ([]allocation.ClaimRef, error) {
	logger := log.FromContext(ctx)
	var (
		mu      sync.Mutex
		handed  []allocation.ClaimRef
		errs    []error
		pending sync.WaitGroup
	)
	for _, ref := range refs {
		gvk, err := ref.GVK()
		if err != nil {
			continue
		}
		cached := allocation.Metadata(gvk)
		onlyMarker := true
		switch err := c.Get(ctx, types.NamespacedName{Namespace: data.GetNamespace(), Name: ref.Name}, cached); {
		case err == nil:
			if !allocation.IsPreallocatedFor(cached, data.GetName()) {
				continue
			}
			onlyMarker = len(cached.Annotations) == 1
		case !apierrors.IsNotFound(err):
			return nil, err
		}
		// A claim the cache has not seen yet is patched blind: the patch's test decides.
		pending.Go(func() {
			logger.V(2).Info("Handing preallocated claim over", ref.Kind, klog.KRef(data.GetNamespace(), ref.Name))
			ok, err := allocation.HandOver(ctx, c, data, ref, data.GetNamespace(), onlyMarker)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", ref, err))
				return
			}
			if ok {
				handOversTotal.WithLabelValues(ref.Kind, path).Inc()
				handed = append(handed, ref)
			}
		})
	}
	pending.Wait()
	slices.SortFunc(handed, func(a, b allocation.ClaimRef) int { return strings.Compare(a.String(), b.String()) })
	if len(errs) > 0 {
		return handed, fmt.Errorf("handing over claims of Metal3Data %s: %v", klog.KObj(data), errs)
	}
	return handed, nil
}
