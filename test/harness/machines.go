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
	for _, shared := range []client.Object{m.Cluster, m.Template} {
		shared.SetUID("")
		if err := c.Create(ctx, shared); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(shared), shared); err != nil {
			return err
		}
	}
	for _, obj := range []client.Object{m.Machine, m.Host, m.Metal3Machine, m.DataClaim} {
		obj.SetUID("")
		owners := obj.GetOwnerReferences()
		for i := range owners {
			uid, err := uidOf(ctx, c, m, owners[i].Kind)
			if err != nil {
				return err
			}
			owners[i].UID = uid
		}
		obj.SetOwnerReferences(owners)
		if err := c.Create(ctx, obj); err != nil {
			return err
		}
	}
	owners := m.Data.OwnerReferences
	for i := range owners {
		uid, err := uidOf(ctx, c, m, owners[i].Kind)
		if err != nil {
			return err
		}
		owners[i].UID = uid
	}
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
