package main

import (
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// record turns what one run observed into its figures.
func (b *bench) record(ctx context.Context, run *Run, ms []*fixtures.Machine, claims claimCreated, capm3 *stack.CAPM3, events []harness.AuditEvent) error {
	ns := ms[0].DataClaim.Namespace
	warned, err := harness.ClaimsLeftToCAPM3(ctx, b.cp.Client, ns)
	if err != nil {
		return err
	}
	arrivals := capm3.Arrivals.In(ns)
	data := dataOf(arrivals)
	var lastArrival time.Time
	for i, m := range ms {
		a := data[m.DataClaim.Name]
		if a.Returned.After(lastArrival) {
			lastArrival = a.Returned
		}
		at, _ := b.ready.Ready(a.Data)
		if run.readyAt == nil {
			run.readyAt = map[types.NamespacedName]time.Time{}
		}
		run.readyAt[a.Data] = at
		run.TimeToReady = append(run.TimeToReady, at.Sub(claims[i]).Seconds())
		run.BeforeData = append(run.BeforeData, a.Returned.Sub(claims[i]).Seconds())
		st := capm3.Counter.Of(a.Data)
		run.Reconciles = append(run.Reconciles, st.Reconciles)
		run.WorkReconciles = append(run.WorkReconciles, st.WorkReconciles)
		run.Requeues += st.Requeues
		run.ClaimsByCAPM3 += st.ClaimsCreated
		for _, c := range st.CreatedClaims {
			if warned[c] {
				run.ClaimsByCAPM3Warned++
			}
		}
		if st.FirstReconcileSawWaitingClaim {
			run.FirstReconcileSawWaitingClaim++
		}
		if st.FirstReconcileSawUnansweredClaim {
			run.FirstReconcileSawUnansweredClaim++
		}
		run.Histories = append(run.Histories, st.History)
	}
	run.ArrivalSpan = lastArrival.Sub(origin(claims, -1)).Seconds()
	recordArrivals(run, arrivals)
	recordRequests(run, events, b.webhookUser())
	keys := make([]types.NamespacedName, 0, len(ms))
	for _, m := range ms {
		keys = append(keys, data[m.DataClaim.Name].Data)
	}
	recordCauses(run, keys, capm3.Counter.Of, events, b.webhookUser())
	return nil
}

func (b *bench) webhookUser() string {
	ns, _ := b.cp.ServiceAccount()
	return "system:serviceaccount:" + ns + ":"
}

// recordArrivals measures the template controller's loop: how long each Metal3Data create call
// took it (its rate limiter included), and the time between two creates of one template.
func recordArrivals(run *Run, arrivals []stack.Arrival) {
	byTemplate := map[string][]time.Time{}
	for _, a := range arrivals {
		if !a.Created {
			run.CreatesRefused++
			continue
		}
		run.CreateCall = append(run.CreateCall, a.Returned.Sub(a.Called).Seconds())
		template := a.Data.Name[:strings.LastIndex(a.Data.Name, "-")]
		byTemplate[template] = append(byTemplate[template], a.Returned)
	}
	run.ExtraMetal3Data = len(run.CreateCall) - run.N
	for _, times := range byTemplate {
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		for i := 1; i < len(times); i++ {
			run.LoopInterval = append(run.LoopInterval, times[i].Sub(times[i-1]).Seconds())
		}
	}
}

// component names the controller behind an audit event, or "" for others.
func component(e harness.AuditEvent, webhookUser string) string {
	switch {
	case strings.HasPrefix(e.UserAgent, stack.CAPM3UserAgent):
		return "capm3"
	case strings.HasPrefix(e.UserAgent, stack.IPAMUserAgent):
		return "metal3-ipam"
	case strings.HasPrefix(e.UserAgent, "cluster-api-ipam-provider-in-cluster"):
		return "in-cluster-ipam"
	case strings.HasPrefix(e.User.Username, webhookUser):
		return "webhook"
	}
	return ""
}

// recordRequests counts API requests per Metal3Data by component, watches and leader election
// left out, and takes from CAPM3's Metal3Data creates the time the API server spent on each,
// admission included.
func recordRequests(run *Run, events []harness.AuditEvent, webhookUser string) {
	run.Requests = map[string]map[string]float64{}
	for _, e := range events {
		who := component(e, webhookUser)
		if who == "" || e.Verb == "watch" || e.ObjectRef.Resource == "leases" {
			continue
		}
		resource := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			resource += "/" + e.ObjectRef.Subresource
		}
		if run.Requests[who] == nil {
			run.Requests[who] = map[string]float64{}
		}
		run.Requests[who][e.Verb+" "+resource] += 1 / float64(run.N)
		if who == "capm3" && e.Verb == "create" && resource == "metal3datas" && e.ResponseStatus.Code < 300 {
			run.CreateServer = append(run.CreateServer, e.StageTimestamp.Sub(e.RequestReceivedTimestamp.Time).Seconds())
		}
	}
	recordAdmissions(run, events, webhookUser)
}

// span is a request's time at the API server.
type span struct{ from, to time.Time }

// recordAdmissions splits each preallocating admission, as the audit log shows it, into the time
// before the webhook's first claim create reached the API server (the call to the webhook, its
// reads, its client's rate limiter), the claim creates, and the time after the last one until the
// Metal3Data was stored (the answer, the API server's own work).
func recordAdmissions(run *Run, events []harness.AuditEvent, webhookUser string) {
	creates := map[string]span{}
	claims := map[string]span{}
	for _, e := range events {
		if e.Verb != "create" || e.ResponseStatus.Code >= 300 {
			continue
		}
		switch who := component(e, webhookUser); {
		case who == "capm3" && e.ObjectRef.Resource == "metal3datas":
			creates[e.ObjectRef.Name] = span{e.RequestReceivedTimestamp.Time, e.StageTimestamp.Time}
		case who == "webhook" && (e.ObjectRef.Resource == "ipclaims" || e.ObjectRef.Resource == "ipaddressclaims"):
			data := dataOfClaim(e.ObjectRef.Name)
			c, seen := claims[data]
			if !seen || e.RequestReceivedTimestamp.Time.Before(c.from) {
				c.from = e.RequestReceivedTimestamp.Time
			}
			if e.StageTimestamp.After(c.to) {
				c.to = e.StageTimestamp.Time
			}
			claims[data] = c
		}
	}
	for data, c := range claims {
		create, ok := creates[data]
		if !ok {
			continue
		}
		run.BeforeClaims = append(run.BeforeClaims, c.from.Sub(create.from).Seconds())
		run.ClaimCreates = append(run.ClaimCreates, c.to.Sub(c.from).Seconds())
		run.AfterClaims = append(run.AfterClaims, create.to.Sub(c.to).Seconds())
	}
}

// dataOfClaim is the Metal3Data a claim is named after: <metal3data>-<pool>.
func dataOfClaim(claim string) string {
	for _, pool := range []string{fixtures.ProvisioningPool, fixtures.BaremetalPool, fixtures.ExternalPool} {
		if data, ok := strings.CutSuffix(claim, "-"+pool); ok {
			return data
		}
	}
	return ""
}

// floor is the least time CAPM3's requests of one resource type take at its client rate limit
// (a client-go limiter per resource type: status and other subresources share it), for the
// resource type that takes longest.
func floor(requests map[string]float64, n int, qps float32, burst int) (float64, string) {
	byResource := map[string]float64{}
	for req, perData := range requests {
		_, resource, _ := strings.Cut(req, " ")
		resource, _, _ = strings.Cut(resource, "/")
		byResource[resource] += perData * float64(n)
	}
	best, bound := 0.0, ""
	for resource, count := range byResource {
		if t := math.Max(0, count-float64(burst)) / float64(qps); t > best {
			best, bound = t, resource
		}
	}
	return best, bound
}

// recordAfterKill measures the Metal3Data the template controller created after the leader was
// killed: their time to Ready, from their claim's create call.
func recordAfterKill(run *Run, ms []*fixtures.Machine, claims claimCreated, capm3 *stack.CAPM3, killed time.Time) {
	data := dataOf(capm3.Arrivals.In(ms[0].DataClaim.Namespace))
	var after []float64
	for i, m := range ms {
		a := data[m.DataClaim.Name]
		if a.Returned.Before(killed) {
			continue
		}
		if at, ok := run.readyAt[a.Data]; ok {
			after = append(after, at.Sub(claims[i]).Seconds())
		}
	}
	run.AfterKillN = len(after)
	run.AfterKill = summarize(after)
}

// Reconcile causes. Each CAPM3 Metal3Data reconcile is attributed to the first write, in the
// audit log, to an object that wakes that Metal3Data (the Metal3Data itself, or one of its claims
// once it has an owner reference naming it) completed after the previous reconcile of that
// Metal3Data started and before this one started: CAPM3's work queue takes an item off the queue
// when a reconcile starts, so the first event after that start marks it for one more reconcile,
// and later ones merge into it. Failing that, to a write received before this reconcile started
// and completed after (in flight), not attributed yet. With neither, a reconcile that follows one
// that asked to be run again is a requeue; any other is left unexplained.
const (
	causeRequeue     = "requeue (RequeueAfter or an error's backoff, no write since the previous reconcile)"
	causeUnexplained = "no write seen and no requeue asked"
	causeMethod      = "Each CAPM3 reconcile of a Metal3Data is attributed to the first write to the Metal3Data, or to one of its claims once the claim's owner reference names it (from CAPM3's create in stock, from the webhook's hand-over patch when preallocated), completed (audit log) after the previous reconcile of that Metal3Data started and before this one started (failing that, to one in flight when it started); the work queue merges later writes into the reconcile the first one asked for. Without such a write, a reconcile after one that asked to be run again is a requeue. Counts are reconciles per Metal3Data, means over the repetitions."
)

// write is an audit-logged write that wakes CAPM3's Metal3Data controller for one Metal3Data.
type write struct {
	// received and at are when the API server received the request and completed it.
	received, at time.Time
	cause        string
}

// wakingWrites returns, by Metal3Data name, the writes that enqueue it in CAPM3's Metal3Data
// controller, in order of completion: writes to the Metal3Data, and writes to its claims (named
// <metal3data>-<pool>) from the one that gave them the owner reference CAPM3's watches map by:
// CAPM3's create, or the webhook's hand-over patch. Before that, a preallocated claim wakes
// nothing.
func wakingWrites(events []harness.AuditEvent, webhookUser string) map[string][]write {
	owned := map[string]bool{}
	out := map[string][]write{}
	for _, e := range events {
		switch e.Verb {
		case "create", "update", "patch", "delete":
		default:
			continue
		}
		if e.ResponseStatus.Code >= 300 {
			continue
		}
		who := component(e, webhookUser)
		if who == "" {
			who = "other"
		}
		verb := e.Verb
		if e.ObjectRef.Subresource != "" {
			verb += " " + e.ObjectRef.Subresource
		}
		var data, cause string
		switch r := e.ObjectRef.Resource; r {
		case "metal3datas":
			data, cause = e.ObjectRef.Name, "Metal3Data: "+who+" "+verb
			if who == "capm3" && e.Verb == "create" {
				cause = "Metal3Data: created (template controller)"
			}
		case "ipclaims", "ipaddressclaims":
			data = dataOfClaim(e.ObjectRef.Name)
			kind := map[string]string{"ipclaims": "IPClaim", "ipaddressclaims": "IPAddressClaim"}[r]
			cause = kind + ": " + who + " " + verb
			key := e.ObjectRef.Namespace + "/" + e.ObjectRef.Name
			switch {
			case who == "capm3" && e.Verb == "create":
				owned[key] = true
			case who == "webhook" && e.Verb == "patch":
				owned[key] = true
				cause += " (hand-over)"
			}
			if !owned[key] {
				continue
			}
		default:
			continue
		}
		if data == "" {
			continue
		}
		out[data] = append(out[data], write{received: e.RequestReceivedTimestamp.Time, at: e.StageTimestamp.Time, cause: cause})
	}
	for _, ws := range out {
		slices.SortStableFunc(ws, func(a, b write) int { return a.at.Compare(b.at) })
	}
	return out
}

// recordCauses counts the run's reconciles per Metal3Data by what woke them.
func recordCauses(run *Run, keys []types.NamespacedName, stats func(types.NamespacedName) stack.Stats, events []harness.AuditEvent, webhookUser string) {
	writes := wakingWrites(events, webhookUser)
	run.Causes = map[string]float64{}
	for _, key := range keys {
		st := stats(key)
		ws := writes[key.Name]
		used := make([]bool, len(ws))
		var prev time.Time
		for k, start := range st.Starts {
			cause := ""
			// The first write completed in the window; else one in flight at the start: its watch
			// event can reach CAPM3 before the API server logs the request complete.
			for _, inWindow := range []func(write) bool{
				func(w write) bool { return w.at.After(prev) && !w.at.After(start) },
				func(w write) bool { return !w.received.After(start) && w.at.After(start) },
			} {
				for i, w := range ws {
					if !used[i] && inWindow(w) {
						cause, used[i] = w.cause, true
						break
					}
				}
				if cause != "" {
					break
				}
			}
			if cause == "" {
				cause = causeUnexplained
				if k > 0 && k <= len(st.History) && requeued(st.History[k-1]) {
					cause = causeRequeue
				}
			}
			run.Causes[cause] += 1 / float64(run.N)
			prev = start
		}
	}
}

// requeued tells whether a letter of Stats.History is of a reconcile that asked to be run again.
func requeued(letter byte) bool { return letter == ',' || letter >= 'a' && letter <= 'z' }
