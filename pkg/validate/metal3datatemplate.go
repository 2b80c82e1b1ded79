package validate

import (
	"context"
	"fmt"
	"maps"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// The webhook fails closed, so a matchCondition in config/webhook skips updates that keep the spec or
// touch an object being deleted: CAPM3's finalizer and owner updates never wait for it.
// +kubebuilder:webhook:path=/validate-infrastructure-cluster-x-k8s-io-v1beta2-metal3datatemplate,mutating=false,failurePolicy=fail,sideEffects=None,groups=infrastructure.cluster.x-k8s.io,resources=metal3datatemplates,verbs=create;update,versions=v1beta2,name=validation.metal3datatemplate.ip-preallocator.metal3.io,matchPolicy=Equivalent,timeoutSeconds=5,admissionReviewVersions=v1

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
	if err := ctrl.NewWebhookManagedBy(mgr, &infrav1.Metal3DataTemplate{}).WithValidator(v).Complete(); err != nil {
		return fmt.Errorf("setting up the Metal3DataTemplate validating webhook: %w", err)
	}
	return nil
}

// ValidateCreate implements admission.Validator.
func (v *Metal3DataTemplate) ValidateCreate(ctx context.Context, tmpl *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	return v.validate(ctx, nil, tmpl)
}

// ValidateUpdate implements admission.Validator.
func (v *Metal3DataTemplate) ValidateUpdate(ctx context.Context, old, tmpl *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	return v.validate(ctx, old, tmpl)
}

// ValidateDelete implements admission.Validator.
func (v *Metal3DataTemplate) ValidateDelete(context.Context, *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	return nil, nil
}

func (v *Metal3DataTemplate) validate(ctx context.Context, old, tmpl *infrav1.Metal3DataTemplate) (admission.Warnings, error) {
	errs, warnings := Template(old, tmpl)
	if len(errs) > 0 {
		return warnings, apierrors.NewInvalid(infrav1.GroupVersion.WithKind("Metal3DataTemplate").GroupKind(), tmpl.Name, errs)
	}
	if tmpl.DeletionTimestamp != nil || old != nil && maps.Equal(poolSet(old), poolSet(tmpl)) {
		return warnings, nil
	}
	ctx, cancel := context.WithTimeout(ctx, clock.ValidationLiveCheck)
	defer cancel()
	return append(warnings, v.poolWarnings(ctx, tmpl)...), nil
}

// Template returns what admission rejects and warns about; old is nil on create. Errors old has too
// are only warnings (ratcheting, as in Cluster API), so stored templates stay editable.
func Template(old, tmpl *infrav1.Metal3DataTemplate) (field.ErrorList, []string) {
	if tmpl.DeletionTimestamp != nil || old != nil && equality.Semantic.DeepEqual(old.Spec, tmpl.Spec) {
		return nil, nil
	}
	errs, warnings := poolReferences(tmpl)
	if old == nil || len(errs) == 0 {
		return errs, warnings
	}
	oldErrs, _ := poolReferences(old)
	stored := map[errorKey]bool{}
	for _, err := range oldErrs {
		stored[keyOf(err)] = true
	}
	var introduced field.ErrorList
	for _, err := range errs {
		if stored[keyOf(err)] {
			warnings = append(warnings, err.Error()+" (admitted: the stored Metal3DataTemplate has it already, but CAPM3 still fails on it)")
			continue
		}
		introduced = append(introduced, err)
	}
	return introduced, warnings
}

// errorKey identifies an error for ratcheting; its message may name other places.
type errorKey struct {
	Type  field.ErrorType
	Field string
	Value string
}

func keyOf(err *field.Error) errorKey {
	return errorKey{Type: err.Type, Field: err.Field, Value: fmt.Sprint(err.BadValue)}
}

func poolSet(tmpl *infrav1.Metal3DataTemplate) map[allocation.PoolRef]bool {
	pools, _ := allocation.Resolve(tmpl, allocation.Machine{})
	set := make(map[allocation.PoolRef]bool, len(pools))
	for _, pool := range pools {
		set[pool.PoolRef] = true
	}
	return set
}

// poolWarnings names referenced pools not served or not existing; what ctx cuts short is logged.
func (v *Metal3DataTemplate) poolWarnings(ctx context.Context, tmpl *infrav1.Metal3DataTemplate) []string {
	logger := log.FromContext(ctx).WithValues("Metal3DataTemplate", klog.KObj(tmpl))
	var warnings []string
	pools, _ := allocation.Resolve(tmpl, allocation.Machine{})
	for _, pool := range pools {
		gk := schema.GroupKind{Group: pool.APIGroup, Kind: pool.Kind}
		mapping, err := restMapping(ctx, v.RESTMapper, gk)
		if meta.IsNoMatchError(err) {
			warnings = append(warnings, fmt.Sprintf("%s: no installed API serves %s for pool %q", pool.Path, gk, pool.Name))
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
			warnings = append(warnings, fmt.Sprintf("%s: %s %q does not exist in namespace %q", pool.Path, gk, pool.Name, tmpl.Namespace))
		case err != nil:
			logger.Info("Cannot check that the pool exists", "pool", pool.Name, "error", err)
		}
	}
	return warnings
}

// restMapping bounds a RESTMapper lookup by ctx: discovering an uncached group takes no context.
func restMapping(ctx context.Context, mapper meta.RESTMapper, gk schema.GroupKind) (*meta.RESTMapping, error) {
	type result struct {
		mapping *meta.RESTMapping
		err     error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("panic: %v", r)}
			}
		}()
		mapping, err := mapper.RESTMapping(gk)
		done <- result{mapping, err}
	}()
	select {
	case r := <-done:
		return r.mapping, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
