package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
	"k8s.io/client-go/kubernetes"
)

// profileSlice is how long each of the API server's CPU profiles lasts: the run's profile is
// their merge, so it covers the run whatever its length, give or take one slice.
const profileSlice = "1"

// profileAPIServer profiles the API server's CPU from now until stop is closed.
func (b *bench) profileAPIServer(ctx context.Context, stop <-chan struct{}) (*profile.Profile, error) {
	cs, err := kubernetes.NewForConfig(b.cp.Config)
	if err != nil {
		return nil, err
	}
	var parts []*profile.Profile
	for {
		data, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", profileSlice).DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("profiling the API server: %w", err)
		}
		p, err := profile.ParseData(data)
		if err != nil {
			return nil, fmt.Errorf("reading the API server's profile: %w", err)
		}
		parts = append(parts, p)
		select {
		case <-stop:
			return profile.Merge(parts)
		default:
		}
	}
}

// profileRun profiles the API server's CPU until stop is closed, writes the profile to path and
// what it went to, per Metal3Data, into run.
func (b *bench) profileRun(ctx context.Context, run *Run, stop <-chan struct{}, path string) error {
	p, err := b.profileAPIServer(ctx, stop)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		return err
	}
	run.APIServerCPU = perData(cpuUsesOf(p), run.N)
	return f.Close()
}

// cpuUse is one line of what the API server's CPU went to: the first rule whose frame is on a
// sample's stack names it, so a request's own work is counted before the filters around it.
type cpuUse struct{ name, frame string }

var cpuUses = []cpuUse{
	{"calling mutating admission webhooks", "mutating.(*mutatingDispatcher)"},
	{"calling validating admission webhooks", "validating.(*validatingDispatcher)"},
	{"writes to a status subresource", "customresource.(*StatusREST).Update"},
	{"other PATCH requests", "handlers.(*patcher)"},
	{"CREATE requests", "createHandler"},
	{"UPDATE requests", "UpdateResource"},
	{"DELETE requests", "DeleteResource"},
	{"GET requests", "GetResource"},
	{"watches: sending events", "(*WatchServer)"},
	{"watches: sending events", "cacher.(*cacheWatcher)"},
	{"LIST requests", "ListResource"},
	{"watch cache: taking in events", "cacher.(*Cacher)"},
	{"watch cache: taking in events", "cacher.(*watchCache)"},
	{"watches: decoding etcd's events", "etcd3.(*watchChan)"},
	{"audit log", "apiserver/pkg/audit"},
	{"audit log", "plugin/pkg/audit"},
	{"garbage collection", "runtime.gcBgMarkWorker"},
	{"garbage collection", "runtime.gcDrain"},
	{"HTTP and request filters", "net/http.(*conn).serve"},
	{"HTTP and request filters", "http2"},
}

// otherUse names the samples no rule matched.
const otherUse = "other"

// cpuUsesOf sums a CPU profile's samples by use, in seconds.
func cpuUsesOf(p *profile.Profile) map[string]float64 {
	index := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			index = i
		}
	}
	uses := map[string]float64{}
	if index < 0 {
		return uses
	}
	for _, s := range p.Sample {
		uses[useOf(s)] += float64(s.Value[index]) / 1e9
	}
	return uses
}

func useOf(s *profile.Sample) string {
	var frames []string
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function != nil {
				frames = append(frames, line.Function.Name)
			}
		}
	}
	for _, u := range cpuUses {
		if slices.ContainsFunc(frames, func(f string) bool { return strings.Contains(f, u.frame) }) {
			return u.name
		}
	}
	return otherUse
}

// useNames orders the uses as cpuUses does, other last.
func useNames() []string {
	var names []string
	for _, u := range cpuUses {
		if !slices.Contains(names, u.name) {
			names = append(names, u.name)
		}
	}
	return append(names, otherUse)
}

// perData turns seconds into milliseconds per Metal3Data.
func perData(uses map[string]float64, n int) map[string]float64 {
	out := maps.Clone(uses)
	for k, v := range out {
		out[k] = 1000 * v / float64(max(1, n))
	}
	return out
}

// printAPIServerCPU prints, for each profiled scenario and mode, what the API server's CPU went to
// per Metal3Data, means over the repetitions.
func printAPIServerCPU(out io.Writer, r *Report) {
	var order []string
	byKey := map[string][]*Run{}
	for _, run := range r.Runs {
		if run.APIServerCPU == nil {
			continue
		}
		key := run.Setting + " " + run.Scenario + ": " + run.Mode
		if byKey[key] == nil {
			order = append(order, key)
		}
		byKey[key] = append(byKey[key], run)
	}
	if len(order) == 0 {
		return
	}
	fmt.Fprintln(out, "\nWhat the API server's CPU went to, in ms per Metal3Data (profiles of each measured window, means over the repetitions): a sample counts for the first line its stack shows (a request's own work before the filters around it); watches are the events sent to every watcher.")
	mean := func(key, use string) float64 {
		var ms float64
		for _, run := range byKey[key] {
			ms += run.APIServerCPU[use] / float64(len(byKey[key]))
		}
		return ms
	}
	fmt.Fprintf(out, "\n| | %s |\n", strings.Join(order, " | "))
	fmt.Fprintf(out, "|---|%s\n", strings.Repeat("---:|", len(order)))
	all := make([]float64, len(order))
	for _, use := range useNames() {
		cells, shown := make([]string, len(order)), false
		for i, key := range order {
			ms := mean(key, use)
			cells[i], all[i] = fmt.Sprintf("%.1f", ms), all[i]+ms
			shown = shown || cells[i] != "0.0"
		}
		// A use that rounds to nothing in every column says nothing.
		if shown {
			fmt.Fprintf(out, "| %s | %s |\n", use, strings.Join(cells, " | "))
		}
	}
	cells := make([]string, len(order))
	for i := range order {
		cells[i] = fmt.Sprintf("**%.1f**", all[i])
	}
	fmt.Fprintf(out, "| **all** | %s |\n", strings.Join(cells, " | "))
}
