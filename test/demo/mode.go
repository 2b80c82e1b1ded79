package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

const (
	modeStock        = "stock"
	modePreallocated = "preallocated"
	// The control plane is left with the webhook registered, for examples/more/ in this namespace.
	preallocatedNamespace = "metal3-demo"
)

// mode is one pass over examples/: its own namespace, the mutating webhook registered or not.
type mode struct {
	name      string
	namespace string
	webhook   bool
}

// modes run in this order: preallocated first, so that whatever is slow the first time (CAPM3's
// first reconciles, the first admission) is paid by the webhook, not by stock CAPM3.
var modes = []mode{
	{name: modePreallocated, namespace: preallocatedNamespace, webhook: true},
	{name: modeStock, namespace: "metal3-demo-stock", webhook: false},
}

// settle is how long the reconciles that follow Ready (CAPM3 woken by its own status update) are
// given before the next mode starts or the table is printed.
const settle = 2 * time.Second

// demo is the running control plane and the controllers' observers.
type demo struct {
	cp      *harness.ControlPlane
	root    string
	out     io.Writer
	ready   *stack.Readiness
	counter *stack.Counter
	origins *claimOrigins
	timeout time.Duration
	probes  int
}

// runMode applies examples/ to the mode's namespace the way a cluster sees it — pools, template
// and Cluster before any machine, each machine's Metal3DataClaim after its other objects — and
// returns the Metal3Data CAPM3's template controller created for the claims, once Ready.
func (d *demo) runMode(ctx context.Context, m mode) ([]types.NamespacedName, error) {
	state := "mutating webhook not registered: CAPM3 creates the claims"
	if m.webhook {
		state = "mutating webhook registered: it creates the claims at admission"
	}
	fmt.Fprintf(d.out, "\n%s, namespace %s, %s\n", m.name, m.namespace, state)
	if err := d.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.namespace}}); err != nil {
		return nil, err
	}
	if err := d.setWebhook(ctx, m.namespace, m.webhook); err != nil {
		return nil, err
	}
	if err := d.apply(ctx, m.namespace, "10-cluster.yaml"); err != nil {
		return nil, err
	}
	pools, err := d.waitPools(ctx, m.namespace)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(d.out, "  the IPAM has reconciled the %d IPPools\n", pools)
	if err := d.apply(ctx, m.namespace, "20-machines.yaml"); err != nil {
		return nil, err
	}
	keys, err := d.exampleData(ctx, m.namespace)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(d.out, "  CAPM3's Metal3DataTemplate controller created %d Metal3Data\n", len(keys))
	if err := d.waitReady(ctx, keys); err != nil {
		return nil, err
	}
	fmt.Fprintf(d.out, "  %d Metal3Data Ready\n", len(keys))
	time.Sleep(settle)
	return keys, nil
}

// apply runs kubectl apply on one file of examples/ and prints what it did, one line.
func (d *demo) apply(ctx context.Context, namespace, file string) error {
	stdout, stderr, err := d.cp.Kubectl(ctx, nil, "apply", "-n", namespace, "-f", filepath.Join(d.root, "examples", file))
	if err != nil {
		return fmt.Errorf("kubectl apply -f examples/%s: %w\n%s", file, err, stderr)
	}
	fmt.Fprintf(d.out, "  kubectl apply -n %s -f examples/%s: %s\n", namespace, file, tally(stdout))
	return nil
}

// tally summarises kubectl apply's lines ("<kind>/<name> created") as "12 created".
func tally(stdout string) string {
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 {
			counts[fields[len(fields)-1]]++
		}
	}
	var parts []string
	for verb, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, verb))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// waitPools waits until the IPAM has reconciled every IPPool of the namespace (it then stamps
// status.lastUpdated), so that the machines do not arrive while it is still starting up.
func (d *demo) waitPools(ctx context.Context, namespace string) (int, error) {
	return poll(ctx, d.timeout, "the IPAM to reconcile the IPPools", func() (int, bool, error) {
		pools := &ipamv1.IPPoolList{}
		if err := d.cp.Client.List(ctx, pools, client.InNamespace(namespace)); err != nil {
			return 0, false, err
		}
		for _, p := range pools.Items {
			if p.Status.LastUpdated == nil {
				return 0, false, nil
			}
		}
		return len(pools.Items), len(pools.Items) > 0, nil
	})
}

// exampleData waits until CAPM3's template controller has created a Metal3Data for each
// Metal3DataClaim of examples/20-machines.yaml, and names them: the controller picks the lowest
// free index, so only the claim's status.renderedData tells which Metal3Data is a claim's.
func (d *demo) exampleData(ctx context.Context, namespace string) ([]types.NamespacedName, error) {
	data, err := os.ReadFile(filepath.Join(d.root, "examples", "20-machines.yaml"))
	if err != nil {
		return nil, err
	}
	objs, err := harness.DecodeYAML(data)
	if err != nil {
		return nil, err
	}
	var claims []string
	for _, o := range objs {
		if o.GetKind() == "Metal3DataClaim" {
			claims = append(claims, o.GetName())
		}
	}
	return poll(ctx, d.timeout, "CAPM3 to create the Metal3Data", func() ([]types.NamespacedName, bool, error) {
		var keys []types.NamespacedName
		for _, name := range claims {
			claim := &infrav1.Metal3DataClaim{}
			if err := d.cp.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, claim); err != nil {
				return nil, false, err
			}
			if claim.Status.RenderedData == nil {
				return nil, false, nil
			}
			keys = append(keys, types.NamespacedName{Namespace: namespace, Name: claim.Status.RenderedData.Name})
		}
		return keys, true, nil
	})
}

func (d *demo) waitReady(ctx context.Context, keys []types.NamespacedName) error {
	_, err := poll(ctx, d.timeout, "the Metal3Data to become Ready", func() (int, bool, error) {
		for _, key := range keys {
			if _, ok := d.ready.Ready(key); !ok {
				return 0, false, nil
			}
		}
		return 0, true, nil
	})
	return err
}

// setWebhook registers or unregisters ip-preallocator's mutating webhook. The API server learns
// of the change from its own informer, a moment later, so it then probes with dry-run creates
// (which the webhook admits without side effects) until the audit log shows the webhook called,
// or not, as asked.
func (d *demo) setWebhook(ctx context.Context, namespace string, on bool) error {
	var err error
	if on {
		err = d.cp.RegisterMutatingWebhooks(ctx)
	} else {
		err = d.cp.UnregisterMutatingWebhooks(ctx)
	}
	if err != nil {
		return err
	}
	_, err = poll(ctx, d.timeout, "the API server to apply the webhook configuration", func() (int, bool, error) {
		called, err := d.probe(ctx, namespace)
		return 0, err == nil && called == on, err
	})
	return err
}

// probe dry-run creates a Metal3Data and tells whether the webhook was called for it.
func (d *demo) probe(ctx context.Context, namespace string) (bool, error) {
	d.probes++
	key := types.NamespacedName{Namespace: namespace, Name: fmt.Sprintf("webhook-probe-%d", d.probes)}
	data := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := d.cp.Client.Create(ctx, data, client.DryRunAll); err != nil {
		return false, err
	}
	// The audit event is written as the response completes, not before the client has it.
	return poll(ctx, 10*time.Second, "the probe's audit event", func() (bool, bool, error) {
		creates, err := auditCreates(d.cp, "metal3datas")
		if err != nil {
			return false, false, err
		}
		event, ok := creates[key]
		return webhookCalled(event), ok, err
	})
}

// poll calls check every 100 ms until it reports done, and returns its value.
func poll[T any](ctx context.Context, timeout time.Duration, what string, check func() (T, bool, error)) (T, error) {
	var v T
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (done bool, err error) {
		v, done, err = check()
		return done, err
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		return v, fmt.Errorf("waited %v for %s", timeout, what)
	}
	return v, err
}
