// Package handover finishes, on every replica, what admission started: it creates the claims an
// admission planned and hands them over to their Metal3Data once it is stored.
package handover

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/answers"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/index"
	"github.com/metal3-community/ip-preallocator/pkg/lifecycle"
	"github.com/metal3-community/ip-preallocator/pkg/memory"
)

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3datas,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// HandOver hands the claims preallocated for a Metal3Data over to it once it is stored, as
// lifecycle.DecideHandOver decides. It runs on every replica, without the lease, so that no
// hand-over waits for a new leader.
type HandOver struct {
	Client client.Client
	// APIReader reads the Metal3Data a claim it does not record is handed over to.
	APIReader  client.Reader
	Recorder   events.EventRecorder
	Admissions *Admissions
	Created    <-chan event.GenericEvent
	// Answers, when set, tells which claims the IPAM has not answered; the hand-over waits for them.
	Answers       *answers.Watcher
	TakeOverDelay time.Duration
	IPAMWait      time.Duration

	seen memory.Sightings[takeOver]
}

// takeOver is what the take-over notes of the IPAM's answers.
type takeOver struct {
	note       lifecycle.Note
	answeredAt time.Time
}

// SetupWithManager registers the controller on every replica.
func (h *HandOver) SetupWithManager(mgr ctrl.Manager) error {
	h.seen.TTL = 2 * (h.TakeOverDelay + h.IPAMWait + clock.AnswerGrace)
	b := ctrl.NewControllerManagedBy(mgr).
		Named("preallocation-handover").
		For(allocation.Metadata(allocation.Metal3DataGVK), builder.WithPredicates(createOnly)).
		WatchesRawSource(source.Channel(h.Created, &handler.EnqueueRequestForObject{}))
	for _, gvk := range index.ClaimGVKs {
		// The claims' informers hold whole claims: the IPAM's answer is one of their events.
		b = b.Watches(allocation.Metadata(gvk), handler.EnqueueRequestsFromMapFunc(dataWaitedFor), builder.WithPredicates(stillWaiting))
	}
	if err := b.WithOptions(controller.Options{MaxConcurrentReconciles: clock.Concurrency, NeedLeaderElection: ptr.To(false)}).
		Complete(h); err != nil {
		return fmt.Errorf("setting up controller preallocation-handover: %w", err)
	}
	return nil
}

var createOnly = predicate.Funcs{
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

var stillWaiting = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return allocation.PhaseOf(o) == allocation.Waiting
})

// dataWaitedFor maps a claim to the Metal3Data it waits for.
func dataWaitedFor(_ context.Context, claim client.Object) []reconcile.Request {
	name, ok := allocation.WaitingFor(claim)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: claim.GetNamespace(), Name: name}}}
}

// scope is what a reconcile gathered besides the facts: what it acts on.
type scope struct {
	data       *metav1.PartialObjectMetadata
	token      string
	recorded   []allocation.ClaimRef
	admitted   []allocation.ClaimRef
	unrecorded []metav1.PartialObjectMetadata
}

// Reconcile gathers the facts of a stored Metal3Data, decides, and acts once.
func (h *HandOver) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	data := allocation.Metadata(allocation.Metal3DataGVK)
	if err := h.Client.Get(ctx, req.NamespacedName, data); err != nil {
		h.seen.Delete(req.NamespacedName)
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	token := data.Annotations[allocation.AdmissionAnnotation]
	if warning := h.Admissions.takeWarning(req.NamespacedName, token); warning != "" {
		h.Recorder.Eventf(data, nil, corev1.EventTypeWarning, "PreallocationIncomplete", "Preallocate", "%s", warning)
	}
	if !data.DeletionTimestamp.IsZero() {
		h.Admissions.done(req.NamespacedName, token)
		h.seen.Delete(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	s := scope{data: data, token: token}
	f, err := h.facts(ctx, &s)
	if err != nil {
		return ctrl.Result{}, err
	}
	return h.act(ctx, s, lifecycle.DecideHandOver(f, h.TakeOverDelay, h.IPAMWait))
}

// facts reads, from the caches and this replica's memory, what the hand-over depends on.
func (h *HandOver) facts(ctx context.Context, s *scope) (lifecycle.HandOverFacts, error) {
	key := client.ObjectKeyFromObject(s.data)
	var waiting []metav1.PartialObjectMetadata
	for _, gvk := range index.ClaimGVKs {
		claims, err := index.List(ctx, h.Client, gvk, key.Namespace, index.WaitingFor, key.Name)
		if err != nil {
			return lifecycle.HandOverFacts{}, err
		}
		waiting = append(waiting, slices.DeleteFunc(claims, func(c metav1.PartialObjectMetadata) bool { return !c.DeletionTimestamp.IsZero() })...)
	}
	s.recorded, _ = allocation.ParseClaims(s.data.Annotations[allocation.ClaimsAnnotation])
	s.unrecorded = slices.DeleteFunc(slices.Clone(waiting), func(c metav1.PartialObjectMetadata) bool {
		return s.token != "" && c.Annotations[allocation.AdmissionAnnotation] == s.token &&
			slices.Contains(s.recorded, allocation.ClaimRef{Kind: c.Kind, Name: c.Name})
	})
	refs, answerBy, created := h.Admissions.claims(key, s.token)
	s.admitted = refs
	f := lifecycle.HandOverFacts{
		Unrecorded:      len(s.unrecorded) > 0,
		Admitted:        created || h.Admissions.admittedHere(key, s.token),
		Created:         created,
		RecordedWaiting: len(waiting) > len(s.unrecorded),
	}
	if !answerBy.IsZero() {
		f.AnswerLeft = max(0, time.Until(answerBy))
	}
	if f.AnswerLeft > 0 {
		unanswered, absent := h.Answers.Unanswered(ctx, key.Namespace, refs)
		f.AdmittedUnanswered = unanswered+absent > 0
	}
	if !f.RecordedWaiting {
		h.seen.Delete(key)
		return f, nil
	}
	sighting := h.seen.See(key, s.data.UID, s.token)
	f.Age, f.Noted = time.Since(sighting.At), sighting.Noted.note
	f.SinceAnswered = time.Since(sighting.Noted.answeredAt)
	if !f.Admitted && h.Answers != nil {
		unanswered, _ := h.Answers.Unanswered(ctx, key.Namespace, s.recorded)
		f.RecordedUnanswered = unanswered > 0
	}
	return f, nil
}
