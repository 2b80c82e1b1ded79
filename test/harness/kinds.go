package harness

import (
	bmov1alpha1 "github.com/metal3-io/baremetal-operator/apis/metal3.io/v1alpha1"
	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// kinds are what manifests may name in {{ uid }}.
var kinds = map[string]schema.GroupVersionKind{
	"Cluster":            clusterv1.GroupVersion.WithKind("Cluster"),
	"Machine":            clusterv1.GroupVersion.WithKind("Machine"),
	"Metal3Machine":      infrav1.GroupVersion.WithKind("Metal3Machine"),
	"Metal3DataClaim":    infrav1.GroupVersion.WithKind("Metal3DataClaim"),
	"Metal3DataTemplate": infrav1.GroupVersion.WithKind("Metal3DataTemplate"),
	"Metal3Data":         infrav1.GroupVersion.WithKind("Metal3Data"),
	"BareMetalHost":      bmov1alpha1.GroupVersion.WithKind("BareMetalHost"),
}
