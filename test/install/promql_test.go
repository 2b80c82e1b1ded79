package install

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

// selector is one metric selector of a query docs/metrics.md gives operators.
type selector struct {
	text, name string
	matchers   []matcher
}

type matcher struct {
	label, op, value string
}

var (
	fencedBlock = regexp.MustCompile("(?s)```(promql|yaml)\n(.*?)```")
	// A metric name with its matchers, or a bare one before a range: function names are followed by
	// "(" and keywords by a space.
	metricSel     = regexp.MustCompile(`\b([a-z_:][a-z0-9_:]*)(?:\{([^}]*)\}|\[)`)
	labelMatcher  = regexp.MustCompile(`(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
	exposedLabels = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
)

// metricsPage is the operators' page of metrics, queries and alerts.
const metricsPage = "docs/metrics.md"

// pageSelectors reads the selectors of the metrics page's PromQL blocks and of any alerts it shows.
func pageSelectors(t *testing.T) []selector {
	t.Helper()
	page := repoFile(t, metricsPage)
	var out []selector
	for _, block := range fencedBlock.FindAllStringSubmatch(string(page), -1) {
		if block[1] == "yaml" && !strings.Contains(block[2], "alert:") {
			continue
		}
		out = append(out, parseSelectors(block[2])...)
	}
	if len(out) == 0 {
		t.Fatal(metricsPage + " has no PromQL selectors to check")
	}
	return out
}

func parseSelectors(query string) []selector {
	var out []selector
	for _, m := range metricSel.FindAllStringSubmatch(query, -1) {
		s := selector{text: m[0], name: m[1]}
		for _, l := range labelMatcher.FindAllStringSubmatch(m[2], -1) {
			s.matchers = append(s.matchers, matcher{label: l[1], op: l[2], value: l[3]})
		}
		out = append(out, s)
	}
	return out
}

// matchesSeries tells whether a series of the exposition text matches s, as Prometheus would.
func (s selector) matchesSeries(exposition string) bool {
	for _, line := range strings.Split(exposition, "\n") {
		labels, ok := strings.CutPrefix(line, s.name+"{")
		if !ok && !strings.HasPrefix(line, s.name+" ") {
			continue
		}
		series := map[string]string{}
		for _, l := range exposedLabels.FindAllStringSubmatch(labels, -1) {
			series[l[1]] = l[2]
		}
		if s.matchesLabels(series) {
			return true
		}
	}
	return false
}

func (s selector) matchesLabels(series map[string]string) bool {
	for _, m := range s.matchers {
		v := series[m.label]
		var ok bool
		switch m.op {
		case "=":
			ok = v == m.value
		case "!=":
			ok = v != m.value
		case "=~", "!~":
			re, err := regexp.Compile("^(?:" + m.value + ")$")
			ok = err == nil && re.MatchString(v) == (m.op == "=~")
		}
		if !ok {
			return false
		}
	}
	return true
}

// checkPageQueries checks that the selectors of docs/metrics.md's queries whose metric which names
// select a series: the webhook's from webhookMetrics, the API server's from its /metrics.
func checkPageQueries(t *testing.T, webhookMetrics string, which func(metric string) bool) {
	t.Helper()
	var apiServerMetrics string
	for _, s := range pageSelectors(t) {
		if !which(s.name) {
			continue
		}
		exposition := webhookMetrics
		if strings.HasPrefix(s.name, "apiserver_") {
			if apiServerMetrics == "" {
				apiServerMetrics = kubectl(t, nil, "get", "--raw", "/metrics")
			}
			exposition = apiServerMetrics
		}
		if !s.matchesSeries(exposition) {
			t.Errorf("%s: %s matches no series", metricsPage, s.text)
		}
	}
}

func TestReadmeSelectors(t *testing.T) {
	names := map[string]bool{}
	for _, s := range pageSelectors(t) {
		names[s.name] = true
	}
	// The alerts' selectors are tested in alerts_test.go, from the rules file.
	for _, want := range []string{"ip_preallocator_admissions_total", "ip_preallocator_releases_total"} {
		if !names[want] {
			t.Errorf("%s's queries: no selector of %s found, only %v", metricsPage, want, names)
		}
	}
	for name := range names {
		if name == "sum" || name == "rate" || name == "increase" || name == "and" {
			t.Errorf("%s's queries: %s read as a metric", metricsPage, name)
		}
	}
}

func TestSelectorMatchesSeries(t *testing.T) {
	exposition := `# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="infrastructure.cluster.x-k8s.io",resource="metal3datas",verb="POST",version="v1beta2"} 3
ip_preallocator_admissions_total{outcome="partial",reason=""} 1
process_open_fds 12
`
	for query, want := range map[string]bool{
		`sum(rate(apiserver_request_total{resource="metal3datas",verb="POST"}[15m]))`:   true,
		`sum(rate(apiserver_request_total{resource="metal3datas",verb="create"}[15m]))`: false,
		`ip_preallocator_admissions_total{outcome=~"failed|partial"}`:                   true,
		`ip_preallocator_admissions_total{outcome=~"failed"}`:                           false,
		`ip_preallocator_admissions_total{outcome=~"part"}`:                             false,
		`ip_preallocator_admissions_total{outcome!="partial"}`:                          false,
		`ip_preallocator_admissions_total{reason="",outcome="partial"}`:                 true,
		`ip_preallocator_admissions_total{missing=""}`:                                  true,
		`sum(increase(ip_preallocator_admissions_total[1h]))`:                           true,
		`sum(increase(ip_preallocator_releases_total[1h]))`:                             false,
		`process_open_fds[5m]`:                            true,
		`ip_preallocator_claims_total{outcome="foreign"}`: false,
	} {
		sels := parseSelectors(query)
		if len(sels) != 1 {
			t.Fatalf("%s: %d selectors", query, len(sels))
		}
		if got := sels[0].matchesSeries(exposition); got != want {
			t.Errorf("%s matches: %v, want %v", query, got, want)
		}
	}
}

// repoFile reads a file of the repository.
func repoFile(t *testing.T, path string) []byte {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return data
}
