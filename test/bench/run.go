package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

const (
	modeStock        = "stock"
	modePreallocated = "preallocated"
	benchUserAgent   = "ip-preallocator-bench"
)

type bench struct {
	cp     *harness.ControlPlane
	ready  *stack.Readiness
	cfg    config
	out    io.Writer
	client client.Client
	runs   int
	// backlogPause is how long the last preallocated backlog waited for its addresses.
	backlogPause time.Duration
}

// waitAllocated waits until n claims of the namespace have an address, at most cfg.pause.
func (b *bench) waitAllocated(ctx context.Context, ns string, n int) error {
	c, err := b.benchClient()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(b.cfg.pause)
	for time.Now().Before(deadline) {
		ipClaims, addrClaims := &ipamv1.IPClaimList{}, &capipamv1.IPAddressClaimList{}
		if err := c.List(ctx, ipClaims, client.InNamespace(ns)); err != nil {
			return err
		}
		if err := c.List(ctx, addrClaims, client.InNamespace(ns)); err != nil {
			return err
		}
		allocated := 0
		for _, claim := range ipClaims.Items {
			if claim.Status.Address != nil {
				allocated++
			}
		}
		for _, claim := range addrClaims.Items {
			if claim.Status.AddressRef.Name != "" {
				allocated++
			}
		}
		if allocated >= n {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return nil
}

func (b *bench) benchClient() (client.Client, error) {
	if b.client != nil {
		return b.client, nil
	}
	cfg := rest.CopyConfig(b.cp.Config)
	cfg.UserAgent, cfg.QPS, cfg.Burst = benchUserAgent, 5000, 10000
	c, err := client.New(cfg, client.Options{Scheme: fixtures.Scheme()})
	b.client = c
	return c, err
}

// world creates a namespace with a Cluster, ThreePoolTemplate's pools and n machines.
func (b *bench) world(ctx context.Context, ns string, n int) ([]*fixtures.Machine, error) {
	c, err := b.benchClient()
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, err
	}
	b.runs++
	subnet := strconv.Itoa(b.runs)
	for _, pool := range []client.Object{
		fixtures.Metal3Pool(fixtures.ProvisioningPool, "172."+subnet),
		fixtures.Metal3Pool(fixtures.BaremetalPool, "10."+subnet),
		fixtures.InClusterPool(fixtures.ExternalPool, "100."+subnet),
	} {
		pool.SetNamespace(ns)
		if err := c.Create(ctx, pool); err != nil {
			return nil, err
		}
	}
	ms := make([]*fixtures.Machine, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	// The Cluster and template first, then the machines in parallel.
	ms[0] = fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), 0).InNamespace(ns)
	if err := harness.CreateMachine(ctx, c, ms[0]); err != nil {
		return nil, err
	}
	for i := 1; i < n; i++ {
		wg.Go(func() {
			ms[i] = fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), i).InNamespace(ns)
			if err := harness.CreateMachine(ctx, c, ms[i]); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return ms, <-errs
}

// created records the client's view of one Metal3Data create.
type created struct {
	at      time.Time
	latency time.Duration
}

func (b *bench) create(ctx context.Context, m *fixtures.Machine) (created, error) {
	c, err := b.benchClient()
	if err != nil {
		return created{}, err
	}
	start := time.Now()
	err = c.Create(ctx, m.Data)
	return created{at: start, latency: time.Since(start)}, err
}

func (b *bench) createAll(ctx context.Context, ms []*fixtures.Machine) ([]created, error) {
	out := make([]created, len(ms))
	errs := make(chan error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			c, err := b.create(ctx, m)
			out[i] = c
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return out, <-errs
}

func (b *bench) waitReady(ctx context.Context, ns string, n int) error {
	deadline := time.After(b.cfg.timeout)
	for len(b.ready.ReadyIn(ns)) < n {
		select {
		case <-b.ready.News:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("%d of %d Metal3Data Ready after %v", len(b.ready.ReadyIn(ns)), n, b.cfg.timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (b *bench) runOne(ctx context.Context, s setting, sc scenario, mode string) (*Run, error) {
	n := map[string]int{"idle": b.cfg.idle, "burst": b.cfg.burst, "backlog": b.cfg.backlog}[sc.Kind]
	ns := fmt.Sprintf("%s-%s-%s", s.Name, sc.Name, mode)
	fmt.Fprintf(b.out, "%s: %d Metal3Data\n", ns, n)
	ms, err := b.world(ctx, ns, n)
	if err != nil {
		return nil, err
	}
	if mode == modeStock {
		err = b.cp.UnregisterMutatingWebhooks(ctx)
	} else {
		err = b.cp.RegisterMutatingWebhooks(ctx)
	}
	if err != nil {
		return nil, err
	}
	// Each run watches its own namespace (the controllers' --namespace), so that it does not
	// also reconcile what earlier runs left.
	ipamOpts := s.IPAM
	if sc.IPAM != nil {
		ipamOpts = *sc.IPAM
	}
	ipamOpts.Namespace = ns
	capm3Opts := s.CAPM3
	capm3Opts.Namespace = ns
	ipam, err := stack.StartIPAM(ctx, b.cp.Config, ipamOpts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := ipam.Stop(); err != nil {
			fmt.Fprintf(b.out, "  stopping the IPAM: %v\n", err)
		}
	}()
	var capm3 *stack.CAPM3
	startCAPM3 := func() error {
		capm3, err = stack.StartCAPM3(ctx, b.cp.Config, capm3Opts)
		return err
	}
	if sc.Kind != "backlog" {
		if err := startCAPM3(); err != nil {
			return nil, err
		}
	}
	// The managers' caches sync before they act; leave them that time outside the measurement.
	time.Sleep(time.Second)

	offset, err := b.cp.AuditOffset()
	if err != nil {
		return nil, err
	}
	run := &Run{Setting: s.Name, Scenario: sc.Name, Mode: mode, N: n}
	start := time.Now()
	var creates []created
	switch sc.Kind {
	case "idle":
		for _, m := range ms {
			c, err := b.create(ctx, m)
			if err != nil {
				return nil, err
			}
			creates = append(creates, c)
			if err := b.waitReady(ctx, ns, len(creates)); err != nil {
				return nil, err
			}
		}
	case "burst":
		if creates, err = b.createAll(ctx, ms); err != nil {
			return nil, err
		}
	case "backlog":
		if creates, err = b.createAll(ctx, ms); err != nil {
			return nil, err
		}
		// CAPM3 comes back once the IPAMs have fulfilled every preallocated claim (at most
		// --backlog-pause); stock, which has no claims yet, waits as long.
		if mode == modePreallocated {
			if err := b.waitAllocated(ctx, ns, 3*n); err != nil {
				return nil, err
			}
			b.backlogPause = time.Since(start)
		}
		time.Sleep(time.Until(start.Add(b.backlogPause)))
		run.CAPM3Started = time.Since(start).Seconds()
		if err := startCAPM3(); err != nil {
			return nil, err
		}
	}
	if err := b.waitReady(ctx, ns, n); err != nil {
		return nil, err
	}
	run.Total = time.Since(start).Seconds()
	// Let the reconciles that follow Ready happen, so that they are counted.
	time.Sleep(2 * time.Second)
	if err := capm3.Stop(); err != nil {
		fmt.Fprintf(b.out, "  stopping CAPM3: %v\n", err)
	}
	events, err := b.cp.AuditSince(offset)
	if err != nil {
		return nil, err
	}
	b.record(run, ms, creates, capm3.Counter, events)
	return run, nil
}

func (b *bench) record(run *Run, ms []*fixtures.Machine, creates []created, counter *stack.Counter, events []harness.AuditEvent) {
	var toReady, createLatency []float64
	for i, m := range ms {
		key := client.ObjectKeyFromObject(m.Data)
		at, _ := b.ready.Ready(key)
		toReady = append(toReady, at.Sub(creates[i].at).Seconds())
		createLatency = append(createLatency, creates[i].latency.Seconds())
		st := counter.Of(key)
		run.Reconciles = append(run.Reconciles, st.Reconciles)
		run.WorkReconciles = append(run.WorkReconciles, st.WorkReconciles)
		run.Requeues += st.Requeues
		run.ClaimsByCAPM3 += st.ClaimsCreated
		if st.FirstReconcileSawWaitingClaim {
			run.FirstReconcileSawWaitingClaim++
		}
		run.Histories = append(run.Histories, st.History)
	}
	run.TimeToReady = toReady
	run.CreateLatency = createLatency
	run.Requests = map[string]map[string]float64{}
	ns, _ := b.cp.ServiceAccount()
	webhookUser := "system:serviceaccount:" + ns + ":"
	for _, e := range events {
		var who string
		switch {
		case strings.HasPrefix(e.UserAgent, stack.CAPM3UserAgent):
			who = "capm3"
		case strings.HasPrefix(e.UserAgent, stack.IPAMUserAgent):
			who = "metal3-ipam"
		case strings.HasPrefix(e.UserAgent, "cluster-api-ipam-provider-in-cluster"):
			who = "in-cluster-ipam"
		case strings.HasPrefix(e.User.Username, webhookUser):
			who = "webhook"
		default:
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
	}
}

// webhookFootprint reads the webhook process's peak resident memory and its cache sizes.
func (b *bench) webhookFootprint() (*Footprint, error) {
	f := &Footprint{CachedObjects: map[string]float64{}}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", b.cp.WebhookPid()))
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			f.PeakRSSMiB = float64(kb) / 1024
		}
	}
	metrics, err := b.cp.Metrics()
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, `ip_preallocator_cached_objects{kind="`)
		if !ok {
			continue
		}
		kind, value, _ := strings.Cut(rest, `"} `)
		f.CachedObjects[kind], _ = strconv.ParseFloat(value, 64)
	}
	return f, nil
}

// admissionLatency creates Metal3Data one after another with only a no-op mutating webhook
// registered, then with only ip-preallocator's, and compares the create latencies.
func (b *bench) admissionLatency(ctx context.Context) (*Admission, error) {
	n := b.cfg.idle
	measure := func(name string) ([]float64, error) {
		ms, err := b.world(ctx, "admission-"+name, n)
		if err != nil {
			return nil, err
		}
		var out []float64
		for _, m := range ms {
			c, err := b.create(ctx, m)
			if err != nil {
				return nil, err
			}
			out = append(out, c.latency.Seconds())
		}
		return out, nil
	}
	if err := b.cp.UnregisterMutatingWebhooks(ctx); err != nil {
		return nil, err
	}
	unregister, err := b.cp.RegisterNoOpWebhook(ctx)
	if err != nil {
		return nil, err
	}
	noop, err := measure("noop")
	if err != nil {
		return nil, err
	}
	if err := unregister(ctx); err != nil {
		return nil, err
	}
	if err := b.cp.RegisterMutatingWebhooks(ctx); err != nil {
		return nil, err
	}
	ours, err := measure("preallocated")
	if err != nil {
		return nil, err
	}
	a := &Admission{NoOp: summarize(noop), Preallocator: summarize(ours)}
	a.RatioP50 = a.Preallocator.P50 / a.NoOp.P50
	a.RatioP99 = a.Preallocator.P99 / a.NoOp.P99
	return a, nil
}
