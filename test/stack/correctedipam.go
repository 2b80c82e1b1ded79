package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// The corrected IPAM is a test double, never shipped: the Metal3 IPAM v1.13.2's own code, run with
// some of the races the fault suite drives it into taken out, so that what the suite still finds
// is ours. Each Correction is one change; Options.CorrectedIPAM picks them.

// Correction is one change the corrected IPAM makes to the Metal3 IPAM v1.13.2.
type Correction string

// The corrections.
const (
	OnePoolController  Correction = "one-pool-controller"
	LiveReads          Correction = "live-reads"
	FinalizerFirst     Correction = "finalizer-first"
	HeldClaimsOnly     Correction = "held-claims-only"
	PoolWaitsForClaims Correction = "pool-waits-for-claims"
	UIDBoundPatches    Correction = "uid-bound-patches"
)

// Corrections is a set of corrections; empty, the Metal3 IPAM as its main.go runs it.
type Corrections []Correction

// Has tells whether the set makes the correction.
func (cs Corrections) Has(c Correction) bool { return slices.Contains(cs, c) }

// NamedRaces are the corrections of the races the fault suite names: two IPPool controllers,
// reads from a lagging cache, the IPAddress created before the claim's finalizer is saved. The
// others stay in, so that the webhook's stray-address release and gone-pool finish still run; a
// second IPAddress for one claim needs the first two races, so its release does not.
var NamedRaces = Corrections{OnePoolController, LiveReads, FinalizerFirst}

// Describe says what the correction changes and the race it takes out, for the fault suite's page.
var Describe = map[Correction]string{
	OnePoolController: "Only the IPPool controller for IPClaims runs. The released IPAM runs two, which " +
		"reconcile every claim of a pool, each from its own snapshot: both can allocate for one claim, " +
		"which then holds two IPAddresses. IPAddressClaims of a Metal3 IPPool are then served only when " +
		"an IPClaim or the pool changes.",
	LiveReads: "IPPools, IPClaims and IPAddresses are read from the API server, not the IPAM's cache " +
		"(with their TypeMeta set, which the IPAM builds owner references from), and one controller " +
		"serialises a pool's passes. The released IPAM reads the pool's status.allocations, keyed by " +
		"claim name, and the claims from its cache: a claim created again under the name of one just " +
		"freed is answered with the freed address.",
	FinalizerFirst: "The IPAM's finalizer is saved on the claim the IPAddress names (same UID, not " +
		"being deleted) before the IPAddress is created, and taken off again when the create fails (a " +
		"namespace being deleted refuses new objects). The released IPAM creates the IPAddress first: " +
		"a claim deleted in between can no longer take the finalizer, and nobody frees the address.",
	HeldClaimsOnly: "The finalizer is saved only on a claim that still carries another (as CAPM3's, " +
		"until it releases the claim): a DELETE that read the claim without finalizers removes it even " +
		"after one is saved (kubernetes/kubernetes#77988), and nobody would free the address. It also " +
		"refuses a claim the webhook released and finished, whose strays the webhook would release.",
	PoolWaitsForClaims: "A pool being deleted keeps its finalizer until no claim of it carries the " +
		"IPAM's; its next passes, woken by the claims' deletion, free them. The released IPAM lets a " +
		"pool go once it counts no IPAddress, and a claim that keeps the finalizer of a pool that is " +
		"gone stays Terminating for ever.",
	UIDBoundPatches: "The IPAM's patches of a claim are bound to the UID it listed. The released IPAM " +
		"patches the claims it listed at the start of a pass by name: a claim deleted and created " +
		"again meanwhile takes the old one's finalizer and error, and is never answered.",
}

// ParseCorrections reads a comma-separated list of corrections; "named" stands for NamedRaces and
// "all" for every correction.
func ParseCorrections(list string) (Corrections, error) {
	var cs Corrections
	for name := range strings.SplitSeq(list, ",") {
		switch c := Correction(strings.TrimSpace(name)); {
		case c == "named":
			cs = append(cs, NamedRaces...)
		case c == "all":
			cs = append(cs, OnePoolController, LiveReads, FinalizerFirst, HeldClaimsOnly, PoolWaitsForClaims, UIDBoundPatches)
		case Describe[c] != "":
			cs = append(cs, c)
		default:
			return nil, fmt.Errorf("unknown IPAM correction %q", name)
		}
	}
	slices.Sort(cs)
	return slices.Compact(cs), nil
}

// correctedIPAMClient returns the IPAM's client with the corrections that act through it.
func correctedIPAMClient(fixes Corrections) func(*rest.Config, client.Options) (client.Client, error) {
	return func(cfg *rest.Config, o client.Options) (client.Client, error) {
		if o.Cache == nil {
			o.Cache = &client.CacheOptions{}
		}
		if fixes.Has(LiveReads) {
			o.Cache.DisableFor = append(o.Cache.DisableFor, &ipamv1.IPPool{}, &ipamv1.IPClaim{}, &ipamv1.IPAddress{})
		}
		c, err := client.NewWithWatch(cfg, o)
		if err != nil {
			return nil, err
		}
		return interceptor.NewClient(c, correctedFuncs(c, fixes)), nil
	}
}

func correctedFuncs(c client.WithWatch, fixes Corrections) interceptor.Funcs {
	// The IPAM builds owner references from the TypeMeta of what it reads, which only the cache
	// sets.
	typed := func(obj runtime.Object) error {
		gvk, err := apiutil.GVKForObject(obj, c.Scheme())
		if err != nil {
			return err
		}
		obj.GetObjectKind().SetGroupVersionKind(gvk)
		return nil
	}
	listed := &listedClaims{uids: map[string]types.UID{}}
	return interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			return typed(obj)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			return meta.EachListItem(list, func(obj runtime.Object) error {
				if claim, ok := obj.(*ipamv1.IPClaim); ok {
					listed.remember(claim)
				}
				return typed(obj)
			})
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			address, ok := obj.(*ipamv1.IPAddress)
			if !ok || !fixes.Has(FinalizerFirst) {
				return c.Create(ctx, obj, opts...)
			}
			claim, added, err := finalizeClaimFirst(ctx, c, address, fixes.Has(HeldClaimsOnly))
			if err != nil {
				return err
			}
			err = c.Create(ctx, obj, opts...)
			if err != nil && added {
				if undo := unfinalizeClaim(ctx, c, claim); undo != nil {
					return errors.Join(err, undo)
				}
			}
			return err
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if pool, ok := obj.(*ipamv1.IPPool); ok && fixes.Has(PoolWaitsForClaims) {
				if err := poolMayGo(ctx, c, pool); err != nil {
					return err
				}
			}
			if fixes.Has(UIDBoundPatches) {
				patch = sameClaim(obj, patch)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, subResource string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if claim, ok := obj.(*ipamv1.IPClaim); ok && subResource == "status" && fixes.Has(UIDBoundPatches) && listed.uid(claim) != "" {
				// The status subresource ignores metadata: a test of the UID guards it instead.
				// Only the IPAM writes an IPClaim's status, so it is written whole.
				ops, err := json.Marshal([]map[string]any{{"op": "test", "path": "/metadata/uid", "value": listed.uid(claim)}, {"op": "add", "path": "/status", "value": claim.Status}})
				if err != nil {
					return err
				}
				patch = client.RawPatch(types.JSONPatchType, ops)
			}
			return c.SubResource(subResource).Patch(ctx, obj, patch, opts...)
		},
	}
}

// listedClaims remembers the UID of each IPClaim version the IPAM listed: the patch helper it
// writes a claim's status with sends the name and resourceVersion read, not the UID.
type listedClaims struct {
	mu   sync.Mutex
	uids map[string]types.UID
}

func versionKey(claim *ipamv1.IPClaim) string {
	return claim.Namespace + "/" + claim.Name + "@" + claim.ResourceVersion
}

func (l *listedClaims) remember(claim *ipamv1.IPClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.uids[versionKey(claim)] = claim.UID
}

func (l *listedClaims) uid(claim *ipamv1.IPClaim) types.UID {
	if claim.UID != "" {
		return claim.UID
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.uids[versionKey(claim)]
}

// sameClaim binds a merge patch of an IPClaim to the claim's UID: the IPAM patches the claims it
// listed at the start of a pass by name, and one deleted and created again meanwhile would take
// the old one's finalizer and error message, and never be answered. The API server refuses a
// patch that changes metadata.uid.
func sameClaim(obj client.Object, patch client.Patch) client.Patch {
	if _, ok := obj.(*ipamv1.IPClaim); !ok || obj.GetUID() == "" || patch.Type() != types.MergePatchType {
		return patch
	}
	return uidBound{Patch: patch}
}

type uidBound struct{ client.Patch }

func (p uidBound) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	merge := map[string]any{}
	if err := json.Unmarshal(data, &merge); err != nil {
		return nil, fmt.Errorf("reading the IPAM's merge patch of IPClaim %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	metadata, _ := merge["metadata"].(map[string]any)
	if metadata == nil {
		metadata = map[string]any{}
	}
	metadata["uid"] = obj.GetUID()
	merge["metadata"] = metadata
	return json.Marshal(merge)
}

// poolMayGo refuses to let a pool being deleted drop its finalizer while a claim of it still
// carries the IPAM's: the IPAM retries the pool.
func poolMayGo(ctx context.Context, c client.Client, pool *ipamv1.IPPool) error {
	if pool.DeletionTimestamp.IsZero() || controllerutil.ContainsFinalizer(pool, ipamv1.IPPoolFinalizer) {
		return nil
	}
	claims := &ipamv1.IPClaimList{}
	if err := c.List(ctx, claims, client.InNamespace(pool.Namespace)); err != nil {
		return fmt.Errorf("listing the IPClaims of IPPool %s/%s before it lets itself go: %w", pool.Namespace, pool.Name, err)
	}
	for _, claim := range claims.Items {
		if claim.Spec.Pool.Name == pool.Name && controllerutil.ContainsFinalizer(&claim, ipamv1.IPClaimFinalizer) {
			return apierrors.NewConflict(ipamv1.GroupVersion.WithResource("ippools").GroupResource(), pool.Name,
				fmt.Errorf("IPClaim %s still carries the IPAM's finalizer", claim.Name))
		}
	}
	return nil
}

// finalizeClaimFirst saves the IPAM's finalizer on the claim address is for, from a live read and
// while its finalizers are still those read, or fails when that claim is gone, replaced, being
// deleted or, with heldOnly, held by nobody; the IPAM then retries the pool. It returns the claim
// and whether the finalizer was added here.
func finalizeClaimFirst(ctx context.Context, c client.Client, address *ipamv1.IPAddress, heldOnly bool) (*ipamv1.IPClaim, bool, error) {
	i := slices.IndexFunc(address.OwnerReferences, func(ref metav1.OwnerReference) bool { return ref.Kind == "IPClaim" })
	if i < 0 {
		return nil, false, fmt.Errorf("IPAddress %s/%s names no IPClaim owner", address.Namespace, address.Name)
	}
	owner := address.OwnerReferences[i]
	claim := &ipamv1.IPClaim{}
	// Without LiveReads this is the IPAM's cache: the patch's tests refuse what it missed.
	if err := c.Get(ctx, types.NamespacedName{Namespace: address.Namespace, Name: owner.Name}, claim); err != nil {
		return nil, false, fmt.Errorf("reading IPClaim %s/%s before creating its IPAddress: %w", address.Namespace, owner.Name, err)
	}
	if claim.UID != owner.UID || !claim.DeletionTimestamp.IsZero() {
		return nil, false, apierrors.NewConflict(ipamv1.GroupVersion.WithResource("ipclaims").GroupResource(), claim.Name,
			fmt.Errorf("the IPClaim the address was allocated for is gone or being deleted"))
	}
	if slices.Contains(claim.Finalizers, ipamv1.IPClaimFinalizer) {
		return claim, false, nil
	}
	if heldOnly && len(claim.Finalizers) == 0 {
		return nil, false, apierrors.NewConflict(ipamv1.GroupVersion.WithResource("ipclaims").GroupResource(), claim.Name,
			fmt.Errorf("nobody holds the IPClaim the address was allocated for: it is being let go"))
	}
	ops, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": owner.UID},
		{"op": "test", "path": "/metadata/finalizers", "value": claim.Finalizers},
		{"op": "add", "path": "/metadata/finalizers/-", "value": ipamv1.IPClaimFinalizer},
	})
	if err != nil {
		return nil, false, err
	}
	if err := c.Patch(ctx, claim, client.RawPatch(types.JSONPatchType, ops)); err != nil {
		return nil, false, fmt.Errorf("saving the IPAM's finalizer on IPClaim %s/%s before creating its IPAddress: %w", claim.Namespace, claim.Name, err)
	}
	return claim, true, nil
}

// unfinalizeClaim takes the IPAM's finalizer off claim again, from a live read of the same UID.
func unfinalizeClaim(ctx context.Context, c client.Client, claim *ipamv1.IPClaim) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		live := &ipamv1.IPClaim{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), live); err != nil {
			return client.IgnoreNotFound(err)
		}
		if live.UID != claim.UID || !controllerutil.RemoveFinalizer(live, ipamv1.IPClaimFinalizer) {
			return nil
		}
		if err := c.Update(ctx, live); err != nil {
			return fmt.Errorf("taking the IPAM's finalizer off IPClaim %s/%s, whose IPAddress was not created: %w", live.Namespace, live.Name, err)
		}
		return nil
	})
}
