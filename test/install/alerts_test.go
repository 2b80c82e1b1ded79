package install

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
)

// rulesFile is the one source of the alerts docs/metrics.md describes.
const rulesFile = "config/components/prometheus-rules/rules.yaml"

// The alerts the rules file must hold, each tested below.
var alertNames = []string{
	"IPPreallocatorNotCalled", "IPPreallocatorCAPM3Incompatible", "IPPreallocatorLeavesClaimsToCAPM3",
	"IPPreallocatorValidationWebhookDown", "IPPreallocatorNoLeader", "IPPreallocatorClaimsWaitingTooLong",
}

// oldNotCalled is the README's alert before the rules file: it fired for a scoped install whenever
// other namespaces created Metal3Data, and never while the webhook's metrics were absent.
const oldNotCalled = `sum(rate(apiserver_request_total{resource="metal3datas",verb="POST"}[15m])) > 0
    and sum(rate(controller_runtime_webhook_requests_total{webhook="/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate"}[15m])) == 0`

// prometheusRule is the part of a monitoring.coreos.com/v1 PrometheusRule the rules file uses.
type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

type ruleGroup struct {
	Name  string      `json:"name"`
	Rules []alertRule `json:"rules"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`

	hold time.Duration
}

// loadRules reads the rules file strictly, as the PrometheusRule's schema has it, and checks its
// rules as Prometheus loads them.
func loadRules(t *testing.T) (prometheusRule, []alertRule) {
	t.Helper()
	data := repoFile(t, rulesFile)
	var pr prometheusRule
	if err := yaml.UnmarshalStrict(data, &pr); err != nil {
		t.Fatalf("%s is not a PrometheusRule: %v", rulesFile, err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("%s is a %s %s, want a monitoring.coreos.com/v1 PrometheusRule", rulesFile, pr.APIVersion, pr.Kind)
	}
	// Prometheus's own loader: expressions, durations, label names, annotation templates.
	groups, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs := rulefmt.Parse(groups, false, model.LegacyValidation); len(errs) > 0 {
		t.Fatalf("%s: Prometheus rejects its rules: %v", rulesFile, errs)
	}
	var rules []alertRule
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if _, err := parser.ParseExpr(r.Expr); err != nil {
				t.Fatalf("%s: %s: %v", rulesFile, r.Alert, err)
			}
			d, err := model.ParseDuration(r.For)
			if err != nil || d <= 0 {
				t.Errorf("%s: %s has no for: duration (%q)", rulesFile, r.Alert, r.For)
			}
			r.hold = time.Duration(d)
			rules = append(rules, r)
		}
	}
	return pr, rules
}

// TestAlertRules checks the rules file as a file: a PrometheusRule with exactly the alerts tested
// here, each with a for:, a severity and annotations that say what to do; docs/metrics.md points at it
// and names the same alerts; make release PROMETHEUS_RULES=true adds it as it is, and only then.
func TestAlertRules(t *testing.T) {
	pr, rules := loadRules(t)
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("%s: severity %q", r.Alert, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: no summary or description", r.Alert)
		}
		if d := r.Annotations["description"]; !strings.Contains(d, "README.md") && !strings.Contains(d, "docs/troubleshooting.md") {
			t.Errorf("%s: the description points at neither README.md nor docs/troubleshooting.md", r.Alert)
		}
	}
	if !slices.Equal(names, alertNames) {
		t.Errorf("%s alerts %v, want %v", rulesFile, names, alertNames)
	}

	// docs/metrics.md: a link to the file, how to enable it, a table of the same alerts, and no copy.
	section := string(repoFile(t, metricsPage))
	for _, want := range []string{"(../" + rulesFile + ")", "PROMETHEUS_RULES=true"} {
		if !strings.Contains(section, want) {
			t.Errorf("%s lacks %s", metricsPage, want)
		}
	}
	if strings.Contains(section, "alert:") || strings.Contains(section, "expr:") {
		t.Errorf("%s copies rules: %s is their one source", metricsPage, rulesFile)
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(IPPreallocator\\w+)` \\|").FindAllStringSubmatch(section, -1) {
		listed = append(listed, m[1])
	}
	if !slices.Equal(listed, names) {
		t.Errorf("%s's alert table lists %v, the rules file %v", metricsPage, listed, names)
	}

	// The release: PROMETHEUS_RULES=true adds the file's PrometheusRule, into the install's
	// namespace; the default release has none.
	const img, version = "registry.example.com/metal3/ip-preallocator:v9.8.7", "v9.8.7"
	for _, on := range []bool{false, true} {
		raw, err := os.ReadFile(release(t, img, version, fmt.Sprintf("PROMETHEUS_RULES=%v", on)))
		if err != nil {
			t.Fatal(err)
		}
		var found []*unstructured.Unstructured
		for _, u := range decode(t, raw) {
			if u.GetKind() == "PrometheusRule" {
				found = append(found, u)
			}
		}
		switch {
		case !on && len(found) > 0:
			t.Errorf("the default release has %d PrometheusRules", len(found))
		case on && len(found) != 1:
			t.Errorf("PROMETHEUS_RULES=true: %d PrometheusRules, want 1", len(found))
		case on:
			u := found[0]
			spec, _ := yaml.Marshal(u.Object["spec"])
			want, _ := yaml.Marshal(pr.Spec)
			if u.GetNamespace() != namespace || !bytes.Equal(spec, want) || u.GetLabels()["app.kubernetes.io/part-of"] != "ip-preallocator" {
				t.Errorf("PROMETHEUS_RULES=true renders PrometheusRule %s/%s (labels %v), not the file's in %s", u.GetNamespace(), u.GetName(), u.GetLabels(), namespace)
			}
		}
	}
}

// webhookJob is the job label Prometheus gives the webhook's series with config/prometheus's
// ServiceMonitor; apiserverJob kube-prometheus's for the API server's.
const (
	webhookJob   = "ip-preallocator-controller-manager-metrics-service"
	apiserverJob = "apiserver"
)

// target is one scrape of one target, as Prometheus stores it: the target's labels added, only
// the metrics the rules select (no other series can change what they return).
type target struct {
	job, instance string
	samples       []promSample
}

type promSample struct {
	lset labels.Labels
	v    float64
}

// snapshot is what Prometheus scraped at one moment.
type snapshot struct {
	name    string
	targets []target
}

// alertsRun scrapes a real install: the webhook's replicas as the ServiceMonitor does (the
// metrics-reader role's token, HTTPS) and the API server.
type alertsRun struct {
	t        *testing.T
	rules    []alertRule
	names    map[string]bool // the metric names the rules select
	token    string
	replicas map[string]string // instance -> metrics address
	http     *http.Client
}

func newAlertsRun(t *testing.T, rules []alertRule) *alertsRun {
	t.Helper()
	a := &alertsRun{
		t: t, rules: rules, names: map[string]bool{}, replicas: map[string]string{},
		token: strings.TrimSpace(kubectl(t, nil, "create", "token", "-n", "monitoring", "prometheus")),
		http:  &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}},
	}
	for _, r := range rules {
		for _, s := range ruleSelectors(t, r.Expr) {
			a.names[s.Name] = true
		}
	}
	return a
}

func ruleSelectors(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	e, err := parser.ParseExpr(expr)
	if err != nil {
		t.Fatal(err)
	}
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

func (a *alertsRun) get(addr string) (string, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+addr+"/metrics", http.NoBody)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metrics of %s: %d %w", addr, resp.StatusCode, err)
	}
	return string(body), nil
}

// parse reads an exposition as Prometheus's scrape does.
func (a *alertsRun) parse(job, instance, body string) target {
	a.t.Helper()
	tg := target{job: job, instance: instance}
	p := textparse.NewPromParser([]byte(body), labels.NewSymbolTable(), false)
	for {
		entry, err := p.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			a.t.Fatalf("parsing the metrics of %s: %v", instance, err)
		}
		if entry != textparse.EntrySeries {
			continue
		}
		_, _, v := p.Series()
		var lset labels.Labels
		p.Labels(&lset)
		if !a.names[lset.Get(model.MetricNameLabel)] {
			continue
		}
		b := labels.NewBuilder(lset)
		b.Set("job", job)
		b.Set("instance", instance)
		tg.samples = append(tg.samples, promSample{lset: b.Labels(), v: v})
	}
	return tg
}

// webhook scrapes one replica.
func (a *alertsRun) webhook(instance string) target {
	a.t.Helper()
	body, err := a.get(a.replicas[instance])
	if err != nil {
		a.t.Fatal(err)
	}
	return a.parse(webhookJob, instance, body)
}

// snap scrapes every replica and the API server.
func (a *alertsRun) snap(name string) *snapshot {
	a.t.Helper()
	s := &snapshot{name: name}
	for _, i := range slices.Sorted(maps.Keys(a.replicas)) {
		s.targets = append(s.targets, a.webhook(i))
	}
	s.targets = append(s.targets, a.parse(apiserverJob, "kube-apiserver", kubectl(a.t, nil, "get", "--raw", "/metrics")))
	return s
}

// waitFor scrapes a replica until cond holds of its samples.
func (a *alertsRun) waitFor(instance, what string, cond func(target) bool) {
	a.t.Helper()
	harness.Eventually(a.t, 30*time.Second, func() error {
		// A replica is ready before its metrics server listens: a refused scrape is tried again.
		body, err := a.get(a.replicas[instance])
		if err != nil {
			return err
		}
		if !cond(a.parse(webhookJob, instance, body)) {
			return fmt.Errorf("replica %s: not yet %s", instance, what)
		}
		return nil
	})
}

// total sums the samples of a metric whose labels match.
func (tg target) total(name string, match func(labels.Labels) bool) float64 {
	sum := 0.0
	for _, s := range tg.samples {
		if s.lset.Get(model.MetricNameLabel) == name && (match == nil || match(s.lset)) {
			sum += s.v
		}
	}
	return sum
}

func leftToCAPM3(tg target) float64 {
	return tg.total("ip_preallocator_admissions_total", func(l labels.Labels) bool {
		return l.Get("outcome") == "failed" || l.Get("outcome") == "partial"
	}) + tg.total("ip_preallocator_claims_total", func(l labels.Labels) bool {
		return l.Get("outcome") == "failed" || l.Get("outcome") == "foreign"
	})
}

// placed is a snapshot at a moment of a scenario: Prometheus scrapes the same values every 30s
// until the next one, as nothing happened meanwhile.
type placed struct {
	at   time.Duration
	snap *snapshot
}

// scenario is a history of real snapshots at placed moments, and the alerts that must fire over
// it: for each, when its condition becomes true (between lo and hi); its for: comes on top.
// Every other alert must not fire.
type scenario struct {
	name   string
	points []placed
	end    time.Duration
	// unscraped: targets Prometheus does not scrape.
	unscraped func(target) bool
	// without: a metric the scraped targets do not expose.
	without string
	// ageing: the age gauges grow with the placed time, as they do with real time.
	ageing bool
	fires  map[string][2]time.Duration
}

const evalInterval = 30 * time.Second

// load stores the scenario's samples: every evalInterval the values of the last snapshot; a
// series gone from the next snapshot gets a staleness marker, as Prometheus writes.
func (sc scenario) load() storage.Queryable {
	store := memStore{}
	samplesOf := func(s *snapshot) map[string]promSample {
		out := map[string]promSample{}
		for _, tg := range s.targets {
			if sc.unscraped != nil && sc.unscraped(tg) {
				continue
			}
			for _, smp := range tg.samples {
				if smp.lset.Get(model.MetricNameLabel) != sc.without {
					out[smp.lset.String()] = smp
				}
			}
		}
		return out
	}
	var last map[string]promSample
	for i, p := range sc.points {
		current := samplesOf(p.snap)
		for key, smp := range last {
			if _, ok := current[key]; !ok {
				store.append(smp.lset, p.at, math.Float64frombits(value.StaleNaN))
			}
		}
		until := sc.end + evalInterval
		if i+1 < len(sc.points) {
			until = sc.points[i+1].at
		}
		for at := p.at; at < until; at += evalInterval {
			for _, smp := range current {
				v := smp.v
				if sc.ageing && smp.lset.Get(model.MetricNameLabel) == "ip_preallocator_oldest_waiting_claim_age_seconds" && v > 0 {
					v += (at - p.at).Seconds()
				}
				store.append(smp.lset, at, v)
			}
		}
		last = current
	}
	return store.queryable()
}

// memStore holds series in memory, for the PromQL engine: Prometheus's TSDB would bring its
// configuration package and every cloud SDK of its service discovery into the test module.
type memStore map[string]*memSeries

type memSeries struct {
	lset    labels.Labels
	samples []chunks.Sample
}

// floatSample is a chunks.Sample of a float value.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                    { return s.t }
func (floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                  { return s.f }
func (floatSample) H() *histogram.Histogram       { return nil }
func (floatSample) FH() *histogram.FloatHistogram { return nil }
func (floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample         { return s }

func (m memStore) append(lset labels.Labels, at time.Duration, v float64) {
	key := lset.String()
	s, ok := m[key]
	if !ok {
		s = &memSeries{lset: lset}
		m[key] = s
	}
	s.samples = append(s.samples, floatSample{t: at.Milliseconds(), f: v})
}

func (m memStore) queryable() storage.Queryable {
	var all []*memSeries
	for _, s := range m {
		all = append(all, s)
	}
	slices.SortFunc(all, func(a, b *memSeries) int { return labels.Compare(a.lset, b.lset) })
	return storage.QueryableFunc(func(int64, int64) (storage.Querier, error) {
		return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			set := &seriesSet{}
			for _, s := range all {
				if matchesAll(ms, s.lset) {
					set.series = append(set.series, storage.NewListSeries(s.lset, s.samples))
				}
			}
			return set
		}}, nil
	})
}

type seriesSet struct {
	series []storage.Series
	next   int
}

func (s *seriesSet) Next() bool                      { s.next++; return s.next <= len(s.series) }
func (s *seriesSet) At() storage.Series              { return s.series[s.next-1] }
func (*seriesSet) Err() error                        { return nil }
func (*seriesSet) Warnings() annotations.Annotations { return nil }

// firing evaluates expr every evalInterval over [0, end], as the rule manager does, and returns
// when it first fires with hold as its for: a series returned at every evaluation for hold.
func firing(t *testing.T, engine *promql.Engine, db storage.Queryable, expr string, hold, end time.Duration) (time.Duration, labels.Labels, bool) {
	t.Helper()
	ctx := context.Background()
	q, err := engine.NewRangeQuery(ctx, db, nil, expr, time.UnixMilli(0), time.UnixMilli(end.Milliseconds()), evalInterval)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	matrix, err := res.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	first, found := time.Duration(math.MaxInt64), false
	var firstLabels labels.Labels
	for _, s := range matrix {
		active, prev := int64(-1), int64(0)
		for _, p := range s.Floats {
			if active < 0 || p.T-prev > evalInterval.Milliseconds() {
				active = p.T
			}
			prev = p.T
			if p.T-active >= hold.Milliseconds() {
				if at := time.Duration(p.T) * time.Millisecond; at < first {
					first, firstLabels, found = at, s.Metric, true
				}
				break
			}
		}
	}
	return first, firstLabels, found
}

// testAlerts makes, on the installed release, each situation an alert is about and the normal
// operation around it, snapshots the metrics Prometheus would scrape, and evaluates every rule
// of the rules file over histories of those snapshots: each fires exactly where it should.
func testAlerts(t *testing.T, pod *harness.Pod) { //nolint:thelper // the body of a TestLifecycle subtest, not a helper: failures should name its own lines
	ctx := context.Background()
	start := time.Now()
	_, rules := loadRules(t)
	a := newAlertsRun(t, rules)
	a.replicas[pod.Name] = pod.Addrs["metrics"]
	w := newWorld(t, "alerts")
	admitted := func(data *infrav1.Metal3Data, err error) bool {
		if err != nil {
			t.Fatal(err)
		}
		return data.Annotations[allocation.ClaimsAnnotation] != ""
	}
	templates := 0
	createTemplate := func() error {
		templates++
		tmpl := fixtures.ThreePoolTemplate(fmt.Sprintf("alerts-%d", templates))
		tmpl.Namespace = w.ns
		return cp.Client.Create(ctx, tmpl)
	}

	// Normal operation: Metal3Data preallocated, a template validated.
	if !admitted(w.admit(ctx, false)) {
		t.Fatal("a Metal3Data was not preallocated")
	}
	n0 := a.snap("normal")
	var normal []*snapshot
	for i := range 3 {
		if !admitted(w.admitExisting(ctx)) {
			t.Fatal("a Metal3Data was not preallocated")
		}
		if i == 1 {
			if err := createTemplate(); err != nil {
				t.Fatal(err)
			}
		}
		normal = append(normal, a.snap(fmt.Sprintf("normal %d", i+1)))
	}

	// Claims left to CAPM3: a claim under the name CAPM3 would use exists before each admission.
	var left []*snapshot
	for i := range 3 {
		before := leftToCAPM3(a.webhook(pod.Name))
		claim := &unstructured.Unstructured{}
		claim.SetGroupVersionKind(allocation.IPClaimGVK)
		claim.SetNamespace(w.ns)
		claim.SetName(w.nextData() + "-" + fixtures.BaremetalPool)
		claim.Object["spec"] = map[string]any{"pool": map[string]any{"name": fixtures.BaremetalPool, "namespace": w.ns}}
		if err := cp.Client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		admitted(w.admitExisting(ctx))
		a.waitFor(pod.Name, "counting a claim left to CAPM3", func(tg target) bool { return leftToCAPM3(tg) > before })
		left = append(left, a.snap(fmt.Sprintf("left to CAPM3 %d", i+1)))
	}

	// A scoped install (make release WATCH_NAMESPACE=...): the webhooks' namespaceSelector leaves
	// the API server no call to make for Metal3Data of other namespaces.
	configs := []string{"mutatingwebhookconfiguration/" + mutating, "validatingwebhookconfiguration/" + validating}
	patch := func(path, value string) {
		for _, c := range configs {
			kubectl(t, nil, "patch", c, "--type=json", "-p", fmt.Sprintf(`[{"op":"replace","path":%q,"value":%s}]`, path, value))
		}
	}
	scope := func(selector string) { patch("/webhooks/0/namespaceSelector", selector) }
	scope(`{"matchLabels":{"kubernetes.io/metadata.name":"capm3-scope"}}`)
	t.Cleanup(func() { scope(`{}`) })
	harness.Eventually(t, 30*time.Second, func() error {
		if admitted(w.admitExisting(ctx)) {
			return fmt.Errorf("a Metal3Data of namespace %s is still preallocated", w.ns)
		}
		return nil
	})
	scoped := []*snapshot{a.snap("scoped")}
	for i := range 3 {
		if admitted(w.admitExisting(ctx)) {
			t.Fatal("a Metal3Data out of scope was preallocated")
		}
		scoped = append(scoped, a.snap(fmt.Sprintf("scoped, other namespace %d", i+1)))
	}
	scope(`{}`)
	harness.Eventually(t, 30*time.Second, func() error {
		if !admitted(w.admitExisting(ctx)) {
			return fmt.Errorf("a Metal3Data of namespace %s is not preallocated yet", w.ns)
		}
		return nil
	})

	// The webhook unreachable: both configurations name a Service that does not exist.
	service := kubectl(t, nil, "get", configs[0], "-o", "jsonpath={.webhooks[0].clientConfig.service.name}")
	route := func(name string) { patch("/webhooks/0/clientConfig/service/name", fmt.Sprintf("%q", name)) }
	route("ip-preallocator-unreachable")
	t.Cleanup(func() { route(service) })
	harness.Eventually(t, 30*time.Second, func() error {
		if admitted(w.admitExisting(ctx)) {
			return fmt.Errorf("a Metal3Data is still preallocated")
		}
		return nil
	})
	unreachable := []*snapshot{a.snap("unreachable")}
	for i := range 3 {
		if admitted(w.admitExisting(ctx)) {
			t.Fatal("a Metal3Data was preallocated by an unreachable webhook")
		}
		unreachable = append(unreachable, a.snap(fmt.Sprintf("unreachable %d", i+1)))
	}
	// ... and a template change fails: the validation fails closed.
	blocked := func() error {
		if err := createTemplate(); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			return fmt.Errorf("a template apply: %v, want a failure to call the validation", err)
		}
		return nil
	}
	harness.Eventually(t, 30*time.Second, blocked)
	validation := []*snapshot{a.snap("validation unreachable")}
	if err := blocked(); err != nil {
		t.Fatal(err)
	}
	validation = append(validation, a.snap("validation unreachable, template blocked"))
	route(service)
	harness.Eventually(t, 30*time.Second, func() error {
		if !admitted(w.admitExisting(ctx)) {
			return fmt.Errorf("a Metal3Data is not preallocated yet")
		}
		return createTemplate()
	})
	recovered := a.snap("reachable again")

	// CAPM3 with the other claim naming: every admission skipped, the gauge at 0; then back.
	gauge := func(want float64) func(target) bool {
		return func(tg target) bool {
			return slices.ContainsFunc(tg.samples, func(s promSample) bool {
				return s.lset.Get(model.MetricNameLabel) == "ip_preallocator_capm3_compatible" && s.v == want
			})
		}
	}
	if err := cp.DeclareCAPM3(ctx, harness.CAPM3Image, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.DeclareCAPM3(ctx, harness.CAPM3Image, false); err != nil {
			t.Error(err)
		}
	})
	a.waitFor(pod.Name, "incompatible", gauge(0))
	incompatible := a.snap("CAPM3 incompatible")
	if err := cp.DeclareCAPM3(ctx, harness.CAPM3Image, false); err != nil {
		t.Fatal(err)
	}
	a.waitFor(pod.Name, "compatible", gauge(1))
	compatible := a.snap("CAPM3 compatible again")

	// Claims that wait: a quota forbids Metal3Data after the webhook preallocated (its status set
	// by hand, as no quota controller runs here).
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-metal3datas", Namespace: w.ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/metal3datas.infrastructure.cluster.x-k8s.io": resource.MustParse("0")}},
	}
	if err := cp.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := client.IgnoreNotFound(cp.Client.Delete(ctx, quota)); err != nil {
			t.Error(err)
		}
	})
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: quota.Spec.Hard}
	if err := cp.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, func() error {
		if _, err := w.admitExisting(ctx); err == nil || !strings.Contains(err.Error(), "exceeded quota") {
			return fmt.Errorf("a Metal3Data beyond the quota: %v", err)
		}
		return nil
	})
	a.waitFor(pod.Name, "counting waiting claims", func(tg target) bool {
		return tg.total("ip_preallocator_oldest_waiting_claim_age_seconds", nil) > 0
	})
	waiting := a.snap("claims waiting")
	if err := cp.Client.Delete(ctx, quota); err != nil {
		t.Fatal(err)
	}
	age := 0.0
	for _, s := range waiting.targets[0].samples {
		if s.lset.Get(model.MetricNameLabel) == "ip_preallocator_oldest_waiting_claim_age_seconds" {
			age = max(age, s.v)
		}
	}

	// A second replica, as the Deployment's replicas: 2 runs: it does not lead.
	standby := startStandby(t, pod)
	a.replicas["standby"] = standby
	a.waitFor("standby", "a ready replica that does not lead", func(tg target) bool {
		return gauge(1)(tg) && slices.ContainsFunc(tg.samples, func(s promSample) bool {
			return s.lset.Get(model.MetricNameLabel) == "leader_election_master_status" && s.v == 0
		})
	})
	replicas := a.snap("two replicas")
	delete(a.replicas, "standby")

	onlyStandby := func(tg target) bool { return tg.job == webhookJob && tg.instance != "standby" }
	job := func(name string) func(target) bool { return func(tg target) bool { return tg.job == name } }
	at := func(step time.Duration, snaps ...*snapshot) []placed {
		var out []placed
		for i, s := range snaps {
			out = append(out, placed{at: time.Duration(i) * step, snap: s})
		}
		return out
	}
	window := func(lo, hi time.Duration) [2]time.Duration { return [2]time.Duration{lo, hi} }
	last := func(s []*snapshot) *snapshot { return s[len(s)-1] }
	scenarios := []scenario{
		{name: "normal operation", points: at(2*time.Minute, append([]*snapshot{n0}, normal...)...), end: 30 * time.Minute},
		{
			name: "claims left to CAPM3 every 10 minutes", points: at(10*time.Minute, append([]*snapshot{last(normal)}, left...)...), end: time.Hour,
			fires: map[string][2]time.Duration{"IPPreallocatorLeavesClaimsToCAPM3": window(10*time.Minute, 10*time.Minute)},
		},
		{name: "a claim left to CAPM3 once", points: at(10*time.Minute, last(normal), left[0]), end: time.Hour},
		{name: "scoped install, Metal3Data of other namespaces", points: at(2*time.Minute, scoped...), end: 30 * time.Minute},
		{name: "scoped install, the webhook not scraped", points: at(2*time.Minute, scoped...), end: 30 * time.Minute, unscraped: job(webhookJob)},
		{
			name: "the webhook unreachable", points: at(2*time.Minute, unreachable...), end: 30 * time.Minute,
			fires: map[string][2]time.Duration{"IPPreallocatorNotCalled": window(2*time.Minute, 2*time.Minute)},
		},
		{
			name: "the webhook unreachable and not scraped", points: at(2*time.Minute, unreachable...), end: 30 * time.Minute, unscraped: job(webhookJob),
			fires: map[string][2]time.Duration{"IPPreallocatorNotCalled": window(2*time.Minute, 2*time.Minute)},
		},
		{
			name: "the webhook answers but is not scraped", points: at(2*time.Minute, append([]*snapshot{n0}, normal...)...), end: 30 * time.Minute, unscraped: job(webhookJob),
			fires: map[string][2]time.Duration{"IPPreallocatorNotCalled": window(2*time.Minute, 2*time.Minute)},
		},
		{
			name: "the API server not scraped", points: at(2*time.Minute, append([]*snapshot{n0}, normal...)...), end: 30 * time.Minute, unscraped: job(apiserverJob),
			fires: map[string][2]time.Duration{"IPPreallocatorNotCalled": window(0, 0)},
		},
		{
			name: "template validation unreachable", points: at(time.Minute, validation...), end: 20 * time.Minute,
			fires: map[string][2]time.Duration{"IPPreallocatorValidationWebhookDown": window(time.Minute, time.Minute)},
		},
		{name: "template validation reachable again", points: at(time.Minute, append(validation, recovered)...), end: 20 * time.Minute},
		{
			name: "CAPM3 incompatible", points: at(time.Minute, recovered, incompatible), end: 20 * time.Minute,
			fires: map[string][2]time.Duration{"IPPreallocatorCAPM3Incompatible": window(time.Minute, time.Minute)},
		},
		{name: "CAPM3 incompatible for 2 minutes", points: at(time.Minute, recovered, incompatible, compatible), end: 20 * time.Minute},
		{
			// Never before the claim is older than the grace period and hold limit (12m).
			name: "claims waiting", points: at(0, waiting), end: 40 * time.Minute, ageing: true,
			fires: map[string][2]time.Duration{"IPPreallocatorClaimsWaitingTooLong": window(12*time.Minute-time.Duration(age)*time.Second, 16*time.Minute-time.Duration(age)*time.Second)},
		},
		{name: "claims waiting 10 minutes", points: at(0, waiting), end: 10 * time.Minute, ageing: true},
		{name: "two replicas, one leads", points: at(0, replicas), end: 20 * time.Minute},
		{
			name: "no replica leads", points: at(0, replicas), end: 20 * time.Minute, unscraped: onlyStandby,
			fires: map[string][2]time.Duration{"IPPreallocatorNoLeader": window(0, 0)},
		},
		{
			name: "the lease metric absent, the webhook scraped", points: at(0, replicas), end: 20 * time.Minute, unscraped: onlyStandby, without: "leader_election_master_status",
			fires: map[string][2]time.Duration{"IPPreallocatorNoLeader": window(0, 0)},
		},
	}

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	fired, quiet := map[string]bool{}, map[string]bool{}
	for _, sc := range scenarios {
		db := sc.load()
		var firings []string
		for _, r := range rules {
			at, lset, ok := firing(t, engine, db, r.Expr, r.hold, sc.end)
			if ok {
				firings = append(firings, fmt.Sprintf("%s at %v", r.Alert, at))
			}
			want, should := sc.fires[r.Alert]
			switch {
			case should && !ok:
				t.Errorf("%s: %s does not fire", sc.name, r.Alert)
			case should && (at < want[0]+r.hold || at > want[1]+r.hold+evalInterval):
				t.Errorf("%s: %s fires at %v, want between %v and %v", sc.name, r.Alert, at, want[0]+r.hold, want[1]+r.hold+evalInterval)
			case !should && ok:
				t.Errorf("%s: %s fires at %v (%v)", sc.name, r.Alert, at, lset)
			}
			if should {
				fired[r.Alert] = true
			} else {
				quiet[r.Alert] = true
			}
		}
		t.Logf("%s: %v", sc.name, firings)
		if sc.name == "scoped install, Metal3Data of other namespaces" {
			// The README's alert before the rules file fired here.
			if _, _, ok := firing(t, engine, db, oldNotCalled, 15*time.Minute, sc.end); !ok {
				t.Errorf("%s: the old IPPreallocatorNotCalled does not fire: the scoped case has no Metal3Data created elsewhere", sc.name)
			}
		}
	}
	for _, r := range rules {
		if !fired[r.Alert] || !quiet[r.Alert] {
			t.Errorf("%s: tested firing %v, not firing %v: want both", r.Alert, fired[r.Alert], quiet[r.Alert])
		}
	}

	// Every selector of the rules selects a series this install exposed at some moment: a
	// misspelt label value would make an alert quiet for ever.
	all := []*snapshot{n0, recovered, incompatible, compatible, waiting, replicas}
	all = slices.Concat(all, normal, left, scoped, unreachable, validation)
	for _, r := range rules {
		for _, vs := range ruleSelectors(t, r.Expr) {
			if !slices.ContainsFunc(all, func(s *snapshot) bool {
				return slices.ContainsFunc(s.targets, func(tg target) bool {
					return slices.ContainsFunc(tg.samples, func(smp promSample) bool { return matchesAll(vs.LabelMatchers, smp.lset) })
				})
			}) {
				t.Errorf("%s: %s selects no series of the install", r.Alert, vs)
			}
		}
	}
	t.Logf("%d scenarios evaluated; the alerts subtest took %v", len(scenarios), time.Since(start).Round(time.Second))
}

func matchesAll(ms []*labels.Matcher, lset labels.Labels) bool {
	for _, m := range ms {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

// admitExisting admits the next machine as admit does, reading its Cluster and template instead
// of creating them: a template create calls the validating webhook.
func (w *world) admitExisting(ctx context.Context) (*infrav1.Metal3Data, error) {
	w.mu.Lock()
	w.n++
	m := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), w.n).InNamespace(w.ns)
	w.mu.Unlock()
	for _, shared := range []client.Object{m.Cluster, m.Template} {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(shared), shared); err != nil {
			return nil, err
		}
	}
	if err := harness.CreateMachineObjects(ctx, cp.Client, m); err != nil {
		return nil, err
	}
	if err := harness.CreateDataClaim(ctx, cp.Client, m); err != nil {
		return nil, err
	}
	return m.Data, cp.Client.Create(ctx, m.Data)
}

// startStandby runs a second replica of the installed Deployment beside pod: its args, its
// service account, the serving certificate's Secret; not published as an endpoint. It returns
// its metrics address; the test's end stops it.
func startStandby(t *testing.T, pod *harness.Pod) string {
	t.Helper()
	ctx := context.Background()
	dep := &appsv1.Deployment{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: deployment}, dep); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: certSecret}, secret); err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(certDir, f), secret.Data[f], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var addrs []string
	for range 3 {
		addr, err := harness.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, addr)
	}
	spec := dep.Spec.Template.Spec
	args := append(slices.Clone(spec.Containers[0].Args),
		"--webhook-host=127.0.0.1", "--webhook-port="+addrs[0][strings.LastIndex(addrs[0], ":")+1:], "--webhook-cert-dir="+certDir,
		"--diagnostics-address="+addrs[1], "--health-addr="+addrs[2],
		"--leader-election-namespace="+namespace, "--release-grace-period=1h", "--release-hold-limit=5s")
	kubeconfig, err := cp.ServiceAccountKubeconfig(namespace, spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"POD_NAMESPACE=" + namespace, "POD_NAME=" + deployment + "-standby", "KUBECONFIG=" + kubeconfig}
	proc, err := harness.StartProcess(ctx, filepath.Join(cp.Dir, deployment+"-standby.log"), pod.Binary, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proc.Stop)
	harness.Eventually(t, 60*time.Second, func() error {
		if !proc.Running() {
			t.Fatalf("the second replica exited; its log: %s", filepath.Join(cp.Dir, deployment+"-standby.log"))
		}
		resp, err := http.Get("http://" + addrs[2] + "/readyz") //nolint:noctx // a probe
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the second replica's /readyz: %d", resp.StatusCode)
		}
		return nil
	})
	return addrs[1]
}
