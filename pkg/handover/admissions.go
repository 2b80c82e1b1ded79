package handover

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// Admissions remembers what this replica decided when it admitted a Metal3Data, and creates the
// claims an admission recorded, in the background: the admission waits for them only as long as
// Admitted says. This replica then hands the claims over itself as soon as the Metal3Data is
// stored and they exist (the hand-over of a live replica never waits for the lease, and every
// other replica leaves those Metal3Data alone). A warning for the operator can only be recorded as
// an Event once the Metal3Data exists, so it waits here too.
//
// It is a manager Runnable: on shutdown it lets the creations in flight finish, within their
// timeout.
type Admissions struct {
	// TTL bounds how long an admission whose Metal3Data is never stored is remembered.
	TTL time.Duration
	// Creator creates the claims of an admission.
	Creator *allocation.Creator
	// CreateTimeout bounds the creation of one admission's claims, retries included.
	CreateTimeout time.Duration
	// Wait bounds how long an admission waits for its claims' create (or reclaim) requests to be
	// sent (see Admitted).
	Wait time.Duration
	// IPAMWait bounds how long the hand-over of an admission made while the IPAM is behind (a
	// claim this replica created has waited more than ipamBehind, since its create returned, and
	// less than ipamGivenUp, for its answer) waits for the IPAM to answer every claim (see HandOver). CAPM3's first reconcile
	// would then come before the answer anyway. Otherwise the claims are handed over at once: the IPAM keeps up, and
	// CAPM3's first reconcile, which comes tens of milliseconds after the Metal3Data is stored,
	// about when the IPAM answers, would meet them unowned.
	IPAMWait time.Duration

	mu      sync.Mutex
	pending map[types.NamespacedName]*admitted
	// unanswered are the claims this replica created that the IPAM has not answered yet, with when
	// their creation started.
	unanswered map[claimKey]time.Time
	running    sync.WaitGroup
	once       sync.Once
	created    chan event.GenericEvent
	stopping   chan struct{}
}

type admitted struct {
	token string
	// stored is the admission token the stored Metal3Data carries if it is this admission's.
	stored   string
	warning  string
	at       time.Time
	creating bool
	// answerBy is when the hand-over stops waiting for the IPAM's answer; zero: it does not wait.
	answerBy time.Time
	// claims are the claims this replica created or reclaimed, to hand over.
	claims []allocation.ClaimRef
}

// claimKey names a claim: its kind and its object key.
type claimKey struct {
	kind string
	types.NamespacedName
}

// ipamBehind is how long the IPAM may take to answer a claim before it counts as behind: well
// above its answer time when it keeps up (tens of milliseconds) and below the lag of a burst it
// is behind on (seconds).
const ipamBehind = 250 * time.Millisecond

// ipamGivenUp is how long an unanswered claim counts toward the IPAM being behind: seconds of
// lag in a burst, not a pool that fails or an IPAM that is down, which would otherwise make
// every admission of healthy pools wait for the answer instead of handing over at once.
const ipamGivenUp = 3 * time.Second

func (a *Admissions) init() {
	a.once.Do(func() {
		a.unanswered = map[claimKey]time.Time{}
		a.pending = map[types.NamespacedName]*admitted{}
		a.created = make(chan event.GenericEvent, 1024)
		a.stopping = make(chan struct{})
	})
}

// Created delivers the Metal3Data whose claims were created, for the hand-over controller.
func (a *Admissions) Created() <-chan event.GenericEvent {
	a.init()
	return a.created
}

// Start waits for the manager to stop, then for the creations in flight.
func (a *Admissions) Start(ctx context.Context) error {
	a.init()
	<-ctx.Done()
	close(a.stopping)
	a.running.Wait()
	return nil
}

// NeedLeaderElection is false: every replica admits.
func (a *Admissions) NeedLeaderElection() bool { return false }

// Admitted records this replica's admission of the Metal3Data key: claims it recorded under the
// admission token, created now, a warning for the operator, and the admission token the stored
// Metal3Data will carry. It returns once the claims' create (or reclaim) requests are on the wire
// to the API server, within Wait, or when ctx ends.
//
// Sending is enough: the API server stores the Metal3Data only after the answer, and CAPM3 reads
// two Secrets and the BareMetalHost live before it creates claims, so the creates arrive first.
// Every write admission waited for would be paid once per machine, in series, where CAPM3's
// template controller creates the Metal3Data of a template one after another; waiting until they
// are stored, even only after a pause, held a burst's whole stream behind its first admission.
func (a *Admissions) Admitted(ctx context.Context, key types.NamespacedName, token, stored string, claims []allocation.Claim, warning string) {
	a.init()
	a.mu.Lock()
	now := time.Now()
	for k, v := range a.pending {
		if !v.creating && now.Sub(v.at) > a.TTL {
			delete(a.pending, k)
		}
	}
	for k, at := range a.unanswered {
		// Longer than ipamGivenUp unanswered: the IPAM is down or failed the claim, and making
		// every later admission wait for the IPAM because of it gains nothing. (A zero time is a
		// create in flight, bounded by CreateTimeout.)
		if !at.IsZero() && now.Sub(at) > ipamGivenUp {
			delete(a.unanswered, k)
		}
	}
	v := &admitted{token: token, stored: stored, warning: warning, at: now, creating: len(claims) > 0}
	if len(claims) > 0 && a.IPAMWait > 0 && a.behind(now) {
		v.answerBy = now.Add(a.IPAMWait)
	}
	a.pending[key] = v
	a.mu.Unlock()
	if len(claims) == 0 {
		return
	}
	var onWire sync.WaitGroup
	onWire.Add(len(claims))
	sent := make(chan struct{})
	go func() {
		onWire.Wait()
		close(sent)
	}()
	a.running.Go(func() {
		a.create(key, token, claims, onWire.Done)
	})
	wait := time.NewTimer(a.Wait)
	defer wait.Stop()
	select {
	case <-sent:
	case <-wait.C:
	case <-ctx.Done():
	}
}

// claimKeyOf keys a claim as the planned claims and the informers of whole claims hold them.
func claimKeyOf(claim client.Object) (claimKey, bool) {
	switch claim.(type) {
	case *ipamv1.IPClaim:
		return claimKey{allocation.KindIPClaim, client.ObjectKeyFromObject(claim)}, true
	case *capipamv1.IPAddressClaim:
		return claimKey{allocation.KindIPAddressClaim, client.ObjectKeyFromObject(claim)}, true
	}
	return claimKey{}, false
}

// track notes the claims about to be created as unanswered, before their creates, so that an
// answer that comes before the creates return is not missed; their clock starts once they are
// created (see createdClaims).
func (a *Admissions) track(claims []allocation.Claim) {
	if a.IPAMWait <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range claims {
		if k, ok := claimKeyOf(c.Object); ok {
			a.unanswered[k] = time.Time{}
		}
	}
}

// createdClaims starts the clock of the tracked claims that were created and are still
// unanswered, and forgets the others (not created, or without a result when the creation failed
// or panicked): the time until the IPAM's answer counts from the create's return, so that a
// client rate limiter or a slow API server is not taken for a lagging IPAM.
func (a *Admissions) createdClaims(claims []allocation.Claim, results []allocation.Result) {
	if a.IPAMWait <= 0 {
		return
	}
	created := map[claimKey]bool{}
	for _, r := range results {
		if k, ok := claimKeyOf(r.Claim.Object); ok && r.Outcome == allocation.Created {
			created[k] = true
		}
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range claims {
		k, ok := claimKeyOf(c.Object)
		if !ok {
			continue
		}
		if _, waiting := a.unanswered[k]; waiting && created[k] {
			a.unanswered[k] = now
		} else {
			delete(a.unanswered, k)
		}
	}
}

// behind tells whether a claim this replica created has waited more than ipamBehind for the
// IPAM's answer since its create returned. Call with a.mu held.
func (a *Admissions) behind(now time.Time) bool {
	for _, at := range a.unanswered {
		if !at.IsZero() && now.Sub(at) > ipamBehind {
			return true
		}
	}
	return false
}

// ClaimEvents is the event handler, for the informers of whole IPClaims and IPAddressClaims, that
// tells when the IPAM answers the claims this replica created, or they go.
func (a *Admissions) ClaimEvents() toolscache.ResourceEventHandler {
	a.init()
	forget := func(obj any) {
		if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		claim, ok := obj.(client.Object)
		if !ok {
			return
		}
		k, ok := claimKeyOf(claim)
		if !ok {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.unanswered, k)
	}
	seen := func(obj any) {
		if claim, ok := obj.(client.Object); ok && allocation.Answered(claim) {
			forget(claim)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: forget,
	}
}

func (a *Admissions) create(key types.NamespacedName, token string, claims []allocation.Claim, sent func()) {
	logger := klog.Background().WithValues("Metal3Data", klog.KRef(key.Namespace, key.Name), "admission", token)
	ctx, cancel := context.WithTimeout(context.Background(), a.CreateTimeout)
	defer cancel()
	var results []allocation.Result
	func() {
		defer func() {
			if r := recover(); r != nil {
				logger.Error(fmt.Errorf("panic: %v", r), "Creating preallocated claims panicked")
			}
		}()
		start := time.Now()
		a.track(claims)
		defer func() { a.createdClaims(claims, results) }()
		results = a.Creator.Create(ctx, key.Name, token, claims, sent)
		claimCreationSeconds.Observe(time.Since(start).Seconds())
	}()
	var (
		refs     []allocation.ClaimRef
		warnings []string
	)
	for _, r := range results {
		claimsTotal.WithLabelValues(r.Claim.Kind(), string(r.Outcome)).Inc()
		switch r.Outcome {
		case allocation.Created, allocation.Reused:
			logger.V(2).Info("Preallocated IP claim", r.Claim.Kind(), klog.KRef(key.Namespace, r.Name), "outcome", r.Outcome)
			refs = append(refs, allocation.ClaimRef{Kind: r.Claim.Kind(), Name: r.Name})
		default:
			logger.Info("IP claim left to CAPM3", r.Claim.Kind(), klog.KRef(key.Namespace, r.Name), "outcome", r.Outcome, "error", r.Err)
			warnings = append(warnings, fmt.Sprintf("ip-preallocator: %s %s left to CAPM3: %v", r.Claim.Kind(), r.Name, r.Err))
		}
	}
	if len(results) < len(claims) {
		warnings = append(warnings, "ip-preallocator: creating the claims failed; CAPM3 creates those that are missing")
	}
	a.mu.Lock()
	if v, ok := a.pending[key]; ok && v.token == token {
		v.creating = false
		v.claims = refs
		v.warning = strings.Join(append(nonEmpty(v.warning), warnings...), "; ")
	}
	a.mu.Unlock()
	notified := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case a.created <- event.GenericEvent{Object: notified}:
	case <-a.stopping:
	}
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// Claims returns the claims this replica's admission token created for the Metal3Data key, once
// their creation is over, and until when, on this replica's clock, their hand-over waits for the
// IPAM's answer (zero: it does not); ok is false while they are being created or when the
// admission was not this replica's.
func (a *Admissions) Claims(key types.NamespacedName, token string) (refs []allocation.ClaimRef, answerBy time.Time, ok bool) {
	a.init()
	a.mu.Lock()
	defer a.mu.Unlock()
	v, found := a.pending[key]
	if !found || token == "" || v.token != token || v.creating {
		return nil, time.Time{}, false
	}
	return v.claims, v.answerBy, true
}

// Pending tells whether anything is left to do for the Metal3Data key, stored with annotations:
// only if they carry the admission token this replica's admission left on it, so that a warning
// of an admission never stored is not taken for one of a Metal3Data another replica admitted
// with claims. (Two admissions that recorded no claims leave the same token, if any.)
func (a *Admissions) Pending(key types.NamespacedName, annotations map[string]string) bool {
	a.init()
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.pending[key]
	return ok && v.stored == annotations[allocation.AdmissionAnnotation] && (v.warning != "" || v.token != "")
}

// TakeWarning returns the warning of this replica's admission of the Metal3Data key, stored with
// the admission token stored, once its claims are created, once.
func (a *Admissions) TakeWarning(key types.NamespacedName, stored string) string {
	a.init()
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.pending[key]
	if !ok || v.stored != stored || v.warning == "" || v.creating {
		return ""
	}
	warning := v.warning
	v.warning = ""
	if v.token == "" {
		delete(a.pending, key)
	}
	return warning
}

// Done forgets an admission whose claims were handed over.
func (a *Admissions) Done(key types.NamespacedName, token string) {
	a.init()
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.pending[key]; ok && v.token == token {
		delete(a.pending, key)
	}
}
