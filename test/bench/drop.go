package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// dropRun removes everything a finished run left in its namespace, finalizers first, as if its
// machines had been deprovisioned: the next run then meets the standing fleet alone, in the API
// server and in the webhook's caches, whatever ran before it. The namespace itself stays (there
// is no namespace controller here), empty.
func (b *bench) dropRun(ctx context.Context, ns string) error {
	cfg := rest.CopyConfig(b.cp.Config)
	cfg.UserAgent, cfg.QPS, cfg.Burst = benchUserAgent, 5000, 10000
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	lists, err := disc.ServerPreferredNamespacedResources()
	if err != nil {
		return fmt.Errorf("discovering what %s may hold: %w", ns, err)
	}
	start, dropped := time.Now(), 0
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			return err
		}
		for _, r := range list.APIResources {
			if !deletable(r) {
				continue
			}
			n, err := dropAll(ctx, meta.Resource(gv.WithResource(r.Name)).Namespace(ns))
			if err != nil {
				return fmt.Errorf("dropping the %s of %s: %w", r.Name, ns, err)
			}
			dropped += n
		}
	}
	fmt.Fprintf(b.out, "  dropped the run's %d objects in %s\n", dropped, time.Since(start).Round(time.Millisecond))
	return b.cachesSettled(ctx)
}

// cachesSettled waits until the single webhook process's caches have taken in the deletions: its
// cached objects the same two reads a second apart, at most a minute.
func (b *bench) cachesSettled(ctx context.Context) error {
	if b.serving == "" {
		return nil
	}
	last := -1.0
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		f, err := b.webhookFootprint()
		if err != nil {
			return err
		}
		total := 0.0
		for _, n := range f.CachedObjects {
			total += n
		}
		if total == last {
			return nil
		}
		last = total
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return nil
}

// deletable: a kind with objects of its own (not a subresource), that can be listed and deleted;
// events are left to expire.
func deletable(r metav1.APIResource) bool {
	has := func(verb string) bool { return slices.Contains(r.Verbs, verb) }
	return !strings.Contains(r.Name, "/") && r.Name != "events" && has("list") && has("delete") && has("patch")
}

// dropWorkers is how many of a kind's objects dropAll deletes at once: one at a time, the API
// server's round trips, not its work, set the pace.
const dropWorkers = 16

// dropAll deletes every object of one kind, removing its finalizers first so that no controller
// is needed to finish it, until none is left.
func dropAll(ctx context.Context, c metadata.ResourceInterface) (int, error) {
	noFinalizers := []byte(`{"metadata":{"finalizers":null}}`)
	var dropped atomic.Int64
	for range 5 {
		objs, err := c.List(ctx, metav1.ListOptions{})
		if err != nil || len(objs.Items) == 0 {
			return int(dropped.Load()), err
		}
		g, ctx := errgroup.WithContext(ctx)
		g.SetLimit(dropWorkers)
		for _, o := range objs.Items {
			g.Go(func() error {
				if len(o.Finalizers) > 0 {
					if _, err := c.Patch(ctx, o.Name, types.MergePatchType, noFinalizers, metav1.PatchOptions{}); !gone(err) {
						return err
					}
				}
				if err := c.Delete(ctx, o.Name, metav1.DeleteOptions{}); !gone(err) {
					return err
				}
				dropped.Add(1)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return int(dropped.Load()), err
		}
	}
	return int(dropped.Load()), fmt.Errorf("objects still there after five passes")
}

func gone(err error) bool { return err == nil || apierrors.IsNotFound(err) }
