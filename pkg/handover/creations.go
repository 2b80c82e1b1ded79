package handover

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/answers"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// Creations creates, in the background, the claims an admission recorded, and tells the
// hand-over when they are created. It is a manager Runnable: on shutdown it lets the creations in
// flight finish, within their timeout.
type Creations struct {
	Admissions *Admissions
	Creator    *allocation.Creator
	// Timeout bounds the creation of one admission's claims, retries included.
	Timeout time.Duration
	// Wait bounds how long an admission waits for its claims' create requests to be sent.
	Wait time.Duration
	// Answers, when set, makes the hand-over of an admission made while the IPAM is behind wait
	// up to IPAMWait for the IPAM's answers.
	Answers  *answers.Watcher
	IPAMWait time.Duration
	// IdleWait, when set with Cache, makes an idle admission wait up to IdleWait, within its
	// deadline, for the IPAM's answers: the IPAM's writes then come before the hand-over, and wake
	// no CAPM3 reconcile. Idle: alone in its namespace (no other Metal3DataClaim of it waits for
	// its Metal3Data), and the IPAM answered every claim this replica created. Never in a burst or
	// backlog, where CAPM3's template loop would wait for each admission in turn, nor at a burst's
	// end while the IPAM works on it.
	IdleWait time.Duration
	// Cache holds the metadata of Metal3DataClaims and Metal3Data.
	Cache client.Reader

	running  sync.WaitGroup
	once     sync.Once
	done     chan event.GenericEvent
	stopping chan struct{}
}

func (c *Creations) init() {
	c.once.Do(func() {
		c.done = make(chan event.GenericEvent, clock.CreatedQueue)
		c.stopping = make(chan struct{})
	})
}

// Created delivers the Metal3Data whose claims were created, for the hand-over.
func (c *Creations) Created() <-chan event.GenericEvent {
	c.init()
	return c.done
}

// Start waits for the manager to stop, then for the creations in flight.
func (c *Creations) Start(ctx context.Context) error {
	c.init()
	<-ctx.Done()
	close(c.stopping)
	c.running.Wait()
	return nil
}

// NeedLeaderElection is false: every replica admits.
func (c *Creations) NeedLeaderElection() bool { return false }

// Admitted records this replica's admission of the Metal3Data key and starts creating its claims.
// It returns once their requests are on the wire, within Wait: the API server stores the
// Metal3Data only after the answer, and CAPM3 reads two Secrets and the BareMetalHost live before
// it creates claims, so the creates arrive first; a wait for the stored claims would be paid once
// per machine, in series, in CAPM3's template loop. Idle (see IdleWait), it also waits for the
// IPAM's answers, within IdleWait.
func (c *Creations) Admitted(ctx context.Context, key types.NamespacedName, token, dataToken string, claims []allocation.Claim, warning string) {
	c.init()
	now := time.Now()
	v := admitted{token: token, dataToken: dataToken, warning: warning, creating: len(claims) > 0}
	if len(claims) > 0 && c.Answers.Behind(now) {
		v.answerBy = now.Add(c.IPAMWait)
	}
	// Never while the IPAM is behind: it is behind only on claims in flight.
	idle := c.IdleWait > 0 && c.Cache != nil && len(claims) > 0 && c.Answers.Idle() &&
		c.alone(ctx, key.Namespace, claims[0].DataClaim)
	c.Admissions.admit(key, v)
	if len(claims) == 0 {
		return
	}
	if idle {
		defer c.waitForAnswers(ctx, key, token)
	}
	var onWire sync.WaitGroup
	onWire.Add(len(claims))
	sent := make(chan struct{})
	go func() {
		onWire.Wait()
		close(sent)
	}()
	c.running.Go(func() {
		c.create(key, token, claims, onWire.Done)
	})
	wait := time.NewTimer(c.Wait)
	defer wait.Stop()
	select {
	case <-sent:
	case <-wait.C:
	case <-ctx.Done():
	}
}

// alone tells, from the cache, whether every Metal3DataClaim of the namespace but dataClaim has
// its Metal3Data: otherwise CAPM3's template loop is creating a burst or working off a backlog.
func (c *Creations) alone(ctx context.Context, namespace, dataClaim string) bool {
	datas := &metav1.PartialObjectMetadataList{}
	datas.SetGroupVersionKind(allocation.Metal3DataGVK.GroupVersion().WithKind("Metal3DataList"))
	dataClaims := &metav1.PartialObjectMetadataList{}
	dataClaims.SetGroupVersionKind(allocation.Metal3DataClaimGVK.GroupVersion().WithKind("Metal3DataClaimList"))
	for _, list := range []*metav1.PartialObjectMetadataList{datas, dataClaims} {
		if err := c.Cache.List(ctx, list, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
			klog.FromContext(ctx).V(1).Info("Not waiting for the IPAM's answers", "error", fmt.Errorf("listing %s: %w", list.Kind, err))
			return false
		}
	}
	answered := map[string]bool{dataClaim: true}
	for _, d := range datas.Items {
		for _, ref := range d.OwnerReferences {
			if ref.Kind == allocation.Metal3DataClaimGVK.Kind {
				answered[ref.Name] = true
			}
		}
	}
	for _, dc := range dataClaims.Items {
		if !answered[dc.Name] && dc.DeletionTimestamp == nil {
			return false
		}
	}
	return true
}

// waitForAnswers waits, at most IdleWait, until the claims of the admission token are created and
// answered by the IPAM.
func (c *Creations) waitForAnswers(ctx context.Context, key types.NamespacedName, token string) {
	ctx, cancel := context.WithTimeout(ctx, c.IdleWait)
	defer cancel()
	// Unanswered in time, the claims are handed over as without the wait.
	_ = wait.PollUntilContextCancel(ctx, clock.IdleAnswerPoll, true, func(ctx context.Context) (bool, error) {
		refs, _, created := c.Admissions.claims(key, token)
		if !created {
			return false, nil
		}
		waiting, absent := c.Answers.Unanswered(ctx, key.Namespace, refs)
		return waiting+absent == 0, nil
	})
}

func (c *Creations) create(key types.NamespacedName, token string, claims []allocation.Claim, sent func()) {
	logger := klog.Background().WithValues("Metal3Data", klog.KRef(key.Namespace, key.Name), "admission", token)
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	var results []allocation.Result
	func() {
		defer func() {
			if r := recover(); r != nil {
				logger.Error(fmt.Errorf("panic: %v", r), "Creating preallocated claims panicked")
			}
		}()
		start := time.Now()
		c.Answers.Track(claims)
		defer func() { c.Answers.Created(claims, results) }()
		results = c.Creator.Create(ctx, key.Name, token, claims, sent)
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
	c.Admissions.created(key, token, refs, warnings)
	notified := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case c.done <- event.GenericEvent{Object: notified}:
	case <-c.stopping:
	}
}

var (
	handOversTotal = promauto.With(metrics.Registry).NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_handovers_total",
		Help: "Preallocated claims handed over to their Metal3Data, by claim kind and by path (admission: by the replica that admitted the Metal3Data; takeover: by the take-over on any replica).",
	}, []string{"kind", "path"})
	claimsTotal = promauto.With(metrics.Registry).NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_claims_total",
		Help: "Claims recorded during admission, by kind and by what their creation, which the admission answers once it is sent, came to (created, reused, foreign, failed).",
	}, []string{"kind", "outcome"})
	claimCreationSeconds = promauto.With(metrics.Registry).NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_claim_creation_duration_seconds",
		Help:    "Time spent creating (or reclaiming) the claims of one admitted Metal3Data, from the admission until the last is stored; the admission answers once they are sent.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
	handOverSeconds = promauto.With(metrics.Registry).NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_handover_duration_seconds",
		Help:    "Time to patch all claims of one Metal3Data once it is stored and its claims are created.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
)
