package validate

import (
	"context"
	"errors"
	"fmt"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// +kubebuilder:webhook:path=/validate-infrastructure-cluster-x-k8s-io-v1beta2-metal3datatemplate,mutating=false,failurePolicy=fail,sideEffects=None,groups=infrastructure.cluster.x-k8s.io,resources=metal3datatemplates,verbs=create;update,versions=v1beta2,name=validation.metal3datatemplate.ip-preallocator.metal3.io,matchPolicy=Equivalent,admissionReviewVersions=v1

// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ippools,verbs=get
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=*,verbs=get

// Metal3DataTemplate validates the pool references of Metal3DataTemplates on create and update.
type Metal3DataTemplate struct {
	// Reader checks that referenced pools exist; templates change rarely, so it may read live.
	Reader client.Reader
	// RESTMapper tells which group/kinds an installed API serves, from cached discovery.
	RESTMapper meta.RESTMapper
}

var _ admission.Validator[*infrav1.Metal3DataTemplate] = &Metal3DataTemplate{}

// SetupWebhookWithManager registers the handler on the manager's webhook server.
func (v *Metal3DataTemplate) SetupWebhookWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &infrav1.Metal3DataTemplate{}).WithValidator(v).Complete()
}

// ValidateCreate implements admission.Validator.
func (v *Metal3DataTemplate) ValidateCreate(ctx context.Context, tmpl *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	return v.validate(ctx, tmpl)
}

// ValidateUpdate implements admission.Validator.
func (v *Metal3DataTemplate) ValidateUpdate(ctx context.Context, _, tmpl *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	return v.validate(ctx, tmpl)
}

// ValidateDelete implements admission.Validator.
func (v *Metal3DataTemplate) ValidateDelete(context.Context, *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	return nil, nil
}

func (v *Metal3DataTemplate) validate(ctx context.Context, tmpl *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	errs, warnings := PoolReferences(tmpl)
	if len(errs) > 0 {
		return warnings, apierrors.NewInvalid(infrav1.GroupVersion.WithKind("Metal3DataTemplate").GroupKind(), tmpl.Name, errs)
	}
	return append(warnings, v.poolWarnings(ctx, tmpl)...), nil
}

// poolWarnings says which directly referenced pools no installed API serves, or do not exist.
func (v *Metal3DataTemplate) poolWarnings(ctx context.Context, tmpl *infrav1.Metal3DataTemplate) []string {
	logger := log.FromContext(ctx).WithValues("Metal3DataTemplate", klog.KObj(tmpl))
	var warnings []string
	checked := map[string]bool{}
	for _, ref := range allocation.References(tmpl) {
		if ref.FromAnnotation != nil {
			continue
		}
		pool := defaulted(ref.Pool)
		if checked[pool.Name] {
			continue
		}
		checked[pool.Name] = true
		gk := schema.GroupKind{Group: pool.APIGroup, Kind: pool.Kind}
		mapping, err := v.RESTMapper.RESTMapping(gk)
		if meta.IsNoMatchError(err) {
			warnings = append(warnings, fmt.Sprintf("%s: no installed API serves %s for pool %q", ref.Path, gk, pool.Name))
			continue
		}
		if err != nil {
			logger.Info("Cannot check the pool's API", "pool", pool.Name, "error", err)
			continue
		}
		obj := &metav1.PartialObjectMetadata{}
		obj.SetGroupVersionKind(mapping.GroupVersionKind)
		err = v.Reader.Get(ctx, client.ObjectKey{Namespace: tmpl.Namespace, Name: pool.Name}, obj)
		switch {
		case apierrors.IsNotFound(err):
			warnings = append(warnings, fmt.Sprintf("%s: %s %q does not exist in namespace %q", ref.Path, gk, pool.Name, tmpl.Namespace))
		case err != nil && !errors.Is(err, context.Canceled):
			logger.Info("Cannot check that the pool exists", "pool", pool.Name, "error", err)
		}
	}
	return warnings
}
