package install

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// footprintRow is one row of docs/footprint.md, which make footprint writes from what it measured.
var footprintRow = regexp.MustCompile(`(?m)^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \|`)

// TestMemoryFromFootprint: the manifest's memory request holds the resident memory make footprint
// measured with its largest fleet, rounded up to 32 MiB; its limit twice the peak measured while
// that fleet's caches synced, rounded up to a power of two; the README states all three. Its
// GOMEMLIMIT bounds the Go heap, not what the process holds besides (the binary's pages, what
// the row without a fleet holds outside its heap): at least the request less that, so that the
// collector does not run ever more often at the memory the webhook holds, and below the limit, so
// that it, not the limit, holds the peak down.
func TestMemoryFromFootprint(t *testing.T) {
	page := repoFile(t, "docs/footprint.md")
	machines, resident, peak, besideHeap := 0, 0, 0, -1
	for _, row := range footprintRow.FindAllStringSubmatch(string(page), -1) {
		n, _ := strconv.Atoi(row[1])
		if n == 0 {
			r, _ := strconv.Atoi(row[2])
			h, _ := strconv.Atoi(row[4])
			besideHeap = r - h
		}
		if n >= machines {
			machines = n
			resident, _ = strconv.Atoi(row[2])
			peak, _ = strconv.Atoi(row[3])
		}
	}
	if machines == 0 || besideHeap < 0 {
		t.Fatalf("docs/footprint.md has no measured fleet, or no row without one (%d machines)", machines)
	}
	wantRequest := (resident + 31) / 32 * 32
	wantLimit := 1
	for wantLimit < 2*peak {
		wantLimit *= 2
	}

	dep := one[appsv1.Deployment](t, decode(t, repoFile(t, "config/manager/manager.yaml")), "Deployment")
	res := dep.Spec.Template.Spec.Containers[0].Resources
	for name, got := range map[string]struct {
		q    resource.Quantity
		want int
	}{
		"request": {res.Requests[corev1.ResourceMemory], wantRequest},
		"limit":   {res.Limits[corev1.ResourceMemory], wantLimit},
	} {
		if got.q.Value() != int64(got.want)<<20 {
			t.Errorf("memory %s %s, want %dMi (footprint: %d MiB resident and %d MiB at the peak with %d machines)",
				name, got.q.String(), got.want, resident, peak, machines)
		}
	}
	var goMemLimit string
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "GOMEMLIMIT" {
			goMemLimit = e.Value
		}
	}
	limit, err := resource.ParseQuantity(strings.TrimSuffix(goMemLimit, "B"))
	if least := wantRequest - besideHeap; err != nil || limit.Value() < int64(least)<<20 || limit.Value() >= int64(wantLimit)<<20 {
		t.Errorf("GOMEMLIMIT %q, want one from %dMi (the request less the %d MiB held beside the heap) to below %dMi (%v)", goMemLimit, least, besideHeap, wantLimit, err)
	}
	readme := repoFile(t, "README.md")
	for _, want := range []string{
		strconv.Itoa(wantRequest) + "Mi", strconv.Itoa(wantLimit) + "Mi", "`GOMEMLIMIT` " + goMemLimit,
		strconv.Itoa(resident) + " MiB with " + thousands(machines), strconv.Itoa(peak) + " MiB at the peak",
	} {
		if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), want) {
			t.Errorf("README.md does not state %q", want)
		}
	}
}

func thousands(n int) string {
	s := strconv.Itoa(n)
	if len(s) > 3 {
		s = s[:len(s)-3] + "," + s[len(s)-3:]
	}
	return s
}
