// Package controllertest holds what the controllers' unit tests share: a Metal3Data, its waiting claims and a fake client with the cache indices.
package controllertest

import (
	"context"
	"testing"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/index"
)

// DataKey is the Metal3Data the controllers' unit tests hand claims over to.
var DataKey = types.NamespacedName{Namespace: "ns", Name: "tmpl-0"}

// Metal3Data is DataKey, recorded by the admission token with the claims record, if token is set.
func Metal3Data(token, record string) *infrav1.Metal3Data {
	d := &infrav1.Metal3Data{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tmpl-0", UID: "data-uid"}}
	if token != "" {
		d.Annotations = map[string]string{allocation.AdmissionAnnotation: token, allocation.ClaimsAnnotation: record}
	}
	return d
}

// WaitingClaim is an IPClaim preallocated for DataKey by the admission token.
func WaitingClaim(name, token string) *ipamv1.IPClaim {
	return &ipamv1.IPClaim{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "ns", UID: types.UID(name + "-uid"),
		Annotations: map[string]string{allocation.PreallocatedForAnnotation: "tmpl-0", allocation.AdmissionAnnotation: token},
		Finalizers:  []string{infrav1.DataFinalizer},
	}}
}

// IndexedClient is a fake client with the controllers' cache indices, whose patches fail as the
// API server's do, and which returns managedFields as the API server does (CreatedHere reads them).
func IndexedClient(funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	b := fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objs...).WithReturnManagedFields()
	for _, f := range index.Fields() {
		b = b.WithIndex(f.Object, f.Name, f.Extract)
	}
	return b.WithInterceptorFuncs(fixtures.APIServerPatchErrors(funcs)).Build()
}

// OwnersOf are the owner references of the IPClaim name in namespace ns.
func OwnersOf(t *testing.T, c client.Reader, name string) []metav1.OwnerReference {
	t.Helper()
	got := &ipamv1.IPClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, got); err != nil {
		t.Fatal(err)
	}
	return got.OwnerReferences
}

// IsDeleting tells whether the IPClaim tmpl-0-a was released: deleted, or kept by CAPM3's finalizer.
func IsDeleting(t *testing.T, c client.Reader) bool {
	t.Helper()
	got := &ipamv1.IPClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "tmpl-0-a"}, got); err != nil {
		return apierrors.IsNotFound(err)
	}
	return !got.DeletionTimestamp.IsZero()
}
