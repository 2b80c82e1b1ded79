package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/compat"
	"github.com/metal3-community/ip-preallocator/pkg/mutate"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

const capm3Image = "quay.io/metal3-io/cluster-api-provider-metal3:"

// TestCompatibilityGuard changes the CAPM3 Deployment and clusterctl Provider the running webhook
// finds, and admits a Metal3Data after each change: preallocated only beside a CAPM3 whose claims
// it mirrors, in its naming mode, at its default client limits; otherwise left to CAPM3, with the
// reason in an Event on the webhook's pod and a metric saying which.
func TestCompatibilityGuard(t *testing.T) {
	ctx := context.Background()
	ns := newWorld(t, "compat", 0, 40).ns
	provider := &clusterctlv1.Provider{
		ObjectMeta:   metav1.ObjectMeta{Namespace: harness.CAPM3Namespace, Name: "infrastructure-metal3"},
		ProviderName: "metal3", Type: string(clusterctlv1.InfrastructureProviderType),
	}
	defer func() {
		_ = cp.Client.Delete(ctx, provider)
		if err := cp.DeclareCAPM3(ctx, harness.CAPM3Image, false); err != nil {
			t.Error(err)
		}
	}()
	setProvider := func(t *testing.T, version string) {
		t.Helper()
		p := provider.DeepCopy()
		p.Version = version
		err := cp.Client.Create(ctx, p)
		if apierrors.IsAlreadyExists(err) {
			err = cp.Client.Patch(ctx, p, client.Merge)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	machine, before, beforeRaised := 0, skipped(t, mutate.ReasonIncompatibleCAPM3), skipped(t, mutate.ReasonLimitsRaised)
	for _, tc := range []struct {
		name string
		// change makes the cluster hold what the webhook then finds.
		change func(t *testing.T)
		// refusal is a part of the refusal, told in an Event of reason; empty: preallocated.
		refusal, reason string
		// raised: CAPM3's client limits are raised, told in an Event; the admission is left to CAPM3.
		raised bool
	}{
		{name: "Deployment of the mirrored version", change: func(t *testing.T) {
			t.Helper()
			declare(t, harness.CAPM3Image, false)
		}},
		{name: "its client limits raised", change: func(t *testing.T) {
			t.Helper()
			declare(t, harness.CAPM3Image, false, "--kube-api-qps=100", "--kube-api-burst=200")
		}, raised: true},
		{name: "at its default client limits again", change: func(t *testing.T) {
			t.Helper()
			declare(t, harness.CAPM3Image, false, "--kube-api-qps=20")
		}},
		{name: "Deployment of the next minor", change: func(t *testing.T) {
			t.Helper()
			declare(t, capm3Image+"v1.14.0", false)
		}, refusal: `CAPM3 "v1.14.0" (image ` + capm3Image + "v1.14.0 of Deployment capm3-system/capm3-controller-manager)", reason: compat.ReasonVersionNotMirrored},
		{name: "Provider of the mirrored version, image by digest", change: func(t *testing.T) {
			t.Helper()
			declare(t, "quay.io/metal3-io/cluster-api-provider-metal3@sha256:"+strings.Repeat("0", 64), false)
			setProvider(t, "v1.13.2")
		}},
		{name: "Provider of an older version", change: func(t *testing.T) {
			t.Helper()
			setProvider(t, "v1.12.3")
		}, refusal: `CAPM3 "v1.12.3" (clusterctl Provider capm3-system/infrastructure-metal3)`, reason: compat.ReasonVersionNotMirrored},
		{name: "the other naming mode", change: func(t *testing.T) {
			t.Helper()
			setProvider(t, "v1.13.2")
			declare(t, harness.CAPM3Image, true)
		}, refusal: "runs with --enable-bmh-name-based-preallocation=true and ip-preallocator with false", reason: compat.ReasonNamingDiffers},
		{name: "no CAPM3", change: func(t *testing.T) {
			t.Helper()
			for _, obj := range []client.Object{provider, harness.CAPM3DeploymentObject("", false)} {
				if err := cp.Client.Delete(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
		}, refusal: "found no CAPM3", reason: compat.ReasonNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.change(t)
			waitCompatible(t, tc.refusal == "")
			waitGauge(t, "ip_preallocator_capm3_limits_raised", tc.raised)
			if tc.refusal != "" {
				waitEvent(t, tc.reason, tc.refusal)
			}
			if tc.raised {
				waitEvent(t, compat.ReasonLimitsRaised, "runs with --kube-api-qps=100, above its default 20")
			}
			m := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), machine).InNamespace(ns)
			machine++
			if err := harness.CreateMachine(ctx, cp.Client, m); err != nil {
				t.Fatal(err)
			}
			if err := cp.Client.Create(ctx, m.Data); err != nil {
				t.Fatal(err)
			}
			recorded := m.Data.Annotations[allocation.ClaimsAnnotation]
			left := tc.refusal != "" || tc.raised
			if !left && recorded == "" {
				t.Errorf("Metal3Data %s was not preallocated", m.Data.Name)
			}
			if left && recorded != "" {
				t.Errorf("Metal3Data %s was preallocated (%s) beside a CAPM3 it should be left to", m.Data.Name, recorded)
			}
		})
	}
	if got := skipped(t, mutate.ReasonIncompatibleCAPM3) - before; got != 4 {
		t.Errorf("ip_preallocator_admissions_total counts %v admissions skipped as IncompatibleCAPM3, want 4", got)
	}
	if got := skipped(t, mutate.ReasonLimitsRaised) - beforeRaised; got != 1 {
		t.Errorf("ip_preallocator_admissions_total counts %v admissions skipped as CAPM3LimitsRaised, want 1", got)
	}
}

// skipped reads how many admissions the webhook skipped for reason.
func skipped(t *testing.T, reason string) float64 {
	t.Helper()
	metrics, err := cp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, `ip_preallocator_admissions_total{outcome="skipped",reason="`+reason+`"} `); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

func declare(t *testing.T, image string, bmhNameBased bool, args ...string) {
	t.Helper()
	if err := cp.DeclareCAPM3(context.Background(), image, bmhNameBased, args...); err != nil {
		t.Fatal(err)
	}
}

// waitCompatible waits for the webhook's verdict in ip_preallocator_capm3_compatible.
func waitCompatible(t *testing.T, compatible bool) {
	t.Helper()
	waitGauge(t, "ip_preallocator_capm3_compatible", compatible)
}

// waitGauge waits until the webhook reports gauge as 1 (on) or 0.
func waitGauge(t *testing.T, gauge string, on bool) {
	t.Helper()
	want := gauge + " 0"
	if on {
		want = gauge + " 1"
	}
	harness.Eventually(t, 30*time.Second, func() error {
		metrics, err := cp.Metrics()
		if err != nil {
			return err
		}
		if !strings.Contains(metrics, "\n"+want+"\n") {
			return fmt.Errorf("no %q in the webhook's metrics", want)
		}
		return nil
	})
}

// waitEvent waits for an Event of reason on the webhook's pod whose note contains part.
func waitEvent(t *testing.T, reason, part string) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, func() error {
		events := &eventsv1.EventList{}
		if err := cp.Client.List(context.Background(), events); err != nil {
			return err
		}
		var notes []string
		for _, e := range events.Items {
			if e.Regarding.Kind == "Pod" && e.Regarding.Name == harness.WebhookPod && e.Reason == reason {
				if strings.Contains(e.Note, part) {
					return nil
				}
				notes = append(notes, e.Note)
			}
		}
		return fmt.Errorf("no %s Event on the webhook's pod says %q; those there say %q", reason, part, notes)
	})
}

// TestOtherNamingMode runs the real CAPM3 controllers with --enable-bmh-name-based-preallocation
// and the webhook without it, its claim creates delayed on the way to the API server, so that
// CAPM3's first reconcile creates its own claims first. Told that CAPM3 names claims as it does
// (what the webhook assumed before it checked), it still creates its claims, which CAPM3 never uses:
// every machine holds two addresses of each Metal3 pool. Told the truth, it leaves every claim to CAPM3.
func TestOtherNamingMode(t *testing.T) {
	ctx := context.Background()
	startIPAMs(t)
	unguarded := newWorld(t, "naming-unguarded", 2, 41)
	guarded := newWorld(t, "naming-guarded", 2, 42)
	capm3, err := stack.StartCAPM3(ctx, cp.Config, stack.Options{
		BMHNameBased: true, Templates: true, Namespaces: []string{unguarded.ns, guarded.ns},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = capm3.Stop() }()

	const delay = 2 * time.Second
	kubeconfig, err := cp.WebhookKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := harness.StartLoopbackProxy(t.TempDir(), "delayed-ipclaims", kubeconfig, func(w http.ResponseWriter, r *http.Request, upstream http.Handler) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/ipclaims") {
			time.Sleep(delay)
		}
		upstream.ServeHTTP(w, r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	restore := cp.RouteWebhook(proxy.Kubeconfig)
	defer func() {
		restore()
		cp.StopWebhook()
		if err := cp.StartWebhook(ctx); err != nil {
			t.Error(err)
		}
	}()
	cp.StopWebhook()
	// StartWebhook declares CAPM3's Deployment in the webhook's naming mode: the wrong one.
	if err := cp.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	waitCompatible(t, true)
	unguarded.createIdle(t)
	harness.Eventually(t, 30*time.Second, func() error {
		if held := metal3Addresses(t, unguarded.ns); held != 2*2*len(unguarded.machines) {
			return fmt.Errorf("without the guard, %d machines hold %d Metal3 addresses, want two per pool: %d",
				len(unguarded.machines), held, 4*len(unguarded.machines))
		}
		return nil
	})

	declare(t, harness.CAPM3Image, true)
	waitCompatible(t, false)
	guarded.createIdle(t)
	time.Sleep(2 * delay)
	if s := summarize(capm3.Counter, guarded.machines); s.claimsByCAPM3 != 3*len(guarded.machines) {
		t.Errorf("with the guard, CAPM3 created %d claims, want every one: %d", s.claimsByCAPM3, 3*len(guarded.machines))
	}
	if held := metal3Addresses(t, guarded.ns); held != 2*len(guarded.machines) {
		t.Errorf("with the guard, %d machines hold %d Metal3 addresses, want one per pool: %d", len(guarded.machines), held, 2*len(guarded.machines))
	}
	claims := &ipamv1.IPClaimList{}
	if err := cp.Client.List(ctx, claims, client.InNamespace(guarded.ns)); err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if !hostNamed(c.Name, guarded.machines) {
			t.Errorf("IPClaim %s is not named after a BareMetalHost, as CAPM3 names its own", c.Name)
		}
	}
}

func hostNamed(name string, ms []*fixtures.Machine) bool {
	for _, m := range ms {
		if strings.HasPrefix(name, m.Host.Name+"-") {
			return true
		}
	}
	return false
}

func metal3Addresses(t *testing.T, ns string) int {
	t.Helper()
	addresses := &ipamv1.IPAddressList{}
	if err := cp.Client.List(context.Background(), addresses, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return len(addresses.Items)
}
