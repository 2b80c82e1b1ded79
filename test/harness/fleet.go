package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// A standing fleet is machines that were made Ready long ago, written directly as a restore from
// backup writes them: the controllers that start on it find every object in place.

// FleetNamespacePrefix begins the name of every namespace of a standing fleet.
const FleetNamespacePrefix = "fleet-"

// FleetNamespaces stores count namespaces named fleet-N, each with a Cluster, a ThreePoolTemplate
// named workers and its three pools, and returns the templates as stored.
func FleetNamespaces(ctx context.Context, c client.Client, count int) ([]*infrav1.Metal3DataTemplate, error) {
	var templates []*infrav1.Metal3DataTemplate
	for i := range count {
		ns := FleetNamespacePrefix + strconv.Itoa(i)
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
		for _, p := range []client.Object{
			fixtures.Metal3Pool(fixtures.ProvisioningPool, "10."+strconv.Itoa(i)),
			fixtures.Metal3Pool(fixtures.BaremetalPool, "10."+strconv.Itoa(100+i)),
			fixtures.InClusterPool(fixtures.ExternalPool, "10."+strconv.Itoa(200+i)),
		} {
			p.SetNamespace(ns)
			if err := c.Create(ctx, p); err != nil {
				return nil, fmt.Errorf("storing pool %s/%s: %w", ns, p.GetName(), err)
			}
		}
		// After its pools, which the webhook's validation of the template looks up.
		m := fixtures.NewMachine(fixtures.ThreePoolTemplate("workers"), 0).InNamespace(ns)
		if err := CreateShared(ctx, c, m); err != nil {
			return nil, fmt.Errorf("storing the cluster and template of %s: %w", ns, err)
		}
		templates = append(templates, m.Template)
	}
	return templates, nil
}

// WriteFleet stores the machines with index from to to-1, spread over the namespaces.
func WriteFleet(ctx context.Context, c client.Client, templates []*infrav1.Metal3DataTemplate, from, to int) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := from; i < to; i++ {
		tmpl := templates[i%len(templates)]
		g.Go(func() error {
			return writeMachine(ctx, c, fixtures.NewMachine(tmpl.DeepCopy(), i/len(templates)).InNamespace(tmpl.Namespace), i%len(templates), i/len(templates))
		})
	}
	return g.Wait()
}

// writeMachine stores one Ready machine: what CAPI and CAPM3 create, the Metal3Data with its
// status, its two IPClaims answered by IPAddresses as the Metal3 IPAM leaves them (its finalizers
// on both) and its IPAddressClaim answered; the in-cluster IPAM, once it runs, adds its finalizer
// and IPAddress.
// Its addresses are in its namespace's pools, which FleetNamespaces numbered by namespace.
func writeMachine(ctx context.Context, c client.Client, m *fixtures.Machine, namespace, index int) error {
	if err := CreateMachineObjects(ctx, c, m); err != nil {
		return fmt.Errorf("storing machine %s/%d: %w", m.Template.Namespace, index, err)
	}
	if err := c.Status().Update(ctx, provisioned(m.Metal3Machine, index)); err != nil {
		return fmt.Errorf("writing the status of Metal3Machine %s/%s: %w", m.Metal3Machine.Namespace, m.Metal3Machine.Name, err)
	}
	if err := CreateDataClaim(ctx, c, m); err != nil {
		return fmt.Errorf("storing Metal3DataClaim %s/%s: %w", m.DataClaim.Namespace, m.DataClaim.Name, err)
	}
	data := m.Data
	if err := c.Create(ctx, data); err != nil {
		return fmt.Errorf("storing Metal3Data %s/%s: %w", data.Namespace, data.Name, err)
	}
	data.Status.Ready = ptr.To(true)
	if err := c.Status().Update(ctx, data); err != nil {
		return fmt.Errorf("writing the status of Metal3Data %s/%s: %w", data.Namespace, data.Name, err)
	}
	owner := allocation.OwnerReference(data)
	for k, pool := range []string{fixtures.ProvisioningPool, fixtures.BaremetalPool} {
		if err := writeIPClaim(ctx, c, data, owner, pool, fmt.Sprintf("10.%d.%d.%d", 100*k+namespace, index/200, 10+index%200)); err != nil {
			return err
		}
	}
	claim := &capipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: allocation.ClaimName(data.Name, fixtures.ExternalPool), Namespace: data.Namespace,
			Labels: data.Labels, OwnerReferences: []metav1.OwnerReference{owner}, Finalizers: []string{infrav1.DataFinalizer},
		},
		Spec: capipamv1.IPAddressClaimSpec{PoolRef: capipamv1.IPPoolReference{
			APIGroup: fixtures.CAPIPoolGroup, Kind: fixtures.CAPIPoolKind, Name: fixtures.ExternalPool,
		}},
	}
	if err := c.Create(ctx, claim); err != nil {
		return fmt.Errorf("storing IPAddressClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	claim.Status.AddressRef = capipamv1.IPAddressReference{Name: claim.Name}
	return c.Status().Update(ctx, claim)
}

// provisioned gives a Metal3Machine the status CAPM3 writes for a provisioned host: its addresses,
// the Secrets rendered for it and its conditions.
func provisioned(m3m *infrav1.Metal3Machine, index int) *infrav1.Metal3Machine {
	now := metav1.Now()
	m3m.Status = infrav1.Metal3MachineStatus{
		LastUpdated: &now,
		Addresses: []clusterv1.MachineAddress{
			{Type: clusterv1.MachineInternalIP, Address: fmt.Sprintf("10.0.%d.%d", index/200, 10+index%200)},
			{Type: clusterv1.MachineInternalIP, Address: fmt.Sprintf("10.1.%d.%d", index/200, 10+index%200)},
			{Type: clusterv1.MachineHostName, Address: "host-" + strconv.Itoa(index)},
			{Type: clusterv1.MachineInternalDNS, Address: "host-" + strconv.Itoa(index) + ".cluster.example.com"},
		},
		RenderedData:   &infrav1.Metal3ObjectRef{Name: m3m.Spec.DataTemplate.Name + "-" + strconv.Itoa(index)},
		MetaData:       &corev1.SecretReference{Name: m3m.Name + "-metadata", Namespace: m3m.Namespace},
		NetworkData:    &corev1.SecretReference{Name: m3m.Name + "-networkdata", Namespace: m3m.Namespace},
		UserData:       &corev1.SecretReference{Name: "bootstrap-" + strconv.Itoa(index), Namespace: m3m.Namespace},
		Initialization: infrav1.Metal3MachineInitializationStatus{Provisioned: ptr.To(true)},
	}
	for _, condition := range []string{"Ready", "AssociateBareMetalHost", "AssociateMetal3MachineMetaData", "Metal3DataReady"} {
		m3m.Status.Conditions = append(m3m.Status.Conditions, metav1.Condition{
			Type: condition, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: now, ObservedGeneration: 1,
		})
	}
	return m3m
}

func writeIPClaim(ctx context.Context, c client.Client, data *infrav1.Metal3Data, owner metav1.OwnerReference, pool, ip string) error {
	claim := &ipamv1.IPClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: allocation.ClaimName(data.Name, pool), Namespace: data.Namespace,
			Labels: data.Labels, OwnerReferences: []metav1.OwnerReference{owner},
			Finalizers: []string{infrav1.DataFinalizer, ipamv1.IPClaimFinalizer},
		},
		Spec: ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: pool, Namespace: data.Namespace}},
	}
	if err := c.Create(ctx, claim); err != nil {
		return fmt.Errorf("storing IPClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	address := &ipamv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{
			Name: pool + "-" + strings.ReplaceAll(ip, ".", "-"), Namespace: data.Namespace, Labels: data.Labels,
			Finalizers: []string{ipamv1.IPAddressFinalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: ipamv1.GroupVersion.String(), Kind: "IPClaim", Name: claim.Name, UID: claim.UID, Controller: ptr.To(true),
			}},
		},
		Spec: ipamv1.IPAddressSpec{
			Claim:   corev1.ObjectReference{Name: claim.Name, Namespace: data.Namespace},
			Pool:    corev1.ObjectReference{Name: pool, Namespace: data.Namespace},
			Address: ipamv1.IPAddressStr(ip), Prefix: 16,
		},
	}
	if err := c.Create(ctx, address); err != nil {
		return fmt.Errorf("storing IPAddress %s/%s: %w", address.Namespace, address.Name, err)
	}
	claim.Status.Address = &corev1.ObjectReference{Name: address.Name, Namespace: data.Namespace}
	if err := c.Status().Update(ctx, claim); err != nil {
		return fmt.Errorf("writing the status of IPClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return nil
}
