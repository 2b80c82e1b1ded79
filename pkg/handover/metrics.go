package handover

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	handOversTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_handovers_total",
		Help: "Preallocated claims handed over to their Metal3Data, by claim kind and by path (admission: by the replica that admitted the Metal3Data; takeover: by the take-over on any replica).",
	}, []string{"kind", "path"})
	claimsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_claims_total",
		Help: "Claims recorded during admission, by kind and by what their creation, which the admission answers once it is sent, came to (created, reused, foreign, failed).",
	}, []string{"kind", "outcome"})
	claimCreationSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_claim_creation_duration_seconds",
		Help:    "Time spent creating (or reclaiming) the claims of one admitted Metal3Data, from the admission until the last is stored; the admission answers once they are sent.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
	handOverSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_handover_duration_seconds",
		Help:    "Time to patch all claims of one Metal3Data once it is stored and its claims are created.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
)

func init() {
	metrics.Registry.MustRegister(handOversTotal, claimsTotal, claimCreationSeconds, handOverSeconds)
}
