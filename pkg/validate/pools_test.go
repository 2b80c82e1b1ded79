package validate

import (
	"strings"
	"testing"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

func template(name string, networks infrav1.NetworkDataNetwork, meta *infrav1.MetaData) *infrav1.Metal3DataTemplate {
	return &infrav1.Metal3DataTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec: infrav1.Metal3DataTemplateSpec{
			MetaData:    meta,
			NetworkData: &infrav1.NetworkData{Networks: &networks},
		},
	}
}

func TestPoolReferences(t *testing.T) {
	capi := infrav1.IPPoolReference{Name: "shared", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}
	longPool := strings.Repeat("p", 240)
	for _, tc := range []struct {
		name         string
		tmpl         *infrav1.Metal3DataTemplate
		wantErrs     []string
		wantWarnings []string
	}{
		{
			name:         "every reference form of the fixtures",
			tmpl:         fixtures.Template("workers"),
			wantWarnings: []string{`spec.metaData.gatewaysFromPool[0]: apiGroup "ignored.example.com" and kind "Ignored" are ignored by CAPM3 v1.13.2: pool "pool-meta-gw" is read as an ipam.metal3.io IPPool`},
		},
		{
			name: "one name with two kinds across networks",
			tmpl: template("t", infrav1.NetworkDataNetwork{
				IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: "shared"}},
				IPv6: []infrav1.NetworkDataIPv6{{FromPoolRef: capi}},
			}, nil),
			wantErrs: []string{`spec.networkData.networks.ipv6[0].fromPoolRef: Invalid value: "shared": pool "shared" is referenced as ipam.cluster.x-k8s.io/InClusterIPPool here and as ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[0].ipAddressFromIPPool; CAPM3 fails on one name with two resource types`},
		},
		{
			name: "metaData always means a Metal3 IPPool, so it conflicts with a CAPI pool of that name",
			tmpl: template("t", infrav1.NetworkDataNetwork{IPv4DHCP: []infrav1.NetworkDataIPv4DHCP{{Routes: []infrav1.NetworkDataRoutev4{{
				Gateway: infrav1.NetworkGatewayv4{FromPoolRef: capi}}}}}},
				&infrav1.MetaData{DNSServersFromPool: []infrav1.FromPool{{Key: "dns", Name: "shared", APIGroup: capi.APIGroup, Kind: capi.Kind}}}),
			wantErrs:     []string{`spec.networkData.networks.ipv4DHCP[0].routes[0].gateway.fromPoolRef: Invalid value: "shared": pool "shared" is referenced as ipam.cluster.x-k8s.io/InClusterIPPool here and as ipam.metal3.io/IPPool at spec.metaData.dnsServersFromPool[0].name; CAPM3 fails on one name with two resource types`},
			wantWarnings: []string{`spec.metaData.dnsServersFromPool[0]: apiGroup "ipam.cluster.x-k8s.io" and kind "InClusterIPPool" are ignored by CAPM3 v1.13.2: pool "shared" is read as an ipam.metal3.io IPPool`},
		},
		{
			name: "same name, same defaulted kind",
			tmpl: template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
				{IPAddressFromIPPool: "p"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", APIGroup: "ipam.metal3.io", Kind: "IPPool"}},
			}}, &infrav1.MetaData{IPAddressesFromPool: []infrav1.FromPool{{Key: "ip", Name: "p", APIGroup: "ipam.metal3.io"}}}),
		},
		{
			name: "fromPoolAnnotation on an unknown object with an invalid key",
			tmpl: template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{
				FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "cluster", Annotation: "example.com/bad key"},
			}}}, nil),
			wantErrs: []string{
				`spec.networkData.networks.ipv4[0].fromPoolAnnotation.object: Unsupported value: "cluster": supported values: "machine", "metal3machine", "baremetalhost"`,
				`spec.networkData.networks.ipv4[0].fromPoolAnnotation.annotation: Invalid value: "example.com/bad key": not a valid annotation key: name part must consist of alphanumeric characters, ` +
					`'-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', ` +
					`regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`,
			},
		},
		{
			name: "fromPoolAnnotation objects are compared case-insensitively, as CAPM3 does",
			tmpl: template("t", infrav1.NetworkDataNetwork{IPv6: []infrav1.NetworkDataIPv6{{Routes: []infrav1.NetworkDataRoutev6{{
				Gateway: infrav1.NetworkGatewayv6{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "BareMetalHost", Annotation: "example.com/gw"}}}}}}}, nil),
		},
		{
			name: "claim names too long for index 0",
			tmpl: template(strings.Repeat("t", 10), infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: longPool + "p"}}}, nil),
			wantErrs: []string{`spec.networkData.networks.ipv4[0].ipAddressFromIPPool: Invalid value: "` + longPool + `p": the claims of pool "` + longPool +
				`p" would be named "tttttttttt-0-` + longPool + `p" (254 characters for index 0), which is not a valid object name: must be no more than 253 characters`},
		},
		{
			name: "claim names that fit for index 0 only up to a digit",
			tmpl: template(strings.Repeat("t", 10), infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: longPool}}}, nil),
			wantWarnings: []string{`spec.networkData.networks.ipv4[0].ipAddressFromIPPool: the claims of pool "` + longPool +
				`" fit in an object name (253 characters) up to index 9 only: CAPM3 cannot claim this pool for the Metal3Data of a larger index`},
		},
		{
			name: "claim names that fit up to five digits",
			tmpl: template(strings.Repeat("t", 10), infrav1.NetworkDataNetwork{}, &infrav1.MetaData{DNSServersFromPool: []infrav1.FromPool{{Key: "k", Name: longPool[:236]}}}),
			wantWarnings: []string{`spec.metaData.dnsServersFromPool[0].name: the claims of pool "` + longPool[:236] +
				`" fit in an object name (253 characters) up to index 99999 only: CAPM3 cannot claim this pool for the Metal3Data of a larger index`},
		},
		{
			name: "claim names that fit for index 999999",
			tmpl: template(strings.Repeat("t", 10), infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: longPool[:235]}}}, nil),
		},
		{
			name: "claim names with characters no object name takes",
			tmpl: template("t", infrav1.NetworkDataNetwork{}, &infrav1.MetaData{GatewaysFromPool: []infrav1.FromPool{{Key: "gw", Name: "Pool_1"}}}),
			wantErrs: []string{`spec.metaData.gatewaysFromPool[0].name: Invalid value: "Pool_1": the claims of pool "Pool_1" would be named "t-0-Pool_1" (10 characters for index 0), ` +
				`which is not a valid object name: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character ` +
				`(e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`},
		},
		{
			name:         "ignored group and kind on a metaData entry",
			tmpl:         template("t", infrav1.NetworkDataNetwork{}, &infrav1.MetaData{PrefixesFromPool: []infrav1.FromPool{{Key: "k", Name: "p", Kind: "GlobalInClusterIPPool"}}}),
			wantWarnings: []string{`spec.metaData.prefixesFromPool[0]: apiGroup "" and kind "GlobalInClusterIPPool" are ignored by CAPM3 v1.13.2: pool "p" is read as an ipam.metal3.io IPPool`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, warnings := poolReferences(tc.tmpl)
			expectVerdict(t, errs, warnings, tc.wantErrs, tc.wantWarnings)
		})
	}
}

// expectVerdict compares errors, as the user reads them, and warnings with what is wanted.
func expectVerdict(t *testing.T, errs field.ErrorList, warnings, wantErrs, wantWarnings []string) {
	t.Helper()
	var got []string
	for _, err := range errs {
		got = append(got, err.Error())
	}
	if diff := fixtures.Diff(wantErrs, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if diff := fixtures.Diff(wantWarnings, warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}
