package faults

import (
	"context"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// readiness watches the Metal3Data and Secrets of some namespaces and remembers when each
// Metal3Data was first seen Ready and each Secret first seen, so that time-to-Ready is measured
// from events rather than by polling every Metal3Data.
type readiness struct {
	mu      sync.Mutex
	ready   map[types.UID]time.Time
	secrets map[string]time.Time
	cancel  context.CancelFunc
}

func watchReadiness(ctx context.Context, namespaces []string) (*readiness, error) {
	ctx, cancel := context.WithCancel(ctx)
	r := &readiness{ready: map[types.UID]time.Time{}, secrets: map[string]time.Time{}, cancel: cancel}
	watched := map[string]cache.Config{}
	for _, ns := range namespaces {
		watched[ns] = cache.Config{}
	}
	c, err := cache.New(cp.Config, cache.Options{Scheme: fixtures.Scheme(), DefaultNamespaces: watched})
	if err != nil {
		cancel()
		return nil, err
	}
	data, err := c.GetInformer(ctx, &infrav1.Metal3Data{})
	if err != nil {
		cancel()
		return nil, err
	}
	onData := func(obj any) {
		if d, ok := obj.(*infrav1.Metal3Data); ok && d.Status.Ready != nil && *d.Status.Ready {
			r.mu.Lock()
			if _, seen := r.ready[d.UID]; !seen {
				r.ready[d.UID] = time.Now()
			}
			r.mu.Unlock()
		}
	}
	secret := &metav1.PartialObjectMetadata{}
	secret.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	secrets, err := c.GetInformer(ctx, secret)
	if err != nil {
		cancel()
		return nil, err
	}
	onSecret := func(obj any) {
		if o, ok := obj.(client.Object); ok {
			r.mu.Lock()
			key := o.GetNamespace() + "/" + o.GetName()
			if _, seen := r.secrets[key]; !seen {
				r.secrets[key] = time.Now()
			}
			r.mu.Unlock()
		}
	}
	if _, err := data.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onData, UpdateFunc: func(_, obj any) { onData(obj) }}); err != nil {
		cancel()
		return nil, err
	}
	if _, err := secrets.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onSecret}); err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		return nil, ctx.Err()
	}
	return r, nil
}

func (r *readiness) stop() { r.cancel() }

// readyAt is when the Metal3Data uid of claim ns/claimName was Ready with both rendered secrets
// (CAPM3 writes <claim>-metadata and <claim>-networkdata, then sets status.ready).
func (r *readiness) readyAt(uid types.UID, ns, claimName string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.ready[uid]
	if !ok {
		return time.Time{}, false
	}
	for _, suffix := range []string{"-metadata", "-networkdata"} {
		s, ok := r.secrets[ns+"/"+claimName+suffix]
		if !ok {
			return time.Time{}, false
		}
		if s.After(at) {
			at = s
		}
	}
	return at, true
}

// waitReady waits until the Metal3Data is Ready with its secrets, at most timeout.
func (r *readiness) waitReady(ctx context.Context, uid types.UID, ns, claimName string, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for {
		if at, ok := r.readyAt(uid, ns, claimName); ok {
			return at, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
