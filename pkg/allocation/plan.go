package allocation

import (
	"maps"
	"strconv"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	capipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// DataLabelName names, on IPClaims in BMH-name mode, the Metal3Data CAPM3 releases them by.
	DataLabelName = "infrastructure.cluster.x-k8s.io/data-name"
	// PoolLabelName is the label CAPM3 puts on IPClaims in BMH-name mode, naming the pool.
	PoolLabelName = "infrastructure.cluster.x-k8s.io/pool-name"

	// AnnotationPrefix begins the name of every annotation the webhook writes.
	AnnotationPrefix = "ip-preallocator.metal3.io/"
	// PreallocatedForAnnotation names the Metal3Data a claim not yet handed over was created for. Not
	// a label: the Metal3 IPAM copies a claim's labels onto its IPAddress.
	PreallocatedForAnnotation = AnnotationPrefix + "preallocated-for"
	// AdmissionAnnotation is the UID of the admission that last claimed a waiting claim, on the claim
	// and its Metal3Data: it binds the hand-over, and its change restarts the grace period.
	AdmissionAnnotation = AnnotationPrefix + "admission"
	// DataClaimAnnotation names a waiting claim's Metal3DataClaim: while that waits for data, CAPM3
	// retries the create, whose admission reclaims the claim, so it is not released.
	DataClaimAnnotation = AnnotationPrefix + "data-claim"
	// ClaimsAnnotation lists on a Metal3Data its preallocated claims, as comma-separated kind/name.
	ClaimsAnnotation = AnnotationPrefix + "claims"

	// KindIPClaim is the kind of a Metal3 IPAM claim.
	KindIPClaim = "IPClaim"
	// KindIPAddressClaim is the kind of a Cluster API IPAM claim.
	KindIPAddressClaim = "IPAddressClaim"
)

var (
	// IPClaimGVK is the version CAPM3 creates IPClaims with.
	IPClaimGVK = ipamv1.GroupVersion.WithKind(KindIPClaim)
	// IPAddressClaimGVK is the version CAPM3 creates IPAddressClaims with.
	IPAddressClaimGVK = capipamv1.GroupVersion.WithKind(KindIPAddressClaim)
	// Metal3DataGVK is the version CAPM3 v1.13 serves Metal3Data in, and the webhook reads them in.
	Metal3DataGVK = infrav1.GroupVersion.WithKind("Metal3Data")
	// Metal3DataClaimGVK is the version of the Metal3DataClaim a Metal3Data answers.
	Metal3DataClaimGVK = infrav1.GroupVersion.WithKind("Metal3DataClaim")
)

// Claim is the claim CAPM3 would create for one pool of one Metal3Data.
type Claim struct {
	Pool PoolRef
	// Object is the claim exactly as CAPM3 creates it, owner reference included.
	Object client.Object
	// Lookup holds the names CAPM3 tries in order; it uses an existing one as it is.
	Lookup []string
	// DataClaim is the name of the Metal3DataClaim the Metal3Data answers, if it names one.
	DataClaim string
}

// Kind is the claim's kind, IPClaim or IPAddressClaim.
func (c Claim) Kind() string { return c.GVK().Kind }

// GVK is the claim's group, version and kind.
func (c Claim) GVK() schema.GroupVersionKind {
	if c.Pool.IsMetal3() {
		return IPClaimGVK
	}
	return IPAddressClaimGVK
}

// preallocated is the claim as created before its Metal3Data has a UID: our annotations instead of
// the owner reference, as an owner that is not stored makes the garbage collector delete the claim.
func (c Claim) preallocated(token string) client.Object {
	obj, _ := c.Object.DeepCopyObject().(client.Object)
	obj.SetOwnerReferences(nil)
	ann := map[string]string{}
	maps.Copy(ann, obj.GetAnnotations())
	ann[PreallocatedForAnnotation] = c.Object.GetOwnerReferences()[0].Name
	ann[AdmissionAnnotation] = token
	if c.DataClaim != "" {
		ann[DataClaimAnnotation] = c.DataClaim
	}
	obj.SetAnnotations(ann)
	return obj
}

// OwnerReference is the reference CAPM3 gives every claim of a Metal3Data.
func OwnerReference(data metav1.Object) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: infrav1.GroupVersion.String(),
		Kind:       "Metal3Data",
		Name:       data.GetName(),
		UID:        data.GetUID(),
		Controller: ptr.To(true),
	}
}

// DataName is the name CAPM3 gives the Metal3Data of a template's machine with index.
func DataName(template string, index int) string {
	return template + "-" + strconv.Itoa(index)
}

// ClaimName is CAPM3's name for owner's claim of pool; owner is the BMH in BMH-name mode.
func ClaimName(owner, pool string) string {
	return owner + "-" + pool
}

// Plan returns, for each pool, the claim CAPM3 would create for data.
func Plan(data *infrav1.Metal3Data, pools []PoolRef, bmhName string, bmhNameBased bool) []Claim {
	claims := make([]Claim, 0, len(pools))
	var dataClaim string
	if data.Spec.Claim != nil && (data.Spec.Claim.Namespace == "" || data.Spec.Claim.Namespace == data.Namespace) {
		dataClaim = data.Spec.Claim.Name
	}
	for _, pool := range pools {
		meta := metav1.ObjectMeta{
			Name:            ClaimName(data.Name, pool.Name),
			Namespace:       data.Namespace,
			Labels:          maps.Clone(data.Labels),
			Finalizers:      []string{infrav1.DataFinalizer},
			OwnerReferences: []metav1.OwnerReference{OwnerReference(data)},
		}
		c := Claim{Pool: pool, Lookup: []string{meta.Name}, DataClaim: dataClaim}
		if !pool.IsMetal3() {
			// CAPM3's BMH-name mode leaks a random Metal3 pool's labels, or none, onto an
			// IPAddressClaim through a shared map; we add none.
			c.Object = &capipamv1.IPAddressClaim{
				TypeMeta:   metav1.TypeMeta{APIVersion: IPAddressClaimGVK.GroupVersion().String(), Kind: KindIPAddressClaim},
				ObjectMeta: meta,
				Spec:       capipamv1.IPAddressClaimSpec{PoolRef: capipamv1.IPPoolReference{Name: pool.Name, APIGroup: pool.APIGroup, Kind: pool.Kind}},
			}
			claims = append(claims, c)
			continue
		}
		if bmhName != data.Name {
			c.Lookup = append(c.Lookup, ClaimName(bmhName, pool.Name))
		}
		if bmhNameBased {
			meta.Name = ClaimName(bmhName, pool.Name)
			meta.Labels = labels.Merge(meta.Labels, labels.Set{DataLabelName: data.Name, PoolLabelName: pool.Name})
		}
		c.Object = &ipamv1.IPClaim{
			TypeMeta:   metav1.TypeMeta{APIVersion: IPClaimGVK.GroupVersion().String(), Kind: KindIPClaim},
			ObjectMeta: meta,
			Spec:       ipamv1.IPClaimSpec{Pool: corev1.ObjectReference{Name: pool.Name, Namespace: data.Namespace}},
		}
		claims = append(claims, c)
	}
	return claims
}
