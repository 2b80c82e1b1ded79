package faults

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// scenarioSpec is one scenario of the suite.
type scenarioSpec struct {
	name, title string
	parallel    bool
	// compared: the counts held to stock's, not to 0. With any, each trial also runs the
	// scenario in namespaces the webhook does not serve (stock CAPM3 and the IPAMs alone).
	compared []string
	run      func(ctx context.Context, sc *scenario)
}

var scenarios = []scenarioSpec{
	{"kills", "SIGKILL of the leader and of the other replica at random moments while Metal3Data are admitted, each restarted after a random pause; once per trial both are killed at once and restarted, and once both are restarted gracefully in turn, as in a rollout.", false, comparedToStock, runKills},
	{"leader-loss", "SIGKILL of the leader while a stream of Metal3Data is admitted (its last hand-overs held, so that it dies with Metal3Data admitted and not handed over); it stays down, as when its node dies, until the other replica holds the lease. Time-to-Ready of the Metal3Data the surviving replica admitted during that election window, against an idle reference (one at a time, no fault) measured in the same run; the Metal3Data the dead leader did not hand over must be handed over by the surviving replica's take-over.", false, nil, runLeaderLoss},
	{"api-faults", "CAPM3 and the Metal3 IPAM, and each webhook replica, reach the API server through a loopback proxy that answers 429 (Retry-After 1 s) to 5% of requests and 500 to 5%, resets the connection of 5% and delays 10% by 300 ms, from the replicas' start-up to the end of the namespace deletion. At the full sizes, against the released IPAM, CAPM3's and the IPAM's links meet the same faults, in both modes; against the corrected IPAM only the replicas' links do, so that what is left is the webhook's.", false, comparedToStock, runAPIFaults},
	{"concurrent", "Metal3Data created all at once, admitted by both replicas; one in twenty has a claim in the InClusterIPPool.", false, comparedToStock, runConcurrent},
	{"rejected-after-mutation", "Half the Metal3Data are rejected by a ValidatingAdmissionPolicy after our mutation; of those, most are created again, at a random moment up to 1.5 grace periods later, and accepted; the others never are. In the baseline the gate rejects half the Metal3Data, chosen the same way, and only the time its namespaces take to be deleted is held to stock's: CAPM3 and the IPAM never see a rejected Metal3Data, so every other count must be 0.", true, []string{invNamespaces, invNamespacesStuck, invNamespacesIPAM}, runGate},
	{"recreate", "The same Metal3Data names are deleted and created again at once (the create retried until the old one is gone), round after round, some before they are Ready.", true, comparedToStock, runRecreate},
	{"namespaces", "Namespaces are deleted while claims preallocated for rejected Metal3Data wait: half the Metal3Data of each are rejected after our mutation, the others stored, and the namespace is deleted at a random moment up to 0.8 grace periods later. The baseline does the same.", true, comparedToStock, runNamespaces},
	{"by-hand", "Every Metal3Data is rejected after our mutation, and the claims preallocated for it deleted by hand at a random moment up to 0.6 grace periods later; then half the Metal3Data are created again (the gate opened) and accepted, and the others' Metal3DataClaims deleted. The baseline does the same: there, with no webhook, the claims do not exist when they are deleted.", true, comparedToStock, runByHand},
}

// TestFaults runs every scenario, each on its own namespaces, its trials and more while a
// comparison with stock lacks the criterion's power. Those that fault the webhook itself, and the
// concurrent one (it measures latency), run alone, one after the other; the others then run in
// parallel.
func TestFaults(t *testing.T) {
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			if s.parallel {
				t.Parallel()
			}
			// After its subtests, whose failures are its own.
			t.Cleanup(func() { report.outcome(s.name, t.Failed()) })
			first := report.trialsDone(s.name)
			for trial := first; trial < first+size.trials || report.wantsTrial(s.name, trial); trial++ {
				modes := []bool{false}
				if s.compared != nil {
					// Alternating when the arms run one after the other, so that a drift of the
					// machine's load favours neither.
					modes = []bool{trial%2 == 1, trial%2 == 0}
				}
				// A trial's arms of a scenario that runs beside others run at once, so that both
				// meet the same load; the others' run alone, one after the other.
				t.Run(fmt.Sprintf("trial-%d", trial), func(t *testing.T) {
					for _, stock := range modes {
						name := s.name
						if stock {
							name += "-stock"
						}
						t.Run(name, func(t *testing.T) {
							if s.parallel {
								t.Parallel()
							}
							runArm(t, s.title, name, trial, stock, s.compared, s.run)
						})
					}
				})
			}
			if s.compared != nil {
				for _, f := range report.failuresAgainstStock(s.name) {
					t.Error(f)
				}
			}
		})
	}
}

// runArm runs one arm of a scenario's trial: the webhook's, or stock's baseline.
func runArm(t *testing.T, title, name string, trial int, stock bool, compared []string, run func(ctx context.Context, sc *scenario)) {
	t.Helper()
	ctx := context.Background()
	sc := newScenario(t, name, uint64(trial))
	sc.trial, sc.control = trial, stock
	if !stock {
		sc.compared = compared
	}
	// Every stock admission goes unanswered by the webhook, by design.
	sc.webhookFaults = sc.webhookFaults || stock
	// A trial that fails before its counts are recorded (t.Fatal at its setup, say) is named on
	// the page, lest an arm show fewer trials than its partner without a word.
	defer func() {
		if !sc.recorded {
			report.lose(sc, title)
		}
	}()
	started := time.Now()
	load := loadAverage()
	run(ctx, sc)
	sc.load = load + "→" + loadAverage()
	sc.finish(ctx, title, started)
}

// ns names a namespace of the scenario's trial.
func (sc *scenario) ns(parts ...any) string {
	name := fmt.Sprintf("%s-%d", sc.name, sc.trial)
	for _, p := range parts {
		name += fmt.Sprintf("-%v", p)
	}
	return name
}

// worlds creates namespaces of perNamespace machines, total machines in all, share of them with
// an InClusterIPPool.
func (sc *scenario) worlds(ctx context.Context, total, perNamespace int, share float64) ([]*world, []*fixtures.Machine) {
	var worlds []*world
	var all []*fixtures.Machine
	for i := 0; total > 0; i++ {
		n := min(total, perNamespace)
		total -= n
		w, err := sc.newWorld(ctx, sc.ns(i), n, share)
		if err != nil {
			sc.t.Fatal(err)
		}
		worlds = append(worlds, w)
		all = append(all, w.machines...)
	}
	return worlds, all
}

// reconnectDirectly points every replica at the API server again, as the scenarios after a
// proxied one expect, and waits for them.
func reconnectDirectly(ctx context.Context, t *testing.T) {
	t.Helper()
	rs := cp.Replicas
	for i := range rs.Len() {
		rs.StopReplica(i)
		rs.SetKubeconfig(i, rs.DefaultKubeconfig())
		if err := rs.Restart(i); err != nil {
			t.Error(err)
		}
	}
	ensureReplicas(ctx, t)
}

// ensureReplicas restarts the replicas that are down and waits until both are ready.
func ensureReplicas(ctx context.Context, t *testing.T) {
	t.Helper()
	rs := cp.Replicas
	for i := range rs.Len() {
		if !rs.Running(i) {
			if err := rs.Restart(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range rs.Len() {
		if err := rs.WaitReady(ctx, i, 90*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

func runKills(ctx context.Context, sc *scenario) {
	sc.webhookFaults = true
	rs := cp.Replicas
	_, machines := sc.worlds(ctx, size.killData, size.perNamespace, inClusterShare)
	before, lbBefore := rs.Counts(), rs.LoadBalancer().Counts()

	// The stream lasts about as long as the kills: one every 1–3 s, each down for up to 1.5 s,
	// and for a third of them a wait of about 15 s for a new leader.
	interval := time.Duration(size.kills) * 7 * time.Second / time.Duration(len(machines))
	streamDone := make(chan struct{})
	var killerDone sync.WaitGroup
	var leaderKills, otherKills, bothKills, rollouts atomic.Int64
	killerDone.Go(func() {
		kills := 0
		both, rolled := false, false
		for {
			select {
			case <-streamDone:
				if kills >= size.kills {
					return
				}
			default:
			}
			time.Sleep(sc.random(time.Second, 3*time.Second))
			if !both && kills >= size.kills/2 {
				// Both at once: every admission in flight fails open until one is back.
				for i := range rs.Len() {
					rs.Kill(i)
				}
				sc.touch()
				kills += rs.Len()
				bothKills.Add(1)
				both = true
				time.Sleep(sc.random(200*time.Millisecond, 1500*time.Millisecond))
				for i := range rs.Len() {
					if err := rs.Restart(i); err != nil {
						sc.t.Error(err)
					}
				}
				continue
			}
			if !rolled && kills >= size.kills*3/4 {
				// A rollout: each replica in turn ends gracefully (it hands the lease on) and
				// comes back, as a Deployment's rolling update replaces its pods.
				for i := range rs.Len() {
					rs.StopReplica(i)
					sc.touch()
					if err := rs.Restart(i); err != nil {
						sc.t.Error(err)
					}
					if err := rs.WaitReady(ctx, i, 60*time.Second); err != nil {
						sc.t.Error(err)
					}
				}
				rollouts.Add(1)
				rolled = true
				continue
			}
			// A third of the kills aim at the leader. After a SIGKILL its lease is only taken over
			// once it expires (15 s), so wait for the next leader, and kill it at a random moment
			// of its term.
			wantLeader := sc.chance(1.0 / 3)
			leader, hasLeader := rs.Leader()
			for wait := time.Now().Add(25 * time.Second); wantLeader && !hasLeader && time.Now().Before(wait); {
				time.Sleep(250 * time.Millisecond)
				if leader, hasLeader = rs.Leader(); hasLeader {
					time.Sleep(sc.random(0, time.Second))
				}
			}
			victim := sc.intn(rs.Len())
			if hasLeader {
				if wantLeader {
					victim = leader
				} else {
					victim = (leader + 1 + sc.intn(rs.Len()-1)) % rs.Len()
				}
			}
			if !rs.Running(victim) {
				continue
			}
			rs.Kill(victim)
			sc.touch()
			kills++
			if hasLeader && victim == leader {
				leaderKills.Add(1)
			} else {
				otherKills.Add(1)
			}
			time.Sleep(sc.random(0, 1500*time.Millisecond))
			if err := rs.Restart(victim); err != nil {
				sc.t.Error(err)
			}
		}
	})
	stream(machines, 4, interval, func(m *fixtures.Machine) { sc.admit(ctx, m.Data) })
	close(streamDone)
	killerDone.Wait()
	ensureReplicas(ctx, sc.t)
	sc.touch()

	after, lbAfter := rs.Counts(), rs.LoadBalancer().Counts()
	sc.addFault("SIGKILL of the leader", leaderKills.Load())
	sc.addFault("SIGKILL of the other replica (or of one while none led)", otherKills.Load())
	sc.addFault("SIGKILL of both at once (2 kills each)", 2*bothKills.Load())
	sc.addFault("graceful restarts of both in turn (a rollout)", int64(rs.Len())*rollouts.Load())
	sc.figuref("%d SIGKILLs over %d Metal3Data; %d restarts, %d exits nobody caused; the load balancer failed %d dials to a dead replica and found none up for %d connections",
		after.Kills-before.Kills, len(machines), after.Restarts-before.Restarts, after.Crashes-before.Crashes,
		lbAfter.FailedDials-lbBefore.FailedDials, lbAfter.Refused-lbBefore.Refused)
	sc.admissionFigures()
}

// admissionFigures reports how the webhook answered the scenario's stored Metal3Data.
func (sc *scenario) admissionFigures() {
	var full, partial, unanswered int
	var latencies []time.Duration
	for _, a := range sc.stored() {
		latencies = append(latencies, a.latency)
		switch {
		case len(a.recorded) > 0 && len(a.warnings) == 0:
			full++
		case a.answered():
			partial++
		default:
			unanswered++
		}
	}
	sc.figuref("%d Metal3Data stored: %d answered with every claim planned, %d with a claim left to CAPM3 (warning), %d admitted unchanged (webhook call failed); create latency p50 %v, p99 %v",
		full+partial+unanswered, full, partial, unanswered,
		percentile(latencies, 0.5).Round(time.Millisecond), percentile(latencies, 0.99).Round(time.Millisecond))
}

// shareFigure reports, once the scenario has settled, the share of the claims its stored
// Metal3Data came to own that the webhook created.
func (sc *scenario) shareFigure() {
	uids := map[types.UID]bool{}
	for _, a := range sc.stored() {
		uids[a.uid] = true
	}
	preallocated, all := preallocatedShare(recorder.in(sc.namespaces), uids)
	sc.figuref("claims created by the webhook: %d of the %d the stored Metal3Data came to own (%.1f%%, by claim UID)",
		preallocated, all, 100*float64(preallocated)/float64(max(all, 1)))
}

func runGate(ctx context.Context, sc *scenario) {
	worlds, machines := sc.worlds(ctx, size.gateData, size.perNamespace, inClusterShare)
	rejected := map[string]bool{}
	retried := map[string]bool{}
	for _, w := range worlds {
		var gated []*infrav1.Metal3Data
		for _, m := range w.machines {
			if sc.chance(0.5) {
				gated = append(gated, m.Data)
				rejected[m.Data.Namespace+"/"+m.Data.Name] = true
				if sc.chance(0.7) {
					retried[m.Data.Namespace+"/"+m.Data.Name] = true
				}
			}
		}
		if err := closeGate(ctx, w.ns, gated); err != nil {
			sc.t.Fatal(err)
		}
	}
	var rejections, accepted, notRetried, unexpected atomic.Int64
	var retries sync.WaitGroup
	stream(machines, 4, 50*time.Millisecond, func(m *fixtures.Machine) {
		key := m.Data.Namespace + "/" + m.Data.Name
		a := sc.admit(ctx, m.Data)
		switch {
		case gateRejected(a.err):
			rejections.Add(1)
		case a.err != nil || rejected[key]:
			unexpected.Add(1)
			sc.t.Errorf("%s: expected %v rejection, got %v", key, rejected[key], a.err)
		}
		if !rejected[key] {
			return
		}
		if !retried[key] {
			// Its machine goes away: CAPM3 stops retrying, and the claims are released.
			notRetried.Add(1)
			retries.Go(func() {
				time.Sleep(sc.random(0, gracePeriod*3/2))
				deleteDataClaim(ctx, sc, m)
			})
			return
		}
		retries.Go(func() {
			time.Sleep(sc.random(0, gracePeriod*3/2))
			if err := openGate(ctx, m.Data.Namespace, m.Data.Name); err != nil {
				sc.t.Error(err)
				return
			}
			a, attempts := sc.admitUntilStored(ctx, m.Data, 100*time.Millisecond, 30*time.Second)
			rejections.Add(int64(attempts - 1))
			if a.err != nil {
				sc.t.Errorf("%s was not accepted on retry: %v", key, a.err)
				return
			}
			accepted.Add(1)
		})
	})
	retries.Wait()
	sc.touch()
	sc.addFault("Metal3Data rejected after our mutation", rejections.Load())
	sc.figuref("%d rejections of %d gated Metal3Data: %d accepted on a later attempt, %d never created again", rejections.Load(), len(rejected), accepted.Load(), notRetried.Load())
	sc.admissionFigures()
}

// generation stores the machine objects of Metal3Data index under new names, as when a machine
// is replaced and CAPM3's template controller reuses the freed index: the Metal3Data has the same
// name, its Metal3DataClaim, Metal3Machine, Machine and host are new.
func (sc *scenario) generation(ctx context.Context, ns string, index, gen int) (*fixtures.Machine, error) {
	m := fixtures.NewMachine(template(workersTemplate), index).InNamespace(ns)
	sc.inArm(m)
	if gen > 0 {
		suffix := fmt.Sprintf("-g%d", gen)
		m.Machine.Name += suffix
		m.Metal3Machine.Name += suffix
		m.Host.Name += suffix
		m.DataClaim.Name = m.Metal3Machine.Name
		m.Machine.Spec.InfrastructureRef.Name = m.Metal3Machine.Name
		m.Metal3Machine.Annotations["metal3.io/BareMetalHost"] = ns + "/" + m.Host.Name
		m.Metal3Machine.OwnerReferences[0].Name = m.Machine.Name
		m.DataClaim.OwnerReferences[0].Name = m.Metal3Machine.Name
		for i, ref := range m.Data.OwnerReferences {
			switch ref.Kind {
			case "Metal3DataClaim":
				m.Data.OwnerReferences[i].Name = m.DataClaim.Name
			case "Metal3Machine":
				m.Data.OwnerReferences[i].Name = m.Metal3Machine.Name
			}
		}
		m.Data.Spec.Claim.Name = m.DataClaim.Name
	}
	return m, harness.CreateMachine(ctx, cp.Client, m)
}

// servesMetal3Data tells whether a mutating webhook is called for Metal3Data: ours.
func servesMetal3Data(w admissionregistrationv1.MutatingWebhook) bool {
	return slices.ContainsFunc(w.Rules, func(r admissionregistrationv1.RuleWithOperations) bool {
		return slices.Contains(r.Resources, "metal3datas")
	})
}

// excludeStockNamespaces keeps our mutating webhook from being called in the namespaces of
// baseline trials, labelled stockLabel.
func excludeStockNamespaces(ctx context.Context) error {
	list := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	if err := cp.Client.List(ctx, list); err != nil {
		return err
	}
	for i := range list.Items {
		cfg := &list.Items[i]
		changed := false
		for j := range cfg.Webhooks {
			if !servesMetal3Data(cfg.Webhooks[j]) {
				continue
			}
			if cfg.Webhooks[j].NamespaceSelector == nil {
				cfg.Webhooks[j].NamespaceSelector = &metav1.LabelSelector{}
			}
			sel := cfg.Webhooks[j].NamespaceSelector
			sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: stockLabel, Operator: metav1.LabelSelectorOpDoesNotExist})
			changed = true
		}
		if !changed {
			continue
		}
		if err := cp.Client.Update(ctx, cfg); err != nil {
			return err
		}
	}
	// The API server reads webhook configurations through an informer; finish checks that no
	// baseline Metal3Data was preallocated.
	time.Sleep(2 * time.Second)
	return nil
}

func runRecreate(ctx context.Context, sc *scenario) {
	worlds := make([]*world, size.recreateNamespaces)
	for i := range worlds {
		w, err := sc.newWorld(ctx, sc.ns(i), 0, 0)
		if err != nil {
			sc.t.Fatal(err)
		}
		worlds[i] = w
	}
	var deletions, refused, beforeReady atomic.Int64
	var lock sync.Mutex
	var recreateTimes []time.Duration
	err := parallel(size.recreateNames, size.recreateNames, func(index int) error {
		w := worlds[index%len(worlds)]
		m, err := sc.generation(ctx, w.ns, index, 0)
		if err != nil {
			return err
		}
		if a := sc.admit(ctx, m.Data); a.err != nil {
			return a.err
		}
		for round := 1; round < size.recreateRounds; round++ {
			// Some are deleted before CAPM3 made them Ready, some after.
			if sc.chance(0.5) {
				time.Sleep(sc.random(0, time.Second))
			} else {
				waitReady(ctx, m.Data, 60*time.Second)
				time.Sleep(sc.random(0, time.Second))
			}
			// The next machine is stored first, so that its Metal3Data's create follows the
			// deletion at once.
			next, err := sc.generation(ctx, w.ns, index, round)
			if err != nil {
				return err
			}
			if ok, _ := isReady(ctx, m.Data); !ok {
				beforeReady.Add(1)
			}
			if err := deleteMachineData(ctx, m); err != nil {
				return err
			}
			deletions.Add(1)
			sc.touch()
			deleted := time.Now()
			m = next
			a, attempts := sc.admitUntilStored(ctx, m.Data, 100*time.Millisecond, 120*time.Second)
			refused.Add(int64(attempts - 1))
			if a.err != nil {
				return fmt.Errorf("%s was not created again: %w", m.Data.Name, a.err)
			}
			lock.Lock()
			recreateTimes = append(recreateTimes, time.Since(deleted))
			lock.Unlock()
		}
		return nil
	})
	if err != nil {
		sc.t.Error(err)
	}
	sc.touch()
	sc.addFault("Metal3Data deleted and created again under the same name", deletions.Load())
	sc.figuref("%d deletions (%d before Ready); %d creates refused while the old Metal3Data of the name still existed; deletion to new Metal3Data stored: p50 %v, max %v",
		deletions.Load(), beforeReady.Load(), refused.Load(), percentile(recreateTimes, 0.5).Round(100*time.Millisecond), percentile(recreateTimes, 1).Round(100*time.Millisecond))
	sc.admissionFigures()
}

func isReady(ctx context.Context, data *infrav1.Metal3Data) (bool, error) {
	got := &infrav1.Metal3Data{}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(data), got); err != nil {
		return false, err
	}
	return got.Status.Ready != nil && *got.Status.Ready, nil
}

func waitReady(ctx context.Context, data *infrav1.Metal3Data, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ok, _ := isReady(ctx, data); ok {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func runNamespaces(ctx context.Context, sc *scenario) {
	var deleted, waitingAtDeletion atomic.Int64
	var nsDeletions sync.WaitGroup
	for i := range size.deletedNamespaces {
		w, err := sc.newWorld(ctx, sc.ns("deleted", i), size.machinesPerNamespace, inClusterShare)
		if err != nil {
			sc.t.Fatal(err)
		}
		var gated []*infrav1.Metal3Data
		for j, m := range w.machines {
			if j%2 == 0 {
				gated = append(gated, m.Data)
			}
		}
		if err := closeGate(ctx, w.ns, gated); err != nil {
			sc.t.Fatal(err)
		}
		stream(w.machines, 4, 0, func(m *fixtures.Machine) { sc.admit(ctx, m.Data) })
		nsDeletions.Go(func() {
			time.Sleep(sc.random(500*time.Millisecond, gracePeriod*8/10))
			waitingAtDeletion.Add(int64(len(waitingClaims(ctx, w.ns))))
			sc.deleteNamespace(ctx, w.ns)
			deleted.Add(1)
			sc.touch()
		})
	}
	nsDeletions.Wait()
	sc.touch()
	sc.addFault("namespaces deleted while claims wait", deleted.Load())
	sc.figuref("%d namespaces deleted with %d claims waiting in them", deleted.Load(), waitingAtDeletion.Load())
	sc.admissionFigures()
}

// runByHand deletes by hand the claims preallocated for rejected Metal3Data, as a person cleaning
// up would; the baseline makes the same requests, which find nothing.
func runByHand(ctx context.Context, sc *scenario) {
	w, err := sc.newWorld(ctx, sc.ns("by-hand"), size.handDeleted, inClusterShare)
	if err != nil {
		sc.t.Fatal(err)
	}
	var datas []*infrav1.Metal3Data
	for _, m := range w.machines {
		datas = append(datas, m.Data)
	}
	if err := closeGate(ctx, w.ns, datas); err != nil {
		sc.t.Fatal(err)
	}
	var byHand, acceptedAfter atomic.Int64
	var work sync.WaitGroup
	stream(w.machines, 4, 0, func(m *fixtures.Machine) {
		if a := sc.admit(ctx, m.Data); !gateRejected(a.err) {
			sc.t.Errorf("%s: expected the gate's rejection, got %v", m.Data.Name, a.err)
		}
		work.Go(func() {
			time.Sleep(sc.random(0, gracePeriod*6/10))
			for _, pool := range poolsOf(m.Data.Spec.Template.Name) {
				// Every claim of half the machines, the provisioning claim of the others.
				if pool != fixtures.ProvisioningPool && sc.chance(0.5) {
					continue
				}
				if err := cp.Client.Delete(ctx, claimObject(m.Data.Namespace, m.Data.Name+"-"+pool, pool)); err == nil {
					byHand.Add(1)
				} else if !apierrors.IsNotFound(err) {
					sc.t.Error(err)
				}
			}
			sc.touch()
			if sc.chance(0.5) {
				deleteDataClaim(ctx, sc, m)
				return
			}
			time.Sleep(sc.random(0, gracePeriod))
			if err := openGate(ctx, m.Data.Namespace, m.Data.Name); err != nil {
				sc.t.Error(err)
				return
			}
			if a, _ := sc.admitUntilStored(ctx, m.Data, 100*time.Millisecond, 30*time.Second); a.err != nil {
				sc.t.Errorf("%s was not accepted: %v", m.Data.Name, a.err)
				return
			}
			acceptedAfter.Add(1)
		})
	})
	work.Wait()
	sc.touch()
	sc.addFault("waiting claims deleted by hand", byHand.Load())
	sc.figuref("%d claims deleted by hand, %d of their Metal3Data accepted afterwards", byHand.Load(), acceptedAfter.Load())
	sc.admissionFigures()
}

// deleteDataClaim deletes the Metal3DataClaim of a machine whose Metal3Data is never created
// again, as when the machine is deleted: while it waited for data, the Metal3Data's claims were
// kept for CAPM3's retry.
func deleteDataClaim(ctx context.Context, sc *scenario, m *fixtures.Machine) {
	if err := client.IgnoreNotFound(cp.Client.Delete(ctx, m.DataClaim)); err != nil {
		sc.t.Error(err)
	}
	sc.touch()
}

func claimObject(ns, name, pool string) client.Object {
	var obj client.Object = &ipamv1.IPClaim{}
	if pool == fixtures.ExternalPool {
		obj = &capipamv1.IPAddressClaim{}
	}
	obj.SetNamespace(ns)
	obj.SetName(name)
	return obj
}

// waitingClaims lists the claims of ns still waiting for their Metal3Data.
func waitingClaims(ctx context.Context, ns string) []string {
	s, err := readNamespace(ctx, ns)
	if err != nil {
		return nil
	}
	var out []string
	for key, cl := range s.claims() {
		if len(cl.obj.GetOwnerReferences()) == 0 {
			out = append(out, key)
		}
	}
	return out
}

// runAPIFaults faults CAPM3's and the Metal3 IPAM's links to the API server in both modes (at
// the full sizes), and with the webhook each replica's own link too: the baseline is stock under
// the same faults.
func runAPIFaults(ctx context.Context, sc *scenario) {
	sc.webhookFaults = true
	rs := cp.Replicas
	faults := harness.Faults{TooManyRequests: 0.05, InternalError: 0.05, Reset: 0.05, Latency: 0.10, Delay: 300 * time.Millisecond}
	proxies := []*harness.FaultProxy{controllerLinks}
	if !sc.control {
		for i := range rs.Len() {
			p, err := cp.StartFaultProxy(fmt.Sprintf("api-proxy-%d-%d", sc.trial, i), rs.DefaultKubeconfig(), uint64(100*sc.trial+i))
			if err != nil {
				sc.t.Fatal(err)
			}
			proxies = append(proxies, p)
		}
	}
	countsBefore := controllerLinks.Counts()
	for i, p := range proxies {
		if i > 0 || size.controllerLinkFaults {
			p.Set(faults)
		}
	}
	// The faults last until the namespaces are gone; a trial that ends early takes them away at once.
	restore := func() {
		controllerLinks.Set(harness.Faults{})
		if sc.control {
			return
		}
		reconnectDirectly(ctx, sc.t)
		for _, p := range proxies[1:] {
			p.Close()
		}
	}
	scheduled := false
	defer func() {
		if !scheduled {
			restore()
		}
	}()
	before := rs.Counts()
	if !sc.control {
		for i := range rs.Len() {
			rs.StopReplica(i)
			rs.SetKubeconfig(i, proxies[i+1].Kubeconfig)
			if err := rs.Restart(i); err != nil {
				sc.t.Fatal(err)
			}
		}
		ensureReplicas(ctx, sc.t)
	}
	_, machines := sc.worlds(ctx, size.apiFaultData, size.perNamespace, inClusterShare)
	stream(machines, 4, 100*time.Millisecond, func(m *fixtures.Machine) { sc.admit(ctx, m.Data) })
	sc.touch()
	sc.admissionFigures()
	injected := func() int64 {
		var n int64
		for _, p := range proxies {
			n += p.Counts().Injected()
		}
		return n
	}
	var atDeletion int64
	sc.onDelete = func() { atDeletion = injected() }
	sc.onFinish = func() {
		defer restore()
		var total harness.FaultCounts
		for i, p := range proxies {
			c := p.Counts()
			if i == 0 {
				c = c.Since(countsBefore)
				sc.figuref("CAPM3's and the Metal3 IPAM's API requests: %s", c)
			} else {
				sc.figuref("replica %d's API requests: %s", i-1, c)
			}
			total = total.Plus(c)
		}
		sc.addFault("429 Too Many Requests", total.TooManyRequests)
		sc.addFault("500 Internal Server Error", total.InternalError)
		sc.addFault("connection resets", total.Reset)
		sc.addFault("requests delayed", total.Delayed)
		if !sc.control {
			after := rs.Counts()
			sc.figuref("replica exits nobody caused (restarted after 1 s): %d", after.Crashes-before.Crashes)
		}
		if !sc.control || size.controllerLinkFaults {
			duringDeletion := injected() - atDeletion
			sc.figuref("faults injected while the namespaces were deleted: %d", duringDeletion)
			sc.extra = append(sc.extra, unfaultedDeletion(duringDeletion))
		}
	}
	scheduled = true
}

// unfaultedDeletion counts a namespace deletion that met no injected fault: the faults were
// taken away too early, and the scenario did not test what it says.
func unfaultedDeletion(injectedDuringDeletion int64) namedCount {
	c := namedCount{name: "namespace deletions without the API faults"}
	if injectedDuringDeletion == 0 {
		c.addf("no fault was injected while the namespaces were deleted")
	}
	return c
}

// concurrentInClusterShare keeps the in-cluster IPAM's share of the concurrent burst at 50 claims
// in 1000: it would need minutes for more.
const concurrentInClusterShare = 0.05

const mutatePath = "/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate"

// webhookRequests sums controller_runtime_webhook_requests_total of the mutating webhook.
func webhookRequests(metrics string) int64 {
	var total int64
	scanner := bufio.NewScanner(strings.NewReader(metrics))
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.HasPrefix(line, "controller_runtime_webhook_requests_total{") && strings.Contains(line, `webhook="`+mutatePath+`"`) {
			if n, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64); err == nil {
				total += int64(n)
			}
		}
	}
	return total
}

func runConcurrent(ctx context.Context, sc *scenario) {
	rs := cp.Replicas
	_, machines := sc.worlds(ctx, size.concurrentData, size.perNamespace, concurrentInClusterShare)
	before := make([]int64, rs.Len())
	for i := range before {
		m, err := rs.Metrics(i)
		if err != nil {
			sc.t.Fatal(err)
		}
		before[i] = webhookRequests(m)
	}
	exits := rs.Counts().Crashes
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range machines {
		wg.Go(func() {
			<-start
			sc.admit(ctx, m.Data)
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(began)
	sc.touch()

	errorsCount := namedCount{name: "admission errors (create failed, webhook did not answer, or left a claim to CAPM3)"}
	var latencies []time.Duration
	for _, a := range sc.admissions {
		latencies = append(latencies, a.latency)
		if a.err != nil || !sc.control && (!a.answered() || len(a.warnings) > 0) {
			errorsCount.addf("%s", a)
		}
	}
	sc.extra = append(sc.extra, errorsCount)
	var perReplica []string
	for i := range before {
		m, err := rs.Metrics(i)
		if err != nil {
			sc.t.Fatal(err)
		}
		perReplica = append(perReplica, fmt.Sprintf("replica %d: %d", i, webhookRequests(m)-before[i]))
	}
	sc.addFault("Metal3Data created at once", int64(len(machines)))
	// A replica that exits during the burst (it lost its lease, say) restarts its metrics.
	sc.figuref("replica exits nobody caused during the burst (restarted after 1 s): %d", rs.Counts().Crashes-exits)
	sc.figuref("%d creates at once, done in %v; admission (create) latency p50 %v, p99 %v, max %v; admissions served: %s",
		len(machines), took.Round(time.Millisecond), percentile(latencies, 0.5).Round(time.Millisecond),
		percentile(latencies, 0.99).Round(time.Millisecond), percentile(latencies, 1).Round(time.Millisecond), strings.Join(perReplica, ", "))
	sc.admissionFigures()
}

// loadAverage is the machine's 1-minute load average: the suite shares the cores with whatever
// else runs.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	load, err := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
	if err != nil {
		return "?"
	}
	return strconv.FormatFloat(load, 'f', 1, 64)
}

func namespace(name string) client.Object {
	obj := &corev1.Namespace{}
	obj.Name = name
	return obj
}
