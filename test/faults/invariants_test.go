package faults

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// namedCount is a figure with a name, and what it counted (the first of them, as evidence).
type namedCount struct {
	name     string
	n        int64
	evidence []string
	// capacity is the most n could have been; 0: nothing bounds it.
	capacity int64
}

const maxEvidence = 12

func (c *namedCount) addf(format string, args ...any) {
	c.n++
	if len(c.evidence) < maxEvidence {
		c.evidence = append(c.evidence, fmt.Sprintf(format, args...))
	}
}

// The invariants, each a count that must be 0.
const (
	invNotReady         = "stored Metal3Data not Ready with addresses rendered"
	invNoOwner          = "claims without an owner"
	invTerminating      = "claims Terminating"
	invOrphanAddress    = "IPAddresses whose claim is gone"
	invLeakedAddress    = "claims holding a second IPAddress"
	invDoubleAllocation = "addresses given to two claims"
	invCAPM3Claims      = "claims created by CAPM3 while the webhook was up"
	invUnanswered       = "admissions the webhook did not answer, no fault injected"
	invNamespaces       = "namespaces gone only after 30 s"
	invNamespacesStuck  = "namespaces not gone in 120 s"
	invNamespacesIPAM   = "namespaces the Metal3 IPAM alone held past 120 s"
	invOursLeft         = "claims the webhook created, left after their namespace's deletion"
	invOursAddresses    = "claims the webhook created that are Terminating, or whose address is gone, second or shared"
	invOthersLeft       = "other claims left after their namespace's deletion"
)

// checkResult is one evaluation of the invariants over a scenario's namespaces.
type checkResult struct {
	counts []namedCount
	// info are figures that may be non-zero: claims CAPM3 created for Metal3Data admitted while
	// the webhook was down, admissions left unanswered while a replica was down.
	info []namedCount
}

// problems is the sum of the counts that must be 0.
func (r checkResult) problems() int64 {
	var n int64
	for _, c := range r.counts {
		n += c.n
	}
	return n
}

func (r checkResult) ok() bool {
	for _, c := range r.counts {
		if c.n != 0 {
			return false
		}
	}
	return true
}

// namespaceState is everything the checks read of one namespace.
type namespaceState struct {
	datas       []infrav1.Metal3Data
	ipClaims    []ipamv1.IPClaim
	addrClaims  []capipamv1.IPAddressClaim
	m3Addresses []ipamv1.IPAddress
	addresses   []capipamv1.IPAddress
	secrets     map[string]corev1.Secret
}

func readNamespace(ctx context.Context, ns string) (*namespaceState, error) {
	s := &namespaceState{secrets: map[string]corev1.Secret{}}
	datas, ipClaims, addrClaims := &infrav1.Metal3DataList{}, &ipamv1.IPClaimList{}, &capipamv1.IPAddressClaimList{}
	m3Addresses, addresses, secrets := &ipamv1.IPAddressList{}, &capipamv1.IPAddressList{}, &corev1.SecretList{}
	for _, list := range []client.ObjectList{datas, ipClaims, addrClaims, m3Addresses, addresses, secrets} {
		if err := cp.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			return nil, err
		}
	}
	s.datas, s.ipClaims, s.addrClaims = datas.Items, ipClaims.Items, addrClaims.Items
	s.m3Addresses, s.addresses = m3Addresses.Items, addresses.Items
	for _, secret := range secrets.Items {
		s.secrets[secret.Name] = secret
	}
	return s, nil
}

// claim is what the checks need of either kind of claim.
type claim struct {
	kind        string
	obj         client.Object
	addressName string
	address     string
}

func (s *namespaceState) claims() map[string]*claim {
	out := map[string]*claim{}
	addr := map[string]string{}
	for _, a := range s.m3Addresses {
		addr["IPClaim/"+a.Name] = string(a.Spec.Address)
	}
	for _, a := range s.addresses {
		addr["IPAddressClaim/"+a.Name] = a.Spec.Address
	}
	for i := range s.ipClaims {
		c := &s.ipClaims[i]
		cl := &claim{kind: "IPClaim", obj: c}
		if c.Status.Address != nil {
			cl.addressName = c.Status.Address.Name
			cl.address = addr["IPClaim/"+cl.addressName]
		}
		out[cl.kind+"/"+c.Name] = cl
	}
	for i := range s.addrClaims {
		c := &s.addrClaims[i]
		cl := &claim{kind: "IPAddressClaim", obj: c, addressName: c.Status.AddressRef.Name}
		if cl.addressName != "" {
			cl.address = addr["IPAddressClaim/"+cl.addressName]
		}
		out[cl.kind+"/"+c.Name] = cl
	}
	return out
}

func claimKind(pool string) string {
	if pool == fixtures.ExternalPool {
		return "IPAddressClaim"
	}
	return "IPClaim"
}

func describe(obj client.Object) string {
	s := fmt.Sprintf("%s/%s uid=%s owners=[", obj.GetNamespace(), obj.GetName(), uidTail(obj.GetUID()))
	for i, ref := range obj.GetOwnerReferences() {
		if i > 0 {
			s += ","
		}
		s += ref.Kind + "/" + ref.Name + "@" + uidTail(ref.UID)
	}
	annotations := maps.Clone(obj.GetAnnotations())
	if token, ok := annotations[allocation.AdmissionAnnotation]; ok {
		annotations[allocation.AdmissionAnnotation] = uidTail(types.UID(token))
	}
	s += fmt.Sprintf("] finalizers=%v annotations=%v", obj.GetFinalizers(), annotations)
	if ts := obj.GetDeletionTimestamp(); ts != nil {
		s += fmt.Sprintf(" deleting since %s (%v ago)", ts.Format(time.RFC3339), time.Since(ts.Time).Round(time.Second))
	}
	return s
}

// check evaluates the invariants over the scenario's namespaces, and over every claim CAPM3 ever
// created in them.
// What a trial of the webhook's arm counts beside its invariants, on the page and not asserted.
const (
	infoRecorded   = "of the claims CAPM3 created while the webhook was up: recorded by the webhook"
	infoWarned     = "claims the webhook left to CAPM3 with a warning (its log, the PreallocationIncomplete Event or an admission warning: not created in time, or CAPM3 created it first), which CAPM3 then created as designed (not counted above)"
	infoCAPM3Down  = "claims created by CAPM3 while the webhook was down"
	infoKilled     = "claims the webhook recorded and never created because the replica that answered was SIGKILLed first, which CAPM3 then created as designed (not counted above)"
	infoUnanswered = "admissions the webhook did not answer (a replica or its API was faulted)"
)

func (sc *scenario) check(ctx context.Context) (checkResult, error) {
	notReady := namedCount{name: invNotReady}
	noOwner := namedCount{name: invNoOwner}
	terminating := namedCount{name: invTerminating}
	orphans := namedCount{name: invOrphanAddress}
	leaked := namedCount{name: invLeakedAddress}
	double := namedCount{name: invDoubleAllocation}
	capm3Up := namedCount{name: invCAPM3Claims}
	capm3Recorded := namedCount{name: infoRecorded}
	capm3Warned := namedCount{name: infoWarned}
	capm3Down := namedCount{name: infoCAPM3Down}
	capm3Killed := namedCount{name: infoKilled}
	unanswered := namedCount{name: invUnanswered}
	unansweredInfo := namedCount{name: infoUnanswered}
	ours := namedCount{name: invOursAddresses}
	webhooks := func(uid types.UID) bool { return recorder.byUID(uid).createdByWebhook() }

	warned := map[string]map[string]bool{}
	logged, err := harness.ClaimsLeftToCAPM3InLogs(cp.Dir)
	if err != nil {
		return checkResult{}, err
	}
	for _, ns := range sc.namespaces {
		s, err := readNamespace(ctx, ns)
		if err != nil {
			return checkResult{}, err
		}
		if warned[ns], err = harness.ClaimsLeftToCAPM3For(ctx, cp.Client, ns); err != nil {
			return checkResult{}, err
		}
		claims := s.claims()
		live := map[types.UID]bool{}
		for _, d := range s.datas {
			if d.DeletionTimestamp.IsZero() {
				live[d.UID] = true
			}
		}
		for i := range s.datas {
			d := &s.datas[i]
			if problem := renderedProblem(d, s, claims); problem != "" {
				notReady.addf("Metal3Data %s: %s", describe(d), problem)
			}
		}
		for _, cl := range claims {
			if cl.obj.GetDeletionTimestamp() != nil {
				terminating.addf("%s %s", cl.kind, describe(cl.obj))
				if webhooks(cl.obj.GetUID()) {
					ours.addf("Terminating: %s %s", cl.kind, describe(cl.obj))
				}
				continue
			}
			owned := false
			for _, ref := range cl.obj.GetOwnerReferences() {
				if ref.Kind == "Metal3Data" && live[ref.UID] {
					owned = true
				}
			}
			if !owned {
				noOwner.addf("%s %s", cl.kind, describe(cl.obj))
			}
		}
		addressViolations(ns, s, claims, webhooks, &ours, &orphans, &leaked, &double)
	}

	byUID := map[types.UID]admission{}
	for _, a := range sc.stored() {
		byUID[a.uid] = a
		if !a.answered() {
			if sc.webhookFaults {
				unansweredInfo.addf("%s", a)
			} else {
				unanswered.addf("%s", a)
			}
		}
	}
	for _, rec := range recorder.in(sc.namespaces) {
		if !rec.createdByCAPM3() {
			continue
		}
		a, ok := byUID[rec.owner]
		switch {
		case !ok:
			capm3Up.addf("%s for a Metal3Data the suite did not admit (owner uid %s)", rec, rec.owner)
		case a.answered():
			switch {
			case leftBy(a, rec, warned[rec.namespace], logged):
				// Left to CAPM3 by design: the webhook's create came after CAPM3's, or failed, and
				// it said so in its log and a Warning Event (which API faults may cost), and in an
				// admission warning when it knew at once.
				capm3Warned.addf("%s", rec)
				continue
			case killedBeforeCreating(a, rec, recorder.createdByWebhook(rec.kind, rec.namespace, rec.name), replicaKilled):
				capm3Killed.addf("%s for %s", rec, a)
				continue
			case slices.Contains(a.recorded, rec.kind+"/"+rec.name):
				// The webhook's claim of that name went away before CAPM3 used it.
				history := recorder.named(rec.kind, rec.namespace, rec.name)
				capm3Up.addf("%s for %s; every claim of that name: %s", rec, a, history)
				capm3Recorded.addf("%s; every claim of that name: %s", rec, history)
				continue
			}
			capm3Up.addf("%s for %s", rec, a)
		default:
			capm3Down.addf("%s for %s", rec, a)
		}
	}
	return checkResult{
		counts: []namedCount{notReady, noOwner, terminating, orphans, leaked, double, ours, capm3Up, unanswered},
		info:   []namedCount{capm3Recorded, capm3Warned, capm3Down, capm3Killed, unansweredInfo},
	}, nil
}

// killedBeforeCreating tells whether the webhook recorded rec for a, never created a claim of
// that name (webhookCreated), and a replica was SIGKILLed between a's create and CAPM3's claim. A
// replica that lives creates the claims it recorded or says in its log that it left them to
// CAPM3; one killed after answering takes its creates in flight with it, and CAPM3 creating them
// is the design.
func killedBeforeCreating(a admission, rec claimRecord, webhookCreated bool, killed func(from, to time.Time) bool) bool {
	return slices.Contains(a.recorded, rec.kind+"/"+rec.name) && !webhookCreated && killed(a.start, rec.seen)
}

// replicaKilled tells whether a webhook replica was SIGKILLed from one moment to another.
func replicaKilled(from, to time.Time) bool {
	return cp.Replicas != nil && cp.Replicas.KilledBetween(from, to)
}

// leftBy tells whether the admission that stored the Metal3Data owning rec said it left rec to
// CAPM3: in its admission warnings, in a Warning Event about that Metal3Data (by UID), or in the
// log line of its admission token. The same claim name said of another admission, an earlier
// Metal3Data of that name say, does not count.
func leftBy(a admission, rec claimRecord, events, logged map[string]bool) bool {
	said := " " + rec.name + " left to CAPM3"
	return slices.ContainsFunc(a.warnings, func(w string) bool { return strings.Contains(w, rec.kind+said) }) ||
		events[string(a.uid)+"/"+rec.kind+"/"+rec.name] ||
		a.token != "" && logged[a.token+"/"+rec.namespace+"/"+rec.kind+"/"+rec.name]
}

// renderedProblem says what is wrong with a stored Metal3Data, or "" when it is Ready and CAPM3
// rendered the addresses of its claims, one per pool, each owned by it.
func renderedProblem(d *infrav1.Metal3Data, s *namespaceState, claims map[string]*claim) string {
	if !d.DeletionTimestamp.IsZero() {
		return "still being deleted"
	}
	if d.Status.Ready == nil || !*d.Status.Ready {
		msg := "not Ready"
		if d.Status.ErrorMessage != "" {
			msg += ": " + d.Status.ErrorMessage
		}
		return msg
	}
	var rendered map[netip.Addr]bool
	if d.Spec.Claim != nil {
		rendered = renderedIPs(s.renderedSecrets(d.Spec.Claim.Name)...)
	}
	var problems []string
	template := ""
	if d.Spec.Template != nil {
		template = d.Spec.Template.Name
	}
	for _, pool := range poolsOf(template) {
		cl, ok := claims[claimKind(pool)+"/"+d.Name+"-"+pool]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("claim of pool %s is missing", pool))
		case ownerUID(cl.obj, "Metal3Data") != d.UID:
			problems = append(problems, fmt.Sprintf("claim %s is not owned by it", cl.obj.GetName()))
		case cl.address == "":
			problems = append(problems, fmt.Sprintf("claim %s has no address", cl.obj.GetName()))
		case !rendered[parseIP(cl.address)]:
			problems = append(problems, fmt.Sprintf("address %s of claim %s is not rendered", cl.address, cl.obj.GetName()))
		}
	}
	return strings.Join(problems, "; ")
}

func parseIP(s string) netip.Addr {
	ip, _ := netip.ParseAddr(s)
	return ip
}

// settle waits for the grace period after the scenario's last activity and checks the
// invariants until all hold; they must hold by the grace period plus settleAfterGrace, or, while
// the controllers are still making progress (fewer problems at each check: a burst of a thousand
// Metal3Data keeps CAPM3 and the IPAMs busy for minutes on two cores, with the webhook as without
// it), by the time the problems stop decreasing for settleAfterGrace, at most settleMax after the
// last activity. The full run checks once more at the deadline, so that nothing the grace period
// decides (a release) comes later.
func (sc *scenario) settle(ctx context.Context) checkResult {
	sc.mu.Lock()
	last := sc.lastActivity
	sc.mu.Unlock()
	deadline := last.Add(gracePeriod + settleAfterGrace)
	sleepUntil(ctx, last.Add(gracePeriod+2*time.Second))
	var res checkResult
	fewest := int64(-1)
	for {
		var err error
		res, err = sc.check(ctx)
		if err != nil {
			sc.t.Logf("check: %v", err)
		} else if res.ok() {
			sc.figuref("invariants held %v after the last activity", time.Since(last).Round(100*time.Millisecond))
			if size.name == "full" {
				sleepUntil(ctx, deadline)
				if res, err = sc.check(ctx); err == nil {
					return res
				}
			}
			return res
		} else if n := res.problems(); fewest < 0 || n < fewest {
			if fewest >= 0 {
				deadline = maxTime(deadline, minTime(time.Now().Add(settleAfterGrace), last.Add(settleMax)))
			}
			fewest = n
		}
		if time.Now().After(deadline) {
			sc.figuref("invariants did not hold %v after the last activity", time.Since(last).Round(100*time.Millisecond))
			return res
		}
		sleepUntil(ctx, time.Now().Add(2*time.Second))
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}

// namespaceGone is how a namespace's deletion went, timed from the request.
type namespaceGone struct {
	ns        string
	took      time.Duration
	err       error
	remaining string
	// ipamOnly: not gone, and at namespaceStuck all that held it was the Metal3 IPAM's own.
	ipamOnly bool
}

// deleteNamespace deletes ns, unless the scenario did already, and tells when it is gone, or at
// namespaceStuck that it is not, with what the namespace controller said it waited for at
// namespaceDeadline. Each namespace is timed from its own deletion, whoever asked for it.
func (sc *scenario) deleteNamespace(ctx context.Context, ns string) <-chan namespaceGone {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if done, ok := sc.deletions[ns]; ok {
		return done
	}
	done := make(chan namespaceGone, 1)
	if sc.deletions == nil {
		sc.deletions = map[string]chan namespaceGone{}
	}
	sc.deletions[ns] = done
	start := time.Now()
	obj := namespace(ns)
	if err := cp.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		done <- namespaceGone{ns: ns, err: err}
		return done
	}
	go func() {
		gone := namespaceGone{ns: ns, err: waitGone(ctx, obj, namespaceDeadline)}
		if gone.err != nil {
			left, failed := namespaceLeft(ctx, ns)
			gone.remaining = namespaceConditions(ctx, ns) + describeNamespaceLeft(left, failed)
			if gone.err = waitGone(ctx, obj, namespaceStuck-time.Since(start)); gone.err != nil {
				left, failed = namespaceLeft(ctx, ns)
				gone.remaining += "; at " + namespaceStuck.String() + describeNamespaceLeft(left, failed)
				gone.ipamOnly = len(failed) == 0 && heldOnlyByIPAM(left)
			}
		}
		gone.took = time.Since(start)
		done <- gone
	}()
	return done
}

// deleteNamespaces deletes the scenario's namespaces that still exist, one after another, and
// counts those gone only after namespaceDeadline (slow) apart from those not gone within
// namespaceStuck, and of these those held only by the Metal3 IPAM's own objects (ipamStuck) apart
// from those held by anything more (stuck); for each it reports what is left. One at a time, as
// the deadline is for what ip-preallocator could hold up: deleting a namespace of a few dozen
// Metal3Data already takes CAPM3, at its 20 requests a second, a good part of it, and several at
// once add up.
func (sc *scenario) deleteNamespaces(ctx context.Context) (slow, stuck, ipamStuck namedCount) {
	slow = namedCount{name: invNamespaces, capacity: int64(len(sc.namespaces))}
	stuck = namedCount{name: invNamespacesStuck, capacity: int64(len(sc.namespaces))}
	ipamStuck = namedCount{name: invNamespacesIPAM, capacity: int64(len(sc.namespaces))}
	results := make(chan namespaceGone, len(sc.namespaces))
	for _, ns := range sc.namespaces {
		results <- <-sc.deleteNamespace(ctx, ns)
	}
	var longest time.Duration
	for range sc.namespaces {
		r := <-results
		longest = max(longest, r.took)
		switch {
		case r.err != nil && r.ipamOnly:
			ipamStuck.addf("namespace %s: %s; at %v%s", r.ns, r.err, namespaceDeadline, r.remaining)
		case r.err != nil:
			stuck.addf("namespace %s: %s; at %v%s", r.ns, r.err, namespaceDeadline, r.remaining)
		case r.took > namespaceDeadline:
			slow.addf("namespace %s: gone %v after deletion; at %v%s", r.ns, r.took.Round(100*time.Millisecond), namespaceDeadline, r.remaining)
		}
	}
	sc.figuref("%d namespaces deleted, the slowest in %v; %d gone only after %v, %d not gone in %v (%d of them held only by the Metal3 IPAM's own objects)",
		len(sc.namespaces), longest.Round(100*time.Millisecond), slow.n, namespaceDeadline, stuck.n+ipamStuck.n, namespaceStuck, ipamStuck.n)
	return slow, stuck, ipamStuck
}

// leftBehind counts, in the namespaces not gone once deleteNamespaces is done, the claims left, by
// who created them (the claim recorder, by UID): the webhook's must be none, whatever stock does.
func (sc *scenario) leftBehind(ctx context.Context) (ours, others namedCount) {
	ours, others = namedCount{name: invOursLeft}, namedCount{name: invOthersLeft}
	for _, ns := range sc.namespaces {
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: ns}, namespace(ns)); apierrors.IsNotFound(err) {
			continue
		}
		for _, gvk := range []schema.GroupVersionKind{ipamv1.GroupVersion.WithKind("IPClaim"), capipamv1.GroupVersion.WithKind("IPAddressClaim")} {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := cp.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
				sc.t.Error(err)
				continue
			}
			for i := range list.Items {
				c := &list.Items[i]
				rec := recorder.byUID(c.UID)
				what := fmt.Sprintf("%s %s/%s: finalizers %v; %s", gvk.Kind, ns, c.Name, c.Finalizers, rec.history())
				if rec.createdByWebhook() {
					ours.addf("%s", what)
				} else {
					others.addf("%s", what)
				}
			}
		}
	}
	return ours, others
}

func namespaceConditions(ctx context.Context, ns string) string {
	obj := &corev1.Namespace{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Name: ns}, obj); err != nil {
		return ""
	}
	var out []string
	for _, c := range obj.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			out = append(out, c.Message)
		}
	}
	return "; namespace controller: " + strings.Join(out, "; ")
}

// leftKinds are the kinds whose finalizers a namespace of the suite waits for.
var leftKinds = []schema.GroupVersionKind{
	infrav1.GroupVersion.WithKind("Metal3DataTemplate"),
	allocation.Metal3DataGVK,
	infrav1.GroupVersion.WithKind("Metal3DataClaim"),
	ipamv1.GroupVersion.WithKind("IPPool"),
	allocation.IPClaimGVK,
	allocation.Metal3AddressGVK,
	{Group: fixtures.CAPIPoolGroup, Version: "v1alpha2", Kind: fixtures.CAPIPoolKind},
	allocation.IPAddressClaimGVK,
	capipamv1.GroupVersion.WithKind("IPAddress"),
}

// namespaceLeft lists the objects of leftKinds a namespace still holds, by kind, and the kinds it
// could not list: the namespace controller's conditions are those of its last pass, up to about
// 8 s old, and do not say whose finalizer it waits for.
func namespaceLeft(ctx context.Context, ns string) (left map[schema.GroupKind][]metav1.PartialObjectMetadata, failed []string) {
	left = map[schema.GroupKind][]metav1.PartialObjectMetadata{}
	for _, gvk := range leftKinds {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := cp.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			failed = append(failed, fmt.Sprintf("%s: listing: %v", gvk.GroupKind(), err))
			continue
		}
		if len(list.Items) > 0 {
			left[gvk.GroupKind()] = list.Items
		}
	}
	return left, failed
}

func describeNamespaceLeft(left map[schema.GroupKind][]metav1.PartialObjectMetadata, failed []string) string {
	out := slices.Clone(failed)
	for _, gvk := range leftKinds {
		if s := describeLeft(gvk.GroupKind(), left[gvk.GroupKind()]); s != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return "; left: none of the suite's kinds"
	}
	return "; left: " + strings.Join(out, "; ")
}

// ipamOwn are the Metal3 IPAM's kinds and the finalizers it puts on them.
var ipamOwn = map[schema.GroupKind]string{
	allocation.Metal3AddressGVK.GroupKind():            ipamv1.IPAddressFinalizer,
	ipamv1.GroupVersion.WithKind("IPPool").GroupKind(): ipamv1.IPPoolFinalizer,
}

// heldOnlyByIPAM tells a namespace the Metal3 IPAM alone holds: every object left with a finalizer
// is one of its IPAddresses or IPPools carrying only its own finalizer. No claim, Metal3Data or
// anything else the webhook or CAPM3 created is left with one: the IPAM's stranded IPAddresses
// (an IPAddress outlives its claim, Known problems) keep their pool, and the pool the namespace.
func heldOnlyByIPAM(left map[schema.GroupKind][]metav1.PartialObjectMetadata) bool {
	held := false
	for kind, items := range left {
		for _, o := range items {
			for _, f := range o.Finalizers {
				if ipamOwn[kind] != f {
					return false
				}
				held = true
			}
		}
	}
	return held
}

// describeLeft counts objects by the finalizers they carry, and the claims the webhook preallocated
// that were never handed over: the webhook's share of the wait.
func describeLeft(kind schema.GroupKind, items []metav1.PartialObjectMetadata) string {
	if len(items) == 0 {
		return ""
	}
	finalizers := map[string]int{}
	deleting, notHandedOver := 0, 0
	for _, o := range items {
		for _, f := range o.Finalizers {
			finalizers[f]++
		}
		if o.DeletionTimestamp != nil {
			deleting++
		}
		if _, ok := o.Annotations[allocation.PreallocatedForAnnotation]; ok && len(o.OwnerReferences) == 0 {
			notHandedOver++
		}
	}
	s := fmt.Sprintf("%d %s (%d being deleted", len(items), kind, deleting)
	if notHandedOver > 0 {
		s += fmt.Sprintf(", %d preallocated and not handed over", notHandedOver)
	}
	for _, f := range slices.Sorted(maps.Keys(finalizers)) {
		s += fmt.Sprintf(", %d with %s", finalizers[f], f)
	}
	return s + ")"
}
