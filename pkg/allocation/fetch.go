package allocation

import (
	"context"
	"errors"
	"fmt"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Address is what CAPM3 takes from a pool for rendering.
type Address struct {
	Address    string
	Prefix     *int32
	Gateway    string
	DNSServers []string
}

// AllocationError is an IPAM's final word that a claim cannot be fulfilled: CAPM3 puts it on the
// Metal3Data and does not retry.
type AllocationError struct {
	Pool    string
	Message string
}

func (e *AllocationError) Error() string {
	return fmt.Sprintf("IP Allocation for %v failed : %v", e.Pool, e.Message)
}

// Addresses is the outcome of the fetch phase for one Metal3Data.
type Addresses struct {
	// ByPool holds the addresses of fulfilled claims, by pool name.
	ByPool map[string]Address
	// Pending lists the pools whose claim is missing, not fulfilled yet, being deleted, or not
	// the Metal3Data's (CAPM3 requeues for each of them).
	Pending []string
}

// Fetch is CAPM3 v1.13.2's fetch phase as a library call: for every planned claim it finds the
// claim CAPM3 would use (the first existing name of Lookup) and reads its address with CAPM3's
// checks. An IPClaim counts only when one of its owner references carries data's UID. A pool
// whose IPAM reported a failure makes Fetch return an *AllocationError.
func Fetch(ctx context.Context, r client.Reader, data *infrav1.Metal3Data, claims []Claim) (Addresses, error) {
	out := Addresses{ByPool: map[string]Address{}}
	for _, claim := range claims {
		addr, pending, err := fetchOne(ctx, r, data, claim)
		if err != nil {
			return out, err
		}
		if pending {
			out.Pending = append(out.Pending, claim.Pool.Name)
			continue
		}
		out.ByPool[claim.Pool.Name] = addr
	}
	return out, nil
}

func fetchOne(ctx context.Context, r client.Reader, data *infrav1.Metal3Data, claim Claim) (Address, bool, error) {
	if claim.Pool.IsMetal3() {
		ipClaim := &ipamv1.IPClaim{}
		if found, err := getFirst(ctx, r, data.Namespace, claim.Lookup, ipClaim); !found || err != nil {
			return Address{}, true, err
		}
		return fromIPClaim(ctx, r, data, claim.Pool, ipClaim)
	}
	addrClaim := &capipamv1.IPAddressClaim{}
	if found, err := getFirst(ctx, r, data.Namespace, claim.Lookup, addrClaim); !found || err != nil {
		return Address{}, true, err
	}
	return fromIPAddressClaim(ctx, r, addrClaim)
}

func getFirst(ctx context.Context, r client.Reader, namespace string, names []string, obj client.Object) (bool, error) {
	for _, name := range names {
		err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, obj)
		if err == nil {
			return true, nil
		}
		if !apierrors.IsNotFound(err) {
			return false, err
		}
	}
	return false, nil
}

func fromIPClaim(ctx context.Context, r client.Reader, data *infrav1.Metal3Data, pool PoolRef, c *ipamv1.IPClaim) (Address, bool, error) {
	owned := false
	for _, ref := range c.OwnerReferences {
		owned = owned || ref.UID == data.UID
	}
	if !owned {
		// CAPM3 requeues until a claim of an earlier Metal3Data of the same name goes away.
		return Address{}, true, nil
	}
	if c.Status.ErrorMessage != nil {
		return Address{}, false, &AllocationError{Pool: pool.Name, Message: *c.Status.ErrorMessage}
	}
	if c.Status.Address == nil {
		return Address{}, true, nil
	}
	ip := &ipamv1.IPAddress{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: data.Namespace, Name: c.Status.Address.Name}, ip); err != nil {
		return Address{}, apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	prefix := int32(ip.Spec.Prefix) //nolint:gosec // CAPM3 rejects prefixes beyond int32; IPAM bounds them to 128.
	addr := Address{Address: string(ip.Spec.Address), Prefix: &prefix}
	if ip.Spec.Gateway != nil {
		addr.Gateway = string(*ip.Spec.Gateway)
	}
	for _, dns := range ip.Spec.DNSServers {
		addr.DNSServers = append(addr.DNSServers, string(dns))
	}
	return addr, false, nil
}

func fromIPAddressClaim(ctx context.Context, r client.Reader, c *capipamv1.IPAddressClaim) (Address, bool, error) {
	if !c.DeletionTimestamp.IsZero() || c.Status.AddressRef.Name == "" {
		return Address{}, true, nil
	}
	ip := &capipamv1.IPAddress{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Status.AddressRef.Name}, ip); err != nil {
		return Address{}, apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	return Address{Address: ip.Spec.Address, Prefix: ip.Spec.Prefix, Gateway: ip.Spec.Gateway}, false, nil
}

// IsAllocationError tells whether err is an IPAM's final allocation failure.
func IsAllocationError(err error) bool {
	var ae *AllocationError
	return errors.As(err, &ae)
}
