package mutate

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	admissionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_admissions_total",
		Help: "Metal3Data CREATE admissions by outcome (preallocated, partial, failed, skipped) and skip reason.",
	}, []string{"outcome", "reason"})
	claimsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ip_preallocator_claims_total",
		Help: "Claims planned during admission by kind and outcome (created, reused, foreign, failed).",
	}, []string{"kind", "outcome"})
	claimCreationSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ip_preallocator_claim_creation_duration_seconds",
		Help:    "Time spent creating the claims of one Metal3Data during admission.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
)

func init() {
	metrics.Registry.MustRegister(admissionsTotal, claimsTotal, claimCreationSeconds)
}
