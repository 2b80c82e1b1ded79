package allocation

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptrace"
	"sync"
	"syscall"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// Outcome is what became of one planned claim.
type Outcome string

const (
	// Created means the webhook created the claim.
	Created Outcome = "created"
	// Reused means an existing claim waiting for this name with the planned spec was claimed again.
	Reused Outcome = "reused"
	// Foreign means a claim CAPM3 would use belongs to something else; it is left to CAPM3.
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
	// APIReader reads live what the cache may not have seen yet.
	APIReader client.Reader
}

// Create makes sure every planned claim of the Metal3Data dataName exists, claimed by token, until
// ctx ends. sent, if not nil, is called once per claim when its request is on the wire or handling
// ended without one. An existing claim is only reclaimed, if it waits for dataName with this spec.
func (c *Creator) Create(ctx context.Context, dataName, token string, claims []Claim, sent func()) []Result {
	results := make([]Result, len(claims))
	var wg sync.WaitGroup
	for i := range claims {
		wg.Go(func() {
			notify := sync.OnceFunc(func() {
				if sent != nil {
					sent()
				}
			})
			defer notify()
			defer func() {
				if r := recover(); r != nil {
					results[i] = Result{Claim: claims[i], Name: claims[i].Object.GetName(), Outcome: Failed, Err: fmt.Errorf("panic: %v", r)}
				}
			}()
			results[i] = c.create(ctx, dataName, token, claims[i], notify)
		})
	}
	wg.Wait()
	return results
}

func (c *Creator) create(ctx context.Context, dataName, token string, claim Claim, sent func()) Result {
	existing, err := lookup(ctx, c.Cache, claim)
	if err != nil {
		return Result{Claim: claim, Name: claim.Object.GetName(), Outcome: Failed, Err: err}
	}
	if existing != nil {
		return c.classify(ctx, claim, existing, dataName, token, sent)
	}

	obj := claim.preallocated(token)
	// Every claim left to CAPM3 loses the head start, so retry within the deadline.
	err = withRetries(ctx, isTransient, func() error {
		return c.Client.Create(onWire(ctx, sent), obj.DeepCopyObject().(client.Object), client.FieldOwner(FieldManager))
	})
	if err == nil {
		return Result{Claim: claim, Name: obj.GetName(), Outcome: Created}
	}
	if !apierrors.IsAlreadyExists(err) {
		return Result{Claim: claim, Name: obj.GetName(), Outcome: Failed, Err: fmt.Errorf("creating %s %s: %w", claim.Kind(), obj.GetName(), err)}
	}
	existing, err = getMetadata(ctx, c.APIReader, claim, claim.Object.GetNamespace(), obj.GetName())
	if err != nil {
		return Result{Claim: claim, Name: obj.GetName(), Outcome: Failed, Err: fmt.Errorf("reading existing %s %s: %w", claim.Kind(), obj.GetName(), err)}
	}
	return c.classify(ctx, claim, existing, dataName, token, sent)
}

// onWire calls sent once a request made with the returned context is written to the API server.
func onWire(ctx context.Context, sent func()) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			sent()
		}
	}})
}

func lookup(ctx context.Context, r client.Reader, claim Claim) (*metav1.PartialObjectMetadata, error) {
	for _, name := range claim.Lookup {
		existing, err := getMetadata(ctx, r, claim, claim.Object.GetNamespace(), name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("looking up %s %s: %w", claim.Kind(), name, err)
		}
		return existing, nil
	}
	return nil, nil
}

// Usable tells, from the cache r, the name claim can be preallocated under for dataName, or why not.
func Usable(ctx context.Context, r client.Reader, dataName string, claim Claim) (string, error) {
	existing, err := lookup(ctx, r, claim)
	switch {
	case err != nil:
		return "", err
	case existing == nil:
		return claim.Object.GetName(), nil
	case !WaitsFor(existing, dataName):
		return "", foreign(claim, existing)
	}
	return existing.GetName(), nil
}

func foreign(claim Claim, existing metav1.Object) error {
	return fmt.Errorf("%s %s/%s exists and does not belong to this Metal3Data; CAPM3 will decide",
		claim.Kind(), existing.GetNamespace(), existing.GetName())
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

// classify tells what an existing claim is to this admission, and reclaims it when it is ours.
func (c *Creator) classify(ctx context.Context, claim Claim, existing metav1.Object, dataName, token string, sent func()) Result {
	name := existing.GetName()
	if !WaitsFor(existing, dataName) {
		return Result{Claim: claim, Name: name, Outcome: Foreign, Err: foreign(claim, existing)}
	}
	// The IPAM writes the claim too; a reclaim that lost that race reads it again.
	var foreign bool
	err := withRetries(ctx, func(err error) bool { return IsTestFailure(err) || isTransient(err) }, func() error {
		full, _ := claim.Object.DeepCopyObject().(client.Object)
		if err := c.APIReader.Get(ctx, types.NamespacedName{Namespace: existing.GetNamespace(), Name: name}, full); err != nil {
			return fmt.Errorf("reading it live: %w", err)
		}
		if owner := Metal3DataOwner(full); owner != nil && owner.Name == dataName && full.GetDeletionTimestamp() == nil {
			// Handed over since read: by a take-over to the Metal3Data this admission made, or, from a
			// stale cache, to an older one of the name, which CAPM3 will not use it for.
			ours, err := c.storedWith(ctx, full.GetNamespace(), dataName, owner.UID, token)
			if err != nil {
				return err
			}
			foreign = !ours
			return nil
		}
		if !WaitsFor(full, dataName) || !equality.Semantic.DeepEqual(specOf(full), specOf(claim.Object)) {
			foreign = true
			return nil
		}
		full.GetObjectKind().SetGroupVersionKind(claim.GVK())
		return Reclaim(onWire(ctx, sent), c.Client, full, token, claim.DataClaim)
	})
	if err != nil {
		return Result{Claim: claim, Name: name, Outcome: Failed, Err: fmt.Errorf("reclaiming %s %s: %w", claim.Kind(), name, err)}
	}
	if foreign {
		return Result{Claim: claim, Name: name, Outcome: Foreign,
			Err: fmt.Errorf("%s %s/%s was preallocated for this name with another spec, or taken meanwhile; CAPM3 will decide",
				claim.Kind(), existing.GetNamespace(), name)}
	}
	return Result{Claim: claim, Name: name, Outcome: Reused}
}

// storedWith tells, from a live read, whether the Metal3Data is stored with uid and token.
func (c *Creator) storedWith(ctx context.Context, namespace, name string, uid types.UID, token string) (bool, error) {
	data := Metadata(Metal3DataGVK)
	found, err := Read(ctx, c.APIReader, types.NamespacedName{Namespace: namespace, Name: name}, data)
	return found && data.UID == uid && data.Annotations[AdmissionAnnotation] == token, err
}

var createBackoff = wait.Backoff{Duration: clock.CreateRetryFirst, Factor: 2, Jitter: 0.2, Steps: clock.CreateRetries, Cap: clock.CreateRetryCap}

// withRetries returns fn's last error, where client-go's retry.OnError turns a deadline into success.
func withRetries(ctx context.Context, retriable func(error) bool, fn func() error) error {
	backoff := createBackoff
	for {
		err := fn()
		if err == nil || !retriable(err) || backoff.Steps <= 1 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff.Step()):
		}
	}
}

// isTransient tells errors a retry may cure: throttling, server errors and broken connections.
func isTransient(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsUnexpectedServerError(err) ||
		utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) || errors.Is(err, syscall.ECONNREFUSED)
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
