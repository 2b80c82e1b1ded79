package integration

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// TestScopes runs the webhook scoped as CAPM3's --namespace and --watch-filter scope CAPM3, beside
// Metal3Data of another scope, with the webhook configuration of config/default, which sends it
// every Metal3Data: in its scope it preallocates; in the other, CAPM3 creates every claim, as without
// the webhook, and the webhook's caches hold nothing of it.
func TestScopes(t *testing.T) {
	ctx := context.Background()
	startIPAMs(t)
	served, other, filtered := newWorld(t, "scope-a", 2, 51), newWorld(t, "scope-b", 2, 52), newWorld(t, "scope-c", 2, 53)
	capm3, err := stack.StartCAPM3(ctx, cp.Config, stack.Options{Templates: true, Namespaces: []string{served.ns, other.ns, filtered.ns}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = capm3.Stop() }()
	defer func() {
		// The other tests of this package expect the webhook unscoped.
		cp.StopWebhook()
		if err := cp.StartWebhook(ctx); err != nil {
			t.Fatal(err)
		}
	}()

	restartWebhook(t, "--namespace="+served.ns)
	served.createIdle(t)
	other.createIdle(t)
	checkScoped(t, capm3, served.machines, other.machines)
	if cached := scrape(t, `ip_preallocator_cached_objects{content="metadata",kind="Metal3Data"}`); cached != float64(len(served.machines)) {
		t.Errorf("the webhook scoped to %s caches %v Metal3Data, want its %d", served.ns, cached, len(served.machines))
	}

	// The watch filter: CAPM3's template controller copies the Metal3DataClaim's labels to the
	// Metal3Data, and CAPM3 the Metal3Data's to its claims.
	restartWebhook(t, "--watch-filter=plane-a")
	labelled, unlabelled := filtered.machines[:1], filtered.machines[1:]
	for _, m := range labelled {
		if m.DataClaim.Labels == nil {
			m.DataClaim.Labels = map[string]string{}
		}
		m.DataClaim.Labels[clusterv1.WatchLabel] = "plane-a"
	}
	filtered.createIdle(t)
	checkScoped(t, capm3, labelled, unlabelled)
	if cached := scrape(t, `ip_preallocator_cached_objects{content="metadata",kind="Metal3Data"}`); cached != float64(len(labelled)) {
		t.Errorf("the webhook filtered to plane-a caches %v Metal3Data, want %d", cached, len(labelled))
	}
	for _, w := range []*world{served, other, filtered} {
		w.deleteAll(t)
	}
}

func restartWebhook(t *testing.T, args ...string) {
	t.Helper()
	cp.StopWebhook()
	if err := cp.StartWebhook(context.Background(), args...); err != nil {
		t.Fatal(err)
	}
}

// checkScoped: CAPM3 created every claim of the machines out of scope, and those in scope were
// preallocated, CAPM3 creating at most those the webhook left to it.
func checkScoped(t *testing.T, capm3 *stack.CAPM3, in, out []*fixtures.Machine) {
	t.Helper()
	inSummary, outSummary := summarize(capm3.Counter, in), summarize(capm3.Counter, out)
	t.Logf("in scope:     %s", inSummary)
	t.Logf("out of scope: %s", outSummary)
	if outSummary.claimsByCAPM3 != 3*len(out) {
		t.Errorf("CAPM3 created %d claims out of the webhook's scope, want all %d", outSummary.claimsByCAPM3, 3*len(out))
	}
	if 2*inSummary.claimsByCAPM3 > 3*len(in) {
		t.Errorf("CAPM3 created %d of %d claims in the webhook's scope", inSummary.claimsByCAPM3, 3*len(in))
	}
	if skipped := scrape(t, `ip_preallocator_admissions_total{outcome="skipped",reason="OutOfScope"}`); skipped != float64(len(out)) {
		t.Errorf("%v admissions skipped as out of scope, want %d", skipped, len(out))
	}
}

// scrape reads one sample of the webhook's metrics; 0 when absent.
func scrape(t *testing.T, sample string) float64 {
	t.Helper()
	text, err := cp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	return 0
}
