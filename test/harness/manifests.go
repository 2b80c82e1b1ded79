package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"text/template"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

var errOwnerNotFound = errors.New("owner not found")

// Render expands a manifest template with values and .Namespace. Owner references need the
// owner's UID, which only exists once the owner is stored, so manifests write
// `uid: {{ uid "Machine" "machine-0" }}` and Render reads it from the namespace.
func (cp *ControlPlane) Render(ctx context.Context, namespace string, manifest []byte, values map[string]any) ([]byte, error) {
	tmpl, err := template.New("manifest").Option("missingkey=error").Funcs(template.FuncMap{
		"uid": func(kind, name string) (string, error) { return cp.UID(ctx, namespace, kind, name) },
	}).Parse(string(manifest))
	if err != nil {
		return nil, err
	}
	data := map[string]any{"Namespace": namespace}
	for k, v := range values {
		data[k] = v
	}
	var out bytes.Buffer
	err = tmpl.Execute(&out, data)
	return out.Bytes(), err
}

// Apply renders a manifest file and applies it with kubectl into namespace, returning kubectl's
// output and warnings. A document whose owner is created earlier in the same file is rendered
// once the documents before it are applied.
func (cp *ControlPlane) Apply(ctx context.Context, namespace, path string, values map[string]any, flags ...string) (stdout, stderr string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	var batch [][]byte
	apply := func() error {
		if len(batch) == 0 {
			return nil
		}
		out, errOut, err := cp.Kubectl(ctx, bytes.Join(batch, []byte("\n---\n")), append([]string{"apply", "-n", namespace, "-f", "-"}, flags...)...)
		stdout, stderr, batch = stdout+out, stderr+errOut, nil
		return err
	}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		rendered, err := cp.Render(ctx, namespace, doc, values)
		if errors.Is(err, errOwnerNotFound) && len(batch) > 0 {
			if err := apply(); err != nil {
				return stdout, stderr, err
			}
			rendered, err = cp.Render(ctx, namespace, doc, values)
		}
		if err != nil {
			return stdout, stderr, err
		}
		batch = append(batch, rendered)
	}
	return stdout, stderr, apply()
}

// UID reads the UID of a namespaced object of one of the kinds the fixtures know.
func (cp *ControlPlane) UID(ctx context.Context, namespace, kind, name string) (string, error) {
	gvk, ok := kinds[kind]
	if !ok {
		return "", fmt.Errorf("uid: unknown kind %q", kind)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, u); err != nil {
		if apierrors.IsNotFound(err) {
			err = errOwnerNotFound
		}
		return "", fmt.Errorf("uid: %s %s/%s: %w", kind, namespace, name, err)
	}
	return string(u.GetUID()), nil
}
