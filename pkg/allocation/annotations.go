package allocation

import (
	"fmt"
	"strings"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Machine holds the objects a fromPoolAnnotation may read; with none, such entries are skipped.
type Machine struct {
	Machine       metav1.Object
	Metal3Machine metav1.Object
	BareMetalHost metav1.Object
}

// AnnotationObjects are the objects a fromPoolAnnotation may name.
var AnnotationObjects = []string{objectMachine, objectMetal3Machine, objectBareMetalHost}

// annotationObjects mirrors the switch of CAPM3's getValueFromAnnotation.
var annotationObjects = map[string]func(Machine) metav1.Object{
	objectMachine:       func(m Machine) metav1.Object { return m.Machine },
	objectMetal3Machine: func(m Machine) metav1.Object { return m.Metal3Machine },
	objectBareMetalHost: func(m Machine) metav1.Object { return m.BareMetalHost },
}

// UnknownObjectError names a fromPoolAnnotation object CAPM3 fails every Metal3Data on.
type UnknownObjectError struct {
	Path   *field.Path
	Object string
}

// Error implements error.
func (e *UnknownObjectError) Error() string {
	return fmt.Sprintf("%s: unknown object type %q", e.Path, e.Object)
}

// CheckAnnotationObject returns an *UnknownObjectError when CAPM3 cannot read from object.
func CheckAnnotationObject(path *field.Path, object string) error {
	if _, ok := annotationObjects[strings.ToLower(object)]; !ok {
		return &UnknownObjectError{Path: path, Object: object}
	}
	return nil
}

// poolName mirrors CAPM3's addFromAnnotation; it is "" when the machine is not known.
func (m Machine) poolName(path *field.Path, a infrav1.FromPoolAnnotation) (string, error) {
	if m.Machine == nil && m.Metal3Machine == nil && m.BareMetalHost == nil {
		return "", nil
	}
	if err := CheckAnnotationObject(path, a.Object); err != nil {
		return "", err
	}
	obj := annotationObjects[strings.ToLower(a.Object)](m)
	if obj == nil {
		return "", fmt.Errorf("%s: %s is nil but referenced in annotation %s", path, a.Object, a.Annotation)
	}
	name := obj.GetAnnotations()[a.Annotation]
	if name == "" {
		return "", fmt.Errorf("%s: annotation %s not found or empty on %s", path, a.Annotation, a.Object)
	}
	return name, nil
}
