package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// world is one namespace with a Cluster, the three pools of ThreePoolTemplate and machines whose
// Metal3DataClaims are not created yet.
type world struct {
	ns       string
	machines []*fixtures.Machine
}

func newWorld(t *testing.T, ns string, n int, subnet int) *world {
	t.Helper()
	ctx := context.Background()
	newNamespace(t, ns)
	for _, pool := range []client.Object{
		fixtures.Metal3Pool(fixtures.ProvisioningPool, fmt.Sprintf("172.%d", subnet)),
		fixtures.Metal3Pool(fixtures.BaremetalPool, fmt.Sprintf("10.%d", subnet)),
		fixtures.InClusterPool(fixtures.ExternalPool, fmt.Sprintf("100.%d", subnet)),
	} {
		pool.SetNamespace(ns)
		if err := cp.Client.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	w := &world{ns: ns}
	for i := range n {
		m := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), i).InNamespace(ns)
		if err := harness.CreateShared(ctx, cp.Client, m); err != nil {
			t.Fatal(err)
		}
		if err := harness.CreateMachineObjects(ctx, cp.Client, m); err != nil {
			t.Fatal(err)
		}
		w.machines = append(w.machines, m)
	}
	return w
}

func ready(ctx context.Context, data *infrav1.Metal3Data) (bool, error) {
	got := &infrav1.Metal3Data{}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(data), got); err != nil {
		return false, err
	}
	return got.Status.Ready != nil && *got.Status.Ready, nil
}

func waitReady(t *testing.T, ms []*fixtures.Machine) {
	t.Helper()
	harness.Eventually(t, 90*time.Second, func() error {
		for _, m := range ms {
			ok, err := ready(context.Background(), m.Data)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("Metal3Data %s/%s is not Ready", m.Data.Namespace, m.Data.Name)
			}
		}
		return nil
	})
}

// createIdle creates the machines' Metal3DataClaims one after another, as CAPM3's Metal3Machine
// controller does, each once the previous machine's Metal3Data is Ready; CAPM3's
// Metal3DataTemplate controller creates the Metal3Data.
func (w *world) createIdle(t *testing.T) {
	t.Helper()
	for _, m := range w.machines {
		if err := harness.CreateDataClaim(context.Background(), cp.Client, m); err != nil {
			t.Fatal(err)
		}
		adoptData(t, m)
		waitReady(t, []*fixtures.Machine{m})
	}
}

// adoptData waits until CAPM3's template controller has created the machine's Metal3Data and
// makes it m.Data: the controller picks the lowest free index, and the claim's
// status.renderedData tells which Metal3Data is the machine's.
func adoptData(t *testing.T, m *fixtures.Machine) {
	t.Helper()
	ctx := context.Background()
	harness.Eventually(t, 60*time.Second, func() error {
		claim := &infrav1.Metal3DataClaim{}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(m.DataClaim), claim); err != nil {
			return err
		}
		if claim.Status.RenderedData == nil {
			return fmt.Errorf("Metal3DataClaim %s has no Metal3Data yet", claim.Name)
		}
		data := &infrav1.Metal3Data{}
		if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Status.RenderedData.Name}, data); err != nil {
			return err
		}
		m.Data = data
		return nil
	})
}

// claims returns the three claims of each machine, by machine index and pool, in the naming mode.
func (w *world) claims(t *testing.T, bmhNameBased bool) map[string]client.Object {
	t.Helper()
	out := map[string]client.Object{}
	for i, m := range w.machines {
		for _, pool := range pools {
			name := m.Data.Name + "-" + pool
			var obj client.Object = &ipamv1.IPClaim{}
			if pool == fixtures.ExternalPool {
				obj = &capipamv1.IPAddressClaim{}
			} else if bmhNameBased {
				name = m.Host.Name + "-" + pool
			}
			if err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: w.ns, Name: name}, obj); err != nil {
				t.Fatal(err)
			}
			out[fmt.Sprintf("%d/%s", i, pool)] = obj
		}
	}
	return out
}

// normalized is a claim with what must differ between two namespaces replaced: namespace, UIDs,
// resource versions, timestamps and managed fields.
func normalized(obj client.Object, data *infrav1.Metal3Data) map[string]any {
	meta := map[string]any{
		"name": obj.GetName(), "labels": obj.GetLabels(), "annotations": obj.GetAnnotations(),
		"finalizers": obj.GetFinalizers(),
	}
	var owners []metav1.OwnerReference
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == data.UID {
			ref.UID = "<the Metal3Data's UID>"
		}
		owners = append(owners, ref)
	}
	meta["ownerReferences"] = owners
	out := map[string]any{"metadata": meta}
	switch c := obj.(type) {
	case *ipamv1.IPClaim:
		spec := c.Spec.DeepCopy()
		spec.Pool.Namespace = strings.Replace(spec.Pool.Namespace, data.Namespace, "<namespace>", 1)
		out["spec"], out["allocated"] = spec, c.Status.Address != nil
	case *capipamv1.IPAddressClaim:
		out["spec"], out["allocated"] = c.Spec, c.Status.AddressRef.Name != ""
	}
	return out
}

func address(ctx context.Context, obj client.Object) (string, error) {
	switch c := obj.(type) {
	case *ipamv1.IPClaim:
		if c.Status.Address == nil {
			return "", nil
		}
		addr := &ipamv1.IPAddress{}
		err := cp.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Status.Address.Name}, addr)
		return string(addr.Spec.Address), err
	case *capipamv1.IPAddressClaim:
		if c.Status.AddressRef.Name == "" {
			return "", nil
		}
		addr := &capipamv1.IPAddress{}
		err := cp.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Status.AddressRef.Name}, addr)
		return addr.Spec.Address, err
	}
	return "", fmt.Errorf("not a claim: %T", obj)
}

// checkRendered: the Secrets CAPM3 rendered hold every allocated address.
func (w *world) checkRendered(t *testing.T, claims map[string]client.Object) {
	t.Helper()
	ctx := context.Background()
	for i, m := range w.machines {
		rendered := ""
		for _, suffix := range []string{"-metadata", "-networkdata"} {
			secret := &corev1.Secret{}
			if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: w.ns, Name: m.Metal3Machine.Name + suffix}, secret); err != nil {
				t.Fatal(err)
			}
			for _, v := range secret.Data {
				rendered += string(v)
			}
		}
		for _, pool := range pools {
			addr, err := address(ctx, claims[fmt.Sprintf("%d/%s", i, pool)])
			if err != nil {
				t.Fatal(err)
			}
			if addr == "" || !strings.Contains(rendered, addr) {
				t.Errorf("%s: address %q of pool %s is not in the rendered data:\n%s", m.Data.Name, addr, pool, rendered)
			}
		}
	}
}

// deleteAll deletes the machines' Metal3DataClaims as CAPM3's Metal3Machine controller does on
// scale-down, and waits until CAPM3's template controller has deleted the Metal3Data and its
// Metal3Data controller has released every claim and the IPAMs every address.
func (w *world) deleteAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, m := range w.machines {
		if err := cp.Client.Delete(ctx, m.DataClaim); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, 90*time.Second, func() error {
		for _, list := range []client.ObjectList{
			&ipamv1.IPClaimList{}, &capipamv1.IPAddressClaimList{}, &ipamv1.IPAddressList{}, &capipamv1.IPAddressList{},
			&infrav1.Metal3DataList{}, &infrav1.Metal3DataClaimList{},
		} {
			if err := cp.Client.List(ctx, list, client.InNamespace(w.ns)); err != nil {
				return err
			}
			if n := len(mustItems(list)); n > 0 {
				return fmt.Errorf("%T still has %d items in %s", list, n, w.ns)
			}
		}
		return nil
	})
}

func mustItems(list client.ObjectList) []any {
	switch l := list.(type) {
	case *ipamv1.IPClaimList:
		return anySlice(l.Items)
	case *capipamv1.IPAddressClaimList:
		return anySlice(l.Items)
	case *ipamv1.IPAddressList:
		return anySlice(l.Items)
	case *capipamv1.IPAddressList:
		return anySlice(l.Items)
	case *infrav1.Metal3DataList:
		return anySlice(l.Items)
	case *infrav1.Metal3DataClaimList:
		return anySlice(l.Items)
	}
	return nil
}

func anySlice[T any](items []T) []any {
	out := make([]any, len(items))
	for i := range items {
		out[i] = items[i]
	}
	return out
}

type summary struct {
	reconciles, requeues, claimsByCAPM3, sawWaiting, n int
	// createdByCAPM3 names the claims CAPM3 created, as namespace/kind/name.
	createdByCAPM3 []string
}

func summarize(counter *stack.Counter, ms []*fixtures.Machine) summary {
	var s summary
	for _, m := range ms {
		st := counter.Of(client.ObjectKeyFromObject(m.Data))
		s.n++
		s.reconciles += st.Reconciles
		s.requeues += st.Requeues
		s.claimsByCAPM3 += st.ClaimsCreated
		for _, c := range st.CreatedClaims {
			s.createdByCAPM3 = append(s.createdByCAPM3, m.Data.Namespace+"/"+c)
		}
		if st.FirstReconcileSawWaitingClaim {
			s.sawWaiting++
		}
	}
	return s
}

func (s summary) String() string {
	return fmt.Sprintf("%.2f CAPM3 reconciles per Metal3Data (%d requeues over %d), %d claims created by CAPM3, %d first reconciles found a claim not handed over yet",
		float64(s.reconciles)/float64(s.n), s.requeues, s.n, s.claimsByCAPM3, s.sawWaiting)
}

// TestRealControllers runs the real CAPM3 v1.13.2 Metal3DataTemplate and Metal3Data
// controllers, the real Metal3 IPAM v1.13.2 and the Cluster API in-cluster IPAM provider, on
// machines whose template has two Metal3 pools and a Cluster API pool, in both naming modes: the
// test creates each machine's Metal3DataClaim and CAPM3's template controller creates the
// Metal3Data, once without the webhook (stock) and once with it, in the same run, on the same
// fixtures in two namespaces.
func TestRealControllers(t *testing.T) {
	ctx := context.Background()
	startIPAMs(t)

	for i, bmhNameBased := range []bool{false, true} {
		t.Run(map[bool]string{false: "metal3data-names", true: "bmh-names"}[bmhNameBased], func(t *testing.T) {
			stock := newWorld(t, fmt.Sprintf("stock-%d", i), 3, 10*i+1)
			prealloc := newWorld(t, fmt.Sprintf("preallocated-%d", i), 3, 10*i+2)
			// CAPM3 watches only the two namespaces (its --namespace), so that its template
			// controller leaves the other tests' Metal3DataClaims alone.
			capm3, err := stack.StartCAPM3(ctx, cp.Config, stack.Options{
				BMHNameBased: bmhNameBased, Templates: true, Namespaces: []string{stock.ns, prealloc.ns},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = capm3.Stop() }()

			cp.StopWebhook()
			stock.createIdle(t)
			if err := cp.StartWebhook(ctx, fmt.Sprintf("--enable-bmh-name-based-preallocation=%v", bmhNameBased)); err != nil {
				t.Fatal(err)
			}
			prealloc.createIdle(t)

			stockSummary, preSummary := summarize(capm3.Counter, stock.machines), summarize(capm3.Counter, prealloc.machines)
			t.Logf("stock:        %s", stockSummary)
			t.Logf("preallocated: %s", preSummary)
			if stockSummary.claimsByCAPM3 != 3*len(stock.machines) {
				t.Errorf("stock CAPM3 created %d claims, want %d", stockSummary.claimsByCAPM3, 3*len(stock.machines))
			}
			// The webhook answers once its claim creates are sent, not stored; a CAPM3 reconcile
			// that comes first creates a claim itself, and the webhook must say so in a Warning Event.
			left, err := harness.ClaimsLeftToCAPM3(ctx, cp.Client, prealloc.ns)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range preSummary.createdByCAPM3 {
				if !left[strings.TrimPrefix(c, prealloc.ns+"/")] {
					t.Errorf("CAPM3 created %s next to the webhook, which did not say it left it to CAPM3", c)
				}
			}
			if 2*preSummary.claimsByCAPM3 > 3*len(prealloc.machines) {
				t.Errorf("CAPM3 created %d of %d claims next to the webhook", preSummary.claimsByCAPM3, 3*len(prealloc.machines))
			}

			stockClaims, preClaims := stock.claims(t, bmhNameBased), prealloc.claims(t, bmhNameBased)
			for key, want := range stockClaims {
				index, _, _ := strings.Cut(key, "/")
				m, _ := strconv.Atoi(index)
				if _, ok := want.(*capipamv1.IPAddressClaim); ok && bmhNameBased {
					// CAPM3 shares one label map between a Metal3Data and its claims: an
					// IPAddressClaim it creates carries the data and pool labels of whichever Metal3
					// pool its map iteration reached first, or none (docs/design.md, "Differences").
					labels := want.GetLabels()
					if pool, ok := labels[allocation.PoolLabelName]; ok && pool != fixtures.ProvisioningPool && pool != fixtures.BaremetalPool {
						t.Errorf("%s: stock pool-name label %q", key, pool)
					}
					delete(labels, allocation.PoolLabelName)
					delete(labels, allocation.DataLabelName)
					want.SetLabels(labels)
				}
				w, g := normalized(want, stock.machines[m].Data), normalized(preClaims[key], prealloc.machines[m].Data)
				if diff := cmp.Diff(w, g); diff != "" {
					t.Errorf("claim %s differs from stock CAPM3's (-stock +preallocated):\n%s", key, diff)
				}
			}
			stock.checkRendered(t, stockClaims)
			prealloc.checkRendered(t, preClaims)

			stock.deleteAll(t)
			prealloc.deleteAll(t)
			if !bmhNameBased {
				releaseGivesAddressesBack(t, fmt.Sprintf("released-%d", i), 10*i+3)
			}
		})
	}
	// The other tests of this package expect the webhook in its default mode.
	cp.StopWebhook()
	if err := cp.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
}

// startIPAMs runs the Cluster API in-cluster IPAM provider and the Metal3 IPAM until the test ends.
func startIPAMs(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := cp.StartInClusterIPAM(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.StopInClusterIPAM)
	ipam, err := stack.StartIPAM(ctx, cp.Config, stack.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ipam.Stop() })
}

// releaseGivesAddressesBack: the claims of a Metal3Data that a later webhook rejects are
// allocated by the IPAMs, then released, and the IPAMs delete their addresses. The test creates
// the Metal3Data itself, in a namespace CAPM3 does not watch: its template controller, when a
// create fails, retries the whole template with backoff, and every retry is a new admission.
func releaseGivesAddressesBack(t *testing.T, ns string, subnet int) {
	t.Helper()
	ctx := context.Background()
	newWorld(t, ns, 0, subnet)
	m := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), 9).InNamespace(ns)
	if err := harness.CreateMachine(ctx, cp.Client, m); err != nil {
		t.Fatal(err)
	}
	m.Data.Labels[harness.RejectLabel] = ""
	if err := cp.Client.Create(ctx, m.Data); err == nil {
		t.Fatal("the rejector admitted the Metal3Data")
	}
	allocated := map[string]string{}
	harness.Eventually(t, 30*time.Second, func() error {
		for _, pool := range pools {
			claim, err := claimOf(ctx, m, pool)
			if err != nil {
				return err
			}
			if addr, err := address(ctx, claim); err == nil && addr != "" {
				allocated[pool] = addr
			}
		}
		if len(allocated) < len(pools) {
			return fmt.Errorf("allocated so far: %v", allocated)
		}
		return nil
	})
	// Its machine goes: nothing retries the Metal3Data, and its claims are not kept for it.
	if err := cp.Client.Delete(ctx, m.DataClaim); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, gracePeriod+30*time.Second, func() error {
		for _, pool := range pools {
			if _, err := claimOf(ctx, m, pool); !apierrors.IsNotFound(err) {
				return fmt.Errorf("claim of %s: %v", pool, err)
			}
		}
		for _, list := range []client.ObjectList{&ipamv1.IPAddressList{}, &capipamv1.IPAddressList{}} {
			if err := cp.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
				return err
			}
			for _, item := range mustItems(list) {
				var addr string
				switch a := item.(type) {
				case ipamv1.IPAddress:
					addr = string(a.Spec.Address)
				case capipamv1.IPAddress:
					addr = a.Spec.Address
				}
				for pool, released := range allocated {
					if addr == released {
						return fmt.Errorf("address %s of %s is still allocated", addr, pool)
					}
				}
			}
		}
		return nil
	})
}
