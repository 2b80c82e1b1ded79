package faults

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// gracePeriod is the replicas' --release-grace-period: short, so that "the grace period plus
// 30 s" after a scenario stays short.
const gracePeriod = 10 * time.Second

// settleAfterGrace is how long after the grace period every invariant must hold, or how long the
// controllers may go without progress towards that (see settle).
const settleAfterGrace = 30 * time.Second

// settleMax bounds how long after its last activity a scenario that keeps making progress may
// take for its invariants to hold.
const settleMax = 5 * time.Minute

// namespaceDeadline is how long a deleted namespace may take to disappear.
const namespaceDeadline = 30 * time.Second

// webhookArm is the watch filter (cluster.x-k8s.io/watch-filter) of the webhook's arm: the
// Metal3Data of its trials, and so their claims, carry it; a baseline's do not.
const webhookArm = "ip-preallocator-arm"

// namespaceStuck is when a namespace not gone counts as stuck rather than slow.
const namespaceStuck = 120 * time.Second

var (
	cp *harness.ControlPlane
	// capm3 counts what CAPM3 did; the suite reads claim creators from the claims themselves.
	capm3    *stack.CAPM3
	recorder *claimRecorder
	// controllerLinks is the API server as CAPM3 and the Metal3 IPAM reach it: a fault proxy that
	// injects nothing until a scenario sets its faults.
	controllerLinks *harness.FaultProxy
	size            sizes
	report          = &suiteReport{}
	logDir          string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if !needsControlPlane(flag.Lookup("test.run").Value.String()) {
		return m.Run()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	size = chooseSizes()
	dir, err := os.MkdirTemp("", "ip-preallocator-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logDir = dir
	if _, err := harness.LogControllersTo(filepath.Join(dir, "controllers.log")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	start := time.Now()
	report.started = start
	if err := setUp(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, "starting the fault suite's control plane:", err, "- logs in", dir)
		if cp != nil {
			cp.Stop()
		}
		return 1
	}
	report.setUp = time.Since(start)
	if path := os.Getenv("FAULTS_REPORT"); path != "" && os.Getenv("FAULTS_MERGE") != "" {
		said, err := report.resume(jsonBeside(path), size, productCommit(), os.Getenv("FAULTS_MORE") != "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "reading the earlier parts:", err)
			cp.Stop()
			return 1
		}
		fmt.Println(said)
	}
	fmt.Printf("fault suite (%s sizes): control plane, CAPM3, IPAMs and %d webhook replicas up in %v; logs in %s\n",
		size.name, cp.Replicas.Len(), report.setUp.Round(time.Millisecond), dir)
	code := m.Run()
	if path := os.Getenv("FAULTS_REPORT"); path != "" {
		if err := report.write(path, size, code == 0); err != nil {
			fmt.Fprintln(os.Stderr, "writing the report:", err)
			code = 1
		} else {
			fmt.Println("wrote", path)
		}
	}
	if code != 0 {
		fmt.Fprintln(os.Stderr, "logs of the replicas, the control plane and the controllers are in", dir)
	}
	cancel()
	cp.Stop()
	return code
}

func setUp(ctx context.Context, dir string) error {
	var err error
	cp, err = harness.Start(ctx, harness.Options{
		Dir:                 dir,
		GarbageCollector:    true,
		NamespaceController: true,
		Webhook:             true,
		WebhookReplicas:     2,
		// The replicas' informers and controllers see only the webhook's arm: stock's stays stock.
		WebhookArgs: []string{"--release-grace-period=" + gracePeriod.String(), "--watch-filter=" + webhookArm},
		// FAULTS_AUDIT=1 keeps the API server's audit log (who wrote what, when) for diagnosis.
		AuditLog: os.Getenv("FAULTS_AUDIT") != "",
	})
	if err != nil {
		return err
	}
	// A replica that exits on its own (lost leadership under API faults, say) comes back as the
	// kubelet would bring it back.
	cp.Replicas.Supervise(ctx, time.Second)
	if err := cp.StartInClusterIPAM(ctx); err != nil {
		return err
	}
	// CAPM3's and the IPAM's client limits are raised: the suite checks correctness, and at their
	// defaults the controllers would take minutes to work through the larger scenarios.
	opts := stack.Options{QPS: 500, Burst: 1000}
	ipamOpts := opts
	ipamOpts.CorrectedIPAM = ipamCorrections
	if controllerLinks, err = cp.StartFaultProxy("controllers-proxy", cp.Kubeconfig, 1); err != nil {
		return err
	}
	linksConfig, err := clientcmd.BuildConfigFromFlags("", controllerLinks.Kubeconfig)
	if err != nil {
		return err
	}
	if _, err := stack.StartIPAM(ctx, linksConfig, ipamOpts); err != nil {
		return err
	}
	if capm3, err = stack.StartCAPM3(ctx, linksConfig, opts); err != nil {
		return err
	}
	if err := startTemplateStandIn(ctx, cp.Config); err != nil {
		return err
	}
	if recorder, err = startClaimRecorder(ctx, cp.Config); err != nil {
		return err
	}
	if err := excludeStockNamespaces(ctx); err != nil {
		return err
	}
	return installGate(ctx)
}

// needsControlPlane tells whether the -run pattern selects TestFaults; the TestCheck tests of the
// suite's checks need none.
func needsControlPlane(run string) bool {
	top, _, _ := strings.Cut(run, "/")
	matched, err := regexp.MatchString(top, "TestFaults")
	return run == "" || err != nil || matched
}

// sizes are the scenario sizes of one run.
type sizes struct {
	name string
	// trials is how many times each scenario runs, on fresh namespaces; maxTrials, how many it may
	// run while a comparison with stock lacks the criterion's power.
	trials, maxTrials int
	// perNamespace is how many machines a namespace holds in the streaming scenarios: all of a
	// namespace's Metal3Data are released at once when it is deleted.
	perNamespace int
	// kills: Metal3Data streamed and SIGKILLs sent meanwhile.
	killData, kills int
	// gate: Metal3Data streamed, of which a share is rejected after our mutation.
	gateData int
	// recreate: names deleted and recreated, and how many times, over how many namespaces (each
	// one namespace more that can be late, so that the namespaces' comparison can fail).
	recreateNames, recreateRounds, recreateNamespaces int
	// namespaces: namespaces deleted while claims wait, machines in each, and Metal3Data whose
	// waiting claims are deleted by hand.
	deletedNamespaces, machinesPerNamespace, handDeleted int
	// apiFaults: Metal3Data streamed while the replicas' API requests meet faults.
	apiFaultData int
	// controllerLinkFaults: in api-faults, CAPM3's and the IPAM's requests meet the faults too.
	// Not at the quick sizes: CAPM3's backoff under failing requests then leaves a share of 30
	// Metal3Data not Ready at the check that varies too much between two trials to compare. Nor
	// with the corrected IPAM, whose run isolates what is the webhook's: there is no corrected
	// CAPM3, and its backoff under faults on its own link leaves Metal3Data not Ready, stock too.
	controllerLinkFaults bool
	// concurrent: Metal3Data created at once.
	concurrentData int
	// leader-loss: Metal3Data of the idle reference before the leader's kill, and as many after.
	leaderIdle int
}

func chooseSizes() sizes {
	s := sizes{
		name: "quick", trials: 1, maxTrials: 1, perNamespace: 50,
		killData: 40, kills: 6,
		gateData:      20,
		recreateNames: 4, recreateRounds: 3, recreateNamespaces: 2,
		deletedNamespaces: 2, machinesPerNamespace: 6, handDeleted: 8,
		apiFaultData:   30,
		concurrentData: 100,
		leaderIdle:     12,
	}
	if os.Getenv("FAULTS_FULL") != "" {
		// Five trials of each, both modes, more where the power asks: two hours or more on two cores.
		s = sizes{
			name: "full", trials: 5, maxTrials: 12, perNamespace: 100,
			killData: 100, kills: 10,
			gateData:      100,
			recreateNames: 40, recreateRounds: 6, recreateNamespaces: 4,
			deletedNamespaces: 4, machinesPerNamespace: 12, handDeleted: 24,
			apiFaultData: 100, controllerLinkFaults: !correctedIPAM(),
			concurrentData: 300,
			leaderIdle:     20,
		}
	}
	if n, err := strconv.Atoi(os.Getenv("FAULTS_TRIALS")); err == nil && n > 0 {
		s.trials = n
	}
	if n, err := strconv.Atoi(os.Getenv("FAULTS_MAX_TRIALS")); err == nil && n > 0 {
		s.maxTrials = n
	}
	s.maxTrials = max(s.maxTrials, s.trials)
	return s
}

// runSeed seeds every scenario's random choices: FAULTS_SEED, or else the clock. The page prints
// it; FAULTS_SEED=<it> repeats the run's choices.
var runSeed = func() uint64 {
	if n, err := strconv.ParseUint(os.Getenv("FAULTS_SEED"), 10, 64); err == nil {
		return n
	}
	return uint64(time.Now().UnixNano())
}()

// ipamCorrections are, with FAULTS_IPAM=corrected, the corrections of the test double that takes
// the Metal3 IPAM's place (stack.Options' CorrectedIPAM): FAULTS_IPAM_CORRECTIONS, by default those
// of the races the page names. The report lists them.
var ipamCorrections = func() stack.Corrections {
	if os.Getenv("FAULTS_IPAM") != "corrected" {
		return nil
	}
	cs, err := stack.ParseCorrections(cmp.Or(os.Getenv("FAULTS_IPAM_CORRECTIONS"), "named"))
	if err != nil {
		panic(fmt.Sprintf("FAULTS_IPAM_CORRECTIONS: %v", err))
	}
	return cs
}()

func correctedIPAM() bool { return len(ipamCorrections) > 0 }

// everyCorrection: the double makes every correction, so that what is left on the webhook's
// claims is the webhook's.
func everyCorrection() bool { return len(ipamCorrections) == len(stack.Describe) }
