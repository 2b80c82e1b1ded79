package faults

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"gonum.org/v1/gonum/stat"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// scenario is one trial of one scenario: its namespaces, every admission it asked for, the faults
// it injected and the figures it measured.
type scenario struct {
	t     *testing.T
	name  string
	trial int
	rng   *rand.Rand
	// extra are invariants of this scenario only, each a count that must be 0.
	extra []namedCount
	// onDelete runs once the invariants are checked, before the namespaces are deleted;
	// onFinish after they are deleted, before the trial is recorded: it adds what was counted
	// until then.
	onDelete, onFinish func()

	mu         sync.Mutex
	namespaces []string
	admissions []admission
	faults     []namedCount
	figures    []string
	// table is a Markdown table the report prints under the scenario's figures.
	table []string
	// webhookFaults: replicas were killed or their API requests failed, so an admission may go
	// unanswered (the API server fails open) without that being a defect.
	webhookFaults bool
	// control: the webhook does not serve the scenario's namespaces; its counts are a baseline
	// of stock CAPM3 and the IPAM, reported, not asserted.
	control bool
	// compared: in the webhook's trial of a scenario that has a stock baseline, the counts held to
	// stock's bound, not to 0.
	compared []string
	// load is the machine's load average (1 min) at the trial's start and after its stream.
	load string
	// deletions are the namespaces deleted so far, each with the end of its deletion to come.
	deletions map[string]chan namespaceGone
	// lastActivity is when the scenario last created, deleted or faulted anything; the checks
	// run after the grace period counted from there.
	lastActivity time.Time
	// recorded: the trial's counts reached the report; a trial that failed before is lost.
	recorded bool
}

// newScenario starts a trial of a scenario. Its random choices follow from the run's seed, the
// scenario's name and the trial, so that a run can be repeated; an arm and its baseline get the
// same stream.
func newScenario(t *testing.T, name string, trial uint64) *scenario {
	t.Helper()
	h := fnv.New64a()
	_, _ = h.Write([]byte(strings.TrimSuffix(name, "-stock")))
	return &scenario{t: t, name: name, rng: rand.New(rand.NewPCG(runSeed^h.Sum64(), trial))}
}

// random returns a duration uniformly in [lo, hi).
func (sc *scenario) random(lo, hi time.Duration) time.Duration {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return lo + time.Duration(sc.rng.Int64N(int64(hi-lo)+1))
}

// intn returns an int in [0, n).
func (sc *scenario) intn(n int) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.rng.IntN(n)
}

// chance is true with probability p.
func (sc *scenario) chance(p float64) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.rng.Float64() < p
}

func (sc *scenario) touch() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.lastActivity = time.Now()
}

func (sc *scenario) addFault(name string, n int64) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i := range sc.faults {
		if sc.faults[i].name == name {
			sc.faults[i].n += n
			return
		}
	}
	sc.faults = append(sc.faults, namedCount{name: name, n: n})
}

func (sc *scenario) figuref(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	sc.t.Log(line)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.figures = append(sc.figures, line)
}

// admission is one create of a Metal3Data as the suite asked for it.
type admission struct {
	key types.NamespacedName
	// uid is set when the Metal3Data was stored.
	uid types.UID
	// recorded is the claims annotation our webhook added, if any, and token its admission
	// annotation.
	recorded []string
	token    string
	warnings []string
	err      error
	// start is when the create was sent, latency how long it took.
	start   time.Time
	latency time.Duration
}

// answered: the webhook answered this admission (it recorded claims or warned); otherwise the
// API server admitted it unchanged because the call failed (failurePolicy: Ignore).
func (a admission) answered() bool { return len(a.recorded) > 0 || len(a.warnings) > 0 }

func (a admission) String() string {
	s := fmt.Sprintf("Metal3Data %s (uid %s) in %v", a.key, a.uid, a.latency.Round(time.Millisecond))
	if len(a.recorded) > 0 {
		s += ", recorded " + strings.Join(a.recorded, ",")
	} else {
		s += ", not mutated"
	}
	if len(a.warnings) > 0 {
		s += fmt.Sprintf(", warnings %q", a.warnings)
	}
	if a.err != nil {
		s += ", error: " + a.err.Error()
	}
	return s
}

type warningsKey struct{}

type warningSink struct{}

// HandleWarningHeaderWithContext collects ip-preallocator's admission warnings of the request
// whose context carries a collector: it says there which claims it left to CAPM3. Other warnings
// (the API server's about finalizer names without a path, on every Metal3Data) are dropped.
func (warningSink) HandleWarningHeaderWithContext(ctx context.Context, _ int, _ string, text string) {
	if w, ok := ctx.Value(warningsKey{}).(*[]string); ok && strings.Contains(text, "ip-preallocator") {
		*w = append(*w, text)
	}
}

var (
	creatorOnce sync.Once
	creator     client.Client
)

// suiteUserAgent names the suite's own writes in managedFields.
const suiteUserAgent = "ip-preallocator-fault-suite"

func metal3DataClient() client.Client {
	creatorOnce.Do(func() {
		cfg := rest.CopyConfig(cp.Config)
		cfg.UserAgent = suiteUserAgent
		cfg.WarningHandlerWithContext = warningSink{}
		c, err := client.New(cfg, client.Options{Scheme: fixtures.Scheme()})
		if err != nil {
			panic(err)
		}
		creator = c
	})
	return creator
}

// admit creates data (a copy: the caller's object is untouched) and records the outcome.
func (sc *scenario) admit(ctx context.Context, data *infrav1.Metal3Data) admission {
	obj := data.DeepCopy()
	obj.ResourceVersion, obj.UID = "", ""
	var warnings []string
	start := time.Now()
	err := metal3DataClient().Create(context.WithValue(ctx, warningsKey{}, &warnings), obj)
	a := admission{key: client.ObjectKeyFromObject(data), warnings: warnings, err: err, start: start, latency: time.Since(start)}
	if err == nil {
		a.uid, a.token = obj.UID, obj.Annotations[allocation.AdmissionAnnotation]
		if v := obj.Annotations[allocation.ClaimsAnnotation]; v != "" {
			a.recorded = strings.Split(v, ",")
		}
	}
	sc.mu.Lock()
	sc.admissions = append(sc.admissions, a)
	sc.lastActivity = time.Now()
	sc.mu.Unlock()
	return a
}

// admitUntilStored retries a create that fails (a rejection, a name still taken) every interval
// until it is stored or timeout passes, as CAPM3's Metal3DataTemplate controller retries.
func (sc *scenario) admitUntilStored(ctx context.Context, data *infrav1.Metal3Data, interval, timeout time.Duration) (admission, int) {
	deadline := time.Now().Add(timeout)
	attempts := 0
	for {
		a := sc.admit(ctx, data)
		attempts++
		if a.err == nil || time.Now().After(deadline) {
			return a, attempts
		}
		time.Sleep(interval)
	}
}

// stored lists the admissions that stored a Metal3Data.
func (sc *scenario) stored() []admission {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out []admission
	for _, a := range sc.admissions {
		if a.err == nil {
			out = append(out, a)
		}
	}
	return out
}

// world is one namespace with a Cluster, a ThreePoolTemplate, its three pools and machines whose
// Metal3Data are not created yet.
type world struct {
	ns       string
	machines []*fixtures.Machine
}

// gateLabel marks the namespaces whose Metal3Data the admission gate (a
// ValidatingAdmissionPolicy) may reject.
const gateLabel = "test.ip-preallocator.metal3.io/gated"

// Every namespace has two templates: workersTemplate, the fixtures' ThreePoolTemplate (two Metal3
// IPPools and an InClusterIPPool), and mastersTemplate, the same without the InClusterIPPool. Only
// a share of the machines use the first: the in-cluster IPAM provider fulfils and releases one
// claim at a time (one worker, no flag raises it; its client has no rate limit), so with every machine on it, it alone
// would keep Metal3Data from being Ready, and namespaces from being deleted, for longer than the
// checks allow.
const (
	workersTemplate = "workers"
	mastersTemplate = "masters"
)

// inClusterShare is the default share of machines whose template has an InClusterIPPool.
const inClusterShare = 0.2

// template returns a template and its pools. It carries the finalizer of CAPM3's
// Metal3DataTemplate controller, which the stand-in removes once no Metal3Data of it is left:
// CAPM3 needs the template to release a Metal3Data's claims.
func template(name string) *infrav1.Metal3DataTemplate {
	tmpl := fixtures.ThreePoolTemplate(name)
	tmpl.Finalizers = []string{infrav1.DataTemplateFinalizer}
	if name == mastersTemplate {
		networks := tmpl.Spec.NetworkData.Networks
		networks.IPv4 = slices.DeleteFunc(networks.IPv4, func(n infrav1.NetworkDataIPv4) bool { return n.FromPoolRef.Name == fixtures.ExternalPool })
	}
	return tmpl
}

// poolsOf are the pools a Metal3Data of the template has claims in.
func poolsOf(templateName string) []string {
	if templateName == mastersTemplate {
		return []string{fixtures.ProvisioningPool, fixtures.BaremetalPool}
	}
	return []string{fixtures.ProvisioningPool, fixtures.BaremetalPool, fixtures.ExternalPool}
}

// newWorld creates namespace ns, its Cluster, pools and templates, and n machines, of which a
// share uses workersTemplate (machine i does when i*share crosses an integer, so they are spread
// over the stream) and the others mastersTemplate.
func (sc *scenario) newWorld(ctx context.Context, ns string, n int, share float64) (*world, error) {
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{gateLabel: "true"}}}
	if sc.control {
		nsObj.Labels[stockLabel] = "true"
	}
	if err := cp.Client.Create(ctx, nsObj); err != nil {
		return nil, err
	}
	sc.mu.Lock()
	sc.namespaces = append(sc.namespaces, ns)
	sc.mu.Unlock()
	for _, pool := range []client.Object{
		fixtures.Metal3Pool(fixtures.ProvisioningPool, "172.16"),
		fixtures.Metal3Pool(fixtures.BaremetalPool, "10.16"),
		fixtures.InClusterPool(fixtures.ExternalPool, "100.16"),
	} {
		pool.SetNamespace(ns)
		if err := cp.Client.Create(ctx, pool); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{workersTemplate, mastersTemplate} {
		shared := fixtures.NewMachine(template(name), 0).InNamespace(ns)
		for _, obj := range []client.Object{shared.Cluster, shared.Template} {
			obj.SetUID("")
			// The template's validation fails closed, and a parallel scenario's faults on the
			// webhook's connections can break the API server's call: the setup tries again, as
			// a person would, rather than lose the trial.
			err := retry.OnError(retry.DefaultBackoff, apierrors.IsInternalError, func() error { return cp.Client.Create(ctx, obj) })
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, err
			}
		}
	}
	w := &world{ns: ns, machines: make([]*fixtures.Machine, n)}
	err := parallel(16, n, func(i int) error {
		name := mastersTemplate
		if int(float64(i+1)*share) > int(float64(i)*share) {
			name = workersTemplate
		}
		m := fixtures.NewMachine(template(name), i).InNamespace(ns)
		sc.inArm(m)
		w.machines[i] = m
		return harness.CreateMachine(ctx, cp.Client, m)
	})
	return w, err
}

// inArm gives the machine's Metal3Data the watch filter of the webhook's arm, outside a baseline.
func (sc *scenario) inArm(m *fixtures.Machine) {
	if !sc.control {
		m.Data.Labels[clusterv1.WatchLabel] = webhookArm
	}
}

// parallel runs f(0..n-1) with at most width at a time and returns the first error.
func parallel(width, n int, f func(i int) error) error {
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// stream runs f on every item, width at a time, starting one every interval.
func stream[T any](items []T, width int, interval time.Duration, f func(T)) {
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i, item := range items {
		if i > 0 && interval > 0 {
			time.Sleep(interval)
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(item)
		})
	}
	wg.Wait()
}

// deleteMachineData deletes a machine's Metal3DataClaim and Metal3Data, as CAPI and CAPM3 do on
// scale-down; the stand-in drops the Metal3Data's claim finalizer once the Metal3DataClaim is
// gone, and CAPM3 releases the claims.
func deleteMachineData(ctx context.Context, m *fixtures.Machine) error {
	if err := cp.Client.Delete(ctx, m.DataClaim.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	data := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: m.Data.Namespace, Name: m.Data.Name}}
	if err := cp.Client.Delete(ctx, data); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// waitGone polls until obj does not exist, at most timeout.
func waitGone(ctx context.Context, obj client.Object, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("still there: finalizers %v, deletion %v", obj.GetFinalizers(), obj.GetDeletionTimestamp())
			}
			return fmt.Errorf("%T %s: %w", obj, client.ObjectKeyFromObject(obj), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// percentile of durations (p in [0,1]): gonum's empirical quantile, the nearest rank (the
// smallest sample at or above the fraction p of them); 0 for no samples.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	slices.Sort(xs)
	return time.Duration(stat.Quantile(p, stat.Empirical, xs, nil))
}
