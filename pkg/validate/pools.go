// Package validate holds the validating admission handlers: Metal3DataTemplate pool references
// are checked when the template is applied, instead of failing a Metal3Data at reconcile time.
package validate

import (
	"fmt"
	"strconv"
	"strings"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// MaxIndex is the largest Metal3Data index for which claim names are checked: CAPM3 names a
// Metal3Data <template>-<index> and its claims <template>-<index>-<pool>, and a template whose
// claim names fit for index 999999 fits for every smaller one.
const MaxIndex = 999999

var annotationObjects = []string{allocation.ObjectMachine, allocation.ObjectMetal3Machine, allocation.ObjectBareMetalHost}

// PoolReferences validates the pool references of a Metal3DataTemplate without reading anything
// else. It rejects only what CAPM3 v1.13.2 fails on at reconcile time: one pool name used with two
// group/kinds, a fromPoolAnnotation that names an unknown object or an invalid annotation key,
// and claim names that cannot be valid. It warns where CAPM3 silently ignores something.
func PoolReferences(tmpl *infrav1.Metal3DataTemplate) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	type first struct {
		pool allocation.PoolRef
		path *field.Path
	}
	seen := map[string]first{}
	for _, ref := range allocation.References(tmpl) {
		if ann := ref.FromAnnotation; ann != nil {
			errs = append(errs, validateFromAnnotation(ref.Path, *ann)...)
			continue
		}
		if gk := ref.MetaDataGroupKind; gk != nil && (gk.Group != "" && gk.Group != allocation.Metal3PoolGroup || gk.Kind != "" && gk.Kind != allocation.Metal3PoolKind) {
			warnings = append(warnings, fmt.Sprintf("%s: apiGroup %q and kind %q are ignored by CAPM3 v1.13.2: pool %q is read as an %s %s",
				strings.TrimSuffix(ref.Path.String(), ".name"), gk.Group, gk.Kind, ref.Pool.Name, allocation.Metal3PoolGroup, allocation.Metal3PoolKind))
		}
		pool := defaulted(ref.Pool)
		if prev, ok := seen[pool.Name]; ok {
			if prev.pool != pool {
				errs = append(errs, field.Invalid(ref.Path, pool.Name, fmt.Sprintf(
					"pool %q is referenced as %s/%s here and as %s/%s at %s; CAPM3 fails on one name with two resource types",
					pool.Name, pool.APIGroup, pool.Kind, prev.pool.APIGroup, prev.pool.Kind, prev.path)))
			}
			continue
		}
		seen[pool.Name] = first{pool: pool, path: ref.Path}
		errs = append(errs, validateClaimName(ref.Path, tmpl.Name, pool.Name)...)
	}
	return errs, warnings
}

func defaulted(ref infrav1.IPPoolReference) allocation.PoolRef {
	pool := allocation.PoolRef{Name: ref.Name, APIGroup: ref.APIGroup, Kind: ref.Kind}
	if pool.APIGroup == "" {
		pool.APIGroup = allocation.Metal3PoolGroup
	}
	if pool.Kind == "" {
		pool.Kind = allocation.Metal3PoolKind
	}
	return pool
}

func validateFromAnnotation(path *field.Path, ann infrav1.FromPoolAnnotation) field.ErrorList {
	var errs field.ErrorList
	object := strings.ToLower(ann.Object)
	if object != allocation.ObjectMachine && object != allocation.ObjectMetal3Machine && object != allocation.ObjectBareMetalHost {
		errs = append(errs, field.NotSupported(path.Child("object"), ann.Object, annotationObjects))
	}
	for _, err := range apivalidation.ValidateAnnotations(map[string]string{ann.Annotation: ""}, path.Child("annotation")) {
		errs = append(errs, field.Invalid(path.Child("annotation"), ann.Annotation, "not a valid annotation key: "+err.Detail))
	}
	return errs
}

// validateClaimName checks the name CAPM3 gives the claim of pool for the longest index.
func validateClaimName(path *field.Path, template, pool string) field.ErrorList {
	name := template + "-" + strconv.Itoa(MaxIndex) + "-" + pool
	msgs := validation.IsDNS1123Subdomain(name)
	if len(msgs) == 0 {
		return nil
	}
	return field.ErrorList{field.Invalid(path, pool, fmt.Sprintf(
		"the claims of pool %q would be named %q (%d characters for index %d), which is not a valid object name: %s",
		pool, name, len(name), MaxIndex, strings.Join(msgs, "; ")))}
}
