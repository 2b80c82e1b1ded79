package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// The leader-loss scenario: the leader is SIGKILLed while a stream of Metal3Data is
// admitted and stays down (its node died) until the other replica holds the lease. During that
// election window the surviving replica keeps admitting and must hand over its own Metal3Data's
// claims without the lease, so their time-to-Ready stays what it is without any fault; the
// Metal3Data the dead leader admitted and had not handed over yet are handed over by the new
// leader.

const (
	// The stream creates leaderLossBatch Metal3Data at once every leaderLossInterval, as CAPM3's
	// template controller does for a scale-up: concurrent admissions make the API server open
	// several connections to the load balancer, which spreads them over both replicas (one
	// admission at a time would keep one connection, to one replica).
	leaderLossInterval = time.Second
	leaderLossBatch    = 3
	// leaderLossBefore is how long the stream runs with both replicas before the kill.
	leaderLossBefore = 3 * time.Second
	// leaderLossAfter is how long the stream goes on once the new leader holds the lease.
	leaderLossAfter = 2 * time.Second
	// killedBeforeHandOver is how many Metal3Data the leader admits, with its hand-overs held,
	// before it is killed; at most holdLimit is waited for them.
	killedBeforeHandOver = 2
	holdLimit            = 10 * time.Second
	// readyTimeout bounds every wait for a Metal3Data to be Ready.
	readyTimeout = 90 * time.Second
)

// timed is an admission with the moment its create was sent and when it was Ready.
type timed struct {
	m       *fixtures.Machine
	a       admission
	sent    time.Time
	readyIn time.Duration
	ready   bool
	// admitter is the replica whose tap created its claims; -1 when no replica did (the admission
	// failed open) or both did.
	admitter int
}

func (x *timed) claimKeys() []string {
	var keys []string
	for _, pool := range poolsOf(x.m.Data.Spec.Template.Name) {
		keys = append(keys, x.m.Data.Namespace+"/"+x.m.Data.Name+"-"+pool)
	}
	return keys
}

// whoAdmitted finds the replica whose tap created claims of x (with claims created after the
// admission answers, a replica that dies in between creates none, and CAPM3 may create one
// first); -1 when none or both did.
func whoAdmitted(taps []*apiTap, x *timed) int {
	who := -1
	for i, t := range taps {
		if slices.ContainsFunc(x.claimKeys(), func(key string) bool { _, ok := t.created(key); return ok }) {
			if who >= 0 {
				return -1
			}
			who = i
		}
	}
	return who
}

// leaseHolder reads the webhook's lease: its holder and when it was acquired.
func leaseHolder(ctx context.Context) (string, time.Time, error) {
	ns, _ := cp.ServiceAccount()
	lease := &coordinationv1.Lease{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: harness.LeaderElectionID}, lease); err != nil {
		return "", time.Time{}, err
	}
	holder, acquired := "", time.Time{}
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	if lease.Spec.AcquireTime != nil {
		acquired = lease.Spec.AcquireTime.Time
	}
	return holder, acquired, nil
}

// waitLeader waits until a running replica reports that it leads, and returns it.
func waitLeader(ctx context.Context, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		if i, ok := cp.Replicas.Leader(); ok {
			return i, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no replica leads after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// measure admits x's Metal3Data, waits until it is Ready and times it.
func (sc *scenario) measure(ctx context.Context, ready *readiness, x *timed) {
	x.sent = time.Now()
	x.a = sc.admit(ctx, x.m.Data)
	if x.a.err != nil {
		return
	}
	if at, ok := ready.waitReady(ctx, x.a.uid, x.m.Data.Namespace, x.m.Data.Spec.Claim.Name, readyTimeout); ok {
		x.ready, x.readyIn = true, at.Sub(x.sent)
	}
}

// durations returns the times-to-Ready of xs (those that were Ready).
func durations(xs []*timed) []time.Duration {
	var out []time.Duration
	for _, x := range xs {
		if x.ready {
			out = append(out, x.readyIn)
		}
	}
	return out
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

// noiseMargin is how far the election window's time-to-Ready may exceed the idle figures: four
// times the idle spread (slowest minus fastest idle Metal3Data), and at least twice the idle
// median. The window has several times as many Metal3Data as the idle reference, a few admitted
// at once, so its maximum is drawn from more tries, and the load of a 2-core machine changes
// within a minute: the window's maximum has exceeded the idle maximum by four times the idle
// spread, by a few milliseconds. Hence a floor of minMargin. A hand-over that waits for the lease costs 15 s or more (the lease
// expires, then CAPM3's requeue), one left to another replica's take-over its delay (5 s by
// default): both far beyond the margin.
func noiseMargin(idle []time.Duration) time.Duration {
	return max(4*(percentile(idle, 1)-percentile(idle, 0)), 2*percentile(idle, 0.5), minMargin)
}

// minMargin is a tenth of the take-over's default delay, the least a Metal3Data the surviving
// replica admitted but did not hand over itself would wait.
const minMargin = 500 * time.Millisecond

func runLeaderLoss(ctx context.Context, sc *scenario) {
	sc.webhookFaults = true
	rs := cp.Replicas
	exitsBefore := rs.Counts().Crashes

	// Each replica reaches the API server through its own tap, which tells who admitted and who
	// handed over what.
	var taps []*apiTap
	for i := range rs.Len() {
		t, err := startAPITap(fmt.Sprintf("tap-%s-%d", sc.ns(), i), i, rs.DefaultKubeconfig())
		if err != nil {
			sc.t.Fatal(err)
		}
		taps = append(taps, t)
	}
	defer func() {
		reconnectDirectly(ctx, sc.t)
		sc.touch()
		for _, t := range taps {
			t.close()
		}
	}()
	for i := range rs.Len() {
		rs.StopReplica(i)
		rs.SetKubeconfig(i, taps[i].kubeconfig)
		if err := rs.Restart(i); err != nil {
			sc.t.Fatal(err)
		}
	}
	ensureReplicas(ctx, sc.t)
	if _, err := waitLeader(ctx, 60*time.Second); err != nil {
		sc.t.Fatal(err)
	}

	// Only Metal3 IPPools: the in-cluster IPAM provider's one claim at a time would make the
	// stream slower than the idle reference for reasons of its own.
	streamMax := leaderLossBatch * (int((leaderLossBefore+holdLimit+25*time.Second+leaderLossAfter)/leaderLossInterval) + 1)
	worlds, machines := sc.worlds(ctx, 2*size.leaderIdle+streamMax, size.perNamespace, 0)
	var namespaces []string
	for _, w := range worlds {
		namespaces = append(namespaces, w.ns)
	}
	ready, err := watchReadiness(ctx, namespaces)
	if err != nil {
		sc.t.Fatal(err)
	}
	defer ready.stop()
	var xs []*timed
	for _, m := range machines {
		xs = append(xs, &timed{m: m, admitter: -1})
	}
	idleBefore, idleAfter, streamed := xs[:size.leaderIdle], xs[size.leaderIdle:2*size.leaderIdle], xs[2*size.leaderIdle:]

	// The idle reference: one at a time, no fault; half before the leader loss and half after,
	// so that a change of the machine's load during the scenario shows in the idle spread.
	idle := func(batch []*timed) {
		for _, x := range batch {
			sc.measure(ctx, ready, x)
			time.Sleep(200 * time.Millisecond)
		}
	}
	idle(idleBefore)

	// The API server keeps its connections to the webhook's load balancer, so admissions go
	// mostly to one replica, the one the idle reference just reached. For the leader to die
	// with Metal3Data of its own, that replica must lead: when it does not, the leader is
	// restarted gracefully (it hands the lease on at once) before the stream.
	killed, err := waitLeader(ctx, 60*time.Second)
	if err != nil {
		sc.t.Fatal(err)
	}
	if served := whoAdmitted(taps, idleBefore[len(idleBefore)-1]); served >= 0 && served != killed {
		rs.StopReplica(killed)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if i, ok := rs.Leader(); ok && i == served {
				break
			}
		}
		if err := rs.Restart(killed); err != nil {
			sc.t.Fatal(err)
		}
		ensureReplicas(ctx, sc.t)
		sc.figuref("the idle reference reached replica %d, which did not lead: replica %d, the leader, was restarted gracefully first, and replica %d took the lease", served, killed, served)
		if killed, err = waitLeader(ctx, 60*time.Second); err != nil {
			sc.t.Fatal(err)
		}
	}
	survivor := 1 - killed
	killedHolder, _, err := leaseHolder(ctx)
	if err != nil {
		sc.t.Fatal(err)
	}

	// The stream, until told to stop.
	stop := make(chan struct{})
	var streamDone sync.WaitGroup
	var sentMu sync.Mutex
	sentCount := 0
	streamDone.Go(func() {
		// One create every interval, each in its own goroutine: a slow create or a long wait for
		// Ready does not hold the next ones back.
		var wg sync.WaitGroup
		defer wg.Wait()
		for batch := range slices.Chunk(streamed, leaderLossBatch) {
			select {
			case <-stop:
				return
			default:
			}
			sentMu.Lock()
			sentCount += len(batch)
			sentMu.Unlock()
			for _, x := range batch {
				wg.Go(func() { sc.measure(ctx, ready, x) })
			}
			time.Sleep(leaderLossInterval)
		}
	})

	time.Sleep(leaderLossBefore)
	// The leader's hand-overs are held from here on, so that it dies with Metal3Data admitted and
	// not handed over, as when it dies between the two.
	holdFrom := time.Now()
	taps[killed].holdHandOvers()
	for wait := time.Now().Add(holdLimit); time.Now().Before(wait); time.Sleep(50 * time.Millisecond) {
		if taps[killed].createdSince(holdFrom) >= killedBeforeHandOver*len(poolsOf(mastersTemplate)) {
			break
		}
	}
	killAt := time.Now()
	rs.Kill(killed)
	sc.touch()
	sc.addFault("SIGKILL of the leader (down until the other replica leads)", 1)
	taps[killed].stopHolding()

	// The election window ends when the survivor holds the lease.
	var electedAt, acquired time.Time
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		holder, at, err := leaseHolder(ctx)
		if err == nil && holder != "" && holder != killedHolder {
			electedAt, acquired = time.Now(), at
			break
		}
		if time.Now().After(deadline) {
			sc.t.Errorf("the surviving replica did not take the lease within 60 s of the kill")
			electedAt = time.Now()
			break
		}
	}
	time.Sleep(leaderLossAfter)
	close(stop)
	streamDone.Wait()
	if err := rs.Restart(killed); err != nil {
		sc.t.Error(err)
	}
	ensureReplicas(ctx, sc.t)
	idle(idleAfter)
	sc.touch()

	// Who admitted what, from the taps.
	for _, x := range xs {
		x.admitter = whoAdmitted(taps, x)
	}
	var idleAll, window, killedOrphans, killedHanded, failedOpen, unknown, others []*timed
	idleAll = append(append(idleAll, idleBefore...), idleAfter...)
	sentMu.Lock()
	streamed = streamed[:sentCount]
	sentMu.Unlock()
	for _, x := range streamed {
		switch {
		case x.a.err != nil:
		case !x.a.answered():
			failedOpen = append(failedOpen, x)
		case x.admitter < 0:
			unknown = append(unknown, x)
		case x.admitter == survivor && !x.sent.Before(killAt) && x.sent.Before(electedAt):
			window = append(window, x)
		case x.admitter == killed && x.sent.Before(killAt):
			handed := true
			for _, key := range x.claimKeys() {
				if _, ok := taps[killed].handedOver(key); !ok {
					handed = false
				}
			}
			if handed {
				killedHanded = append(killedHanded, x)
			} else {
				killedOrphans = append(killedOrphans, x)
			}
		default:
			others = append(others, x)
		}
	}

	// The killed replica's Metal3Data that it did not hand over: handed over since, by whom.
	orphaned := namedCount{name: "Metal3Data admitted by the killed leader, not handed over by it, whose claims the new leader did not hand over"}
	var handOverAfterKill []time.Duration
	byReplica := make([]int, rs.Len())
	for _, x := range killedOrphans {
		// The last of its claims to be handed over, and by whom (the killed replica only
		// after its restart, through the same tap).
		var last time.Time
		by := -1
		for _, key := range x.claimKeys() {
			for i, t := range taps {
				if at, ok := t.handedOver(key); ok && at.After(last) {
					last, by = at, i
				}
			}
		}
		if owned, problem := ownedBy(ctx, x); !owned {
			orphaned.addf("%s: %s", x.a, problem)
			continue
		}
		if by >= 0 {
			handOverAfterKill = append(handOverAfterKill, last.Sub(killAt))
			byReplica[by]++
		}
	}
	if len(killedOrphans) == 0 {
		orphaned.addf("the leader admitted no Metal3Data with its hand-overs held in %v before the kill: nothing to check", holdLimit)
	}
	notReady := namedCount{name: "measured Metal3Data not Ready within " + readyTimeout.String()}
	for _, x := range slices.Concat(idleAll, window, killedOrphans, killedHanded) {
		if !x.ready {
			notReady.addf("%s, admitted by replica %d", x.a, x.admitter)
		}
	}

	idleTimes, windowTimes := durations(idleAll), durations(window)
	margin := noiseMargin(idleTimes)
	idleP50, idleMax := percentile(idleTimes, 0.5), percentile(idleTimes, 1)
	winP50, winMax := percentile(windowTimes, 0.5), percentile(windowTimes, 1)
	slow := namedCount{name: "election-window time-to-Ready (p50, max) beyond the idle figures plus the noise margin"}
	if len(windowTimes) < 5 {
		slow.addf("only %d Metal3Data admitted by the surviving replica during the election window were Ready: too few to compare", len(windowTimes))
	} else {
		if winP50 > idleP50+margin {
			slow.addf("p50 %v > idle p50 %v + margin %v", ms(winP50), ms(idleP50), ms(margin))
		}
		if winMax > idleMax+margin {
			var slowest []string
			for _, x := range window {
				if x.ready && x.readyIn > idleMax+margin {
					slowest = append(slowest, fmt.Sprintf("%s Ready in %v", x.a.key, ms(x.readyIn)))
				}
			}
			slow.addf("max %v > idle max %v + margin %v: %v", ms(winMax), ms(idleMax), ms(margin), slowest)
		}
	}
	sc.extra = append(sc.extra, slow, orphaned, notReady)

	sc.figuref("replica %d led and was killed %v into the stream (its hand-overs held for the last %v); replica %d held the lease %v after the kill (lease acquired %v after it): the election window",
		killed, ms(killAt.Sub(streamed[0].sent)), ms(killAt.Sub(holdFrom)), survivor, ms(electedAt.Sub(killAt)), ms(acquired.Sub(killAt)))
	sc.figuref("time-to-Ready (create sent to Ready with its secrets rendered), idle reference, %d Metal3Data one at a time (half before the kill, half after): p50 %v, min %v, max %v",
		len(idleTimes), ms(idleP50), ms(percentile(idleTimes, 0)), ms(idleMax))
	sc.figuref("time-to-Ready of the %d Metal3Data admitted by the surviving replica during the election window: p50 %v, max %v; allowed: p50 %v, max %v (the idle figures plus a noise margin of %v: four times the idle spread, at least twice the idle p50 and %v)",
		len(windowTimes), ms(winP50), ms(winMax), ms(idleP50+margin), ms(idleMax+margin), ms(margin), minMargin)
	orphanTimes := durations(killedOrphans)
	sc.figuref("the killed leader admitted %d Metal3Data of the stream: %d handed over by itself, %d not (it died first); those were handed over %v after the kill (p50; max %v), %d by replica %d, and were Ready in p50 %v, max %v",
		len(killedHanded)+len(killedOrphans), len(killedHanded), len(killedOrphans),
		ms(percentile(handOverAfterKill, 0.5)), ms(percentile(handOverAfterKill, 1)), byReplica[survivor], survivor,
		ms(percentile(orphanTimes, 0.5)), ms(percentile(orphanTimes, 1)))
	var perReplica []string
	for i := range taps {
		n := 0
		for _, x := range streamed {
			if x.admitter == i && x.sent.Before(killAt) {
				n++
			}
		}
		perReplica = append(perReplica, fmt.Sprintf("replica %d: %d", i, n))
	}
	sc.figuref("%d Metal3Data streamed (%d at once every %v): %d admitted by the survivor in the window, %d by the killed leader, %d unanswered (the webhook call failed open at the kill; CAPM3 created their claims), %d answered but no replica created their claims, %d others (by the survivor before the kill, or after the window); admitted before the kill: %s; %d hand-over patches of the leader held",
		len(streamed), leaderLossBatch, leaderLossInterval, len(window), len(killedHanded)+len(killedOrphans), len(failedOpen), len(unknown), len(others), strings.Join(perReplica, ", "), taps[killed].held.Load())
	sc.figuref("replica exits nobody caused (a lost lease, say; restarted after 1 s): %d", rs.Counts().Crashes-exitsBefore)
	sc.table = []string{
		"| time-to-Ready (create sent to Ready, secrets rendered) | Metal3Data | p50 | max |",
		"|---|---:|---:|---:|",
		fmt.Sprintf("| idle reference, one at a time, no fault | %d | %v | %v |", len(idleTimes), ms(idleP50), ms(idleMax)),
		fmt.Sprintf("| admitted by the surviving replica during the election window (%v) | %d | %v | %v |", electedAt.Sub(killAt).Round(100*time.Millisecond), len(windowTimes), ms(winP50), ms(winMax)),
		fmt.Sprintf("| allowed: idle + noise margin %v | | %v | %v |", ms(margin), ms(idleP50+margin), ms(idleMax+margin)),
		fmt.Sprintf("| admitted by the killed leader, not handed over by it (the new leader did) | %d | %v | %v |", len(orphanTimes), ms(percentile(orphanTimes, 0.5)), ms(percentile(orphanTimes, 1))),
	}
	for _, line := range sc.table {
		sc.t.Log(line)
	}
	sc.admissionFigures()
}

// ownedBy tells whether every claim of x is owned by its Metal3Data, waiting for it at most
// readyTimeout (the new leader hands over after the lease and its hand-over delay).
func ownedBy(ctx context.Context, x *timed) (bool, string) {
	deadline := time.Now().Add(readyTimeout)
	for {
		problem := ""
		for _, pool := range poolsOf(x.m.Data.Spec.Template.Name) {
			obj := claimObject(x.m.Data.Namespace, x.m.Data.Name+"-"+pool, pool)
			if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, obj); err != nil {
				problem += fmt.Sprintf("%s: %v; ", obj.GetName(), err)
			} else if ownerUID(obj, "Metal3Data") != x.a.uid {
				problem += fmt.Sprintf("%s: %s; ", obj.GetName(), describe(obj))
			}
		}
		if problem == "" {
			return true, ""
		}
		if time.Now().After(deadline) {
			return false, problem
		}
		time.Sleep(200 * time.Millisecond)
	}
}
