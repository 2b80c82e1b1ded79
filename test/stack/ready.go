package stack

import (
	"context"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// Readiness watches Metal3Data and records when each was first seen and first seen Ready.
type Readiness struct {
	mu    sync.Mutex
	seen  map[types.NamespacedName]time.Time
	ready map[types.NamespacedName]time.Time
	// News receives each Metal3Data once, when it becomes Ready.
	News chan types.NamespacedName
}

// WatchReadiness starts watching every Metal3Data until ctx ends.
func WatchReadiness(ctx context.Context, cfg *rest.Config) (*Readiness, error) {
	r := &Readiness{
		seen: map[types.NamespacedName]time.Time{}, ready: map[types.NamespacedName]time.Time{},
		News: make(chan types.NamespacedName, 100000),
	}
	c, err := cache.New(cfg, cache.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		return nil, err
	}
	informer, err := c.GetInformer(ctx, &infrav1.Metal3Data{})
	if err != nil {
		return nil, err
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    r.observe,
		UpdateFunc: func(_, obj any) { r.observe(obj) },
	}); err != nil {
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	c.WaitForCacheSync(ctx)
	return r, nil
}

func (r *Readiness) observe(obj any) {
	data, ok := obj.(*infrav1.Metal3Data)
	if !ok {
		return
	}
	now := time.Now()
	key := types.NamespacedName{Namespace: data.Namespace, Name: data.Name}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.seen[key]; !seen {
		r.seen[key] = now
	}
	if _, done := r.ready[key]; !done && data.Status.Ready != nil && *data.Status.Ready {
		r.ready[key] = now
		r.News <- key
	}
}

// Seen is when the Metal3Data was first seen.
func (r *Readiness) Seen(key types.NamespacedName) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.seen[key]
	return t, ok
}

// Ready is when the Metal3Data was first seen Ready.
func (r *Readiness) Ready(key types.NamespacedName) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.ready[key]
	return t, ok
}

// ReadyIn returns the Ready Metal3Data of a namespace (all namespaces when empty).
func (r *Readiness) ReadyIn(namespace string) map[types.NamespacedName]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[types.NamespacedName]time.Time{}
	for k, v := range r.ready {
		if namespace == "" || k.Namespace == namespace {
			out[k] = v
		}
	}
	return out
}
