package mutate

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var admissionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ip_preallocator_admissions_total",
	Help: "Metal3Data CREATE admissions by outcome (preallocated, partial, failed, skipped) and skip reason.",
}, []string{"outcome", "reason"})

func init() {
	metrics.Registry.MustRegister(admissionsTotal)
}
