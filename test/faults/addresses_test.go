package faults

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// address is an IPAddress of either kind, as the checks see it: the claim it is held for, by
// name and by the UID of its owner reference (both IPAMs set one to the claim), and its value.
type address struct {
	kind, name string
	// claimKind is IPClaim or IPAddressClaim.
	claimKind, claimName string
	// claimUID is empty when the garbage collector removed the reference to a claim that is gone.
	claimUID types.UID
	// key is the value in its pool: API group/pool/address, the address parsed.
	key string
	ip  netip.Addr
}

func (a address) String() string {
	return fmt.Sprintf("%s %s (%s) of %s %s (uid %s)", a.kind, a.name, a.ip, a.claimKind, a.claimName, uidTail(a.claimUID))
}

// addresses lists the namespace's IPAddresses of both kinds.
func (s *namespaceState) addressList() []address {
	var out []address
	for _, a := range s.m3Addresses {
		ip, _ := netip.ParseAddr(string(a.Spec.Address))
		out = append(out, address{kind: "IPAddress", name: a.Name, claimKind: "IPClaim", claimName: a.Spec.Claim.Name,
			claimUID: ownerUID(&a, "IPClaim"), key: "ipam.metal3.io/" + a.Spec.Pool.Name + "/" + ip.String(), ip: ip})
	}
	for _, a := range s.addresses {
		ip, _ := netip.ParseAddr(a.Spec.Address)
		out = append(out, address{kind: "IPAddress.ipam.cluster.x-k8s.io", name: a.Name, claimKind: "IPAddressClaim", claimName: a.Spec.ClaimRef.Name,
			claimUID: ownerUID(&a, "IPAddressClaim"), key: "ipam.cluster.x-k8s.io/" + a.Spec.PoolRef.Name + "/" + ip.String(), ip: ip})
	}
	return out
}

func ownerUID(obj client.Object, kind string) types.UID {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == kind {
			return ref.UID
		}
	}
	return ""
}

// addressViolations counts, in one namespace, the IPAddresses whose claim is gone, the claims
// holding a second IPAddress and the addresses given to two claims. Everything is keyed by claim UID, not name: a claim re-created under
// the name of one that is gone is another claim, and the Metal3 IPAM names an IPAddress after its
// value, so two claims can share one IPAddress object.
//   - orphan: an IPAddress whose owner reference names no live claim (or was removed because its
//     claim is gone);
//   - leaked: a claim UID held by two IPAddresses, one of them an address nobody uses;
//   - twice: an address value held for two claim UIDs (by their IPAddresses' owners, or by what
//     the claims' status points at); a claim whose status points at an IPAddress held for another
//     claim; an address rendered into the Secrets of two Metal3Data.
func addressViolations(ns string, s *namespaceState, claims map[string]*claim, webhooks func(types.UID) bool, ours, orphans, leaked, double *namedCount) {
	live := map[types.UID]*claim{}
	for _, cl := range claims {
		live[cl.obj.GetUID()] = cl
	}
	list := s.addressList()
	byClaimUID := map[types.UID][]string{}
	holders := map[string]map[types.UID]bool{}
	hold := func(key string, uid types.UID) {
		if holders[key] == nil {
			holders[key] = map[types.UID]bool{}
		}
		holders[key][uid] = true
	}
	byName := map[string]address{}
	// One address given to two claims is one double allocation, however many ways it shows.
	counted := map[string]bool{}
	for _, a := range list {
		byName[a.kind+"/"+a.name] = a
		if cl, ok := live[a.claimUID]; !ok || a.claimUID == "" || cl.kind != a.claimKind {
			orphans.addf("%s: %s: no live claim holds it", ns, a)
			if webhooks(a.claimUID) {
				ours.addf("address gone: %s: %s", ns, a)
			}
			continue
		}
		byClaimUID[a.claimUID] = append(byClaimUID[a.claimUID], a.kind+"/"+a.name)
		hold(a.key, a.claimUID)
	}
	for _, cl := range claims {
		if cl.addressName == "" {
			continue
		}
		a, ok := byName[addressKindOf(cl.kind)+"/"+cl.addressName]
		if !ok {
			continue
		}
		hold(a.key, cl.obj.GetUID())
		if a.claimUID != "" && a.claimUID != cl.obj.GetUID() && !counted[a.key] {
			counted[a.key] = true
			double.addf("%s: %s %s (uid %s) has address %s (%s), which is held for %s (uid %s)",
				ns, cl.kind, cl.obj.GetName(), uidTail(cl.obj.GetUID()), a.name, a.ip, a.claimName, uidTail(a.claimUID))
			if webhooks(cl.obj.GetUID()) || webhooks(a.claimUID) {
				ours.addf("shared: %s: %s %s has address %s, held for %s", ns, cl.kind, cl.obj.GetName(), a.name, a.claimName)
			}
		}
	}
	for uid, names := range byClaimUID {
		if len(names) > 1 {
			sort.Strings(names)
			leaked.addf("%s: %s %s (uid %s) is held by IPAddresses %v", ns, live[uid].kind, live[uid].obj.GetName(), uidTail(uid), names)
			if webhooks(uid) {
				ours.addf("second: %s: %s %s is held by IPAddresses %v", ns, live[uid].kind, live[uid].obj.GetName(), names)
			}
		}
	}
	for _, key := range sortedKeys(holders) {
		if uids := holders[key]; len(uids) > 1 && !counted[key] {
			counted[key] = true
			double.addf("%s: %s is held for claims %v", ns, key, describeUIDs(uids, live))
			for uid := range uids {
				if webhooks(uid) {
					ours.addf("shared: %s: %s is held for claims %v", ns, key, describeUIDs(uids, live))
					break
				}
			}
		}
	}
	rendered := renderedBy(s)
	for _, a := range list {
		if datas := rendered[a.ip]; len(datas) > 1 && !counted[a.key] {
			counted[a.key] = true
			double.addf("%s: %s is rendered for Metal3Data %v", ns, a, datas)
		}
	}
}

func addressKindOf(claimKind string) string {
	if claimKind == "IPClaim" {
		return "IPAddress"
	}
	return "IPAddress.ipam.cluster.x-k8s.io"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func describeUIDs(uids map[types.UID]bool, live map[types.UID]*claim) []string {
	var out []string
	for uid := range uids {
		name := "gone"
		if cl, ok := live[uid]; ok {
			name = cl.kind + "/" + cl.obj.GetName()
		}
		out = append(out, fmt.Sprintf("%s (uid %s)", name, uidTail(uid)))
	}
	sort.Strings(out)
	return out
}

// ipWord matches what may be an IP address in rendered cloud-init: digits, hex letters, dots and
// colons; ParseAddr decides.
var ipWord = regexp.MustCompile(`[0-9A-Fa-f:.]{2,}`)

// renderedIPs parses every IP address in rendered Secret values: "172.16.0.10" is not
// "172.16.0.100", nor is "fd00::1" "fd00::10".
func renderedIPs(values ...[]byte) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, v := range values {
		for _, word := range ipWord.FindAll(v, -1) {
			if ip, err := netip.ParseAddr(strings.Trim(string(word), ".:")); err == nil {
				out[ip] = true
			}
		}
	}
	return out
}

// renderedSecrets returns the values of the metadata and networkdata Secrets CAPM3 renders for
// a Metal3DataClaim.
func (s *namespaceState) renderedSecrets(dataClaim string) [][]byte {
	var values [][]byte
	for _, suffix := range []string{"-metadata", "-networkdata"} {
		for _, key := range sortedKeys(s.secrets[dataClaim+suffix].Data) {
			values = append(values, s.secrets[dataClaim+suffix].Data[key])
		}
	}
	return values
}

// renderedBy maps every IP address rendered into a Metal3Data's Secrets to the Metal3Data that
// render it; gateways and DNS servers, common to many, are there too and are never claims'.
func renderedBy(s *namespaceState) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	for _, d := range s.datas {
		if d.Spec.Claim == nil {
			continue
		}
		for ip := range renderedIPs(s.renderedSecrets(d.Spec.Claim.Name)...) {
			if !slices.Contains(out[ip], d.Name) {
				out[ip] = append(out[ip], d.Name)
			}
		}
	}
	return out
}

// uidTail is enough of a UID to tell objects of one name apart in a report, and not a run of hex
// a reader could take for a commit.
func uidTail(uid types.UID) string {
	if uid == "" {
		return `""`
	}
	return "…" + string(uid[max(0, len(uid)-4):])
}
