package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// claimRecord is a claim as first seen: who created it, and for whom.
type claimRecord struct {
	kind, namespace, name string
	uid                   types.UID
	// creator is the field manager that set the claim's spec, that is, the client that created
	// it: the webhook binary, CAPM3, or the suite.
	creator string
	// owner is the UID of the Metal3Data the claim was first owned by: CAPM3 creates claims with
	// it, ours get it at hand-over.
	owner types.UID
	// preallocatedFor is our annotation as first seen.
	preallocatedFor string
	// seen and gone are when the recorder saw it first and saw it deleted.
	seen, gone time.Time
}

func (r claimRecord) String() string {
	return r.kind + " " + r.namespace + "/" + r.name + " (uid " + string(r.uid) + ")"
}

// history is the life of the claim: creator, for whom, when it was seen and gone.
func (r claimRecord) history() string {
	s := fmt.Sprintf("uid %s created by %s", r.uid, r.creator)
	if r.preallocatedFor != "" {
		s += " preallocated for " + r.preallocatedFor
	}
	if r.owner != "" {
		s += " owned by " + string(r.owner)
	}
	s += " seen " + r.seen.Format("15:04:05.000")
	if !r.gone.IsZero() {
		s += " gone " + r.gone.Format("15:04:05.000")
	}
	return s
}

// createdByCAPM3 tells a claim CAPM3 created: its client's user agent is its field manager.
func (r claimRecord) createdByCAPM3() bool { return r.creator == stack.CAPM3UserAgent }

// claimRecorder watches every claim from its creation on and remembers its creator, so that
// claims CAPM3 created and that are gone by the checks still count.
type claimRecorder struct {
	mu      sync.Mutex
	records map[types.UID]claimRecord
}

func startClaimRecorder(ctx context.Context, cfg *rest.Config) (*claimRecorder, error) {
	r := &claimRecorder{records: map[types.UID]claimRecord{}}
	c, err := cache.New(cfg, cache.Options{Scheme: fixtures.Scheme()})
	if err != nil {
		return nil, err
	}
	for _, obj := range []client.Object{&ipamv1.IPClaim{}, &capipamv1.IPAddressClaim{}} {
		informer, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, err
		}
		if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    r.observe,
			UpdateFunc: func(_, obj any) { r.observe(obj) },
			DeleteFunc: r.deleted,
		}); err != nil {
			return nil, err
		}
	}
	go func() { _ = c.Start(ctx) }()
	c.WaitForCacheSync(ctx)
	return r, nil
}

func (r *claimRecorder) observe(obj any) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, seen := r.records[o.GetUID()]; seen {
		if rec.owner == "" {
			rec.owner = ownerUID(o, "Metal3Data")
			r.records[o.GetUID()] = rec
		}
		return
	}
	rec := claimRecord{
		namespace: o.GetNamespace(), name: o.GetName(), uid: o.GetUID(), seen: time.Now(),
		preallocatedFor: o.GetAnnotations()[allocation.PreallocatedForAnnotation],
	}
	switch o.(type) {
	case *ipamv1.IPClaim:
		rec.kind = "IPClaim"
	default:
		rec.kind = "IPAddressClaim"
	}
	rec.owner = ownerUID(o, "Metal3Data")
	for _, f := range o.GetManagedFields() {
		if f.FieldsV1 != nil && strings.Contains(string(f.FieldsV1.Raw), `"f:spec"`) {
			rec.creator = f.Manager
		}
	}
	r.records[o.GetUID()] = rec
}

func (r *claimRecorder) deleted(obj any) {
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, ok := r.records[o.GetUID()]; ok {
		rec.gone = time.Now()
		r.records[o.GetUID()] = rec
	}
}

// byUID returns the record of the claim with that UID; empty if none was seen.
func (r *claimRecorder) byUID(uid types.UID) claimRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.records[uid]
}

// createdByWebhook tells a claim the webhook created and preallocated.
func (r claimRecord) createdByWebhook() bool { return r.preallocatedFor != "" && !r.createdByCAPM3() }

// createdByWebhook tells whether the webhook ever created a claim of that kind and name.
func (r *claimRecorder) createdByWebhook(kind, namespace, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if rec.kind == kind && rec.namespace == namespace && rec.name == name && rec.createdByWebhook() {
			return true
		}
	}
	return false
}

// named returns the history of every claim of that kind and name, oldest first.
func (r *claimRecorder) named(kind, namespace, name string) string {
	r.mu.Lock()
	var recs []claimRecord
	for _, rec := range r.records {
		if rec.kind == kind && rec.namespace == namespace && rec.name == name {
			recs = append(recs, rec)
		}
	}
	r.mu.Unlock()
	sort.Slice(recs, func(i, j int) bool { return recs[i].seen.Before(recs[j].seen) })
	var parts []string
	for _, rec := range recs {
		parts = append(parts, rec.history())
	}
	return strings.Join(parts, "; ")
}

// in returns the claims ever seen in the namespaces.
func (r *claimRecorder) in(namespaces []string) []claimRecord {
	set := map[string]bool{}
	for _, ns := range namespaces {
		set[ns] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []claimRecord
	for _, rec := range r.records {
		if set[rec.namespace] {
			out = append(out, rec)
		}
	}
	return out
}

// preallocatedShare counts, of the claims ever owned by the Metal3Data with these UIDs, those
// the webhook created: by claim UID, whatever the webhook said.
func preallocatedShare(recs []claimRecord, datas map[types.UID]bool) (preallocated, all int) {
	for _, rec := range recs {
		if rec.owner == "" || !datas[rec.owner] {
			continue
		}
		all++
		if rec.createdByWebhook() {
			preallocated++
		}
	}
	return preallocated, all
}
