package main

import (
	"context"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
)

const (
	mutatingWebhookName = "preallocate.metal3data.ip-preallocator.metal3.io"
	mutatingWebhookPath = "/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate"
)

// histogram is the sum and count of the series of a Prometheus histogram that match.
type histogram struct{ sum, count float64 }

func (h histogram) minus(o histogram) histogram { return histogram{h.sum - o.sum, h.count - o.count} }

func (h histogram) mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / h.count
}

// scrape adds up the _sum and _count series of metric whose labels contain every one of labels.
func scrape(text, metric string, labels ...string) histogram {
	return histogram{counter(text, metric+"_sum", labels...), counter(text, metric+"_count", labels...)}
}

// counter adds up the series of metric whose labels contain every one of labels.
func counter(text, metric string, labels ...string) float64 {
	var total float64
	for _, line := range strings.Split(text, "\n") {
		i := strings.LastIndex(line, " ")
		if i < 0 {
			continue
		}
		name, series, _ := strings.Cut(line[:i], "{")
		if name != metric || !containsAll(series, labels) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64); err == nil {
			total += v
		}
	}
	return total
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// admissionClocks are three views of the mutating webhook's time: the API server's, from the
// moment it calls the webhook to the answer (transport included), the webhook handler's own, and
// the part of it the handler spent creating claims (its client's rate limiter included); and the
// admissions it left to CAPM3 because CAPM3's client limits are raised.
type admissionClocks struct {
	apiserver, handler, claims histogram
	limitsRaised               float64
}

func (a admissionClocks) minus(o admissionClocks) admissionClocks {
	return admissionClocks{a.apiserver.minus(o.apiserver), a.handler.minus(o.handler), a.claims.minus(o.claims), a.limitsRaised - o.limitsRaised}
}

func (b *bench) admissionClocks(ctx context.Context) (admissionClocks, error) {
	cs, err := kubernetes.NewForConfig(b.cp.Config)
	if err != nil {
		return admissionClocks{}, err
	}
	raw, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return admissionClocks{}, err
	}
	// The replicas' counters start again when one is killed: their handler's view is left out.
	// Stock runs without the single process.
	var webhook string
	if b.replicas == nil && b.serving != "" {
		if webhook, err = b.cp.Metrics(); err != nil {
			return admissionClocks{}, err
		}
	}
	return admissionClocks{
		apiserver: scrape(string(raw), "apiserver_admission_webhook_admission_duration_seconds",
			`name="`+mutatingWebhookName+`"`, `operation="CREATE"`, `type="admit"`),
		handler:      scrape(webhook, "controller_runtime_webhook_latency_seconds", `webhook="`+mutatingWebhookPath+`"`),
		claims:       scrape(webhook, "ip_preallocator_claim_creation_duration_seconds"),
		limitsRaised: counter(webhook, "ip_preallocator_admissions_total", `outcome="skipped"`, `reason="CAPM3LimitsRaised"`),
	}, nil
}
