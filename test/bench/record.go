package main

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// record turns what one run observed into its figures.
func (b *bench) record(run *Run, ms []*fixtures.Machine, claims claimCreated, capm3 *stack.CAPM3, events []harness.AuditEvent) {
	ns := ms[0].DataClaim.Namespace
	arrivals := capm3.Arrivals.In(ns)
	data := dataOf(arrivals)
	var lastArrival time.Time
	for i, m := range ms {
		a := data[m.DataClaim.Name]
		if a.Returned.After(lastArrival) {
			lastArrival = a.Returned
		}
		at, _ := b.ready.Ready(a.Data)
		run.TimeToReady = append(run.TimeToReady, at.Sub(claims[i]).Seconds())
		run.BeforeData = append(run.BeforeData, a.Returned.Sub(claims[i]).Seconds())
		st := capm3.Counter.Of(a.Data)
		run.Reconciles = append(run.Reconciles, st.Reconciles)
		run.WorkReconciles = append(run.WorkReconciles, st.WorkReconciles)
		run.Requeues += st.Requeues
		run.ClaimsByCAPM3 += st.ClaimsCreated
		if st.FirstReconcileSawWaitingClaim {
			run.FirstReconcileSawWaitingClaim++
		}
		run.Histories = append(run.Histories, st.History)
	}
	run.ArrivalSpan = lastArrival.Sub(origin(claims, -1)).Seconds()
	recordArrivals(run, arrivals)
	recordRequests(run, events, b.webhookUser())
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
