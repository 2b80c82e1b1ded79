package validate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// maxIndex is the largest Metal3Data index a template is expected to serve.
const maxIndex = 999999

// poolReferences rejects only what CAPM3 fails every Metal3Data of the template on, and warns where
// CAPM3 silently ignores something or claim names stop fitting below maxIndex.
func poolReferences(tmpl *infrav1.Metal3DataTemplate) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	pools, conflicts := allocation.Resolve(tmpl, allocation.Machine{})
	for _, err := range conflicts {
		errs = append(errs, resolveError(err))
	}
	for _, ref := range allocation.References(tmpl) {
		if ann := ref.FromAnnotation; ann != nil {
			errs = append(errs, validateFromAnnotation(ref.Path, *ann)...)
			continue
		}
		if gk := ref.MetaDataGroupKind; gk != nil && !allocation.Defaulted(infrav1.IPPoolReference{APIGroup: gk.Group, Kind: gk.Kind}).IsMetal3() {
			warnings = append(warnings, fmt.Sprintf("%s: apiGroup %q and kind %q are ignored by CAPM3 %s: pool %q is read as an %s %s",
				strings.TrimSuffix(ref.Path.String(), ".name"), gk.Group, gk.Kind, allocation.CAPM3Version, ref.Pool.Name,
				allocation.Metal3PoolGroup, allocation.Metal3PoolKind))
		}
	}
	for _, pool := range pools {
		nameErrs, nameWarnings := validateClaimName(pool.Path, tmpl.Name, pool.Name)
		errs = append(errs, nameErrs...)
		warnings = append(warnings, nameWarnings...)
	}
	return errs, warnings
}

// resolveError turns a conflict, Resolve's only error without a machine, into a field error.
func resolveError(err error) *field.Error {
	var conflict *allocation.PoolConflictError
	if !errors.As(err, &conflict) {
		return field.InternalError(field.NewPath("spec"), err)
	}
	return field.Invalid(conflict.Path, conflict.Pool.Name, fmt.Sprintf(
		"pool %q is referenced as %s/%s here and as %s/%s at %s; CAPM3 fails on one name with two resource types",
		conflict.Pool.Name, conflict.Pool.APIGroup, conflict.Pool.Kind, conflict.First.APIGroup, conflict.First.Kind, conflict.FirstPath))
}

func validateFromAnnotation(path *field.Path, ann infrav1.FromPoolAnnotation) field.ErrorList {
	var errs field.ErrorList
	var unknown *allocation.UnknownObjectError
	if errors.As(allocation.CheckAnnotationObject(path, ann.Object), &unknown) {
		errs = append(errs, field.NotSupported(path.Child("object"), unknown.Object, allocation.AnnotationObjects))
	}
	for _, err := range apivalidation.ValidateAnnotations(map[string]string{ann.Annotation: ""}, path.Child("annotation")) {
		errs = append(errs, field.Invalid(path.Child("annotation"), ann.Annotation, "not a valid annotation key: "+err.Detail))
	}
	return errs
}

// validateClaimName rejects claim names invalid at index 0, hence at every index, and warns when
// only a larger index makes them too long.
func validateClaimName(path *field.Path, template, pool string) (field.ErrorList, []string) {
	name := allocation.ClaimName(allocation.DataName(template, 0), pool)
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(path, pool, fmt.Sprintf(
			"the claims of pool %q would be named %q (%d characters for index 0), which is not a valid object name: %s",
			pool, name, len(name), strings.Join(msgs, "; ")))}, nil
	}
	longest := allocation.ClaimName(allocation.DataName(template, maxIndex), pool)
	if len(longest) <= validation.DNS1123SubdomainMaxLength {
		return nil, nil
	}
	// Index 0 takes one digit of the name; the largest index that fits has all the room in nines.
	digits := 1 + validation.DNS1123SubdomainMaxLength - len(name)
	largest, _ := strconv.Atoi(strings.Repeat("9", digits))
	return nil, []string{fmt.Sprintf(
		"%s: the claims of pool %q fit in an object name (%d characters) up to index %d only: CAPM3 cannot claim this pool for the Metal3Data of a larger index",
		path, pool, validation.DNS1123SubdomainMaxLength, largest)}
}
