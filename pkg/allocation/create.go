package allocation

import (
	"context"
	"fmt"
	"sync"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Outcome is what became of one planned claim.
type Outcome string

const (
	// Created means the webhook created the claim.
	Created Outcome = "created"
	// Reused means the claim already existed, preallocated earlier for a Metal3Data of this name, not
	// handed over to anyone yet and with the planned spec, so it is claimed again for this one.
	Reused Outcome = "reused"
	// Foreign means a claim CAPM3 would use exists and belongs to something else. It is left
	// untouched; CAPM3 decides what to do with it, as it would without the webhook.
	Foreign Outcome = "foreign"
	// Failed means the claim could not be looked up or created; CAPM3 will create it itself.
	Failed Outcome = "failed"
)

// Result is the outcome for one planned claim.
type Result struct {
	Claim Claim
	// Name is the claim that was created or found.
	Name    string
	Outcome Outcome
	Err     error
}

// Creator creates the planned claims of a Metal3Data ahead of CAPM3.
type Creator struct {
	// Client creates claims. Its rate limit should fit a burst of machines.
	Client client.Client
	// Cache answers whether a claim exists; it needs only claim metadata.
	Cache client.Reader
	// APIReader settles, with a live read, who owns a claim whose create found it existing
	// although the cache did not have it yet, and reads a claim in full before it is reused.
	APIReader client.Reader
}

// Create makes sure every planned claim of the Metal3Data named dataName exists, concurrently,
// claimed by the admission token, and stops waiting when ctx ends. A claim that already exists
// under one of the names CAPM3 looks for is never modified, unless it waits for this name with
// the planned spec: then only its AdmissionAnnotation changes.
func (c *Creator) Create(ctx context.Context, dataName, token string, claims []Claim) []Result {
	results := make([]Result, len(claims))
	var wg sync.WaitGroup
	for i := range claims {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					results[i] = Result{Claim: claims[i], Name: claims[i].Object.GetName(), Outcome: Failed, Err: fmt.Errorf("panic: %v", r)}
				}
			}()
			results[i] = c.create(ctx, dataName, token, claims[i])
		})
	}
	wg.Wait()
	return results
}

func (c *Creator) create(ctx context.Context, dataName, token string, claim Claim) Result {
	namespace := claim.Object.GetNamespace()
	for _, name := range claim.Lookup {
		existing, err := getMetadata(ctx, c.Cache, claim, namespace, name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return Result{Claim: claim, Name: name, Outcome: Failed, Err: fmt.Errorf("looking up %s %s: %w", claim.Kind(), name, err)}
		}
		return c.classify(ctx, claim, existing, dataName, token)
	}

	obj := claim.Preallocated(token)
	err := c.Client.Create(ctx, obj)
	if err == nil {
		return Result{Claim: claim, Name: obj.GetName(), Outcome: Created}
	}
	if !apierrors.IsAlreadyExists(err) {
		return Result{Claim: claim, Name: obj.GetName(), Outcome: Failed, Err: fmt.Errorf("creating %s %s: %w", claim.Kind(), obj.GetName(), err)}
	}
	existing, err := getMetadata(ctx, c.APIReader, claim, namespace, obj.GetName())
	if err != nil {
		return Result{Claim: claim, Name: obj.GetName(), Outcome: Failed, Err: fmt.Errorf("reading existing %s %s: %w", claim.Kind(), obj.GetName(), err)}
	}
	return c.classify(ctx, claim, existing, dataName, token)
}

func getMetadata(ctx context.Context, r client.Reader, claim Claim, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	m := Metadata(claim.GVK())
	err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, m)
	return m, err
}

// Metadata is an empty metadata-only object of a kind, for reads that need only metadata.
func Metadata(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	return m
}

// IsPreallocatedFor tells whether a claim was preallocated for the Metal3Data named dataName and
// is still waiting to be handed over.
func IsPreallocatedFor(claim metav1.Object, dataName string) bool {
	return claim.GetAnnotations()[PreallocatedForAnnotation] == dataName &&
		len(claim.GetOwnerReferences()) == 0 && claim.GetDeletionTimestamp() == nil
}

// classify decides what an existing claim is to this admission, and reclaims it when it is ours.
func (c *Creator) classify(ctx context.Context, claim Claim, existing metav1.Object, dataName, token string) Result {
	name := existing.GetName()
	if !IsPreallocatedFor(existing, dataName) {
		return Result{Claim: claim, Name: name, Outcome: Foreign,
			Err: fmt.Errorf("%s %s/%s exists and does not belong to this Metal3Data; CAPM3 will decide",
				claim.Kind(), existing.GetNamespace(), name)}
	}
	full, _ := claim.Object.DeepCopyObject().(client.Object)
	if err := c.APIReader.Get(ctx, types.NamespacedName{Namespace: existing.GetNamespace(), Name: name}, full); err != nil {
		return Result{Claim: claim, Name: name, Outcome: Failed, Err: fmt.Errorf("reading %s %s: %w", claim.Kind(), name, err)}
	}
	if !equality.Semantic.DeepEqual(specOf(full), specOf(claim.Object)) {
		return Result{Claim: claim, Name: name, Outcome: Foreign,
			Err: fmt.Errorf("%s %s/%s was preallocated for this name with another spec; CAPM3 will decide",
				claim.Kind(), existing.GetNamespace(), name)}
	}
	full.GetObjectKind().SetGroupVersionKind(claim.GVK())
	if err := Reclaim(ctx, c.Client, full, token); err != nil {
		return Result{Claim: claim, Name: name, Outcome: Failed, Err: fmt.Errorf("reclaiming %s %s: %w", claim.Kind(), name, err)}
	}
	return Result{Claim: claim, Name: name, Outcome: Reused}
}

// specOf is what a claim asks the IPAM for; CAPM3 uses an existing claim without looking at it.
func specOf(obj client.Object) any {
	switch o := obj.(type) {
	case *ipamv1.IPClaim:
		return o.Spec
	case *capipamv1.IPAddressClaim:
		return o.Spec
	}
	return nil
}
