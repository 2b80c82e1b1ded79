package harness

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// CreateMachine stores everything of m but its Metal3Data, as CAPI and CAPM3 would have created
// it, with owner references carrying the owners' real UIDs (the garbage collector deletes
// dependents of owners whose UID does not match). The Cluster and template are created when they
// do not exist yet. It fixes m.Data's owner references too; the caller creates the Metal3Data.
func CreateMachine(ctx context.Context, c client.Client, m *fixtures.Machine) error {
	if err := CreateShared(ctx, c, m); err != nil {
		return err
	}
	if err := CreateMachineObjects(ctx, c, m); err != nil {
		return err
	}
	return CreateDataClaim(ctx, c, m)
}

// CreateShared stores m's Cluster and template when they do not exist yet, and reads their UIDs
// into m.
func CreateShared(ctx context.Context, c client.Client, m *fixtures.Machine) error {
	for _, shared := range []client.Object{m.Cluster, m.Template} {
		shared.SetUID("")
		if err := c.Create(ctx, shared); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(shared), shared); err != nil {
			return err
		}
	}
	return nil
}

// CreateMachineObjects stores what exists of a machine before CAPM3's Metal3Machine controller
// creates its Metal3DataClaim: the Machine, the BareMetalHost and the Metal3Machine that names it.
func CreateMachineObjects(ctx context.Context, c client.Client, m *fixtures.Machine) error {
	for _, obj := range []client.Object{m.Machine, m.Host, m.Metal3Machine} {
		if err := createOwned(ctx, c, m, obj); err != nil {
			return err
		}
	}
	return nil
}

// CreateDataClaim stores m's Metal3DataClaim, owned by its Metal3Machine, in one request, as
// CAPM3's Metal3Machine controller does; CAPM3's Metal3DataTemplate controller then creates the
// Metal3Data. It fixes m.Data's owner references, for a caller that creates the Metal3Data itself.
func CreateDataClaim(ctx context.Context, c client.Client, m *fixtures.Machine) error {
	if err := createOwned(ctx, c, m, m.DataClaim); err != nil {
		return err
	}
	return setOwnerUIDs(ctx, c, m, m.Data)
}

func createOwned(ctx context.Context, c client.Client, m *fixtures.Machine, obj client.Object) error {
	obj.SetUID("")
	if err := setOwnerUIDs(ctx, c, m, obj); err != nil {
		return err
	}
	return c.Create(ctx, obj)
}

func setOwnerUIDs(ctx context.Context, c client.Client, m *fixtures.Machine, obj client.Object) error {
	owners := obj.GetOwnerReferences()
	for i := range owners {
		uid, err := uidOf(ctx, c, m, owners[i].Kind)
		if err != nil {
			return err
		}
		owners[i].UID = uid
	}
	obj.SetOwnerReferences(owners)
	return nil
}

func uidOf(ctx context.Context, c client.Client, m *fixtures.Machine, kind string) (types.UID, error) {
	var owner client.Object
	switch kind {
	case "Machine":
		owner = m.Machine
	case "Metal3Machine":
		owner = m.Metal3Machine
	case "Metal3DataClaim":
		owner = m.DataClaim
	case "Metal3DataTemplate":
		owner = m.Template
	}
	if owner.GetUID() != "" {
		return owner.GetUID(), nil
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(kinds[kind])
	err := c.Get(ctx, client.ObjectKeyFromObject(owner), meta)
	return meta.UID, err
}
