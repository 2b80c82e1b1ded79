package faults

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// scenarioResult sums a scenario's trials.
type scenarioResult struct {
	// control: a baseline without the webhook; its counts are not asserted.
	control bool
	// compared: the counts held to the baseline's bound.
	compared    []string
	name, title string
	// failed: the scenario's test failed.
	failed   bool
	trials   int
	faults   []namedCount
	admitted int
	attempts int
	counts   []namedCount
	info     []namedCount
	// tables are the scenario's Markdown tables, one per trial.
	tables [][]string
	// perTrial are each trial's Metal3Data stored and invariant counts.
	perTrial []trialCounts
	// lost are the trials that failed before their counts were recorded.
	lost     []int
	duration time.Duration
}

type trialCounts struct {
	// load is the machine's load average (1 min) when the trial started and after its stream.
	load   string
	stored int
	counts map[string]int64
	// capacity is, per count, the most the trial could have had; absent: nothing bounds it.
	capacity map[string]int64
	// evidence is, per count, the first of its events.
	evidence map[string][]string
	// figures are what the trial measured besides its counts.
	figures []string
}

type suiteReport struct {
	mu      sync.Mutex
	setUp   time.Duration
	started time.Time
	results []*scenarioResult
	// parts and earlier are, when the run resumes earlier parts (resume), those parts and their
	// results; more, that this part's trials add to theirs (FAULTS_MORE) rather than replace them.
	parts   []partEvidence
	earlier []*scenarioResult
	more    bool
	// ran are the scenarios this part ran.
	ran map[string]bool
}

func sumInto(dst *[]namedCount, src []namedCount) {
	for _, c := range src {
		found := false
		for i := range *dst {
			if (*dst)[i].name == c.name {
				(*dst)[i].n += c.n
				(*dst)[i].evidence = append((*dst)[i].evidence, c.evidence...)
				found = true
			}
		}
		if !found {
			*dst = append(*dst, namedCount{name: c.name, n: c.n, evidence: append([]string(nil), c.evidence...)})
		}
	}
}

// resultOf is the result of sc's arm, new if none is yet; r.mu is held.
func (r *suiteReport) resultOf(sc *scenario, title string) *scenarioResult {
	if r.ran == nil {
		r.ran = map[string]bool{}
	}
	r.ran[baseName(sc.name)] = true
	for _, x := range r.results {
		if x.name == sc.name {
			return x
		}
	}
	res := &scenarioResult{name: sc.name, title: title, control: sc.control, compared: sc.compared}
	r.results = append(r.results, res)
	return res
}

// lose records that sc's trial failed before its counts were recorded.
func (r *suiteReport) lose(sc *scenario, title string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.resultOf(sc, title)
	res.lost = append(res.lost, sc.trial)
}

func (r *suiteReport) add(sc *scenario, title string, counts, info []namedCount, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.resultOf(sc, title)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.recorded = true
	res.trials++
	res.duration += took
	sumInto(&res.faults, sc.faults)
	sumInto(&res.counts, counts)
	sumInto(&res.info, info)
	trial := trialCounts{counts: map[string]int64{}, capacity: map[string]int64{}, evidence: map[string][]string{}, load: sc.load}
	for _, a := range sc.admissions {
		res.attempts++
		if a.err == nil {
			res.admitted++
			trial.stored++
		}
	}
	for _, c := range counts {
		trial.counts[c.name] += c.n
		if c.capacity > 0 {
			trial.capacity[c.name] += c.capacity
		}
		if len(c.evidence) > 0 {
			trial.evidence[c.name] = c.evidence
		}
	}
	trial.figures = slices.Clone(sc.figures)
	res.perTrial = append(res.perTrial, trial)
	if len(sc.table) > 0 {
		res.tables = append(res.tables, slices.Clone(sc.table))
	}
}

// finish settles the scenario, checks the invariants, deletes its namespaces, fails the test for
// every count that is not 0 (with its evidence) and records the trial for the report.
func (sc *scenario) finish(ctx context.Context, title string, started time.Time) {
	res := sc.settle(ctx)
	sc.shareFigure()
	if sc.control {
		for _, a := range sc.stored() {
			if len(a.recorded) > 0 {
				sc.t.Errorf("the baseline's Metal3Data %s was preallocated: the webhook was still called", a)
			}
		}
	}
	if sc.onDelete != nil {
		sc.onDelete()
	}
	slow, stuck, ipamStuck := sc.deleteNamespaces(ctx)
	ours, others := sc.leftBehind(ctx)
	if sc.onFinish != nil {
		sc.onFinish()
	}
	counts := append(append(res.counts, slow, stuck, ipamStuck, ours, others), sc.extra...)
	sc.t.Logf("%s: invariants:", sc.name)
	for _, c := range counts {
		sc.t.Logf("  %-62s %d", c.name, c.n)
	}
	for _, c := range res.info {
		sc.t.Logf("  (may be non-zero) %-45s %d", c.name, c.n)
	}
	for _, c := range counts {
		switch {
		case c.n == 0:
		case sc.control:
			sc.t.Logf("baseline without the webhook: %s: %d\n    %s", c.name, c.n, strings.Join(c.evidence, "\n    "))
		case slices.Contains(sc.compared, c.name):
			sc.t.Logf("held to stock's bound once every trial ran: %s: %d\n    %s", c.name, c.n, strings.Join(c.evidence, "\n    "))
		case c.name == invOursAddresses && !everyCorrection():
			// The IPAM's races reach the webhook's claims as CAPM3's; only the double with every
			// correction takes them all out, and there none may be left.
			sc.t.Logf("the IPAM's races, on claims the webhook created: %d\n    %s", c.n, strings.Join(c.evidence, "\n    "))
		default:
			sc.t.Errorf("%s: %d\n    %s", c.name, c.n, strings.Join(c.evidence, "\n    "))
		}
	}
	report.add(sc, title, counts, res.info, time.Since(started))
}

func (r *suiteReport) write(path string, s sizes, passed bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	e := r.evidenceOf(s, productCommit(), r.merged())
	var wall time.Duration
	for _, part := range e.Parts {
		took, _ := time.ParseDuration(part.Took)
		wall += took
	}
	for _, res := range r.results {
		passed = passed && !res.failed
	}
	p("# Reliability: the fault suite")
	p("")
	p("Written by `make faults` (the %s sizes of `test/faults`; trials of each scenario: %d, up to %d where a", s.name, s.trials, s.maxTrials)
	p("comparison with stock lacked the power) on %s, from the figures the run measured;", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	p("nothing here is typed by hand.")
	p("")
	if len(e.Parts) > 1 {
		p("The run ran in %d parts, one after the other on the same product code and seed (`make faults SCENARIOS=...`):", len(e.Parts))
		for _, part := range e.Parts {
			p("- %s, %s: %s", part.Started.UTC().Format("2006-01-02 15:04 UTC"), part.Took, strings.Join(part.Scenarios, ", "))
		}
		p("")
	}
	if missing := r.missing(); len(missing) > 0 {
		p("**Incomplete: not run yet: %s.**", strings.Join(missing, ", "))
		p("")
	}
	if correctedIPAM() {
		p("**Not the Metal3 IPAM as it is released: its place was taken by a test double, its code with")
		p("these changes and no other; what the released IPAM does besides, it did here too.**")
		p("")
		for _, c := range ipamCorrections {
			p("- `%s`: %s", c, stack.Describe[c])
		}
		p("")
	}
	p("## What it means")
	p("")
	for _, line := range r.meaning(passed) {
		p("%s", line)
	}
	p("")
	for _, line := range r.failureModes() {
		p("%s", line)
	}
	p("")
	if !correctedIPAM() {
		for _, line := range r.knownProblems() {
			p("%s", line)
		}
		p("")
	}
	p("## How it was measured")
	p("")
	p("Every random choice of the run follows from its seed, %d (`FAULTS_SEED=%d` repeats them); a", runSeed, runSeed)
	p("scenario's trial and its baseline's make the same choices.")
	p("")
	p("The suite runs etcd, kube-apiserver, kube-controller-manager (garbage collector, namespace")
	p("controller), CAPM3 v1.13.2's Metal3Data controller and the Metal3 IPAM in-process, the in-cluster")
	p("IPAM provider, and two webhook replicas under leader election behind a load balancer, with")
	p("`--release-grace-period=%v`. It creates the Metal3Data itself, to control names and timing.", gracePeriod)
	p("Each scenario streams Metal3Data while it injects its faults, checks the invariants within the")
	p("grace period plus %v of its last action (while problems keep falling, until they stop for %v,", settleAfterGrace, settleAfterGrace)
	p("at most %v), and deletes its namespaces. A baseline runs the same trial, faults and random", settleMax)
	p("choices in namespaces the webhook does not serve, beside the webhook's arm, or alternating with")
	p("it, nothing else running, where the scenario faults the replicas or measures latency.")
	p("Each Metal3Data has claims in two Metal3 IPPools; %.0f%% (%.0f%% in concurrent, all in recreate,", 100*inClusterShare, 100*concurrentInClusterShare)
	p("none in leader-loss) one in an InClusterIPPool too, whose provider handles one claim at a time.")
	p("A claim left to CAPM3 with a warning is one the webhook's log, its PreallocationIncomplete")
	p("Event or an admission warning names: not created in time, or CAPM3 created it first.")
	p("")
	p("The run took %v.", wall.Round(time.Second))
	p("")
	names := invariants
	header := "| scenario | trials | faults injected | Metal3Data admitted |"
	rule := "|---|---:|---:|---:|"
	for _, n := range names {
		header += " " + n + " |"
		rule += "---:|"
	}
	p("%s", header)
	p("%s", rule)
	for _, res := range r.results {
		if res.control {
			// Its counts compared to the webhook's are in the comparisons above.
			continue
		}
		var injected int64
		for _, f := range res.faults {
			injected += f.n
		}
		name := res.name
		row := fmt.Sprintf("| %s | %d | %d | %d |", name, res.trials, injected, res.admitted)
		for _, n := range names {
			row += fmt.Sprintf(" %d |", countOf(res.counts, n))
		}
		p("%s", row)
	}
	p("")
	for _, res := range r.results {
		if res.control {
			continue
		}
		p("## %s", res.name)
		p("")
		p("%s", res.title)
		p("")
		for _, line := range armLines(res, names) {
			p("%s", line)
		}
		p("%s", trialLoads(res))
		if base := baselineOf(r.results, res); base != nil {
			// Its other counts are the webhook's, which does not serve a baseline: the JSON has them.
			p("- its baseline (stock CAPM3 and the IPAMs alone, the same workload and faults): %d trials, %d Metal3Data stored%s",
				base.trials, base.admitted, lostTrials(base, "; "))
		}
		p("")
	}
	p("Each trial's counts, figures and first events: the JSON beside this page.")
	p("")
	p("## Machine")
	p("")
	for _, line := range machine() {
		p("- %s", line)
	}
	p("")
	p("## How to reproduce")
	p("")
	p("```sh")
	p("make faults                  # full sizes; writes this file (%v here, and the build)", wall.Round(time.Minute))
	p("make faults SCENARIOS='kills|api-faults'   # a part: those scenarios, merged with the earlier parts")
	p("make faults SCENARIOS=recreate MORE=1       # more trials of recreate, added to the earlier parts'")
	p("cd test && go test -count=1 -v -timeout 30m ./faults   # every scenario at the quick sizes (make test runs four)")
	p("cd test && FAULTS_FULL=1 FAULTS_TRIALS=1 go test -count=1 -v -timeout 60m ./faults   # one trial of each")
	p("make faults-corrected-ipam   # the same against the corrected IPAM test double")
	p("```")
	p("")
	p("Logs of every process (a replica's: `replica-<i>.log`) stay in the directory the run prints.")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return err
	}
	return writeEvidence(jsonBeside(path), e)
}

// invariants are every count the page gives, in its order.
var invariants = []string{invNotReady, invNoOwner, invTerminating, invOrphanAddress, invLeakedAddress, invDoubleAllocation, invOursAddresses, invCAPM3Claims, invUnanswered, invNamespaces, invNamespacesStuck, invNamespacesIPAM, invOursLeft, invOthersLeft}

// comparedToStock are the counts that stock CAPM3 and the IPAM show under churn on their own: with
// a baseline, the webhook's are held to stock's by the criterion (compareArms), not to 0.
var comparedToStock = []string{invNotReady, invTerminating, invOrphanAddress, invLeakedAddress, invDoubleAllocation, invNamespaces, invNamespacesStuck, invNamespacesIPAM, invOthersLeft}

// baselineOf is the stock baseline of a webhook scenario's result, or nil.
func baselineOf(results []*scenarioResult, res *scenarioResult) *scenarioResult {
	for _, x := range results {
		if x.control && x.name == res.name+"-stock" {
			return x
		}
	}
	return nil
}

// armOf is a count's trials in one arm, for compareArms.
func armOf(res *scenarioResult, name string) []armTrial {
	out := make([]armTrial, len(res.perTrial))
	for i, tr := range res.perTrial {
		out[i] = armTrial{events: tr.counts[name], stored: int64(tr.stored), capacity: tr.capacity[name]}
	}
	return out
}

// aboveStock lists the counts of res held to stock's that the criterion finds worse than stock's.
func aboveStock(res, stock *scenarioResult) []string {
	var above []string
	for _, n := range res.compared {
		if compareArms(armOf(res, n), armOf(stock, n)).verdict == verdictWorse {
			above = append(above, n)
		}
	}
	return above
}

// eachComparison calls f with each count of each scenario held to its baseline's, and the verdict.
func eachComparison(results []*scenarioResult, f func(res, stock *scenarioResult, name string, c comparison)) {
	for _, res := range results {
		stock := baselineOf(results, res)
		if res.control || stock == nil {
			continue
		}
		for _, n := range res.compared {
			f(res, stock, n, compareArms(armOf(res, n), armOf(stock, n)))
		}
	}
}

// undecided lists the comparisons that neither failed nor pass: too few trials, or unable to fail.
func undecided(results []*scenarioResult) []string {
	var out []string
	eachComparison(results, func(res, _ *scenarioResult, n string, c comparison) {
		if !c.passes() && c.verdict != verdictWorse {
			out = append(out, fmt.Sprintf("%s, %s: %v", res.name, n, c))
		}
	})
	return out
}

// againstBaselines is the report's table of the webhook's counts beside stock's, with the
// criterion's verdict on each; comparisons without an event in either arm are named after it.
func againstBaselines(results []*scenarioResult) []string {
	var lines []string
	none := map[string][]string{}
	var order []string
	eachComparison(results, func(res, stock *scenarioResult, n string, c comparison) {
		if c.verdict == verdictNoEvents {
			if none[n] == nil {
				order = append(order, n)
			}
			none[n] = append(none[n], res.name)
			return
		}
		if len(lines) == 0 {
			lines = []string{"| scenario | count | with the webhook | stock | per 1,000 Metal3Data, with / stock | verdict | z | power against 2× | dispersion |",
				"|---|---|---:|---:|---:|---|---:|---:|---:|"}
		}
		k, stockK := countOf(res.counts, n), countOf(stock.counts, n)
		verdict := string(c.verdict)
		switch {
		case c.verdict == verdictWorse:
			verdict = "**" + verdict + "**"
		case c.verdict == verdictUnderpowered && c.trialsNeeded > 0:
			verdict = fmt.Sprintf("too few trials (about %d each)", c.trialsNeeded)
		case c.verdict == verdictUnderpowered:
			verdict = "too few trials"
		}
		lines = append(lines, fmt.Sprintf("| %s | %s | %d of %d | %d of %d | %.1f / %.1f | %s | %.2f | %.0f%% | %.1f |", res.name, n, k, res.admitted, stockK, stock.admitted,
			1000*float64(k)/float64(max(res.admitted, 1)), 1000*float64(stockK)/float64(max(stock.admitted, 1)), verdict, c.z, 100*c.power, c.dispersion))
	})
	if len(order) > 0 {
		lines = append(lines, "", "No event in either arm (a pass), by count:")
		for _, n := range order {
			lines = append(lines, fmt.Sprintf("- %s: %s", n, strings.Join(none[n], ", ")))
		}
	}
	return lines
}

// leaks sums, over the webhook's scenarios or over the baselines, the stored Metal3Data and each
// count.
func (r *suiteReport) leaks(control bool) (stored int, counts map[string]int64) {
	counts = map[string]int64{}
	for _, res := range r.results {
		if res.control != control {
			continue
		}
		stored += res.admitted
		for _, c := range res.counts {
			counts[c.name] += c.n
		}
	}
	return stored, counts
}

// meaning is the report's opening: the verdict and what the webhook cost, beside stock.
func (r *suiteReport) meaning(passed bool) []string {
	var out []string
	open := undecided(r.results)
	others := "every other count was 0"
	if !everyCorrection() {
		others = "every other count but that of the IPAM's races on the webhook's claims (below) was 0"
	}
	switch {
	case passed && len(open) == 0:
		out = append(out,
			"**Every invariant held**: with the webhook, no count was worse than what stock CAPM3 and the",
			"IPAM show under the same churn (where a baseline ran), each comparison with the power the",
			"criterion asks, and "+others+".")
	case passed:
		out = append(out,
			"**No count was found worse than stock's, and "+others+"; but these comparisons could not",
			"tell, so the run does not show the webhook is not worse:**", "")
		for _, o := range open {
			out = append(out, "- "+o)
		}
	default:
		out = append(out, "**Some invariants did not hold**: the scenarios and counts are below, each with its evidence.")
	}
	out = append(out, "")
	stored, ours := r.leaks(false)
	stockStored, stock := r.leaks(true)
	out = append(out,
		"| over every trial | stored Metal3Data | "+strings.Join(comparedToStock, " | ")+" |",
		"|---|---:|"+strings.Repeat("---:|", len(comparedToStock)))
	row := func(name string, n int, counts map[string]int64) string {
		line := fmt.Sprintf("| %s | %d |", name, n)
		for _, c := range comparedToStock {
			line += fmt.Sprintf(" %d |", counts[c])
		}
		return line
	}
	out = append(out, row("with the webhook (every scenario)", stored, ours))
	if stockStored > 0 {
		out = append(out, row("stock CAPM3 and IPAM alone (the baselines)", stockStored, stock))
	}
	if !everyCorrection() {
		out = append(out, "", fmt.Sprintf("Of the webhook's row, %d were on claims the webhook created: the IPAM's races this run left", ours[invOursAddresses]),
			"in reach them as CAPM3's. Against the corrected double with every correction, none may be.")
	}
	out = append(out,
		"",
		"Baselines run where stock has an equivalent (not leader-loss); rejected-after-mutation is held",
		"to stock's only in the namespaces' deletion time. The criterion, fixed before the run: worse when",
		"a one-sided quasi-Poisson score test at 5% finds the webhook's rate per stored Metal3Data above",
		"stock's, with the trial-to-trial variance as its dispersion; a pass needs 80% power against a",
		"true 2x where either arm has events (\"too few trials\": not found worse, without that power,",
		"and about how many trials of each arm would give it). A comparison the webhook's arm could not",
		"fail even at its most (slow or stuck namespaces: one per namespace) says so and is no pass.",
		"")
	if lines := againstBaselines(r.results); len(lines) > 0 {
		out = append(out, lines...)
	}
	return out
}

// knownProblems names what stock CAPM3 and the Metal3 IPAM v1.13.2 do on their own, with the
// baselines' figures, what the webhook does about each, and how to reproduce them.
func (r *suiteReport) knownProblems() []string {
	stored, stock := r.leaks(true)
	return []string{
		"## Known problems of the Metal3 IPAM and CAPM3",
		"",
		fmt.Sprintf("Stock CAPM3 and the Metal3 IPAM v1.13.2 alone, over the %d Metal3Data of this run's baselines, left", stored),
		fmt.Sprintf("%d IPAddresses whose claim is gone, %d claims holding a second IPAddress, gave %d addresses to two claims, left %d Metal3Data not Ready,",
			stock[invOrphanAddress], stock[invLeakedAddress], stock[invDoubleAllocation], stock[invNotReady]),
		fmt.Sprintf("%d claims Terminating, %d namespaces gone only after 30 s and %d not gone in 120 s, %d of those held only by", stock[invTerminating], stock[invNamespaces],
			stock[invNamespacesStuck]+stock[invNamespacesIPAM], stock[invNamespacesIPAM]),
		"the IPAM's stranded IPAddresses and their pools. The causes, and what the webhook does so that it",
		"does not add to them:",
		"",
		"- **An IPAddress outlives its claim.** The IPAM creates a claim's IPAddress before it saves its",
		"  finalizer on the claim. A claim deleted in between can no longer take the finalizer, and the IPAM",
		"  never frees the address; its finalizer holds the namespace. `cd test && go test -v ./ipamrace`",
		"  reproduces it. The webhook keeps a deleted waiting claim of its own 10 s, and releases as the IPAM",
		"  would any IPAddress the IPAM made for it if it never finalized the claim, and both if it made two.",
		"- **One claim, two addresses.** The IPAM's two IPPool controllers both allocate for a claim when",
		"  their lists of claims differ; the status names the last, and the other address stays taken. The",
		"  webhook's leader releases the one the status does not name of a claim the webhook created, once",
		"  both are 10 s old, unless its Metal3Data is Ready (CAPM3 rendered one: both stay). The same race",
		"  can answer a claim with an address another claim holds; nothing outside the IPAM can undo that.",
		"- **A claim deleted while its Metal3Data lives stays Terminating**: CAPM3 keeps its finalizer while",
		"  the Metal3Data exists. The webhook removes it from its own deleted waiting claims (an IPClaim's",
		"  after the 10 s above, once no other IPClaim of its pool waits for the IPAM, at most",
		"  `--release-hold-limit`).",
		"- **A namespace takes more than 30 s to be deleted.** Deleted before its Metal3DataClaim, a",
		"  Metal3Data waits, with its claims, for an event to wake CAPM3, at most its 30 s requeue; the",
		"  namespace controller looks again about 8 s after a pass that found finalizers. The webhook's",
		"  waiting IPClaims add the 10 s and the busy-pool hold above. The evidence lists what a late",
		"  namespace still held.",
		"",
		"`make faults-corrected-ipam` runs this suite against a test double of the IPAM with the races of the",
		"first two problems taken out (docs/reliability-corrected-ipam.md lists each change it makes); what it",
		"still finds is the webhook's, CAPM3's, or the IPAM's other races, left in so that the webhook's",
		"handling of them runs.",
	}
}

// wantsTrial tells whether a scenario that has run done trials needs another: a comparison with
// stock lacks the criterion's power, and about size.maxTrials trials of each arm would give it. It
// reads the pooled rate and the dispersion, never which arm is ahead, so adding trials does not
// bias the verdict.
func (r *suiteReport) wantsTrial(name string, done int) bool {
	if done >= size.maxTrials {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	wants := false
	eachComparison(r.results, func(res, _ *scenarioResult, _ string, c comparison) {
		wants = wants || res.name == name && c.verdict == verdictUnderpowered && c.trialsNeeded > 0 && c.trialsNeeded <= size.maxTrials
	})
	return wants
}

// outcome records whether a scenario, with its baseline, failed.
func (r *suiteReport) outcome(name string, failed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, res := range r.results {
		if baseName(res.name) == name {
			res.failed = failed
		}
	}
}

// failuresAgainstStock lists every count compared to stock for which the scenario name, over all
// its trials, is above stock's bound.
func (r *suiteReport) failuresAgainstStock(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var failures []string
	for _, res := range r.results {
		if res.name != name || res.control {
			continue
		}
		stock := baselineOf(r.results, res)
		if stock == nil {
			return []string{name + " has no baseline in this run"}
		}
		for _, n := range aboveStock(res, stock) {
			failures = append(failures, fmt.Sprintf("%s: %s: %d in %d stored Metal3Data, against stock's %d in %d: %v", name, n,
				countOf(res.counts, n), res.admitted, countOf(stock.counts, n), stock.admitted, compareArms(armOf(res, n), armOf(stock, n))))
		}
	}
	return failures
}

// armLines are the page's lines of one arm of a scenario: what it did, and its counts that are not
// in the tables.
func armLines(res *scenarioResult, names []string) []string {
	var faults []string
	for _, f := range res.faults {
		faults = append(faults, fmt.Sprintf("%s %d", f.name, f.n))
	}
	out := []string{fmt.Sprintf("- trials: %d, %v in all; Metal3Data creates: %d, stored: %d; faults injected: %s",
		res.trials, res.duration.Round(time.Second), res.attempts, res.admitted, cmp.Or(strings.Join(faults, ", "), "none"))}
	for _, c := range res.counts {
		if !slices.Contains(names, c.name) {
			out = append(out, fmt.Sprintf("- %s (must be 0): %d", c.name, c.n))
		}
	}
	var info []string
	for _, c := range res.info {
		info = append(info, fmt.Sprintf("%s: %d", cmp.Or(infoLabels[c.name], c.name), c.n))
	}
	if len(info) > 0 {
		out = append(out, "- "+strings.Join(info, "; "))
	}
	if lost := lostTrials(res, ""); lost != "" {
		out = append(out, "- "+lost)
	}
	return out
}

// infoLabels are the page's short names of the webhook arm's counts that are not asserted; "How
// it was measured" says what a warning is.
var infoLabels = map[string]string{
	infoRecorded:   "claims CAPM3 created while the webhook was up, recorded by it",
	infoWarned:     "claims left to CAPM3 with a warning, which CAPM3 then created as designed",
	infoCAPM3Down:  "claims created by CAPM3 while the webhook was down",
	infoKilled:     "claims CAPM3 created because the replica that answered was SIGKILLed before creating them",
	infoUnanswered: "admissions unanswered (a replica or its API faulted)",
}

// lostTrials names the trials of an arm that failed before their counts were recorded, after
// sep; "" when there are none.
func lostTrials(res *scenarioResult, sep string) string {
	if len(res.lost) == 0 {
		return ""
	}
	trials := make([]string, len(res.lost))
	for i, n := range res.lost {
		trials[i] = strconv.Itoa(n)
	}
	return fmt.Sprintf("%strials lost, not counted (they failed before their counts were recorded; the run's log says why): %s", sep, strings.Join(trials, ", "))
}

// trialLoads is the page's line of the load during each trial; a baseline's trial runs beside or
// right after the webhook's.
func trialLoads(res *scenarioResult) string {
	loads := make([]string, len(res.perTrial))
	for i, tr := range res.perTrial {
		loads[i] = tr.load
	}
	return "- load (1 min) of each trial, at its start → after its stream: " + strings.Join(loads, ", ")
}

func countOf(cs []namedCount, name string) int64 {
	for _, c := range cs {
		if c.name == name {
			return c.n
		}
	}
	return 0
}

// machine describes where the run ran.
func machine() []string {
	var out []string
	model := ""
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	out = append(out, fmt.Sprintf("%d CPUs (%s), %s", runtime.NumCPU(), model, memTotal()))
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		out = append(out, fmt.Sprintf("%s/%s, Linux %s, %s", runtime.GOOS, runtime.GOARCH, strings.TrimSpace(string(data)), runtime.Version()))
	}
	versions := []string{}
	for _, bin := range []string{"kube-apiserver", "etcd", "cluster-api-ipam-provider-in-cluster"} {
		if data, err := os.ReadFile(filepath.Join(cp.Root, "bin", "."+bin+".version")); err == nil {
			versions = append(versions, bin+" "+strings.TrimSpace(string(data)))
		}
	}
	out = append(out, strings.Join(versions, ", ")+", CAPM3 and ip-address-manager v1.13.2")
	// The commit's date, not its hash: the page is read next to the code, whose history says which.
	if _, committed := harness.ProductCommit(cp.Root); committed != "" {
		out = append(out, "the product code as last changed on "+committed)
	}
	return out
}

func memTotal() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "MemTotal:") {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "MemTotal:")), "%d", &kb); err != nil {
				return ""
			}
			return fmt.Sprintf("%.1f GiB memory", float64(kb)/(1<<20))
		}
	}
	return ""
}

// productCommit is the last commit that changed the product, marked when the product has
// uncommitted changes.
func productCommit() string {
	commit, _ := harness.ProductCommit(cp.Root)
	return commit
}
