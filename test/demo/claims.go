package main

import (
	"context"
	"sync"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// claimOrigins records which IPClaims ip-preallocator created. The webhook creates a claim with
// the preallocated-for annotation and the hand-over removes it moments later, so only the
// claim's creation event tells, not the stored claim.
type claimOrigins struct {
	mu        sync.Mutex
	byWebhook map[types.NamespacedName]bool
}

// watchClaimOrigins starts watching IPClaims until ctx ends; start it before any claim exists.
func watchClaimOrigins(ctx context.Context, cfg *rest.Config) (*claimOrigins, error) {
	o := &claimOrigins{byWebhook: map[types.NamespacedName]bool{}}
	c, err := cache.New(cfg, cache.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		return nil, err
	}
	informer, err := c.GetInformer(ctx, &ipamv1.IPClaim{})
	if err != nil {
		return nil, err
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: o.created}); err != nil {
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	c.WaitForCacheSync(ctx)
	return o, nil
}

func (o *claimOrigins) created(obj any) {
	claim, ok := obj.(*ipamv1.IPClaim)
	if !ok {
		return
	}
	_, preallocated := claim.Annotations[allocation.PreallocatedForAnnotation]
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byWebhook[types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}] = preallocated
}

// createdByWebhook tells whether the claim carried the preallocated-for annotation when created.
func (o *claimOrigins) createdByWebhook(key types.NamespacedName) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byWebhook[key]
}
