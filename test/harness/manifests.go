package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"text/template"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Render expands a manifest template. Owner references need the owner's UID, which only exists
// once the owner is stored, so manifests write `uid: {{ uid "Machine" "machine-0" }}` and Render
// reads it from the namespace.
func (cp *ControlPlane) Render(ctx context.Context, namespace string, manifest []byte) ([]byte, error) {
	tmpl, err := template.New("manifest").Option("missingkey=error").Funcs(template.FuncMap{
		"uid": func(kind, name string) (string, error) { return cp.UID(ctx, namespace, kind, name) },
	}).Parse(string(manifest))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = tmpl.Execute(&out, map[string]string{"Namespace": namespace})
	return out.Bytes(), err
}

// RenderFile is Render for a file.
func (cp *ControlPlane) RenderFile(ctx context.Context, namespace, path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return cp.Render(ctx, namespace, data)
}

// UID reads the UID of a namespaced object of one of the kinds the fixtures know.
func (cp *ControlPlane) UID(ctx context.Context, namespace, kind, name string) (string, error) {
	gvks, ok := kinds[kind]
	if !ok {
		return "", fmt.Errorf("uid: unknown kind %q", kind)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvks)
	if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, u); err != nil {
		return "", fmt.Errorf("uid: %s %s/%s: %w", kind, namespace, name, err)
	}
	return string(u.GetUID()), nil
}
