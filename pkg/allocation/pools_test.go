package allocation

import (
	"errors"
	"testing"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

const ann = "example.com/pool"

func machineWith(machine, m3m, bmh string) Machine {
	obj := func(v string) metav1.Object {
		return &metav1.ObjectMeta{Annotations: map[string]string{ann: v}}
	}
	return Machine{Machine: obj(machine), Metal3Machine: obj(m3m), BareMetalHost: obj(bmh)}
}

func metal3(name string) PoolRef {
	return PoolRef{Name: name, APIGroup: Metal3PoolGroup, Kind: Metal3PoolKind}
}

func networks(n infrav1.NetworkDataNetwork) *infrav1.Metal3DataTemplate {
	return &infrav1.Metal3DataTemplate{Spec: infrav1.Metal3DataTemplateSpec{
		NetworkData: &infrav1.NetworkData{Networks: &n},
	}}
}

func TestReferencedPools(t *testing.T) {
	capi := infrav1.IPPoolReference{Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}
	route4 := func(gw infrav1.NetworkGatewayv4, dns string) []infrav1.NetworkDataRoutev4 {
		r := infrav1.NetworkDataRoutev4{Network: "0.0.0.0", Gateway: gw}
		if dns != "" {
			r.Services = &infrav1.NetworkDataServicev4{DNSFromIPPool: dns}
		}
		return []infrav1.NetworkDataRoutev4{r}
	}
	route6 := func(gw infrav1.NetworkGatewayv6, dns string) []infrav1.NetworkDataRoutev6 {
		r := infrav1.NetworkDataRoutev6{Network: "::", Gateway: gw}
		if dns != "" {
			r.Services = &infrav1.NetworkDataServicev6{DNSFromIPPool: dns}
		}
		return []infrav1.NetworkDataRoutev6{r}
	}
	byAnnotation := func(object string) infrav1.FromPoolAnnotation {
		return infrav1.FromPoolAnnotation{Object: object, Annotation: ann}
	}

	for _, tc := range []struct {
		name    string
		tmpl    *infrav1.Metal3DataTemplate
		machine Machine
		want    []PoolRef
		wantErr string
	}{
		{name: "no data", tmpl: &infrav1.Metal3DataTemplate{}},
		{
			name: "metaData lists are Metal3 pools whatever their apiGroup and kind",
			tmpl: &infrav1.Metal3DataTemplate{Spec: infrav1.Metal3DataTemplateSpec{MetaData: &infrav1.MetaData{
				IPAddressesFromPool: []infrav1.FromPool{{Name: "a", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}},
				PrefixesFromPool:    []infrav1.FromPool{{Name: "b"}, {Name: "a"}},
				GatewaysFromPool:    []infrav1.FromPool{{Name: "c", Kind: "Other"}},
				DNSServersFromPool:  []infrav1.FromPool{{Name: "d"}},
			}}},
			want: []PoolRef{metal3("a"), metal3("b"), metal3("c"), metal3("d")},
		},
		{
			name: "static fromPoolRef keeps apiGroup and kind",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{FromPoolRef: capi}}}),
			want: []PoolRef{{Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}},
		},
		{
			name: "fromPoolRef without apiGroup and kind defaults to a Metal3 IPPool",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv6: []infrav1.NetworkDataIPv6{{FromPoolRef: infrav1.IPPoolReference{Name: "p"}}}}),
			want: []PoolRef{metal3("p")},
		},
		{
			name: "fromPoolRef with only a kind keeps it and defaults the group",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "GlobalInClusterIPPool"}}}}),
			want: []PoolRef{{Name: "p", APIGroup: Metal3PoolGroup, Kind: "GlobalInClusterIPPool"}},
		},
		{
			name: "fromPoolRef wins over ipAddressFromIPPool",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{FromPoolRef: infrav1.IPPoolReference{Name: "ref"}, IPAddressFromIPPool: "name"}}}),
			want: []PoolRef{metal3("ref")},
		},
		{
			name: "ipAddressFromIPPool",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv6: []infrav1.NetworkDataIPv6{{IPAddressFromIPPool: "v6"}}}),
			want: []PoolRef{metal3("v6")},
		},
		{
			name:    "fromPoolAnnotation on each object, case-insensitive, and the direct reference next to it",
			machine: machineWith("from-machine", "from-m3m", "from-bmh"),
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
				{FromPoolAnnotation: byAnnotation("machine"), IPAddressFromIPPool: "also"},
				{FromPoolAnnotation: byAnnotation("Metal3Machine")},
				{FromPoolAnnotation: byAnnotation("BAREMETALHOST")},
			}}),
			want: []PoolRef{metal3("from-machine"), metal3("also"), metal3("from-m3m"), metal3("from-bmh")},
		},
		{
			name:    "fromPoolAnnotation names a Metal3 pool",
			machine: machineWith("capi", "", ""),
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
				{FromPoolAnnotation: byAnnotation("machine")}, {FromPoolRef: capi},
			}}),
			wantErr: `spec.networkData.networks.ipv4[1].fromPoolRef: pool "capi": multiple references with the same name but different resource types ` +
				`(ipam.cluster.x-k8s.io/InClusterIPPool and ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[0].fromPoolAnnotation)`,
		},
		{
			name:    "route gateways and DNS of static networks",
			machine: machineWith("gw-ann", "", ""),
			tmpl: networks(infrav1.NetworkDataNetwork{
				IPv4: []infrav1.NetworkDataIPv4{{Routes: append(append(
					route4(infrav1.NetworkGatewayv4{FromIPPool: "gw4"}, "dns4"),
					route4(infrav1.NetworkGatewayv4{FromPoolRef: capi, FromIPPool: "ignored"}, "")...),
					route4(infrav1.NetworkGatewayv4{FromPoolAnnotation: byAnnotation("machine")}, "")...)}},
				IPv6: []infrav1.NetworkDataIPv6{{Routes: route6(infrav1.NetworkGatewayv6{FromIPPool: "gw6"}, "dns6")}},
			}),
			want: []PoolRef{metal3("gw4"), metal3("dns4"), {Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"},
				metal3("gw-ann"), metal3("gw6"), metal3("dns6")},
		},
		{
			name:    "DHCP and SLAAC routes; their fromPoolAnnotation is ignored",
			machine: machineWith("", "", ""),
			tmpl: networks(infrav1.NetworkDataNetwork{
				IPv4DHCP:  []infrav1.NetworkDataIPv4DHCP{{Routes: route4(infrav1.NetworkGatewayv4{FromIPPool: "d4", FromPoolAnnotation: byAnnotation("machine")}, "d4dns")}},
				IPv6DHCP:  []infrav1.NetworkDataIPv6DHCP{{Routes: route6(infrav1.NetworkGatewayv6{FromPoolRef: infrav1.IPPoolReference{Name: "d6"}}, "")}},
				IPv6SLAAC: []infrav1.NetworkDataIPv6DHCP{{Routes: route6(infrav1.NetworkGatewayv6{FromPoolAnnotation: byAnnotation("machine")}, "slaacdns")}},
			}),
			want: []PoolRef{metal3("d4"), metal3("d4dns"), metal3("d6"), metal3("slaacdns")},
		},
		{
			name: "top-level DNS service",
			tmpl: &infrav1.Metal3DataTemplate{Spec: infrav1.Metal3DataTemplateSpec{NetworkData: &infrav1.NetworkData{
				Services: &infrav1.NetworkDataService{DNSFromIPPool: "dns"},
			}}},
			want: []PoolRef{metal3("dns")},
		},
		{
			name: "same name with another kind",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
				{IPAddressFromIPPool: "capi"}, {FromPoolRef: capi},
			}}),
			wantErr: "spec.networkData.networks.ipv4[1].fromPoolRef: pool \"capi\": multiple references with the same name but different resource types " +
				"(ipam.cluster.x-k8s.io/InClusterIPPool and ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[0].ipAddressFromIPPool)",
		},
		{
			name:    "empty annotation value",
			machine: machineWith("", "", ""),
			tmpl:    networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{FromPoolAnnotation: byAnnotation("machine")}}}),
			wantErr: "spec.networkData.networks.ipv4[0].fromPoolAnnotation: annotation example.com/pool not found or empty on machine",
		},
		{
			name:    "unknown annotation object",
			machine: machineWith("x", "x", "x"),
			tmpl:    networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{FromPoolAnnotation: byAnnotation("cluster")}}}),
			wantErr: `spec.networkData.networks.ipv4[0].fromPoolAnnotation: unknown object type "cluster"`,
		},
		{
			name:    "annotation object missing",
			machine: Machine{Machine: &metav1.ObjectMeta{}},
			tmpl:    networks(infrav1.NetworkDataNetwork{IPv6: []infrav1.NetworkDataIPv6{{FromPoolAnnotation: byAnnotation("baremetalhost")}}}),
			wantErr: "spec.networkData.networks.ipv6[0].fromPoolAnnotation: baremetalhost is nil but referenced in annotation example.com/pool",
		},
		{
			name: "without a machine fromPoolAnnotation is skipped, as when CAPM3 releases claims",
			tmpl: networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
				{FromPoolAnnotation: byAnnotation("cluster"), IPAddressFromIPPool: "direct"},
			}}),
			want: []PoolRef{metal3("direct")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReferencedPools(tc.tmpl, tc.machine)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error = %v, want %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := fixtures.Diff(tc.want, got); diff != "" {
				t.Errorf("pools (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConflictIsErrConflictingPoolTypes(t *testing.T) {
	tmpl := networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "p"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "Other"}},
	}})
	_, err := ReferencedPools(tmpl, Machine{})
	if !errors.Is(err, errConflictingPoolTypes) {
		t.Fatalf("error = %v", err)
	}
	var conflict *PoolConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("error %T is not a *PoolConflictError", err)
	}
	want := PoolConflictError{
		Path:      field.NewPath("spec", "networkData", "networks", "ipv4").Index(1).Child("fromPoolRef"),
		Pool:      PoolRef{Name: "p", APIGroup: Metal3PoolGroup, Kind: "Other"},
		First:     metal3("p"),
		FirstPath: field.NewPath("spec", "networkData", "networks", "ipv4").Index(0).Child("ipAddressFromIPPool"),
	}
	if diff := fixtures.Diff(want, *conflict); diff != "" {
		t.Errorf("conflict (-want +got):\n%s", diff)
	}
}

// TestResolveReportsEveryError: validation shows every broken reference at once, while CAPM3 (and
// ReferencedPools) stops at the first.
func TestResolveReportsEveryError(t *testing.T) {
	tmpl := networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "a"},
		{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "cluster", Annotation: ann}, FromPoolRef: infrav1.IPPoolReference{Name: "a", Kind: "K"}},
		{IPAddressFromIPPool: "b"},
		{FromPoolRef: infrav1.IPPoolReference{Name: "b", APIGroup: "g"}},
	}})
	pools, errs := Resolve(tmpl, machineWith("x", "x", "x"))
	var got []string
	for _, err := range errs {
		got = append(got, err.Error())
	}
	want := []string{
		`spec.networkData.networks.ipv4[1].fromPoolAnnotation: unknown object type "cluster"`,
		`spec.networkData.networks.ipv4[1].fromPoolRef: pool "a": multiple references with the same name but different resource types (ipam.metal3.io/K and ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[0].ipAddressFromIPPool)`,
		`spec.networkData.networks.ipv4[3].fromPoolRef: pool "b": multiple references with the same name but different resource types (g/IPPool and ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[2].ipAddressFromIPPool)`,
	}
	if diff := fixtures.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	var unknown *UnknownObjectError
	if !errors.As(errs[0], &unknown) || unknown.Object != "cluster" || unknown.Path.String() != "spec.networkData.networks.ipv4[1].fromPoolAnnotation" {
		t.Errorf("first error %#v", errs[0])
	}
	wantPools := []Pool{
		{PoolRef: metal3("a"), Path: field.NewPath("spec", "networkData", "networks", "ipv4").Index(0).Child("ipAddressFromIPPool")},
		{PoolRef: metal3("b"), Path: field.NewPath("spec", "networkData", "networks", "ipv4").Index(2).Child("ipAddressFromIPPool")},
	}
	if diff := fixtures.Diff(wantPools, pools); diff != "" {
		t.Errorf("pools (-want +got):\n%s", diff)
	}
}

func TestCheckAnnotationObject(t *testing.T) {
	path := field.NewPath("spec", "x")
	for _, object := range []string{"machine", "Metal3Machine", "BAREMETALHOST"} {
		if err := CheckAnnotationObject(path, object); err != nil {
			t.Errorf("%s: %v", object, err)
		}
	}
	err := CheckAnnotationObject(path, "cluster")
	if diff := fixtures.Diff(&UnknownObjectError{Path: path, Object: "cluster"}, err); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
}

func TestDefaulted(t *testing.T) {
	for _, tc := range []struct {
		ref  infrav1.IPPoolReference
		want PoolRef
	}{
		{infrav1.IPPoolReference{Name: "p"}, metal3("p")},
		{infrav1.IPPoolReference{Name: "p", Kind: "K"}, PoolRef{Name: "p", APIGroup: Metal3PoolGroup, Kind: "K"}},
		{infrav1.IPPoolReference{Name: "p", APIGroup: "g"}, PoolRef{Name: "p", APIGroup: "g", Kind: Metal3PoolKind}},
		{infrav1.IPPoolReference{Name: "p", APIGroup: "g", Kind: "K"}, PoolRef{Name: "p", APIGroup: "g", Kind: "K"}},
	} {
		if got := Defaulted(tc.ref); got != tc.want {
			t.Errorf("Defaulted(%+v) = %+v, want %+v", tc.ref, got, tc.want)
		}
	}
}

func TestReferencesPaths(t *testing.T) {
	tmpl := networks(infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{
		FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "machine", Annotation: ann},
		Routes: []infrav1.NetworkDataRoutev4{{Gateway: infrav1.NetworkGatewayv4{FromIPPool: "gw"},
			Services: &infrav1.NetworkDataServicev4{DNSFromIPPool: "dns"}}},
	}}})
	tmpl.Spec.MetaData = &infrav1.MetaData{GatewaysFromPool: []infrav1.FromPool{{Name: "m", APIGroup: "g", Kind: "k"}}}
	var paths []string
	for _, r := range References(tmpl) {
		paths = append(paths, r.Path.String())
	}
	want := []string{
		"spec.metaData.gatewaysFromPool[0].name",
		"spec.networkData.networks.ipv4[0].fromPoolAnnotation",
		"spec.networkData.networks.ipv4[0].routes[0].gateway.fromIPPool",
		"spec.networkData.networks.ipv4[0].routes[0].services.dnsFromIPPool",
	}
	if diff := fixtures.Diff(want, paths); diff != "" {
		t.Errorf("paths (-want +got):\n%s", diff)
	}
	if gk := References(tmpl)[0].MetaDataGroupKind; gk == nil || *gk != (metav1.GroupKind{Group: "g", Kind: "k"}) {
		t.Errorf("metaData group/kind = %v", gk)
	}
}
