package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/component-base/logs"
	logsv1 "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/flags"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
	"github.com/metal3-community/ip-preallocator/pkg/mutate"
)

// options are the webhook's flags.
type options struct {
	manager          flags.ManagerOptions
	webhookHost      string
	webhookPort      int
	certDir          string
	healthAddr       string
	enableHTTP2      bool
	logs             *logs.Options
	leaderElect      bool
	leaderElectionNS string
	leaseDuration    time.Duration
	renewDeadline    time.Duration
	retryPeriod      time.Duration
	bmhNameBased     bool
	capm3Version     string
	admissionTimeout time.Duration
	releaseGrace     time.Duration
	releaseHold      time.Duration
	handOverDelay    time.Duration
	ipamWait         time.Duration
	requesters       []string
	namespace        string
	watchFilter      string
	qps              float32
	burst            int
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	o.logs = logs.NewOptions()
	logsv1.AddFlags(o.logs, fs)
	flags.AddManagerOptions(fs, &o.manager)
	fs.StringVar(&o.webhookHost, "webhook-host", "", "Address the webhook server binds to; empty for all.")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "Port the webhook server listens on.")
	fs.StringVar(&o.certDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs",
		"Directory holding tls.crt and tls.key; they are reloaded when they change.")
	fs.StringVar(&o.healthAddr, "health-addr", ":9440", "Address the readiness and liveness probes bind to.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false,
		"Serve HTTP/2 on the webhook and metrics servers (off because of CVE-2023-44487 and CVE-2023-39325).")
	fs.BoolVar(&o.leaderElect, "leader-elect", false,
		"Elect a leader among replicas for the controllers; the webhook is served by every replica.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", clock.Lease,
		"How long a non-leader waits before it forces a stale lease.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", clock.RenewDeadline,
		"How long the leader retries renewing its lease before it gives up.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", clock.RetryPeriod,
		"How long candidates wait between attempts to acquire or renew the lease.")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "",
		"Namespace of the leader election lease; defaults to the pod's namespace.")
	fs.BoolVar(&o.bmhNameBased, "enable-bmh-name-based-preallocation", false,
		"Name IPClaims <baremetalhost>-<pool> like CAPM3 with the same flag; set it exactly as CAPM3's.")
	fs.StringVar(&o.capm3Version, "capm3-version", "",
		"CAPM3's version where no clusterctl Provider or labelled Deployment tells it; empty to find it.")
	fs.DurationVar(&o.admissionTimeout, "admission-timeout", clock.AdmissionTimeout,
		"How long one admission may take from the request's start; the API server's timeout for the call bounds it too.")
	fs.DurationVar(&o.releaseGrace, "release-grace-period", clock.ReleaseGrace,
		"How long a preallocated claim waits for its Metal3Data to be stored before it is released.")
	fs.DurationVar(&o.releaseHold, "release-hold-limit", clock.ReleaseHold,
		"How long past the grace period a claim is held (unanswered, its Metal3DataClaim waiting, its pool busy),\n"+
			"and a deleted waiting claim keeps CAPM3's finalizer while its pool is busy.")
	fs.DurationVar(&o.ipamWait, "handover-ipam-wait", clock.IPAMWait,
		"While the IPAM is behind, how long after the admission a hand-over (or take-over) waits for the IPAM\n"+
			"to answer every claim of the stored Metal3Data; 0 hands over at once.")
	fs.DurationVar(&o.handOverDelay, "handover-takeover-delay", clock.TakeOverDelay,
		"How long every replica leaves a stored Metal3Data's claims to the replica that admitted it before it hands them over itself.")
	fs.StringVar(&o.namespace, "namespace", "",
		"The one namespace to serve, as CAPM3's flag of the same name; empty for all.")
	fs.StringVar(&o.watchFilter, "watch-filter", "",
		"Serve only Metal3Data labelled "+clusterv1.WatchLabel+" with this value, as CAPM3's flag of the same name; empty for all.")
	fs.StringSliceVar(&o.requesters, "preallocate-for-requesters", nil,
		"Users whose Metal3Data creates get claims preallocated, e.g. the service account CAPM3 runs as; empty for everyone (transparent).")
	fs.Float32Var(&o.qps, "kube-api-qps", clock.APIQPS, "Requests per second to the API server, per resource type.")
	fs.IntVar(&o.burst, "kube-api-burst", clock.APIBurst, "Burst of requests to the API server, per resource type.")
}

// checkFlags refuses flag values the webhook cannot work with. An IPAM wait above the grace period
// works: the take-over waits for the same answers.
func (o *options) checkFlags() error {
	if o.ipamWait < 0 {
		return fmt.Errorf("--handover-ipam-wait (%s) must not be negative", o.ipamWait)
	}
	return nil
}

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;list

// refuseSecondInstall fails when another install's preallocating webhook, registered before this
// install's, calls a service outside this pod's namespace: the webhooks of both would preallocate
// every Metal3Data, each in turn. The install first registered keeps running.
func refuseSecondInstall(ctx context.Context, r client.Reader, namespace string) error {
	if namespace == "" {
		return nil
	}
	configs := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	if err := r.List(ctx, configs); err != nil {
		return fmt.Errorf("listing MutatingWebhookConfigurations to find another install: %w", err)
	}
	// The first registered of this install's configurations, and of the others'.
	var ours, other *admissionregistrationv1.MutatingWebhookConfiguration
	otherNamespace := ""
	for i := range configs.Items {
		c := &configs.Items[i]
		for _, w := range c.Webhooks {
			if w.Name != mutate.WebhookName || w.ClientConfig.Service == nil {
				continue
			}
			switch ns := w.ClientConfig.Service.Namespace; {
			case ns == namespace:
				ours = earlier(ours, c)
			case earlier(other, c) == c:
				other, otherNamespace = c, ns
			}
		}
	}
	if other == nil || ours != nil && earlier(ours, other) == ours {
		return nil
	}
	return fmt.Errorf("another ip-preallocator install serves this cluster: MutatingWebhookConfiguration %s, registered first, calls its webhook in namespace %s; "+
		"with two, both webhooks would preallocate every Metal3Data: uninstall this one (namespace %s) or that one",
		klog.KObj(other), otherNamespace, namespace)
}

// earlier is the configuration registered first, by name within a second; b when there is no a.
func earlier(a, b *admissionregistrationv1.MutatingWebhookConfiguration) *admissionregistrationv1.MutatingWebhookConfiguration {
	if a == nil || b.CreationTimestamp.Before(&a.CreationTimestamp) || b.CreationTimestamp.Equal(&a.CreationTimestamp) && b.Name < a.Name {
		return b
	}
	return a
}
