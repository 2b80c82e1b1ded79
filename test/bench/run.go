package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

const (
	modeStock        = "stock"
	modePreallocated = "preallocated"
	// modeNoOp registers the webhook, whose process admits every Metal3Data unchanged.
	modeNoOp       = "no-op-webhook"
	benchUserAgent = "ip-preallocator-bench"
)

type bench struct {
	cp *harness.ControlPlane
	// replicas, while the leader-loss scenario runs, are the webhook's two replicas in place of
	// the single process; stopSupervising ends their supervision.
	replicas        *harness.Replicas
	stopSupervising context.CancelFunc
	ready           *stack.Readiness
	cfg             config
	out             io.Writer
	load            *loadSampler
	client          client.Client
	runs            int
	// serving is the mode the single webhook process serves (see serveAs); empty when it is
	// stopped.
	serving string
	// footprint is the webhook's, as far as read (see readFootprint).
	footprint *Footprint
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

// world creates a namespace with a Cluster, ThreePoolTemplate's pools, the templates and n
// machines without their Metal3DataClaims; machine i uses template i mod templates.
func (b *bench) world(ctx context.Context, ns string, n, templates int) ([]*fixtures.Machine, error) {
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
	for i := range ms {
		ms[i] = fixtures.NewMachine(fixtures.ThreePoolTemplate(fmt.Sprintf("workers-%d", i%templates)), i).InNamespace(ns)
	}
	// The Cluster and each template once (every template create is validated by the webhook,
	// which reads the pools live), shared by the machines that use them; then every machine.
	for i, m := range ms {
		if i < templates {
			if err := harness.CreateShared(ctx, c, m); err != nil {
				return nil, err
			}
			continue
		}
		m.Cluster, m.Template = ms[0].Cluster, ms[i%templates].Template
	}
	return ms, parallel(ms, func(m *fixtures.Machine) error { return harness.CreateMachineObjects(ctx, c, m) })
}

// parallel calls f for every machine at once and returns the first error.
func parallel(ms []*fixtures.Machine, f func(*fixtures.Machine) error) error {
	errs := make(chan error, len(ms))
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() {
			if err := f(m); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// claimCreated is when the Metal3DataClaim of a machine was sent, by the machine's index.
type claimCreated map[int]time.Time

func (b *bench) createClaim(ctx context.Context, m *fixtures.Machine) (time.Time, error) {
	c, err := b.benchClient()
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	return at, harness.CreateDataClaim(ctx, c, m)
}

func (b *bench) createClaims(ctx context.Context, ms []*fixtures.Machine, at claimCreated) error {
	var mu sync.Mutex
	index := map[*fixtures.Machine]int{}
	for i, m := range ms {
		index[m] = i
	}
	return parallel(ms, func(m *fixtures.Machine) error {
		t, err := b.createClaim(ctx, m)
		mu.Lock()
		at[index[m]] = t
		mu.Unlock()
		return err
	})
}

// createClaimsAt creates the claims one after another, perSecond of them a second, as CAPM3's
// Metal3Machine controller does while a MachineDeployment's machines come up one by one. A create
// that takes longer delays the next, as it would in the controller.
func (b *bench) createClaimsAt(ctx context.Context, ms []*fixtures.Machine, at claimCreated, perSecond float64) error {
	tick := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
	defer tick.Stop()
	for i, m := range ms {
		t, err := b.createClaim(ctx, m)
		if err != nil {
			return err
		}
		at[i] = t
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// countClaims counts the IP claims of both groups in namespace ns.
func (b *bench) countClaims(ctx context.Context, ns string) (int, error) {
	ipClaims, addressClaims := &ipamv1.IPClaimList{}, &capipamv1.IPAddressClaimList{}
	if err := b.cp.Client.List(ctx, ipClaims, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("counting the IPClaims of %s: %w", ns, err)
	}
	if err := b.cp.Client.List(ctx, addressClaims, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("counting the IPAddressClaims of %s: %w", ns, err)
	}
	return len(ipClaims.Items) + len(addressClaims.Items), nil
}

// dataOf maps each claim to the Metal3Data the template controller created for it last (the one
// the claim's status.renderedData names, unless CAPM3 created one more since).
func dataOf(arrivals []stack.Arrival) map[string]stack.Arrival {
	out := map[string]stack.Arrival{}
	for _, a := range arrivals {
		if a.Created {
			out[a.Claim] = a
		}
	}
	return out
}

// waitReady waits until the Metal3Data of every machine exists and is Ready.
func (b *bench) waitReady(ctx context.Context, capm3 *stack.CAPM3, ms []*fixtures.Machine) error {
	deadline := time.After(b.cfg.timeout)
	for {
		pending := b.notReady(capm3, ms)
		if pending == 0 {
			return nil
		}
		select {
		case <-b.ready.News:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("%d of %d machines without a Ready Metal3Data after %v", pending, len(ms), b.cfg.timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *bench) notReady(capm3 *stack.CAPM3, ms []*fixtures.Machine) int {
	if len(ms) == 0 {
		return 0
	}
	data := dataOf(capm3.Arrivals.In(ms[0].DataClaim.Namespace))
	pending := 0
	for _, m := range ms {
		a, ok := data[m.DataClaim.Name]
		if !ok {
			pending++
			continue
		}
		if _, ok := b.ready.Ready(a.Data); !ok {
			pending++
		}
	}
	return pending
}

// declareLimits declares in CAPM3's Deployment the client limits CAPM3 runs with in this setting,
// where the webhook reads them, and waits until every webhook process running has read them.
func (b *bench) declareLimits(ctx context.Context, s setting) error {
	var args []string
	raised := s.limitsRaised()
	if raised {
		args = []string{fmt.Sprintf("--kube-api-qps=%g", s.CAPM3.QPS), fmt.Sprintf("--kube-api-burst=%d", s.CAPM3.Burst)}
	}
	if err := b.cp.SetCAPM3Args(ctx, args...); err != nil {
		return err
	}
	want := "ip_preallocator_capm3_limits_raised 0\n"
	if raised {
		want = "ip_preallocator_capm3_limits_raised 1\n"
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, read := range b.webhookMetrics() {
			metrics, err := read()
			if err == nil && !strings.Contains(metrics, want) {
				err = fmt.Errorf("the webhook does not report %q yet", strings.TrimSpace(want))
			}
			if last = err; err != nil {
				return false, nil //nolint:nilerr // polled again; the last error is told on timeout
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("CAPM3's client limits declared: %w (%v)", err, last)
	}
	return nil
}

// webhookMetrics reads the metrics of each webhook process running.
func (b *bench) webhookMetrics() []func() (string, error) {
	if b.replicas != nil {
		var reads []func() (string, error)
		for i := range b.replicas.Len() {
			if b.replicas.Running(i) {
				reads = append(reads, func() (string, error) { return b.replicas.Metrics(i) })
			}
		}
		return reads
	}
	if b.serving != "" {
		return []func() (string, error){b.cp.Metrics}
	}
	return nil
}

// setWebhook registers ip-preallocator's mutating webhook for the modes that call it and deletes
// it for stock: the API server then does not call the webhook at all. The process keeps running
// (serveAs), so that every mode meets the machine in the same state; what its informers cost the
// machine in stock too is in the CPU table (the webhook's column) and docs/benchmarks.md.
func (b *bench) setWebhook(ctx context.Context, mode string) error {
	if mode == modeStock {
		return b.cp.UnregisterMutatingWebhooks(ctx)
	}
	return b.cp.RegisterMutatingWebhooks(ctx)
}

// serveAs makes the single webhook process fit the mode of the next run: it is restarted so that
// it preallocates for nobody before a no-op run, and with its defaults before a preallocated run
// that follows one; stock keeps whichever runs. The no-op process answers every admission without
// reading or creating anything, through the same server, certificate and registration as when it
// preallocates. The leader-loss replicas run with the defaults and are started separately.
func (b *bench) serveAs(ctx context.Context, mode string) error {
	if b.replicas != nil || mode == modeStock || mode == b.serving {
		return nil
	}
	if err := b.stopWebhook(); err != nil {
		return err
	}
	args := singleWebhook
	if mode == modeNoOp {
		args = append(slices.Clone(singleWebhook), "--preallocate-for-requesters=system:serviceaccount:nobody:nobody")
	}
	if err := b.cp.StartWebhook(ctx, args...); err != nil {
		return err
	}
	b.serving = mode
	return nil
}

// stopWebhook stops the single webhook process, once its footprint is read if it preallocated.
func (b *bench) stopWebhook() error {
	if b.serving == modePreallocated {
		if err := b.readFootprint(); err != nil {
			return err
		}
	}
	b.cp.StopWebhook()
	b.serving = ""
	return nil
}

// singleWebhook are the flags of the single webhook process: no leader election (see run).
var singleWebhook = []string{"--leader-elect=false"}

// startReplicas replaces the single webhook process by two replicas under leader election behind
// a load balancer on the address the webhook configuration names, as a Deployment of two runs
// them; a replica that exits on its own (a lost lease) is restarted after a second, as the
// kubelet would.
func (b *bench) startReplicas(ctx context.Context) error {
	if err := b.stopWebhook(); err != nil {
		return err
	}
	rs, err := b.cp.StartReplicas(ctx, 2)
	if err != nil {
		return err
	}
	supervise, cancel := context.WithCancel(ctx)
	rs.Supervise(supervise, time.Second)
	b.replicas, b.stopSupervising = rs, cancel
	return nil
}

func (b *bench) stopReplicas() {
	if b.replicas == nil {
		return
	}
	b.stopSupervising()
	b.replicas.Stop()
	b.replicas = nil
}

// replicasSettled restarts a replica that is down, waits until both are ready and one leads.
func (b *bench) replicasSettled(ctx context.Context) error {
	rs := b.replicas
	for i := range rs.Len() {
		if !rs.Running(i) {
			if err := rs.Restart(i); err != nil {
				return err
			}
		}
	}
	for i := range rs.Len() {
		if err := rs.WaitReady(ctx, i, 90*time.Second); err != nil {
			return err
		}
	}
	// After a SIGKILL the lease is taken over once it expires (15 s).
	for deadline := time.Now().Add(60 * time.Second); ; {
		if _, ok := rs.Leader(); ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("no webhook replica leads after 60 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// killLeader waits until half of the run's Metal3Data exist, then kills the leading replica
// (SIGKILL) and starts it again half a second later. It returns when
// the kill was, and whether a leader was found to kill (after 5 s without one, none is killed).
func (b *bench) killLeader(ctx context.Context, capm3 *stack.CAPM3, ns string, n int) (time.Time, bool, error) {
	for {
		created := 0
		for _, a := range capm3.Arrivals.In(ns) {
			if a.Created {
				created++
			}
		}
		if 2*created >= n {
			break
		}
		select {
		case <-ctx.Done():
			return time.Time{}, false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	rs := b.replicas
	leader, ok := rs.Leader()
	for wait := time.Now().Add(5 * time.Second); !ok && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond)
		leader, ok = rs.Leader()
	}
	if !ok {
		return time.Now(), false, nil
	}
	rs.Kill(leader)
	killed := time.Now()
	time.Sleep(500 * time.Millisecond)
	return killed, true, rs.Restart(leader)
}

// controllers starts the run's IPAM and CAPM3, each watching only the run's namespace (their
// --namespace), so that they do not also reconcile what earlier runs left.
func (b *bench) controllers(ctx context.Context, s setting, sc scenario, ns string) (*stack.Running, *stack.CAPM3, error) {
	ipamOpts := s.IPAM
	if sc.IPAM != nil {
		ipamOpts = *sc.IPAM
	}
	ipamOpts.Namespaces = []string{ns}
	capm3Opts := s.CAPM3
	capm3Opts.Namespaces, capm3Opts.Templates, capm3Opts.HoldMetal3Data = []string{ns}, true, sc.Kind == "backlog"
	ipam, err := stack.StartIPAM(ctx, b.cp.Config, ipamOpts)
	if err != nil {
		return nil, nil, err
	}
	capm3, err := stack.StartCAPM3(ctx, b.cp.Config, capm3Opts)
	if err != nil {
		_ = ipam.Stop()
		return nil, nil, err
	}
	if err := capm3.WarmUp(ctx); err != nil {
		_ = ipam.Stop()
		_ = capm3.Stop()
		return nil, nil, err
	}
	return ipam, capm3, nil
}

// runNamespace is the namespace of one run.
func runNamespace(s setting, sc scenario, mode string, repeat int) string {
	return fmt.Sprintf("%s-%s-%s-%d", s.Name, sc.Name, mode, repeat)
}

func (b *bench) runOne(ctx context.Context, s setting, sc scenario, mode string, repeat int) (*Run, error) {
	n := map[string]int{"idle": b.cfg.idle, "burst": b.cfg.burst, "backlog": b.cfg.backlog, "slow": b.cfg.slow}[sc.Kind]
	if sc.Kind == "burst" && s.limitsRaised() {
		n = b.cfg.raisedBurst
	}
	templates := 1
	if sc.Spread {
		templates = b.cfg.templates
	}
	if sc.LeaderLoss {
		n = b.cfg.leaderLoss
		if err := b.replicasSettled(ctx); err != nil {
			return nil, err
		}
	}
	ns := runNamespace(s, sc, mode, repeat)
	fmt.Fprintf(b.out, "%s: %d machines, %d template(s)\n", ns, n, templates)
	ms, err := b.world(ctx, ns, n, templates)
	if err != nil {
		return nil, err
	}
	if err := b.declareLimits(ctx, s); err != nil {
		return nil, err
	}
	if err := b.setWebhook(ctx, mode); err != nil {
		return nil, err
	}
	ipam, capm3, err := b.controllers(ctx, s, sc, ns)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := ipam.Stop(); err != nil {
			fmt.Fprintf(b.out, "  stopping the IPAM: %v\n", err)
		}
	}()
	// The IPAM's caches sync before it acts, and the API server applies the webhook
	// configuration from its own informer: leave them that time outside the measurement.
	time.Sleep(time.Second)
	if err := b.warmUp(ctx, ns, templates); err != nil {
		return nil, err
	}

	offset, err := b.cp.AuditOffset()
	if err != nil {
		return nil, err
	}
	clocks, err := b.admissionClocks(ctx)
	if err != nil {
		return nil, err
	}
	run := &Run{Setting: s.Name, Scenario: sc.Name, Mode: mode, Repeat: repeat, N: n, Templates: templates}
	loadFrom := time.Now()
	cpuFrom, err := readCPU()
	if err != nil {
		return nil, err
	}
	stopProfile, profiled := make(chan struct{}), make(chan error, 1)
	var stopOnce sync.Once
	defer stopOnce.Do(func() { close(stopProfile) })
	if slices.Contains(b.cfg.profiled, s.Name+"/"+sc.Name) {
		go func() {
			profiled <- b.profileRun(ctx, run, stopProfile, filepath.Join(b.cp.Dir, ns+".apiserver.pprof"))
		}()
	} else {
		profiled <- nil
	}
	claims, released, err := b.drive(ctx, sc, capm3, ms, run)
	if err != nil {
		return nil, err
	}
	var killed time.Time
	if sc.LeaderLoss {
		if killed, run.LeaderKilled, err = b.killLeader(ctx, capm3, ns, n); err != nil {
			return nil, err
		}
		run.KilledAt = killed.Sub(origin(claims, -1)).Seconds()
	}
	if err := b.waitReady(ctx, capm3, ms); err != nil {
		return nil, err
	}
	run.Total = time.Since(origin(claims, -1)).Seconds()
	cpuTo, err := readCPU()
	if err != nil {
		return nil, err
	}
	run.CPU, run.CPUWindow = cpuTo.minus(cpuFrom), time.Since(loadFrom).Seconds()
	stopOnce.Do(func() { close(stopProfile) })
	if err := <-profiled; err != nil {
		return nil, err
	}
	if !released.IsZero() {
		run.Released = released.Sub(origin(claims, -1)).Seconds()
	}
	if err := b.checkRendered(ctx, capm3, ns); err != nil {
		return nil, err
	}
	if run.Claims, err = b.countClaims(ctx, ns); err != nil {
		return nil, err
	}
	// Let the reconciles that follow Ready happen, so that they are counted.
	time.Sleep(2 * time.Second)
	if err := capm3.Stop(); err != nil {
		fmt.Fprintf(b.out, "  stopping CAPM3: %v\n", err)
	}
	events, err := b.cp.AuditSince(offset)
	if err != nil {
		return nil, err
	}
	if writes := fleetWrites(events); writes > 0 {
		return nil, fmt.Errorf("%s: the IPAMs wrote %d times to the standing fleet during the run, which then measured their catching up", ns, writes)
	}
	after, err := b.admissionClocks(ctx)
	if err != nil {
		return nil, err
	}
	spent := after.minus(clocks)
	run.WebhookCalls, run.WebhookCall, run.WebhookHandler = int(spent.apiserver.count), spent.apiserver.mean(), spent.handler.mean()
	run.WebhookClaimCreation = spent.claims.mean()
	run.LeftForLimits = int(spent.limitsRaised)
	run.Load = b.load.meanSince(loadFrom)
	if err := b.record(ctx, run, ms, claims, capm3, events); err != nil {
		return nil, err
	}
	if sc.LeaderLoss {
		recordAfterKill(run, ms, claims, capm3, killed)
	}
	return run, nil
}

// warmUpRounds is how many times warmUp sends its dry-run creates.
const warmUpRounds = 3

// warmUp sends the webhook as many dry-run Metal3Data creates at once as the run has templates
// (CAPM3's template loops admit that many at once), a few times. A webhook in a cluster runs for
// days: the API server's first connections to a process restarted for this run (serveAs, TLS
// handshakes) and its first requests are not what the measurement is about. The webhook admits a
// dry run without preallocating; nothing is stored. Stock runs get the same creates, which no
// webhook answers, so that every mode starts after the same work.
func (b *bench) warmUp(ctx context.Context, ns string, parallel int) error {
	c, err := b.benchClient()
	if err != nil {
		return err
	}
	for round := range warmUpRounds {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for i := range max(1, parallel) {
			wg.Go(func() {
				data := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("warm-up-%d-%d", round, i)}}
				if err := c.Create(ctx, data, client.DryRunAll); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("warming the webhook up: %w", err)
		}
	}
	return nil
}

// origin is when machine i's Metal3DataClaim was sent, or with i < 0 the run's first claim.
func origin(claims claimCreated, i int) time.Time {
	if i >= 0 {
		return claims[i]
	}
	first := claims[0]
	for _, at := range claims {
		if at.Before(first) {
			first = at
		}
	}
	return first
}

// drive creates the scenario's Metal3DataClaims and, in a backlog, releases CAPM3's Metal3Data
// controller --backlog-pause after the first claim, noting in run how many Metal3Data it held;
// it returns when each claim was sent and when the release was.
func (b *bench) drive(ctx context.Context, sc scenario, capm3 *stack.CAPM3, ms []*fixtures.Machine, run *Run) (claimCreated, time.Time, error) {
	claims := claimCreated{}
	switch sc.Kind {
	case "idle":
		for i, m := range ms {
			at, err := b.createClaim(ctx, m)
			if err != nil {
				return nil, time.Time{}, err
			}
			claims[i] = at
			if err := b.waitReady(ctx, capm3, ms[:i+1]); err != nil {
				return nil, time.Time{}, err
			}
		}
	case "burst":
		if err := b.createClaims(ctx, ms, claims); err != nil {
			return nil, time.Time{}, err
		}
	case "slow":
		if err := b.createClaimsAt(ctx, ms, claims, b.cfg.slowRate); err != nil {
			return nil, time.Time{}, err
		}
	case "backlog":
		start := time.Now()
		if err := b.createClaims(ctx, ms, claims); err != nil {
			return nil, time.Time{}, err
		}
		// CAPM3's Metal3Data controller is behind for the same time in both modes, whatever
		// the template controller and the IPAMs did meanwhile.
		time.Sleep(time.Until(start.Add(b.cfg.pause)))
		run.HeldBacklog = len(dataOf(capm3.Arrivals.In(ms[0].DataClaim.Namespace)))
		released := time.Now()
		capm3.ReleaseMetal3Data()
		return claims, released, nil
	}
	return claims, time.Time{}, nil
}

// readFootprint reads the footprint of the single webhook process: the cache sizes of this
// read, which come later and so are the largest, and the highest peak memory of any read, since
// the process is restarted around the no-op runs.
func (b *bench) readFootprint() error {
	f, err := b.webhookFootprint()
	if err != nil {
		return err
	}
	if b.footprint != nil {
		f.PeakRSSMiB = max(f.PeakRSSMiB, b.footprint.PeakRSSMiB)
	}
	b.footprint = f
	return nil
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
		series, ok := strings.CutPrefix(line, "ip_preallocator_cached_objects{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(series, "} ")
		var kind, content string
		for _, label := range strings.Split(labels, ",") {
			name, v, _ := strings.Cut(label, "=")
			v = strings.Trim(v, `"`)
			switch name {
			case "kind":
				kind = v
			case "content":
				content = v
			}
		}
		if content == "object" {
			// The claims' second informer, which holds their status.
			kind += " (object)"
		}
		f.CachedObjects[kind], _ = strconv.ParseFloat(value, 64)
	}
	return f, nil
}

// checkRendered checks that the Metal3Data measured for each claim is the one its
// status.renderedData names: the template controller patches the claim right after the create,
// in the same loop, so by the time a Metal3Data is Ready its claim names it.
func (b *bench) checkRendered(ctx context.Context, capm3 *stack.CAPM3, ns string) error {
	c, err := b.benchClient()
	if err != nil {
		return err
	}
	list := &infrav1.Metal3DataClaimList{}
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return err
	}
	data := dataOf(capm3.Arrivals.In(ns))
	for _, claim := range list.Items {
		rendered := claim.Status.RenderedData
		if rendered == nil || data[claim.Name].Data != (types.NamespacedName{Namespace: ns, Name: rendered.Name}) {
			return fmt.Errorf("Metal3DataClaim %s names %v; the template controller created %v for it last", claim.Name, rendered, data[claim.Name].Data)
		}
	}
	return nil
}
