package main

import (
	"math"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// TestCPUUsesOf: a sample counts for the first use whose frame its stack shows, a hand-over's
// PATCH apart from the IPAM's status writes, and samples no rule names as other.
func TestCPUUsesOf(t *testing.T) {
	var id uint64
	stack := func(names ...string) []*profile.Location {
		var locs []*profile.Location
		for _, n := range names {
			id++
			locs = append(locs, &profile.Location{ID: id, Line: []profile.Line{{Function: &profile.Function{ID: id, Name: n}}}})
		}
		return locs
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Value: []int64{1, 2e6}, Location: stack("k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Update", "k8s.io/apiserver/pkg/endpoints/handlers.(*patcher).patchResource.func2", "net/http.(*conn).serve")},
			{Value: []int64{1, 3e6}, Location: stack("k8s.io/apiextensions-apiserver/pkg/registry/customresource.(*StatusREST).Update", "k8s.io/apiserver/pkg/endpoints/handlers.(*patcher).patchResource.func2")},
			{Value: []int64{1, 5e6}, Location: stack("k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP", "k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).serveResource.ListResource.func3")},
			{Value: []int64{1, 7e6}, Location: stack("runtime.memmove")},
		},
	}
	got := perData(cpuUsesOf(p), 2)
	want := map[string]float64{"other PATCH requests": 1, "writes to a status subresource": 1.5, "watches: sending events": 2.5, otherUse: 3.5}
	if len(got) != len(want) {
		t.Errorf("uses %v, want %v", got, want)
	}
	for use, ms := range want {
		if math.Abs(got[use]-ms) > 1e-9 {
			t.Errorf("%s: %.3f ms per Metal3Data, want %.3f", use, got[use], ms)
		}
	}
}

// TestPrintAPIServerCPULeavesOutNothing: a use that rounds to nothing in every column has no row;
// the others keep theirs, and the total counts every use.
func TestPrintAPIServerCPULeavesOutNothing(t *testing.T) {
	r := &Report{Runs: []*Run{
		{Setting: "raised-limits", Scenario: "burst", Mode: modeStock, APIServerCPU: map[string]float64{"GET requests": 2, "LIST requests": 0.01}},
		{Setting: "raised-limits", Scenario: "burst", Mode: modePreallocated, APIServerCPU: map[string]float64{"GET requests": 3}},
	}}
	var out strings.Builder
	printAPIServerCPU(&out, r)
	text := out.String()
	if strings.Contains(text, "| LIST requests |") {
		t.Errorf("a row for a use of 0.0 in every column:\n%s", text)
	}
	for _, row := range []string{"| GET requests | 2.0 | 3.0 |", "| **all** | **2.0** | **3.0** |"} {
		if !strings.Contains(text, row) {
			t.Errorf("no %q in:\n%s", row, text)
		}
	}
}
