// Package allocation mirrors the IP claims CAPM3's Metal3Data controller would create, and creates,
// hands over and releases them ahead of CAPM3, free of admission types.
package allocation

import (
	"errors"
	"fmt"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

const (
	// CAPM3Version is the CAPM3 release whose behaviour this package mirrors.
	CAPM3Version = "v1.13.2"

	// Metal3PoolGroup is the group CAPM3 defaults a pool reference to.
	Metal3PoolGroup = "ipam.metal3.io"
	// Metal3PoolKind is the kind CAPM3 defaults a pool reference to.
	Metal3PoolKind = "IPPool"

	// objectMachine is how a fromPoolAnnotation names the CAPI Machine (case-insensitive, as in CAPM3).
	objectMachine = "machine"
	// objectMetal3Machine is how a fromPoolAnnotation names the Metal3Machine.
	objectMetal3Machine = "metal3machine"
	// objectBareMetalHost is how a fromPoolAnnotation names the BareMetalHost.
	objectBareMetalHost = "baremetalhost"
)

// errConflictingPoolTypes is CAPM3's reconcile-time error for a pool name used with two group/kinds.
var errConflictingPoolTypes = errors.New("multiple references with the same name but different resource types")

// PoolRef is a pool reference with CAPM3's defaults applied.
type PoolRef struct {
	Name     string
	APIGroup string
	Kind     string
}

// IsMetal3 tells whether CAPM3 claims this pool with an IPClaim rather than an IPAddressClaim.
func (p PoolRef) IsMetal3() bool {
	return p.APIGroup == Metal3PoolGroup && p.Kind == Metal3PoolKind
}

// Reference is one place in a Metal3DataTemplate that names a pool, as written.
type Reference struct {
	Path *field.Path
	// Pool is empty when FromAnnotation names the pool instead.
	Pool infrav1.IPPoolReference
	// FromAnnotation names an annotation whose value is the pool name.
	FromAnnotation *infrav1.FromPoolAnnotation
	// MetaDataGroupKind is set for metaData entries, whose apiGroup and kind CAPM3 ignores.
	MetaDataGroupKind *metav1.GroupKind
}

// References lists a template's pool references in the order CAPM3's getReferencedPools visits them.
func References(tmpl *infrav1.Metal3DataTemplate) []Reference {
	spec := field.NewPath("spec")
	refs := metaDataRefs(tmpl.Spec.MetaData, spec.Child("metaData"))
	nd := tmpl.Spec.NetworkData
	if nd != nil && nd.Networks != nil {
		refs = append(refs, networkRefs(nd.Networks, spec.Child("networkData", "networks"))...)
	}
	if nd != nil && nd.Services != nil && nd.Services.DNSFromIPPool != "" {
		refs = append(refs, Reference{
			Path: spec.Child("networkData", "services", "dnsFromIPPool"),
			Pool: infrav1.IPPoolReference{Name: nd.Services.DNSFromIPPool},
		})
	}
	return refs
}

func metaDataRefs(md *infrav1.MetaData, p *field.Path) []Reference {
	if md == nil {
		return nil
	}
	var refs []Reference
	for _, list := range []struct {
		name  string
		pools []infrav1.FromPool
	}{
		{"ipAddressesFromPool", md.IPAddressesFromPool},
		{"prefixesFromPool", md.PrefixesFromPool},
		{"gatewaysFromPool", md.GatewaysFromPool},
		{"dnsServersFromPool", md.DNSServersFromPool},
	} {
		for i, pool := range list.pools {
			refs = append(refs, Reference{
				Path:              p.Child(list.name).Index(i).Child("name"),
				Pool:              infrav1.IPPoolReference{Name: pool.Name, APIGroup: Metal3PoolGroup, Kind: Metal3PoolKind},
				MetaDataGroupKind: &metav1.GroupKind{Group: pool.APIGroup, Kind: pool.Kind},
			})
		}
	}
	return refs
}

func networkRefs(networks *infrav1.NetworkDataNetwork, p *field.Path) []Reference {
	var refs []Reference
	for i, n := range networks.IPv4 {
		np := p.Child("ipv4").Index(i)
		refs = appendAddressRefs(refs, np, &n.FromPoolAnnotation, n.FromPoolRef, "ipAddressFromIPPool", n.IPAddressFromIPPool)
		for j, r := range n.Routes {
			refs = appendRouteRefs(refs, np.Child("routes").Index(j), &r.Gateway.FromPoolAnnotation,
				r.Gateway.FromPoolRef, r.Gateway.FromIPPool, ptr.Deref(r.Services, infrav1.NetworkDataServicev4{}).DNSFromIPPool)
		}
	}
	for i, n := range networks.IPv6 {
		np := p.Child("ipv6").Index(i)
		refs = appendAddressRefs(refs, np, &n.FromPoolAnnotation, n.FromPoolRef, "ipAddressFromIPPool", n.IPAddressFromIPPool)
		for j, r := range n.Routes {
			refs = appendRouteRefs(refs, np.Child("routes").Index(j), &r.Gateway.FromPoolAnnotation,
				r.Gateway.FromPoolRef, r.Gateway.FromIPPool, ptr.Deref(r.Services, infrav1.NetworkDataServicev6{}).DNSFromIPPool)
		}
	}
	// CAPM3 ignores fromPoolAnnotation on the routes of DHCP and SLAAC networks.
	for i, n := range networks.IPv4DHCP {
		for j, r := range n.Routes {
			refs = appendRouteRefs(refs, p.Child("ipv4DHCP").Index(i).Child("routes").Index(j), nil,
				r.Gateway.FromPoolRef, r.Gateway.FromIPPool, ptr.Deref(r.Services, infrav1.NetworkDataServicev4{}).DNSFromIPPool)
		}
	}
	for _, list := range []struct {
		name     string
		networks []infrav1.NetworkDataIPv6DHCP
	}{{"ipv6DHCP", networks.IPv6DHCP}, {"ipv6SLAAC", networks.IPv6SLAAC}} {
		for i, n := range list.networks {
			for j, r := range n.Routes {
				refs = appendRouteRefs(refs, p.Child(list.name).Index(i).Child("routes").Index(j), nil,
					r.Gateway.FromPoolRef, r.Gateway.FromIPPool, ptr.Deref(r.Services, infrav1.NetworkDataServicev6{}).DNSFromIPPool)
			}
		}
	}
	return refs
}

// appendAddressRefs mirrors CAPM3: any annotation pool, then fromPoolRef or, without it, the pool
// nameField names.
func appendAddressRefs(refs []Reference, p *field.Path, ann *infrav1.FromPoolAnnotation,
	ref infrav1.IPPoolReference, nameField, name string) []Reference {
	if ann != nil && *ann != (infrav1.FromPoolAnnotation{}) {
		refs = append(refs, Reference{Path: p.Child("fromPoolAnnotation"), FromAnnotation: ptr.To(*ann)})
	}
	switch {
	case ref.Name != "":
		refs = append(refs, Reference{Path: p.Child("fromPoolRef"), Pool: ref})
	case name != "":
		refs = append(refs, Reference{Path: p.Child(nameField), Pool: infrav1.IPPoolReference{Name: name}})
	}
	return refs
}

func appendRouteRefs(refs []Reference, p *field.Path, ann *infrav1.FromPoolAnnotation,
	ref infrav1.IPPoolReference, name, dnsPool string) []Reference {
	refs = appendAddressRefs(refs, p.Child("gateway"), ann, ref, "fromIPPool", name)
	if dnsPool != "" {
		refs = append(refs, Reference{Path: p.Child("services", "dnsFromIPPool"), Pool: infrav1.IPPoolReference{Name: dnsPool}})
	}
	return refs
}

// Defaulted applies CAPM3's addRef defaults: an ipam.metal3.io IPPool.
func Defaulted(ref infrav1.IPPoolReference) PoolRef {
	pool := PoolRef{Name: ref.Name, APIGroup: ref.APIGroup, Kind: ref.Kind}
	if pool.APIGroup == "" {
		pool.APIGroup = Metal3PoolGroup
	}
	if pool.Kind == "" {
		pool.Kind = Metal3PoolKind
	}
	return pool
}

// PoolConflictError locates errConflictingPoolTypes: Pool at Path reuses First's name at FirstPath.
type PoolConflictError struct {
	Path      *field.Path
	Pool      PoolRef
	First     PoolRef
	FirstPath *field.Path
}

// Error implements error.
func (e *PoolConflictError) Error() string {
	return fmt.Sprintf("%s: pool %q: %v (%s/%s and %s/%s at %s)", e.Path, e.Pool.Name, errConflictingPoolTypes,
		e.Pool.APIGroup, e.Pool.Kind, e.First.APIGroup, e.First.Kind, e.FirstPath)
}

// Unwrap lets errors.Is match errConflictingPoolTypes.
func (e *PoolConflictError) Unwrap() error { return errConflictingPoolTypes }

// Pool is a pool a template references, and where it is referenced first.
type Pool struct {
	PoolRef
	Path *field.Path
}

// Resolve computes the pools a template references for m as CAPM3's getReferencedPools does, one per
// name in order of first reference. Where CAPM3 stops at the first error, it returns them all.
func Resolve(tmpl *infrav1.Metal3DataTemplate, m Machine) ([]Pool, []error) {
	var pools []Pool
	var errs []error
	index := map[string]int{}
	for _, ref := range References(tmpl) {
		var pool PoolRef
		if ref.FromAnnotation == nil {
			pool = Defaulted(ref.Pool)
		} else {
			name, err := m.poolName(ref.Path, *ref.FromAnnotation)
			if err != nil {
				errs = append(errs, err)
			}
			if name == "" {
				continue
			}
			pool = PoolRef{Name: name, APIGroup: Metal3PoolGroup, Kind: Metal3PoolKind}
		}
		i, seen := index[pool.Name]
		if !seen {
			index[pool.Name] = len(pools)
			pools = append(pools, Pool{PoolRef: pool, Path: ref.Path})
			continue
		}
		if first := pools[i]; first.PoolRef != pool {
			errs = append(errs, &PoolConflictError{Path: ref.Path, Pool: pool, First: first.PoolRef, FirstPath: first.Path})
		}
	}
	return pools, errs
}

// ReferencedPools returns Resolve's pools, or its first error, the one CAPM3 fails with.
func ReferencedPools(tmpl *infrav1.Metal3DataTemplate, m Machine) ([]PoolRef, error) {
	pools, errs := Resolve(tmpl, m)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	var refs []PoolRef
	for _, p := range pools {
		refs = append(refs, p.PoolRef)
	}
	return refs, nil
}
